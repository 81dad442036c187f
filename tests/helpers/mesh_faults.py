"""A two-layer MLP written tensor-parallel by hand (``jax.shard_map``), with the sharding
mistakes people make planted in its per-shard body, as a user's model factory
(``model.factory``), like tests/helpers/cnn_faults.py for the CNN.

The model: ``x (in,) -> relu(x @ W1 + b1) (hidden,) -> norm -> @ W2 + b2 (out,)``, with
``norm`` an RMS norm over the hidden features. Its declared partitioning
(``Model.partitioning``) is Megatron's: ``W1`` ``(in, hidden)`` and ``b1`` split on the
hidden axis over the mesh axis ``"model"`` (column-parallel), ``W2`` ``(hidden, out)``
split on its hidden (input) axis (row-parallel), ``b2`` replicated. When the forward is
traced on a mesh with a ``"model"`` axis (the tensor-parallel paths set it as the context
mesh), it runs its per-shard body under ``jax.shard_map``: each device computes its
slice of the hidden units, and the row-parallel matmul's partial sums must be added
across the axis (``psum``), as must the norm's sum of squares. On one device (the loop,
vmap, the data-parallel path, the float64 oracle) it runs the plain body. Faults:

- ``forgot_psum``: the row-parallel matmul's partial sums are not ``psum``-ed: each
  device's output is its own slice's contribution. JAX's replication check would refuse
  ``out_specs=P()`` for a value that varies over ``"model"``, so the body turns it off
  (``check_vma=False``), as people do when it complains: the run then takes one
  device's partial sum as the output.
- ``local_norm``: the partitioning splits the hidden axis, which the RMS norm reduces
  over, and the body takes the mean of squares over its local slice without the
  collective (``pmean``): each device normalizes its slice by its own scale.

Both are invisible on one device and on a ``"model"`` axis of 1 (a psum over one device is
the identity): the tensor-parallel paths must fail on any mesh with 2 or more devices on
``"model"``, naming the path and that axis; ``"none"`` is the healthy model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from vmapcheck.core.mesh import MODEL_AXIS
from vmapcheck.core.models import Model, Params

FAULTS = ("none", "forgot_psum", "local_norm")
EPS = 1e-6


def partitioning(params: Params) -> Params:
    """Megatron's column- then row-parallel split (see the module docstring)."""
    del params  # the split is the same for any sizes the model axis divides
    return {
        "W1": P(None, MODEL_AXIS),
        "b1": P(MODEL_AXIS),
        "W2": P(MODEL_AXIS, None),
        "b2": P(),
    }


def _plain(params: Params, x: jax.Array) -> jax.Array:
    """x (in,) -> (out,) on one device."""
    h = jax.nn.relu(x @ params["W1"] + params["b1"])
    h = h / jnp.sqrt(jnp.mean(h * h) + EPS)
    return h @ params["W2"] + params["b2"]


def _sharded(fault: str) -> Any:
    """The per-shard forward: x (in,) replicated, W1/b1/W2 sliced on the hidden axis."""

    def body(w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, x: jax.Array):
        h = jax.nn.relu(x @ w1 + b1)  # (hidden / devices,): this device's hidden units
        square_sum = jnp.sum(h * h)
        if fault != "local_norm":
            square_sum = jax.lax.psum(square_sum, MODEL_AXIS)
            hidden = h.shape[0] * jax.lax.axis_size(MODEL_AXIS)
        else:  # the bug: the mean over this device's slice of the hidden axis only
            hidden = h.shape[0]
        h = h / jnp.sqrt(square_sum / hidden + EPS)
        partial = h @ w2  # (out,): this slice's share of the row-parallel matmul
        if fault != "forgot_psum":
            partial = jax.lax.psum(partial, MODEL_AXIS)
        return partial + b2

    specs = partitioning({})
    return jax.shard_map(
        body,
        in_specs=(specs["W1"], specs["b1"], specs["W2"], specs["b2"], P()),
        out_specs=P(),
        # forgot_psum's output varies over "model": the check would refuse it, and the
        # bug is a user who turned it off.
        check_vma=fault != "forgot_psum",
    )


def make_model(fault: str, in_features: int = 4, hidden: int = 8, out_features: int = 3) -> Model:
    """The MLP with ``fault`` planted in its per-shard body (one of :data:`FAULTS`)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; planted faults: {', '.join(FAULTS)}")

    def forward_one(params: Params, x: jax.Array) -> jax.Array:
        """x (in_features,) -> (out_features,)."""
        if MODEL_AXIS in jax.sharding.get_abstract_mesh().axis_names:
            # Built at each trace: a shard_map without a mesh takes the context mesh of
            # its first call and refuses another one after (the 1-D and 2-D paths').
            sharded = _sharded(fault)
            return sharded(params["W1"], params["b1"], params["W2"], params["b2"], x)
        return _plain(params, x)

    def init(key: jax.Array) -> Params:
        # float32 whatever jax_enable_x64 says (the check stage runs with it on).
        k1, k2, k3, k4 = jax.random.split(key, 4)
        f32 = jnp.float32
        return {
            "W1": jax.random.normal(k1, (in_features, hidden), f32) / f32(in_features**0.5),
            "b1": f32(0.1) * jax.random.normal(k2, (hidden,), f32),
            "W2": jax.random.normal(k3, (hidden, out_features), f32) / f32(hidden**0.5),
            "b2": f32(0.1) * jax.random.normal(k4, (out_features,), f32),
        }

    return Model(
        name=f"mesh_mlp_{fault}",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        init=init,
        partitioning=partitioning,
    )


def factory_overrides(fault: str) -> tuple[str, ...]:
    """Hydra overrides (on top of the built-in MLP's config) that make the run's model
    :func:`make_model` with ``fault``, named after it, as ``dvc exp run -S`` would set
    them; its hidden width is the default (a multiple of the test process's 2 devices)."""
    return (
        f"model.name=planted_mesh_{fault}",
        "+model.factory._target_=tests.helpers.mesh_faults.make_model",
        f"+model.factory.fault={fault}",
        "+model.factory.in_features=${model.in_features}",
        "+model.factory.out_features=${model.out_features}",
    )
