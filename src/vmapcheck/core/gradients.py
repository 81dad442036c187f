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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.core.forms import forward_keys, keyed_model, with_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.record import GradientProbe
from vmapcheck.core.state import partition


def make_loss_one(model: Model):
    def loss_one(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model.forward_one(params, x) - y) ** 2)

    return loss_one


def _all_finite(tree: Any) -> bool:
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


def gradient_probe(
    model: Model, params: Params, x: jax.Array, y: jax.Array, key: jax.Array | None = None
) -> tuple[dict[str, np.ndarray], GradientProbe]:
    """Loss and gradients on (x (batch, in), y (batch, out)), and on a NaN-target copy.

    A stochastic model's row ``i`` gets the key the paths give it
    (:func:`vmapcheck.core.forms.with_keys` from ``key``; None: seed 0's), the same in the
    batch loss and the per-example gradients, so the two compare like with like.

    Returns ``(arrays, record)``: arrays ``batch_grad.<leaf>`` and
    ``per_example_mean.<leaf>`` (float32 or wider, for check to compare); the record
    says whether the loss and gradients were finite, and whether a NaN planted in one
    target came out as a non-finite loss and gradient (detected, not masked).
    """
    leaves = partition(model, params)
    trainable, state = leaves.split(params)
    x = with_keys(model, x, key if key is not None else forward_keys(0))
    full_loss_one = make_loss_one(keyed_model(model))

    def loss_one(weights: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        return full_loss_one(leaves.merge(weights, state), x, y)

    def batch_loss(p: dict[str, jax.Array], xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean(jax.vmap(loss_one, in_axes=(None, 0, 0))(p, xs, ys))

    value, grads = jax.jit(jax.value_and_grad(batch_loss))(trainable, x, y)
    per_example = jax.jit(jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0)))(trainable, x, y)
    per_example_mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), per_example)
    poisoned = y.at[0, 0].set(jnp.nan)
    probe_value, probe_grads = jax.jit(jax.value_and_grad(batch_loss))(trainable, x, poisoned)
    arrays: dict[str, np.ndarray] = {}
    for prefix, tree in (("batch_grad", grads), ("per_example_mean", per_example_mean)):
        for name in leaves.trainable_names:  # the params' tree order
            host = np.asarray(tree[name])
            arrays[f"{prefix}.{name}"] = (
                host.astype(np.float32) if host.dtype == jnp.bfloat16 else host
            )
    record: GradientProbe = {
        "loss": float(value),
        "loss_finite": bool(jnp.isfinite(value)),
        "grads_finite": _all_finite(grads),
        "per_example_finite": _all_finite(per_example),
        "nan_probe": {
            "planted": "NaN in target row 0, output 0",
            "loss_finite": bool(jnp.isfinite(probe_value)),
            "grads_finite": _all_finite(probe_grads),
        },
    }
    return arrays, record
