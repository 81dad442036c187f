"""Loss and gradients as checks: finite on real data, NaN detected, per-example = batch.

``loss_one(params, x, y)``: squared error of one example, x (in_features,), y
(out_features,). The batch loss is its mean over the batch (axis 0), so the gradient
of the batch loss must equal the mean of the per-example gradients
``vmap(grad(loss_one), in_axes=(None, 0, 0))`` — params shared, examples mapped.
Gradients are taken with respect to the trainable leaves only, as training takes them:
the model's declared state leaves (``Model.state_leaves``) are held fixed
(:mod:`vmapcheck.core.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.core.forms import forward_keys, keyed_model, with_keys
from vmapcheck.core.jit_cache import cached
from vmapcheck.core.models import Model, Params
from vmapcheck.core.record import GradientProbe
from vmapcheck.core.state import ParamsPartition, partition


def make_loss_one(model: Model):
    def loss_one(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model.forward_one(params, x) - y) ** 2)

    return loss_one


def _finite(tree: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Leaf path -> whether every element of that leaf is finite (a bool scalar)."""
    return {name: jnp.all(jnp.isfinite(leaf)) for name, leaf in tree.items()}


def _probe_program(model: Model, leaves: ParamsPartition) -> Callable[..., dict[str, Any]]:
    """The gradient probe as one jitted program ``(trainable, state, xs, ys) -> dict``
    (trainable and state: ``{leaf path: array}`` as ``leaves.split`` gives them; xs
    ``(batch, ...)``, ys ``(batch, out_features)``, batch axis 0). The state leaves are
    an argument, not captured: the program does not depend on the params' values, so
    it is reused for any params of this structure."""
    full_loss_one = make_loss_one(keyed_model(model))

    def loss_one(
        weights: dict[str, jax.Array], state: Any, x: jax.Array, y: jax.Array
    ) -> jax.Array:
        return full_loss_one(leaves.merge(weights, state), x, y)

    def batch_loss(p: dict[str, jax.Array], state: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean(jax.vmap(loss_one, in_axes=(None, None, 0, 0))(p, state, xs, ys))

    def probe(p: dict[str, jax.Array], state: Any, xs: jax.Array, ys: jax.Array) -> dict[str, Any]:
        value, grads = jax.value_and_grad(batch_loss)(p, state, xs, ys)
        per_example = jax.vmap(jax.grad(loss_one), in_axes=(None, None, 0, 0))(p, state, xs, ys)
        poisoned = ys.at[0, 0].set(jnp.nan)
        probe_value, probe_grads = jax.value_and_grad(batch_loss)(p, state, xs, poisoned)
        return {
            "loss": value,
            "grads": grads,
            "per_example_mean": jax.tree.map(lambda g: jnp.mean(g, axis=0), per_example),
            "grads_finite": _finite(grads),
            "per_example_finite": _finite(per_example),
            "probe_loss": probe_value,
            "probe_grads_finite": _finite(probe_grads),
        }

    return jax.jit(probe)


def gradient_probe(
    model: Model, params: Params, x: jax.Array, y: jax.Array, key: jax.Array | None = None
) -> tuple[dict[str, np.ndarray], GradientProbe]:
    """Loss and gradients on (x (batch, in), y (batch, out)), and on a NaN-target copy.

    ``x``: a batch of the model's input contract, batch axis 0 (an array, or a dict of
    leaves); ``y``: the targets, ``(batch, out_features)``, batch axis 0.
    A stochastic model's row ``i`` gets the key the paths give it
    (:func:`vmapcheck.core.forms.with_keys` from ``key``; None: seed 0's), the same in the
    batch loss and the per-example gradients, so the two compare like with like.

    Returns ``(arrays, record)``: arrays ``batch_grad.<leaf>`` and
    ``per_example_mean.<leaf>`` (float32 or wider, for check to compare); the record
    says whether the loss and gradients were finite (and which trainable leaves' were
    not, in tree order), and whether a NaN planted in one target came out as a
    non-finite loss and gradient (detected, not masked).

    Everything runs as one compiled program (one trace and one compile per batch shape:
    the Python API runs this in a user's test, where each compile is seconds of CPU).
    """
    leaves = partition(model, params)
    trainable, state = leaves.split(params)
    x = with_keys(model, x, key if key is not None else forward_keys(0))
    # The same jitted program for this model and params structure on every call in the
    # process (vmapcheck.core.jit_cache): a repeat check compiles nothing.
    program = cached(model, "gradient_probe", leaves, lambda: _probe_program(model, leaves))
    found = jax.device_get(program(trainable, state, x, y))
    arrays: dict[str, np.ndarray] = {}
    for prefix, tree in (
        ("batch_grad", found["grads"]),
        ("per_example_mean", found["per_example_mean"]),
    ):
        for name in leaves.trainable_names:  # the params' tree order
            host = np.asarray(tree[name])
            arrays[f"{prefix}.{name}"] = (
                host.astype(np.float32) if host.dtype == jnp.bfloat16 else host
            )
    names = leaves.trainable_names
    record: GradientProbe = {
        "loss": float(found["loss"]),
        "loss_finite": bool(np.isfinite(found["loss"])),
        "grads_finite": all(bool(found["grads_finite"][n]) for n in names),
        "per_example_finite": all(bool(found["per_example_finite"][n]) for n in names),
        # The leaves to look at first: their batch or per-example gradient has NaN/Inf.
        "nonfinite_leaves": [
            n for n in names if not (found["grads_finite"][n] and found["per_example_finite"][n])
        ],
        "nan_probe": {
            "planted": "NaN in target row 0, output 0",
            "loss_finite": bool(np.isfinite(found["probe_loss"])),
            "grads_finite": all(bool(found["probe_grads_finite"][n]) for n in names),
        },
    }
    return arrays, record
