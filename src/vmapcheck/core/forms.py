"""The forms a batch is computed in, and the input validation every path shares.

Every batched form maps a batch ``X`` (the model's input contract with a leading batch
axis 0 on every leaf: ``(batch, in_features)`` for a flat-vector model, a dict of
leaves otherwise; :mod:`vmapcheck.core.contract`) to ``(batch, out_features)``:

- ``loop``: a Python loop of ``forward_one`` over rows, stacked (the per-example oracle);
- ``map``: the same loop as ``jax.lax.map`` (compiled once, a scan over the rows);
- ``chunked``: ``jax.lax.map`` with ``batch_size``: the rows in chunks, each chunk under
  vmap inside the compiled loop, the rows left over vmapped after it;
- ``vmap``: ``jax.vmap(forward_one, in_axes=(None, 0))`` — params shared (None), rows
  mapped over axis 0;
- ``direct``: the model's hand-batched ``forward_batch``.

Each comes eager and under ``jax.jit``: the paths themselves are the entries of
:data:`vmapcheck.core.paths.PATHS`, built from the functions here. One more path is
data parallelism, a different thing from vmap: ``sharded_jit``
(:class:`ShardedForward`) splits the batch axis 0 over the devices of a 1-D mesh and
runs ``jit(vmap(forward_one))`` on each shard. vmap vectorizes on one device; it does
not distribute.

Inputs are validated once, before dispatch, by :func:`validate_batch`, so an invalid
batch is refused identically by every path. vmap maps every input leaf over axis 0.

A forward that samples (``Model.stochastic``: ``forward_one(params, x, key)``) is run by
every form above through :func:`keyed_model`: a deterministic model over :class:`Keyed`
inputs, where each row's typed PRNG key is one more batched leaf. So the loop, lax.map,
scan, vmap, the mesh's shards, a permutation and a split all carry row ``i``'s key with
row ``i`` with no code of their own; :func:`with_keys` gives a batch its keys, row ``i``
``jax.random.split(base, rows)[i]`` (a prefix of the rows gets the same keys as the whole
batch: ``split`` is prefix-stable under the partitionable threefry JAX uses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vmapcheck.core import contract, distributed
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.record import MeshRecord
from vmapcheck.core.runtime import check_device_count
from vmapcheck.core.state import leaf_name
from vmapcheck.errors import InvalidInputError

Path = Callable[[Params, Any], jax.Array]


# --- a forward that samples: each row's key travels as one more batched leaf -------------

# The name of the key stream's entry that the forwards of a run draw their row keys from
# (vmapcheck.core.keys.KEY_NAMES).
FORWARD_KEYS = "forward"


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Keyed:
    """A stochastic model's input: ``x`` (the model's input contract, a batch with the
    batch on axis 0 of every leaf, or one example) and ``keys``, typed PRNG keys:
    ``(batch,)`` for a batch, row ``i``'s key at ``keys[i]``; a scalar key for one
    example. A pytree of both, so every form maps, slices, permutes and pads the keys
    with their rows."""

    x: Any
    keys: jax.Array


def forward_keys(seed: int) -> jax.Array:
    """The base key the forwards of a run split their row keys from: the ``forward``
    entry of the run's named key stream (:func:`vmapcheck.core.keys.named_keys`)."""
    return named_keys(seed)[FORWARD_KEYS]


def row_keys(base: jax.Array, rows: int) -> jax.Array:
    """``jax.random.split(base, rows)``: ``(rows,)`` typed keys, row ``i`` gets ``[i]``."""
    return jax.random.split(base, rows)


def with_keys(model: Model, x: Any, base: jax.Array, *, example: bool = False) -> Any:
    """``x`` as ``model``'s forms take it: unchanged for a deterministic model or an
    input already :class:`Keyed`; else ``Keyed(x, row_keys(base, rows))`` for a batch
    (batch axis 0), ``Keyed(x, row_keys(base, 1)[0])`` for one unbatched ``example`` (the
    key row 0 of any batch gets)."""
    if not model.stochastic or isinstance(x, Keyed):
        return x
    if example:
        return Keyed(x, row_keys(base, 1)[0])
    return Keyed(x, row_keys(base, contract.rows(x)))


def unkeyed(x: Any) -> Any:
    """The model's own input of ``x``: ``x.x`` of a :class:`Keyed`, else ``x``."""
    return x.x if isinstance(x, Keyed) else x


def keyed_model(model: Model) -> Model:
    """``model`` itself when deterministic; for a stochastic one, the deterministic model
    every form runs: ``forward_one(params, Keyed(x, key))`` is the user's
    ``forward_one(params, x, key)``, ``forward_batch(params, Keyed(X, keys))`` the user's
    ``forward_batch(params, X, keys)`` (``keys`` ``(batch,)``), and the activations alike.
    Shapes are the user's; only the key rides along with its row."""
    if not model.stochastic:
        return model

    def one(fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        if fn is None:
            return None
        return lambda params, kx: fn(params, kx.x, kx.keys)

    # The user's forward_one(params, x, key): ForwardOne's two arguments do not say it.
    user_one: Callable[..., jax.Array] = model.forward_one

    def forward_one(params: Params, kx: Any) -> jax.Array:  # kx: a Keyed example
        return user_one(params, kx.x, kx.keys)

    return replace(
        model,
        stochastic=False,
        forward_one=forward_one,
        forward_batch=one(model.forward_batch),
        activations_one=one(model.activations_one),
        activations_batch=one(model.activations_batch),
    )


def _keys_allowed(model: Model) -> None:
    """Refuse keys given to a model that does not sample (its forwards take none)."""
    if not model.stochastic:
        raise InvalidInputError(
            f"keys: model {model.name!r} is not stochastic (Model.stochastic=False): its "
            "forwards take no key; pass the batch alone",
            reason="keys",
        )


def _validate_keys(keys: Any, rows: int | None) -> None:
    """Refuse keys that are not typed PRNG keys of shape ``(rows,)`` (a scalar key for
    one example, ``rows`` None), naming what was found."""
    expected = "()" if rows is None else f"({rows},)"
    if not isinstance(keys, jax.Array) or not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        found = getattr(keys, "dtype", type(keys).__name__)
        raise InvalidInputError(
            f"keys: expected typed PRNG keys (jax.random.key / jax.random.split) of shape "
            f"{expected}, one per row; got {found}",
            reason="keys",
        )
    shape = tuple(keys.shape)
    if shape != (() if rows is None else (rows,)):
        raise InvalidInputError(
            f"keys: expected shape {expected}, one key per row of the batch; got {shape}",
            reason="keys",
        )


def validate_batch(x: Any, model: Model, dtype: Any) -> None:
    """Refuse anything but a batch of ``model``'s input contract (every leaf with a leading
    batch axis 0 of the same size >= 1, its shape, its dtype, finite floats, ids in range).

    This is the one place every batched path validates its input
    (:meth:`vmapcheck.core.contract.InputSpec.validate_batch`). A :class:`Keyed` batch's
    ``x`` is validated so, and its keys must be ``(batch,)`` typed PRNG keys.

    Raises:
        InvalidInputError: naming the leaf and the problem, e.g. "expected 3 features,
            got 4" (a flat vector) or "leaf 'tokens': expected dtype int32, got float32".
    """
    model.contract.validate_batch(unkeyed(x), dtype)
    if isinstance(x, Keyed):
        _keys_allowed(model)
        _validate_keys(x.keys, contract.rows(x.x))


def validate_vector(x: Any, model: Model, dtype: Any) -> None:
    """The same contract for one unbatched example (what ``forward_one`` takes)."""
    model.contract.validate_example(unkeyed(x), dtype)
    if isinstance(x, Keyed):
        _keys_allowed(model)
        _validate_keys(x.keys, None)


def batched_forward(model: Model, params: Params, in_axes: tuple[Any, Any] = (None, 0)) -> Path:
    """``jax.vmap(model.forward_one, in_axes)``, refusing params mapped without batch copies.

    The seed's first listed mistake is ``in_axes=(0, 0)`` for params that are shared by
    every row. JAX then slices the weights along their first axis as if each row had its
    own copy: it fails when that axis differs from the batch size, and silently computes
    something else when it happens to match. Mapping params is right only when every leaf
    carries a leading batch axis on top of the model's own (contract) shape.

    Raises:
        InvalidInputError: ``in_axes`` is not a pair (params axis, input axis), the input
            axis is no int axis of every input leaf batched, or params are mapped but a
            leaf has exactly its unbatched shape; the message names the leaf and the fix.
    """
    if not isinstance(in_axes, tuple | list) or len(in_axes) != 2:
        found = f"{type(in_axes).__name__} {in_axes!r}"[:120]
        raise InvalidInputError(
            "in_axes: expected a pair (params axis, input axis), one entry per argument of "
            f"forward_one(params, x), e.g. (None, 0) for params shared by every row; got "
            f"{found}",
            reason="in_axes",
        )
    params_axis, input_axis = in_axes
    # Every leaf of a batch has its example's rank plus the batch axis: the input axis
    # must be an axis of each (vmap would otherwise fail at the call, naming no argument).
    ranks = [len(leaf.shape) + 1 for leaf in model.contract.leaves]
    if (
        isinstance(input_axis, bool)
        or not isinstance(input_axis, int)
        or not all(-r <= input_axis < r for r in ranks)
    ):
        found = f"{type(input_axis).__name__} {input_axis!r}"[:120]
        raise InvalidInputError(
            f"in_axes[1]: expected the batch axis of the input, an int in "
            f"[-{min(ranks)}, {min(ranks) - 1}] (0: the batch on axis 0), got {found}",
            reason="in_axes",
        )
    if params_axis is not None and (
        isinstance(params_axis, bool) or not isinstance(params_axis, int)
    ):
        raise InvalidInputError(
            f"in_axes[0]: expected None (params shared by every row) or an int axis, got "
            f"{type(params_axis).__name__}",
            reason="in_axes",
        )
    if params_axis is not None:
        template = jax.eval_shape(model.init, jax.random.key(0))
        for (path, leaf), own in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree.leaves(template),
            strict=True,
        ):
            if tuple(np.shape(leaf)) == tuple(own.shape):
                raise InvalidInputError(
                    f"in_axes maps params over axis {params_axis}, but params have no batch "
                    f"copies: leaf {leaf_name(path)} has shape {tuple(own.shape)}, the model's "
                    "own shape, so vmap would slice the weights across the batch (or fail "
                    "on a size mismatch). Params shared by every row take in_axes=(None, 0)."
                )
    return jax.vmap(model.forward_one, in_axes=tuple(in_axes))


# The one axis of the data-parallel mesh: the batch axis 0 is split along it.
DATA_AXIS = "data"


def data_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh ``(num_devices,)`` named ``("data",)`` over the first devices present.

    ``num_devices`` None: every device. The axis type is ``Auto`` (jax 0.11's
    ``make_mesh`` defaults to ``Explicit``): the compiler propagates the batch sharding
    through whatever a user's ``forward_one`` does, where Explicit mode would make the
    sharding part of every intermediate's type and reject operations whose output
    sharding it cannot infer (and the uneven slice that drops the padding).

    Raises:
        BackendUnavailableError: more devices asked for than are present (names
            backend.num_devices, the number asked and the devices present).
    """
    devices = jax.devices()
    n = check_device_count(num_devices, devices)
    return jax.make_mesh((n,), (DATA_AXIS,), axis_types=(AxisType.Auto,), devices=devices[:n])


class ShardedForward:
    """The data-parallel path ``sharded_jit``; not vmap, though it contains it.

    What is sharded: ``jax.jit(jax.vmap(model.forward_one, in_axes=(None, 0)))``, the
    same function as the ``vmap_jit`` path (every model has ``forward_one``; the
    hand-batched ``forward_batch`` is optional), compiled with the batch axis 0 of ``x``
    split over the mesh axis "data" (``NamedSharding(mesh, P("data"))``) and params
    replicated on every device (``P()``). Each device computes its block of rows; the
    output stays split the same way. So sharded_jit against vmap_jit isolates
    distribution: same program, the batch spread over ``mesh.size`` devices.

    Shapes: ``x`` (batch, in_features) -> (batch, out_features). A batch whose size is
    not a multiple of the device count is padded to the next multiple by repeating its
    last row (a real, validated row, so the padding holds no value the input did not),
    run, and the padded rows sliced off the result. Rows are independent under vmap, so
    the padding cannot change the real rows' outputs. Eager it has no counterpart: a
    sharded computation is one compiled SPMD program.
    """

    def __init__(self, model: Model, mesh: Mesh, name: str):
        self.name = name
        self.mesh = mesh
        self.devices = int(mesh.size)
        self.batch_sharding = NamedSharding(mesh, P(DATA_AXIS))
        self.replicated = NamedSharding(mesh, P())
        self.jitted = jax.jit(
            jax.vmap(model.forward_one, in_axes=(None, 0)),
            in_shardings=(self.replicated, self.batch_sharding),
            out_shardings=self.batch_sharding,
        )

    def padded_rows(self, rows: int) -> int:
        """``rows`` rounded up to a multiple of the device count."""
        return -(-rows // self.devices) * self.devices

    def place_params(self, params: Params) -> Params:
        """Params copied to every device of the mesh (replicated); in a group of
        processes, each places its own devices' copies (vmapcheck.core.distributed)."""
        return distributed.put(params, self.replicated)

    def place_batch(self, x: Any) -> Any:
        """Every leaf of ``x`` padded to :meth:`padded_rows` rows (its last row repeated)
        and split over the mesh along axis 0."""
        x = contract.pad_rows(x, self.padded_rows(contract.rows(x)))
        return distributed.put(x, self.batch_sharding)

    def finish(self, out: jax.Array, rows: int) -> Any:
        """The output's first ``rows`` rows (the padding dropped), whole on this process
        (gathered from every process when the mesh spans several)."""
        return distributed.whole_rows(out, rows)

    def __call__(self, params: Params, x: Any) -> jax.Array:
        out = self.jitted(self.place_params(params), self.place_batch(x))
        return self.finish(out, contract.rows(x))

    def describe(self) -> MeshRecord:
        """What the sharded path ran on: recorded in forward, check and bench reports."""
        devices = list(self.mesh.devices.flat)
        return {
            "path": self.name,
            "form": "jax.jit(jax.vmap(forward_one, in_axes=(None, 0))): batch axis 0 split "
            f"over mesh axis {DATA_AXIS!r}, params replicated (data parallelism, not vmap)",
            "parallelism": "data-parallel",
            "devices": self.devices,
            "mesh_shape": {DATA_AXIS: self.devices},
            "device_ids": [int(d.id) for d in devices],
            "platform": devices[0].platform,
            "device_kind": devices[0].device_kind,
            "padding": f"a batch is padded to a multiple of {self.devices} rows by repeating "
            "its last row; the padded rows are sliced off the output",
        }


def cast_tree(tree: Any, dtype: Any) -> Any:
    """Cast every floating leaf of ``tree`` to ``dtype`` (params enter at the run's
    precision); other leaves (a model's int32 counters, bool flags) keep their dtype."""

    def cast(leaf: Any) -> jax.Array:
        found = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        if jnp.issubdtype(found, jnp.floating):
            return jnp.asarray(leaf, dtype=dtype)
        return jnp.asarray(leaf)

    return jax.tree_util.tree_map(cast, tree)


# --- the forms, untransformed ------------------------------------------------------------


def loop_forward(model: Model) -> Path:
    """``stack([forward_one(params, row) for row in X])``: the per-example oracle."""
    forward_one = model.forward_one

    def loop(params: Params, batch: Any) -> jax.Array:
        n = contract.rows(batch)
        return jnp.stack([forward_one(params, contract.take(batch, i)) for i in range(n)])

    return loop


def map_forward(model: Model) -> Path:
    """``lax.map(lambda row: forward_one(params, row), X)``: the per-row loop as one
    compiled loop (a scan over axis 0 of every leaf), what a user writes instead of a
    Python loop; it compiles once for any batch size, where the unrolled loop grows."""
    forward_one = model.forward_one

    def mapped(params: Params, batch: Any) -> jax.Array:
        return jax.lax.map(lambda row: forward_one(params, row), batch)

    return mapped


def chunked_forward(model: Model, batch_size: int) -> Path:
    """``lax.map(lambda row: forward_one(params, row), X, batch_size=batch_size)``: what a
    user writes to bound memory on a large batch. Rows go ``batch_size`` at a time through
    ``vmap(forward_one)`` inside a compiled loop, and the ``rows % batch_size`` left over
    through one more vmap after it, so a row is computed beside a few others, never
    beside the whole batch."""
    forward_one = model.forward_one

    def chunked(params: Params, batch: Any) -> jax.Array:
        return jax.lax.map(lambda row: forward_one(params, row), batch, batch_size=batch_size)

    return chunked


def scan_forward(model: Model) -> Path:
    """``lax.scan`` over axis 0 of every leaf, ``forward_one`` on each row, no carry:
    what a user writes to keep one row's activations in memory at a time (a streaming
    or recurrent-style loop); like ``lax.map``, it compiles once for any batch size."""
    forward_one = model.forward_one

    def scanned(params: Params, batch: Any) -> jax.Array:
        return jax.lax.scan(lambda carry, row: (carry, forward_one(params, row)), None, batch)[1]

    return scanned


def vmap_forward(model: Model) -> Path:
    """``vmap(forward_one, in_axes=(None, 0))``: params shared, rows mapped over axis 0."""
    return jax.vmap(model.forward_one, in_axes=(None, 0))


def vmap_of_jit_forward(model: Model) -> Path:
    """``vmap(jit(forward_one), in_axes=(None, 0))``: a common user pattern (a jitted
    per-example function, batched afterwards); vmap traces through the inner jit."""
    return jax.vmap(jax.jit(model.forward_one), in_axes=(None, 0))


def direct_forward(model: Model) -> Path | None:
    """The model's hand-batched ``forward_batch``; None when it has none (reported as
    not provided, never faked)."""
    return model.forward_batch


def one_forward(model: Model) -> Path:
    """``forward_one`` itself, on one unbatched example."""
    return model.forward_one


# --- the forms, as activations (what the diagnosis compares layer by layer) ---------------

# The activation name used when a model exposes no activations: the output alone.
OUTPUT = "output"


class Layers:
    """One form's activations as a list of arrays (what jit, vmap and eval_shape accept);
    the layer names are filled in whenever the function runs or is traced.

    ``Layers(fn)(params, X)`` -> ``[activation (rows, units), ...]``, batch axis 0, in
    the order ``fn`` returns them; ``names`` then holds their layer names.
    """

    def __init__(self, fn: Callable[[Params, jax.Array], list[tuple[str, jax.Array]]]):
        self.fn = fn
        self.names: list[str] = []

    def __call__(self, params: Params, x: jax.Array) -> list[jax.Array]:
        acts = self.fn(params, x)
        self.names = [name for name, _ in acts]
        return [value for _, value in acts]


def _named(one: Layers, arrays: list[jax.Array]) -> list[tuple[str, jax.Array]]:
    # After the call: running (or tracing) ``one`` is what fills in its names.
    return list(zip(one.names, arrays, strict=True))


def _per_row(model: Model) -> tuple[Layers, bool]:
    if model.activations_one is not None:
        return Layers(model.activations_one), True
    return Layers(lambda p, x: [(OUTPUT, model.forward_one(p, x))]), False


# (activations on a batch, whether they are per layer); None: the model lacks the form.
Activations = tuple[Layers, bool]


def loop_activations(model: Model) -> Activations:
    """Each row's activations (``activations_one``), stacked along axis 0."""
    one, per_layer = _per_row(model)

    def loop(params: Params, batch: Any) -> list[jax.Array]:
        n = contract.rows(batch)
        rows = [one(params, contract.take(batch, i)) for i in range(n)]
        return [jnp.stack(layer) for layer in zip(*rows, strict=True)]

    return Layers(lambda p, x: _named(one, loop(p, x))), per_layer


def map_activations(model: Model) -> Activations:
    """``activations_one`` row by row under ``lax.map`` (each layer stacked on axis 0)."""
    one, per_layer = _per_row(model)

    def mapped(params: Params, batch: Any) -> list[jax.Array]:
        return jax.lax.map(lambda row: one(params, row), batch)

    return Layers(lambda p, x: _named(one, mapped(p, x))), per_layer


def chunked_activations(model: Model, batch_size: int) -> Activations:
    """``activations_one`` under ``lax.map`` with ``batch_size`` (each layer stacked on
    axis 0)."""
    one, per_layer = _per_row(model)

    def chunked(params: Params, batch: Any) -> list[jax.Array]:
        return jax.lax.map(lambda row: one(params, row), batch, batch_size=batch_size)

    return Layers(lambda p, x: _named(one, chunked(p, x))), per_layer


def scan_activations(model: Model) -> Activations:
    """``activations_one`` row by row under ``lax.scan`` (each layer stacked on axis 0)."""
    one, per_layer = _per_row(model)

    def scanned(params: Params, batch: Any) -> list[jax.Array]:
        return jax.lax.scan(lambda carry, row: (carry, one(params, row)), None, batch)[1]

    return Layers(lambda p, x: _named(one, scanned(p, x))), per_layer


def vmap_activations(model: Model) -> Activations:
    """``activations_one`` under ``vmap(in_axes=(None, 0))``."""
    one, per_layer = _per_row(model)
    mapped = jax.vmap(one, in_axes=(None, 0))
    return Layers(lambda p, x: _named(one, mapped(p, x))), per_layer


def vmap_of_jit_activations(model: Model) -> Activations:
    """``jit(activations_one)`` under ``vmap(in_axes=(None, 0))``."""
    one, per_layer = _per_row(model)
    mapped = jax.vmap(jax.jit(one), in_axes=(None, 0))
    return Layers(lambda p, x: _named(one, mapped(p, x))), per_layer


def direct_activations(model: Model) -> Activations | None:
    """``activations_batch`` (else the hand-batched output alone); None without one."""
    if model.forward_batch is None:
        return None
    if model.activations_batch is not None:
        return Layers(model.activations_batch), True
    forward_batch = model.forward_batch
    return Layers(lambda p, x: [(OUTPUT, forward_batch(p, x))]), False
