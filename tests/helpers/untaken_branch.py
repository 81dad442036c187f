"""A model with the NaN-from-the-untaken-branch bug, and its published fix, as a user's
model factory (``model.factory``) and for the Python API.

The bug (the JAX FAQ's "Gradients contain NaN where using where"): a hidden activation
``jnp.where(h > 0, jnp.sqrt(h), 0.0)``. The forward is finite on every row: the select
takes 0 where ``h <= 0``. The gradient is not: the untaken branch's derivative ``0.5 /
sqrt(h)`` is NaN there, and the select multiplies it by a zero cotangent, ``0 * NaN =
NaN``. The fix is the double where: the masked values are made safe before ``sqrt`` too.

The same activation written with ``lax.cond`` per unit under vmap (``cond``) is kept as
a model that must pass: a cond under vmap becomes a select, but JAX 0.11.2's batching
rule for cond feeds each branch its operand masked by the predicate (``select_n`` of the
operand and its ``stop_gradient``: a double where of its own), so its gradient is finite
(seen 2026-12-07 in the jaxpr of ``grad(vmap(cond))``).

The MLP ``[in_features, *hidden, out_features]`` (the built-in one's params, He-normal
weights and zero biases: :func:`vmapcheck.core.models.mlp_init`) with that activation in
its hidden layers; one code serves one row and a batch (broadcasting explicitly, as
strict JAX wants it), batch axis 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from vmapcheck.core.models import Model, Params, mlp_init

# How the activation is written: the bug, its fix, and a cond under vmap (finite).
FORMS = ("where", "where_fixed", "cond")


def _sqrt_unit(v: jax.Array) -> jax.Array:
    return jnp.sqrt(v)


def _safe_sqrt_unit(v: jax.Array) -> jax.Array:
    # The double where: the untaken branch sees 1.0, whose gradient is finite.
    return jnp.sqrt(jnp.where(v > 0, v, 1.0))


def _activation(form: str) -> Callable[[jax.Array], jax.Array]:
    """``h`` (any shape) -> sqrt(h) where h > 0, else 0, written as ``form``."""
    if form not in FORMS:
        raise ValueError(f"form: expected one of {', '.join(FORMS)}, got {form!r}")
    unit = _safe_sqrt_unit if form.endswith("_fixed") else _sqrt_unit
    if form.startswith("where"):
        return lambda h: jnp.where(h > 0, unit(h), 0.0)

    def one(v: jax.Array) -> jax.Array:  # a scalar: lax.cond's predicate must be one
        return jax.lax.cond(v > 0, unit, jnp.zeros_like, v)

    def per_unit(h: jax.Array) -> jax.Array:
        flat = h.reshape(-1)
        return jax.vmap(one)(flat).reshape(h.shape)

    return per_unit


def make_model(
    in_features: int = 4,
    hidden: Sequence[int] = (16,),
    out_features: int = 3,
    form: str = "where",
) -> Model:
    """The MLP with ``form``'s sqrt activation in its hidden layers (:data:`FORMS`)."""
    act = _activation(form)
    widths = [in_features, *hidden, out_features]

    def forward(params: Params, x: jax.Array) -> jax.Array:  # (in,) -> (out,); (n, in) -> (n, out)
        h = x
        *inner, last = params["layers"]
        for layer in inner:
            pre = h @ layer["W"]
            h = act(pre + jnp.broadcast_to(layer["b"], pre.shape))
        out = h @ last["W"]
        return out + jnp.broadcast_to(last["b"], out.shape)

    return Model(
        name=f"sqrt_{form}",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward,
        forward_batch=forward,
        init=lambda key: mlp_init(key, widths),
        description=f"MLP with a sqrt activation written as {form}",
    )
