"""Reduction order: a long float32 sum whose rounding depends on the order it is added
in, amplified by ``remainder`` until the batched and per-example results differ in the
third digit (jax#38768)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model

ROWS, COLS, OUT = 12, 6, 8  # the report's t1 (12, 6) and t2 (6, 8)


def _init(key: jax.Array) -> dict[str, jax.Array]:
    """The report's second operand t2 (6, 8), float32."""
    return {"t2": jax.random.normal(key, (COLS, OUT), jnp.float32)}


def _head(d: jax.Array, t1: jax.Array, t2: jax.Array) -> jax.Array:
    """remainder(d, max(|t1 @ t2|, 0.1)): d (...) is a sum near 2000; the remainder keeps
    only its low digits, so d's last-bit rounding moves the output by up to ~1e-3."""
    e = t1 @ t2  # (..., 12, 8)
    return jnp.remainder(d[..., None, None], jnp.maximum(jnp.abs(e), 0.1))


def _gram_terms(t1: jax.Array) -> jax.Array:
    """c = inner(round(t1), t1) flattened: (..., 12, 6) -> (..., 144)."""
    b = jnp.einsum("...ik,...jk->...ij", jnp.round(t1), t1)
    return b.reshape(*b.shape[:-2], ROWS * ROWS)


def _model(blocked_batched_sum: bool) -> Case:
    """The report's f(t1, t2) with t1 the example (72 features) and t2 the params:
    (72,) -> (96,) = the (12, 8) result flattened."""

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (72,) -> (96,)
        t1 = x.reshape(ROWS, COLS)
        c = _gram_terms(t1)
        return _head(jnp.vecdot(c, c), t1, params["t2"]).reshape(ROWS * OUT)

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 72) -> (n, 96)
        t1 = x.reshape(-1, ROWS, COLS)
        c = _gram_terms(t1)
        if blocked_batched_sum:
            # The batched form adds the 144 squares in 12 blocks of 12, then the blocks:
            # the same sum, rounded in another order, as the reported vmap's was.
            d = jnp.sum(jnp.sum((c * c).reshape(-1, ROWS, ROWS), axis=-1), axis=-1)
        else:
            d = jax.vmap(jnp.vecdot)(c, c)  # each row reduced in the per-example order
        return _head(d, t1, params["t2"]).reshape(-1, ROWS * OUT)

    model = Model(
        name="remainder_of_sum",
        in_features=ROWS * COLS,
        out_features=ROWS * OUT,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
        trainable=False,
    )
    examples = np.asarray(jax.random.normal(jax.random.key(940156), (3, ROWS * COLS)))
    return model, _init(jax.random.key(1)), examples.astype(np.float32)


BUGS = (
    RealBug(
        name="remainder_amplifies_sum_order",
        kind="reduction order",
        source=Source(
            repo="jax-ml/jax",
            number=38768,
            title="jax.vmap produces different results from eager for a function involving "
            "jnp.round, jnp.inner, jax.lax.collapse, jnp.vecdot, and jnp.remainder",
            fixed_by=(
                "maintainer (jakevdp): 'in general this kind of thing is expected' with "
                "floating point; the remedy is the same reduction order, or a tolerance"
            ),
        ),
        what="jax.vmap with batch size 1 differs from eager by up to 0.000732, because a "
        "sum rounded in another order is amplified by jnp.remainder.",
        bug=lambda: _model(blocked_batched_sum=True),
        fix=lambda: _model(blocked_batched_sum=False),
        caught_by=CaughtBy("batching", "-vs-direct"),
        # Fixed, the paths agree (bitwise), but remainder keeps the float32 sum's rounding:
        # far from float64 on every path, a numerical finding (issue 42's false alarm).
        fix_may_fail=("numerical",),
    ),
)
