"""A Keras 3 model (JAX backend) as a vmapcheck :class:`~vmapcheck.core.models.Model`:
``keras_model(model)`` for the Python API (docs/keras.md; needs ``pip install
'vmapcheck[keras]'``, or ``keras`` beside vmapcheck).

Keras 3 runs on JAX when ``KERAS_BACKEND=jax`` (set before keras is first imported; this
module sets it when unset and refuses any other backend). Its stateless API is what makes
a Keras model a pure function of its variables, the form vmapcheck checks::

    outputs, non_trainable = model.stateless_call(trainable, non_trainable, X, training=False)

The wrapper maps that onto vmapcheck's model:

- **params**: one pytree shared by every row, the model's variable values by their Keras
  path (``variable.path``)::

      {"trainable": {"dense/kernel": (4, 16), "dense/bias": (16,), ...},
       "non_trainable": {"batch_normalization/moving_mean": (16,), ...,
                         "seed_generator/seed_generator_state": (2,) uint32}}

  ``non_trainable`` (BatchNorm's moving statistics, a Dropout's seed state, uint32) is
  declared the model's state (``Model.state_leaves``, docs/state-leaves.md): kept, never
  differentiated. ``init`` returns the values the Keras model holds now (its trained
  weights), whatever the key: the check is of this model as it is (``trainable=False``).
- **forward_batch(params, X)**: ``X`` ``(batch, in_features)``, batch axis 0 ->
  ``(batch, out_features)``: one ``stateless_call`` on the whole batch (the ``direct``
  path). **forward_one(params, x)**: ``x`` ``(in_features,)`` -> ``(out_features,)``, the
  same call on a batch of one (Keras layers take a batch). The non-trainable values the
  call returns are discarded: at inference they are the ones it was given.
- **training**: passed to every call, ``False`` by default. ``True`` is the planted
  mistake docs/keras.md shows: BatchNormalization then normalizes with the statistics of
  the batch it is given (a batch of one in the loop) and Dropout draws, so a row's output
  depends on the batch around it, and the check fails on batching.
- **dtype**: Keras computes in its variables' dtype and casts the values it is given to
  it, so float64 params alone would still run in float32. vmapcheck runs the model in the
  precision's dtype and its float64 oracle in float64: for a dtype other than the model's
  own, the forward uses a clone of the model whose every layer has that dtype policy
  (``keras.models.clone_model``, built once per dtype). A subclassed model cannot be
  cloned that way (it has no layer graph): :func:`keras_model` refuses it, naming why.

Only a model with one flat input ``(batch, in_features)`` and one output ``(batch,
out_features)`` is wrapped; another shape is a :class:`~vmapcheck.errors.ConfigError`
naming what was found.
"""

from __future__ import annotations

import os

# Keras picks its backend once, at its first import: JAX unless the user chose another
# (which keras_model then refuses, naming it), before the import below.
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp
import keras

from vmapcheck.core.models import Model, Params
from vmapcheck.errors import ConfigError

# The params subtrees: Keras' trainable variables (weights) and non-trainable ones (state).
TRAINABLE, NON_TRAINABLE = "trainable", "non_trainable"


def _flat_width(shape: tuple[int | None, ...], what: str) -> int:
    """The feature count of a Keras ``(None, features)`` shape; else a ConfigError."""
    if len(shape) != 2 or shape[1] is None:
        raise ConfigError(
            f"keras model {what}: expected one flat tensor (batch, features), found shape "
            f"{shape}; docs/keras.md says how to wrap other inputs"
        )
    return int(shape[1])


def _by_path(variables: list[keras.Variable], what: str) -> dict[str, jax.Array]:
    """``{variable.path: value}``, in the model's order; two variables of one path are a
    ConfigError (the params would lose one)."""
    values: dict[str, jax.Array] = {}
    for variable in variables:
        if variable.path in values:
            raise ConfigError(
                f"keras model: two {what} variables share the path {variable.path!r}; "
                "expected each variable's path to be unique (give the layers distinct names)"
            )
        values[variable.path] = jnp.asarray(variable.value)
    return values


def _clone(model: keras.Model, dtype: str) -> keras.Model:
    """``model`` with every layer's dtype policy set to ``dtype``: the same architecture,
    its variables in ``dtype`` (their values unused: stateless_call is given them)."""

    def layer_in_dtype(layer: keras.layers.Layer) -> keras.layers.Layer:
        config = layer.get_config()
        config["dtype"] = dtype
        return type(layer).from_config(config)

    try:
        clone = keras.models.clone_model(model, clone_function=layer_in_dtype)
    except (TypeError, ValueError) as exc:  # a custom layer whose config does not round-trip
        raise ConfigError(
            f"keras model {model.name!r}: expected layers that keras.models.clone_model can "
            f"rebuild in {dtype} from their get_config() (the float64 oracle and the f64/bf16 "
            f"precisions run the model in their dtype), found: {exc}"
        ) from None
    # stateless_call takes the values by position: the clone's variables must line up
    # with the model's, one for one, shape for shape.
    for what in ("trainable_variables", "non_trainable_variables"):
        ours = [tuple(v.shape) for v in getattr(model, what)]
        theirs = [tuple(v.shape) for v in getattr(clone, what)]
        if ours != theirs:
            raise ConfigError(
                f"keras model {model.name!r} rebuilt in {dtype}: expected its {what} to "
                f"have the shapes {ours}, found {theirs}"
            )
    return clone


def keras_model(
    model: keras.Model,
    *,
    training: bool = False,
    output_names: list[str] | None = None,
    description: str | None = None,
) -> Model:
    """The built Keras 3 ``model`` (JAX backend) as a vmapcheck ``Model``: params
    ``{"trainable": {path: value}, "non_trainable": {path: value}}`` (the latter declared
    state), ``forward_batch(params, X (batch, in_features))`` -> ``(batch, out_features)``
    (batch axis 0) and ``forward_one(params, x (in_features,))`` -> ``(out_features,)``,
    both ``model.stateless_call(..., training=training)``.

    ``training``: Keras' training flag on every call; ``False`` for inference (``True``
    makes BatchNormalization and Dropout depend on the batch). ``output_names``: one per
    output (default ``y0``, ``y1``, ...).
    """
    if keras.backend.backend() != "jax":
        raise ConfigError(
            f"keras backend: expected 'jax', found {keras.backend.backend()!r}: set "
            "KERAS_BACKEND=jax before keras is first imported (docs/keras.md)"
        )
    if not isinstance(model, keras.Model):
        raise ConfigError(f"keras model: expected a keras.Model, found {type(model).__name__}")
    if not isinstance(training, bool):
        raise ConfigError(f"training: expected a bool, found {training!r}")
    if not model.built or getattr(model, "inputs", None) is None:
        # A subclassed model has no layer graph (no inputs), and clone_model, which the
        # other dtypes need, rebuilds a model from that graph.
        raise ConfigError(
            f"keras model {model.name!r}: expected a built Sequential or functional model "
            "(its inputs known: keras.Input(...) first), found "
            + ("one not built" if not model.built else f"a {type(model).__name__} without inputs")
            + " (a subclassed model is not supported: docs/keras.md)"
        )
    if len(model.inputs) != 1 or len(model.outputs or ()) != 1:
        raise ConfigError(
            f"keras model {model.name!r}: expected one input and one output, found "
            f"{len(model.inputs)} and {len(model.outputs or ())}"
        )
    in_features = _flat_width(tuple(model.inputs[0].shape), "input")
    out_features = _flat_width(tuple(model.outputs[0].shape), "output")
    names = tuple(output_names) if output_names else tuple(f"y{i}" for i in range(out_features))
    if len(names) != out_features:
        raise ConfigError(
            f"output_names: expected {out_features} (the model's outputs), found {len(names)}"
        )
    trainable = _by_path(model.trainable_variables, "trainable")
    non_trainable = _by_path(model.non_trainable_variables, "non-trainable")
    # One Keras model per float dtype, the model's own first; the clones are built eagerly
    # even when the first call comes inside a jit or vmap trace (their variables' values
    # would otherwise be tracers that leak).
    models = {str(jnp.dtype(model.variable_dtype)): model}

    def in_dtype(dtype: str) -> keras.Model:
        if dtype not in models:
            with (
                jax.ensure_compile_time_eval(),
                jax.numpy_rank_promotion("allow"),
                jax.numpy_dtype_promotion("standard"),
            ):
                models[dtype] = _clone(model, dtype)
        return models[dtype]

    def init(key: jax.Array) -> Params:
        """The Keras model's own values (its trained weights); ``key`` is unused."""
        del key
        return {TRAINABLE: dict(trainable), NON_TRAINABLE: dict(non_trainable)}

    def forward_batch(params: Params, batch: jax.Array) -> jax.Array:
        """batch: (batch, in_features), batch axis 0 -> (batch, out_features); the
        non-trainable values Keras returns are discarded."""
        keras_model_ = in_dtype(str(batch.dtype))
        # Keras' layers broadcast a bias (units,) against (batch, units) and mix Python
        # scalars into their math: JAX's default promotion, inside Keras only, whatever
        # strict settings the caller's suite runs under (this project's tests raise).
        with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
            outputs, _ = keras_model_.stateless_call(
                [params[TRAINABLE][path] for path in trainable],
                [params[NON_TRAINABLE][path] for path in non_trainable],
                batch,
                training=training,
            )
        return outputs

    def forward_one(params: Params, x: jax.Array) -> jax.Array:
        """x: (in_features,) -> (out_features,): Keras layers take a batch, so one row is
        a batch of one."""
        return forward_batch(params, x[None])[0]

    return Model(
        name=model.name,
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        trainable=False,
        output_names=names,
        description=description
        or (
            f"Keras 3 model {model.name!r} (JAX backend) through stateless_call, "
            f"training={training}: {in_features} features -> {out_features} outputs"
        ),
        state_leaves=(NON_TRAINABLE,) if non_trainable else (),
    )
