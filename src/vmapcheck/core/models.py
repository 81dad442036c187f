"""Models written for one feature vector, batched by the harness.

A :class:`Model` exposes ``forward_one(params, x)`` for a single feature vector of shape
``(in_features,)`` returning ``(out_features,)``, and a hand-batched ``forward_batch(params,
X)`` for ``X`` of shape ``(batch, in_features)`` (batch axis 0) returning ``(batch,
out_features)``. Params are a pytree shared by every row: they are never mapped over.

A model may also expose its intermediate activations (``activations_one`` /
``activations_batch``), which the diagnosis (:mod:`vmapcheck.check.diagnosis`) compares layer
by layer between the paths to name the first layer that diverges.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp

from vmapcheck.config import ModelConfig
from vmapcheck.core.contract import InputSpec
from vmapcheck.core.record import InputLeafRecord
from vmapcheck.errors import ConfigError

Params = Any  # a pytree of arrays
# (params, x) -> output, where x is one example (in_features,) or, under an input
# contract (Model.inputs), a dict of leaves; a stochastic model's forward takes its key
# after x, and a forward written once takes ``tap=`` (:data:`Tap`): hence ``...``.
ForwardOne = Callable[..., jax.Array]
# The same over a batch: X (batch, in_features) or the dict with batch axis 0 per leaf.
ForwardBatch = Callable[..., jax.Array]
# [(layer name, activation), ...] in computation order; the last entry is the output.
Activations = list[tuple[str, jax.Array]]
ActivationsFn = Callable[[Params, jax.Array], Activations]
# A forward written once reports each intermediate through ``tap(name, value) -> value``.
Tap = Callable[[str, jax.Array], jax.Array]


def no_tap(name: str, value: jax.Array) -> jax.Array:
    """The tap of a plain forward call: records nothing, returns ``value`` unchanged."""
    return value


def recorded(forward: Callable[..., jax.Array], output: str) -> ActivationsFn:
    """The activations of ``forward(params, x, tap=...)``: every tapped value, then the
    output under the name ``output``.

    Writing the forward once, with taps, is what keeps the activations honest: they are
    the very values the forward computes, never a second implementation that could
    drift from it. Shapes follow ``forward``: for ``forward_one`` each activation is
    ``(units,)``, for ``forward_batch`` it is ``(batch, units)`` (batch axis 0).
    """

    def activations(params: Params, x: jax.Array, *key: jax.Array) -> Activations:
        # ``key``: a stochastic forward's key (or keys), passed on as its third argument.
        taken: Activations = []

        def tap(name: str, value: jax.Array) -> jax.Array:
            taken.append((name, value))
            return value

        out = forward(params, x, *key, tap=tap)
        return [*taken, (output, out)]

    return activations


@dataclass(frozen=True, kw_only=True)
class Model:
    """What the harness needs of a model; a user's factory returns one (docs/own-model.md).

    - ``forward_one(params, x)``: x of shape (in_features,) -> (out_features,); pure.
    - ``init(key)``: params pytree from a typed PRNG key, each subkey used once.
    - ``forward_batch(params, X)``: the hand-batched form, X (batch, in_features) with
      the batch on axis 0 -> (batch, out_features); None when the model has none (the
      ``direct`` path is then reported as not provided, never faked).
    - ``trainable``: False keeps ``init``'s params (e.g. the seed's fixed toy model).
    - ``output_names`` / ``description``: the meaning of the outputs, for the contract.
    - ``activations_one(params, x)`` (optional): ``[(layer name, activation (units,)),
      ...]`` for one vector, in computation order, the last being ``forward_one``'s
      output; ``activations_batch(params, X)``: the same names for the hand-batched form,
      each ``(batch, units)``. A layer named like a params subtree (``layers[1]`` for
      ``layers[1].W`` and ``layers[1].b``) lets the diagnosis name the leaves that feed it.
      :func:`recorded` builds both from a forward written with a ``tap``. None: the
      diagnosis compares outputs only and says so.
    - ``preprocessing``: names of the leading activations that are input preprocessing
      (e.g. a standardization), judged in the diagnosis's data & preprocessing stage.
    - ``inputs``: the input contract when one example is a dict of leaves (an image, token
      ids and a mask, ...: :class:`vmapcheck.core.contract.InputSpec`); then ``x`` above
      is that dict, a batch the same dict with a leading batch axis 0 on every leaf, and
      ``in_features`` the number of table columns the leaves take together. None: the
      flat-vector contract ``(in_features,)``.
    - ``stochastic``: True for a forward that samples (MC dropout, noise): then
      ``forward_one(params, x, key)`` takes one typed PRNG key (``jax.random.key``, a
      scalar key array) for its example, ``forward_batch(params, X, keys)`` takes
      ``keys`` of shape ``(batch,)``, row ``i``'s key at ``keys[i]`` (the very key the
      loop gives row ``i``), and the activations take the key the same way. The harness
      draws ``keys = jax.random.split(base, rows)`` from the run's key stream and every
      path gives row ``i`` ``keys[i]`` (:mod:`vmapcheck.core.forms`).
    - ``state_leaves``: the params leaves that are the model's state, not weights
      (BatchNorm running statistics, int32 counters, RNG state), each entry a leaf path
      as the params file names it (``bn1.mean``) or a subtree's path covering every leaf
      under it (``state``). They stay in the params (the forward reads them; the params
      file, contract, reference and registry keep them) and training leaves them
      bit-identical. Every other leaf is trained and must be float
      (:func:`vmapcheck.core.state.partition` refuses one that is not, naming it).
    - ``partitioning(params)`` (optional): how the tensor-parallel paths split the params
      over the mesh axis ``"model"``: a pytree shaped like ``params`` with a
      ``jax.sharding.PartitionSpec`` per leaf (``P(None, "model")``: a dense kernel
      ``(in, out)`` split on its output axis; ``P()``: replicated). None: the default
      rule (:func:`vmapcheck.core.mesh.default_partitioning`). docs/mesh.md.
    """

    name: str
    in_features: int
    out_features: int
    forward_one: ForwardOne
    init: Callable[[jax.Array], Params]
    forward_batch: ForwardBatch | None = None
    trainable: bool = True
    output_names: tuple[str, ...] = ()
    description: str = ""
    activations_one: ActivationsFn | None = None
    activations_batch: ActivationsFn | None = None
    preprocessing: tuple[str, ...] = ()
    inputs: InputSpec | None = None
    state_leaves: tuple[str, ...] = ()
    stochastic: bool = False
    partitioning: Callable[[Params], Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stochastic, bool):
            raise ConfigError(
                f"model {self.name!r}: stochastic: expected True or False, found "
                f"{type(self.stochastic).__name__}"
            )
        _check_key_arguments(self)
        entries = self.state_leaves
        if isinstance(entries, str) or not all(
            isinstance(entry, str) and entry for entry in entries
        ):
            raise ConfigError(
                f"model {self.name!r}: state_leaves: expected a tuple of leaf paths such as "
                f"('bn1.mean', 'state'), found {entries!r}"
            )
        # A list (from a config) is kept as the tuple a frozen Model hashes.
        object.__setattr__(self, "state_leaves", tuple(entries))

    @property
    def contract(self) -> InputSpec:
        """The input contract: ``inputs``, else one float leaf ``(in_features,)``."""
        return self.inputs if self.inputs is not None else InputSpec.vector(self.in_features)

    def outputs(self) -> tuple[str, ...]:
        """Output names: as declared, else y0, y1, ..."""
        return self.output_names or tuple(f"y{i}" for i in range(self.out_features))


def _takes(fn: Callable[..., Any], count: int) -> bool | None:
    """Whether ``fn`` can be called with ``count`` positional arguments; None when its
    signature cannot be read (a builtin, some C extensions): then it is not judged."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _check_key_arguments(model: Model) -> None:
    """A stochastic model's forwards take ``(params, x, key)``; a deterministic model's
    take ``(params, x)``: the mismatch is refused here, naming the function and the fix,
    rather than as a TypeError deep inside a trace."""
    forwards = {
        "forward_one": model.forward_one,
        "forward_batch": model.forward_batch,
        "activations_one": model.activations_one,
        "activations_batch": model.activations_batch,
    }
    for name, fn in forwards.items():
        if fn is None:
            continue
        if model.stochastic and _takes(fn, 3) is False:
            arguments = "(params, X, keys)" if name.endswith("batch") else "(params, x, key)"
            raise ConfigError(
                f"model {model.name!r} is stochastic=True, so {name} must take {arguments}: "
                f"one typed PRNG key per example (keys of shape (batch,) for a batch); "
                f"{getattr(fn, '__name__', name)} takes no key argument"
            )
        if not model.stochastic and _takes(fn, 2) is False and _takes(fn, 3):
            raise ConfigError(
                f"model {model.name!r}: {name} takes a third argument (a key?) but the model "
                "is not stochastic: a forward that samples is declared Model(..., "
                "stochastic=True) (docs/own-model.md, 'A forward that samples')"
            )


# --- toy: the seed guide's model ---------------------------------------------------------


def toy_params() -> Params:
    """W = arange(6).reshape(3, 2) / 10, b = [0.1, -0.2] (float32), exactly as the seed."""
    return {
        "W": jnp.arange(6, dtype=jnp.float32).reshape(3, 2) / 10,
        "b": jnp.array([0.1, -0.2], dtype=jnp.float32),
    }


def toy_forward_one(params: Params, x: jax.Array, tap: Tap = no_tap) -> jax.Array:
    """relu(x @ W + b) for one feature vector x of shape (3,); returns shape (2,).

    One layer: its output is the only activation (``tap`` has nothing to report).
    """
    return jax.nn.relu(x @ params["W"] + params["b"])


def toy_forward_batch(params: Params, batch: jax.Array, tap: Tap = no_tap) -> jax.Array:
    """relu(batch @ W + b) for batch of shape (n, 3) (batch axis 0); returns (n, 2)."""
    return jax.nn.relu(batch @ params["W"] + params["b"][None, :])


# The toy's one layer reads the root leaves W and b.
TOY_LAYER = "dense"


# --- mlp -------------------------------------------------------------------------------


def mlp_init(key: jax.Array, widths: list[int]) -> Params:
    """He-normal weights and zero biases for consecutive ``widths`` (in, hidden..., out).

    One subkey per layer, split from ``key``, each used once.
    """
    layer_keys = jax.random.split(key, len(widths) - 1)
    layers = []
    for layer_key, fan_in, fan_out in zip(layer_keys, widths[:-1], widths[1:], strict=True):
        scale = jnp.sqrt(2.0 / fan_in).astype(jnp.float32)
        weight = jax.random.normal(layer_key, (fan_in, fan_out), dtype=jnp.float32) * scale
        layers.append({"W": weight, "b": jnp.zeros((fan_out,), dtype=jnp.float32)})
    return {"layers": layers}


def mlp_forward_one(params: Params, x: jax.Array, tap: Tap = no_tap) -> jax.Array:
    """Hidden layers relu(h @ W + b), linear output; x: (in_features,) -> (out_features,).

    ``tap`` sees each hidden layer's output as ``layers[i]`` (the name of its params).
    """
    hidden = x
    *inner, last = params["layers"]
    for i, layer in enumerate(inner):
        hidden = tap(f"layers[{i}]", jax.nn.relu(hidden @ layer["W"] + layer["b"]))
    return hidden @ last["W"] + last["b"]


def mlp_forward_batch(params: Params, batch: jax.Array, tap: Tap = no_tap) -> jax.Array:
    """The same network written for a batch: (n, in_features) -> (n, out_features), axis 0."""
    hidden = batch
    *inner, last = params["layers"]
    for i, layer in enumerate(inner):
        hidden = tap(f"layers[{i}]", jax.nn.relu(hidden @ layer["W"] + layer["b"][None, :]))
    return hidden @ last["W"] + last["b"][None, :]


def mlp_output_layer(widths: list[int]) -> str:
    """The name of the output layer of an MLP of ``widths``: ``layers[len(widths) - 2]``."""
    return f"layers[{len(widths) - 2}]"


def _leaves_line(leaves: list[InputLeafRecord]) -> str:
    return "; ".join(
        f"{leaf['leaf']} {tuple(leaf['shape'])} {leaf['dtype']}"
        + (f" [0, {leaf['range'][1]}]" if "range" in leaf else "")
        for leaf in leaves
    )


def _from_factory(config: ModelConfig) -> Model:
    from hydra.utils import instantiate

    assert config.factory is not None  # chosen for a config that names its factory
    target = config.factory["_target_"]
    try:
        model = instantiate(config.factory, _convert_="all")
    except Exception as exc:  # Hydra wraps import and call errors alike
        raise ConfigError(
            f"model.factory._target_={target!r} could not be instantiated: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    except SystemExit as exc:  # Hydra passes it on: the factory (or its module) exited
        raise ConfigError(
            f"model.factory._target_={target!r} called sys.exit({exc.code!r}) instead of "
            "returning a Model: nothing was built; a factory must return a Model or raise"
        ) from None
    if not isinstance(model, Model):
        raise ConfigError(
            f"model.factory._target_={target!r} returned {type(model).__name__}, "
            "expected a vmapcheck.core.models.Model"
        )
    for key in ("in_features", "out_features"):
        if getattr(model, key) != getattr(config, key):
            raise ConfigError(
                f"model.{key}={getattr(config, key)} but {target} built a model with "
                f"{key}={getattr(model, key)}"
            )
    declared = InputSpec.from_config(config)
    if _leaves_line(model.contract.describe()) != _leaves_line(declared.describe()):
        raise ConfigError(
            f"model.inputs declares {_leaves_line(declared.describe())} but {target} built "
            f"a model taking {_leaves_line(model.contract.describe())}"
        )
    if not declared.flat:
        # The config's contract is the one recorded: its leaves' meanings are the user's.
        model = replace(model, inputs=declared)
    return replace(model, name=config.name)


def build_model(config: ModelConfig) -> Model:
    """The model named by ``config`` (already validated): built in, or a user's factory.

    Raises:
        ConfigError: the factory cannot be imported or called, returns something else than
            a Model, or a Model whose widths differ from the config's.
    """
    if config.factory is not None:
        return _from_factory(config)
    if config.name == "toy":
        return Model(
            name="toy",
            in_features=3,
            out_features=2,
            forward_one=toy_forward_one,
            forward_batch=toy_forward_batch,
            init=lambda key: toy_params(),
            trainable=False,
            description="the seed guide's model: relu(x @ W + b), fixed params",
            activations_one=recorded(toy_forward_one, TOY_LAYER),
            activations_batch=recorded(toy_forward_batch, TOY_LAYER),
        )
    assert config.hidden is not None  # ModelConfig requires it of mlp
    widths = [config.in_features, *config.hidden, config.out_features]
    return Model(
        name="mlp",
        in_features=config.in_features,
        out_features=config.out_features,
        forward_one=mlp_forward_one,
        forward_batch=mlp_forward_batch,
        init=lambda key: mlp_init(key, widths),
        description=f"MLP {widths}: relu hidden layers, linear output (regression)",
        activations_one=recorded(mlp_forward_one, mlp_output_layer(widths)),
        activations_batch=recorded(mlp_forward_batch, mlp_output_layer(widths)),
    )
