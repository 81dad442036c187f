"""The mesh paths with partitioned params: tensor parallelism, alone and with data parallelism.

``sharded_jit`` (:class:`vmapcheck.core.forms.ShardedForward`) splits the batch over a 1-D
mesh and replicates the params. The two paths here split the *params* over a mesh axis
named ``"model"``, so each device holds a slice of a weight and JAX's SPMD partitioner
(``jax.jit`` with ``in_shardings``/``out_shardings``) inserts the collectives that put the
slices' partial results together. That changes the order of the sums a row's output is
made of, the way a batch size does:

- ``tensor_parallel_jit``: a 1-D mesh ``("model",)`` over the devices; params split by
  the model's partitioning (:func:`partition_specs`), the batch replicated on every
  device (every device sees every row, and holds its slice of each weight);
- ``data_model_jit``: a 2-D mesh ``("data", "model")``; params split over ``"model"``
  and replicated over ``"data"``, the batch axis 0 split over ``"data"`` (padded to a
  multiple of its size like ``sharded_jit``).

Neither is vmap, though both run ``jax.vmap(forward_one, in_axes=(None, 0))``: vmap
vectorizes over rows on one device; these distribute the same program over devices.

The program is traced with the path's mesh as JAX's context mesh (``jax.set_mesh``), so
a model whose forward is written per shard (``jax.shard_map`` with ``mesh=None``, its
collectives named after the axis ``"model"``) runs its sharded body on these paths and
its one-device body elsewhere (``jax.sharding.get_abstract_mesh()`` is empty there).

How the params are split: ``Model.partitioning(params)`` when the model declares it (a
pytree of ``PartitionSpec`` shaped like the params, naming only the axis ``"model"``),
else :func:`default_partitioning`. With one device (a single TPU chip, a plain CPU) the
paths run on a mesh of one: nothing is split, and :meth:`MeshForward.describe` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vmapcheck.core import contract, distributed
from vmapcheck.core.forms import DATA_AXIS
from vmapcheck.core.models import Model, Params
from vmapcheck.core.record import MeshRecord
from vmapcheck.core.runtime import check_device_count
from vmapcheck.core.state import leaf_name
from vmapcheck.errors import ConfigError

# The mesh axis params are split along (tensor parallelism); a model's partitioning and
# the collectives of a forward written per shard name it.
MODEL_AXIS = "model"
# The config key that sets the 2-D path's "model" axis (vmapcheck.config.run.BackendConfig).
MODEL_AXIS_KEY = "backend.model_axis"


def smallest_factor(n: int) -> int:
    """The smallest prime factor of ``n`` (``n`` itself when prime; 1 for 1)."""
    for f in range(2, int(n**0.5) + 1):
        if n % f == 0:
            return f
    return n


def grid_shape(devices: int, model_axis: int | None) -> tuple[int, int]:
    """``(data, model)``: the 2-D mesh of ``devices``. ``model_axis`` None: ``data`` is
    the smallest prime factor of ``devices`` and ``model`` the rest (8 -> 2 x 4, 2 -> 2 x
    1, 1 -> 1 x 1), so a mesh of several devices splits the params wherever it can.

    Raises:
        ConfigError: ``model_axis`` does not divide ``devices``, naming
            backend.model_axis, the divisors it may take and the value found.
    """
    if model_axis is None:
        data = smallest_factor(devices)
        return data, devices // data
    if devices % model_axis:
        divisors = [d for d in range(1, devices + 1) if devices % d == 0]
        raise ConfigError(
            f"{MODEL_AXIS_KEY}={model_axis}: expected a divisor of the mesh's {devices} "
            f"device(s) ({', '.join(map(str, divisors))}), so that the 2-D mesh is data x "
            f"model = {devices} devices; found {model_axis}, which leaves "
            f"{devices} / {model_axis} devices on the data axis"
        )
    return devices // model_axis, model_axis


def run_mesh(num_devices: int | None, model_axis: int | None) -> Mesh:
    """The run's mesh: a 2-D ``("data", "model")`` mesh of the first ``num_devices``
    devices (None: all present), shaped by :func:`grid_shape`. Every mesh path views its
    devices in its own shape (:func:`view`): ``sharded_jit`` all of them on ``"data"``,
    ``tensor_parallel_jit`` all of them on ``"model"``, ``data_model_jit`` this grid.

    Raises:
        BackendUnavailableError: more devices asked for than are present.
        ConfigError: ``model_axis`` does not divide the device count (:func:`grid_shape`).
    """
    devices = jax.devices()
    n = check_device_count(num_devices, devices)
    shape = grid_shape(n, model_axis)
    return Mesh(
        np.asarray(devices[:n]).reshape(shape),
        (DATA_AXIS, MODEL_AXIS),
        axis_types=(AxisType.Auto, AxisType.Auto),
    )


def view(mesh: Mesh, axes: tuple[str, ...]) -> Mesh:
    """``mesh``'s devices (row-major) as a mesh with ``axes``: one axis takes them all;
    ``("data", "model")`` is ``mesh`` itself when it has those axes, else the default
    :func:`grid_shape` of its device count. Axis types Auto, as
    :func:`vmapcheck.core.forms.data_mesh` says why."""
    if tuple(mesh.axis_names) == axes:
        return mesh
    devices = np.asarray(mesh.devices).reshape(-1)
    shape = (devices.size,) if len(axes) == 1 else grid_shape(devices.size, None)
    return Mesh(devices.reshape(shape), axes, axis_types=(AxisType.Auto,) * len(axes))


def default_partitioning(params: Params, size: int) -> Any:
    """The partitioning of a model that declares none: a weight of rank 2 or more (a
    dense kernel ``(in, out)``, a conv kernel ``(kh, kw, in, out)``, an embedding table
    ``(vocab, features)``) whose last (output) axis is a multiple of ``size`` is split on
    that axis over ``"model"``; every other leaf (biases, norms' scales, a kernel whose
    output axis ``size`` does not divide) is replicated. Megatron's column-parallel
    layer, everywhere it fits: the next layer then contracts over a split axis, and the
    partitioner inserts the all-reduce or all-gather that needs."""

    def spec(leaf: Any) -> P:
        shape = np.shape(leaf)
        if len(shape) >= 2 and shape[-1] % size == 0:
            return P(*([None] * (len(shape) - 1)), MODEL_AXIS)
        return P()

    return jax.tree_util.tree_map(spec, params)


def partition_specs(model: Model, params: Params, size: int) -> Any:
    """Each params leaf's ``PartitionSpec`` on a ``"model"`` axis of ``size`` devices:
    ``model.partitioning(params)`` when declared, else :func:`default_partitioning`.

    Raises:
        ConfigError: the declared tree does not match the params, a leaf's entry is no
            ``PartitionSpec``, names an axis other than ``"model"`` (params are never
            split over the batch axis ``"data"``), has more entries than the leaf has
            axes, or splits an axis ``size`` does not divide; the message names the
            model, the leaf, what was expected and what was found.
    """
    if model.partitioning is None:
        return default_partitioning(params, size)
    declared = model.partitioning(params)
    where = f"model {model.name!r}: partitioning"
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    specs, found = jax.tree_util.tree_flatten(declared, is_leaf=lambda n: isinstance(n, P))
    if cast(Any, found) != treedef:  # PyTreeDef compares by structure (no stub for it)
        raise ConfigError(
            f"{where}: expected a pytree of PartitionSpec shaped like the params "
            f"({len(leaves)} leaves, {treedef}); found {found}"
        )
    for (path, leaf), spec in zip(leaves, specs, strict=True):
        name = leaf_name(path)
        if not isinstance(spec, P):
            raise ConfigError(
                f"{where}: leaf {name}: expected a jax.sharding.PartitionSpec, found "
                f"{type(spec).__name__}"
            )
        shape = np.shape(leaf)
        if len(spec) > len(shape):
            raise ConfigError(
                f"{where}: leaf {name}: expected at most {len(shape)} entries (its shape is "
                f"{shape}), found {spec}"
            )
        for axis, entry in enumerate(spec):
            names = entry if isinstance(entry, tuple) else (entry,)
            if any(n not in (None, MODEL_AXIS) for n in names):
                raise ConfigError(
                    f"{where}: leaf {name}: expected entries None or {MODEL_AXIS!r} (params "
                    f"are split over the model axis only), found {spec}"
                )
            if MODEL_AXIS in names and shape[axis] % size:
                raise ConfigError(
                    f"{where}: leaf {name}: {spec} splits axis {axis} of size {shape[axis]} "
                    f"over {size} devices on mesh axis {MODEL_AXIS!r}: expected a multiple "
                    f"of {size}"
                )
    return jax.tree_util.tree_unflatten(treedef, specs)


@dataclass(frozen=True)
class InMesh:
    """A jitted function traced and run with ``mesh`` as JAX's context mesh
    (``jax.set_mesh``), so a ``jax.shard_map`` in the model's forward finds it; ``lower``
    too, so the bench's compiled cost is that of the program that runs."""

    jitted: Any
    mesh: Mesh

    def __call__(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh):
            return self.jitted(*args)

    def lower(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh):
            return self.jitted.lower(*args)


@dataclass(frozen=True)
class Program:
    """:class:`MeshForward`'s program as ``jax.jit`` gives one: ``program(params, x)``
    runs it, ``program.lower(params, x)`` lowers it (params and batch placed), each with
    the program for the params' structure."""

    forward: MeshForward

    def __call__(self, params: Params, x: Any) -> jax.Array:
        return self.forward._program(params)[1](params, x)

    def lower(self, params: Params, x: Any) -> Any:
        return self.forward._program(params)[1].lower(params, x)


class MeshForward:
    """``jax.jit(jax.vmap(forward_one, in_axes=(None, 0)))`` with the params split over
    the mesh axis ``"model"`` (tensor parallelism, not vmap), and with ``split_batch``
    the batch axis 0 split over ``"data"`` too.

    Shapes: ``x`` (batch, *example) -> (batch, out_features). ``mesh``: a 1-D
    ``("model",)`` mesh (``split_batch`` False: the batch is replicated, every device
    computes every row with its slice of the weights) or a 2-D ``("data", "model")`` one.
    A batch is padded to a multiple of the ``"data"`` axis (its last row repeated, like
    ``sharded_jit``), and the padded rows are sliced off the output.
    """

    def __init__(self, model: Model, mesh: Mesh, name: str, split_batch: bool):
        self.model = model
        self.name = name
        self.mesh = mesh
        self.split_batch = split_batch
        self.devices = int(mesh.size)
        self.model_size = int(mesh.shape[MODEL_AXIS])
        self.data_size = int(mesh.shape[DATA_AXIS]) if split_batch else 1
        batch_spec = P(DATA_AXIS) if split_batch else P()
        self.batch_sharding = NamedSharding(mesh, batch_spec)
        self._forward = jax.vmap(model.forward_one, in_axes=(None, 0))
        # One jitted program per params structure (the shardings are a pytree like it).
        self._programs: dict[Any, tuple[Any, InMesh]] = {}

    def _program(self, params: Params) -> tuple[Any, InMesh]:
        treedef = jax.tree_util.tree_structure(params)
        if treedef not in self._programs:
            specs = partition_specs(self.model, params, self.model_size)
            shardings = jax.tree_util.tree_map(
                lambda spec: NamedSharding(self.mesh, spec),
                specs,
                is_leaf=lambda node: isinstance(node, P),
            )
            jitted = jax.jit(
                self._forward,
                in_shardings=(shardings, self.batch_sharding),
                out_shardings=self.batch_sharding,
            )
            self._programs[treedef] = (shardings, InMesh(jitted, self.mesh))
        return self._programs[treedef]

    def padded_rows(self, rows: int) -> int:
        """``rows`` rounded up to a multiple of the ``"data"`` axis (1: no padding)."""
        return -(-rows // self.data_size) * self.data_size

    def place_params(self, params: Params) -> Params:
        """Each params leaf split over ``"model"`` by its spec (:func:`partition_specs`);
        in a group of processes, each places its own devices' shards
        (vmapcheck.core.distributed)."""
        shardings = self._program(params)[0]
        return jax.tree_util.tree_map(distributed.put, params, shardings)

    def place_batch(self, x: Any) -> Any:
        """``x`` padded to :meth:`padded_rows` rows and put on the mesh (split over
        ``"data"``, or replicated)."""
        x = contract.pad_rows(x, self.padded_rows(contract.rows(x)))
        return distributed.put(x, self.batch_sharding)

    def finish(self, out: jax.Array, rows: int) -> Any:
        """The output's first ``rows`` rows (the padding dropped), whole on this process
        (gathered from every process when the mesh spans several)."""
        return distributed.whole_rows(out, rows)

    @property
    def jitted(self) -> Program:
        """The compiled program on placed params and batch, callable and lowerable like
        a ``jax.jit`` function (what the bench times and costs)."""
        return Program(self)

    def describe(self) -> MeshRecord:
        """What the path ran on, for forward, check and bench records: its parallelism
        (tensor-parallel, not vmap), the mesh's shape by axis, and, on a mesh of one
        device on the model axis, that nothing is split."""
        devices = list(self.mesh.devices.flat)
        shape = {axis: int(size) for axis, size in self.mesh.shape.items()}
        split = " and the batch axis 0 over mesh axis 'data'" if self.split_batch else ""
        about: MeshRecord = {
            "path": self.name,
            "form": "jax.jit(jax.vmap(forward_one, in_axes=(None, 0))): params split over "
            f"mesh axis {MODEL_AXIS!r} ({self.partitioning_source()}){split}"
            + (
                " (data and tensor parallelism"
                if self.split_batch
                else ", the batch replicated (tensor parallelism"
            )
            + ", not vmap)",
            "parallelism": "data- and tensor-parallel" if self.split_batch else "tensor-parallel",
            "devices": self.devices,
            "mesh_shape": shape,
            "device_ids": [int(d.id) for d in devices],
            "platform": devices[0].platform,
            "device_kind": devices[0].device_kind,
            "padding": f"a batch is padded to a multiple of {self.data_size} rows by "
            "repeating its last row; the padded rows are sliced off the output"
            if self.split_batch
            else "none: every device computes every row",
        }
        if self.model_size == 1:
            about["note"] = (
                f"a mesh of 1 device on axis {MODEL_AXIS!r}: no param is split, so this path "
                "tests no tensor-parallel arithmetic here; run on more devices (an emulated "
                "CPU mesh: backend.num_devices) to split them"
            )
        return about

    def partitioning_source(self) -> str:
        """Where the params' specs come from, in words."""
        if self.model.partitioning is not None:
            return "the model's declared partitioning"
        return "the default rule: a weight's last axis when the axis size divides it"
