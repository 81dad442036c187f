"""dtype promotion: a constant that is weakly typed for one example but strongly typed in
the batched path promotes a bfloat16 model to float32 (jax#10025)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model

OFFSET = 0.5


def _init(key: jax.Array) -> dict[str, jax.Array]:
    """One dense layer 3 -> 2, float32 (the run casts it to bfloat16)."""
    return {"W": jax.random.normal(key, (3, 2), jnp.float32)}


def _model(strong_batched_constant: bool) -> Case:
    """tanh(x @ W) + 0.5: (3,) -> (2,). For one example 0.5 is a Python scalar, weakly
    typed: the sum keeps x's dtype. Before jax PR #10027 vmap's batch tracers stripped
    that weak type, so the batched constant promoted like a strong int32/float32 array
    (the report: ``uint8 + weak int32`` gave ``int32`` under vmap only)."""

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return jnp.tanh(x @ params["W"]) + OFFSET

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 3) -> (n, 2)
        h = jnp.tanh(x @ params["W"])
        if strong_batched_constant:
            # The per-row constant as the batch tracer held it: strongly typed float32.
            return h + jnp.full((x.shape[0], 1), OFFSET, dtype=jnp.float32)
        return h + jnp.full((x.shape[0], 1), OFFSET, dtype=h.dtype)

    model = Model(
        name="weak_offset",
        in_features=3,
        out_features=2,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
        trainable=False,
    )
    examples = np.random.default_rng(9).normal(size=(4, 3)).astype(np.float32)
    return model, _init(jax.random.key(0)), examples


BUGS = (
    RealBug(
        name="batch_tracer_strips_weak_type",
        kind="dtype promotion",
        source=Source(
            repo="jax-ml/jax",
            number=10025,
            title="Batch tracers strip weak type",
            fixed_by="PR #10027 'vmap: preserve weak_type in batching tracer' (jakevdp)",
        ),
        what="jnp.add(x, y) of a uint8 array and a weakly typed scalar array is uint8, but "
        "vmap(jnp.add)(x, y) is int32: under vmap the weak type is lost and the result "
        "promotes.",
        bug=lambda: _model(strong_batched_constant=True),
        fix=lambda: _model(strong_batched_constant=False),
        # In a bfloat16 run the promotion shows as a float32 output of the batched path
        # only, the loop's being bfloat16: the batched path disagrees, a batching fault.
        check_kwargs={"precision": "bf16"},
        caught_by=CaughtBy("batching", "expected dtype bfloat16, got float32"),
    ),
)
