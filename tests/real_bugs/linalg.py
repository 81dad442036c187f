"""Linear algebra batched vs unbatched: a batched inverse that returns finite numbers for
a singular matrix where the unbatched one returns inf."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model


def _init(key: jax.Array) -> dict[str, jax.Array]:
    """A per-feature scale (4,), float32, kept near 1."""
    return {"scale": 1.0 + 0.1 * jax.random.normal(key, (4,), jnp.float32)}


def _gram(params: Any, x: jax.Array) -> jax.Array:
    """x (..., 4) -> the 2x2 Gram matrix A^T A of A = (x * scale) as 2x2, (..., 2, 2)."""
    scale = params["scale"].reshape((1,) * (x.ndim - 1) + (4,))  # over the batch axes
    a = (x * scale).reshape(*x.shape[:-1], 2, 2)
    return jnp.swapaxes(a, -1, -2) @ a


def _inverse_flushing_zero_pivots(m: jax.Array) -> jax.Array:
    """The 2x2 inverse as XLA's batched CPU triangular solve computed it before
    openxla/xla#15026: a zero pivot gave 0, not inf, so a singular matrix came back
    finite (openxla/xla#3891: ``[[0.], [1.]]`` batched, ``[[-inf], [inf]]`` alone).
    m (n, 2, 2) -> (n, 2, 2)."""
    a, b, c, d = m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1]
    det = a * d - b * c
    inv_det = jnp.where(det == 0, 0.0, 1.0 / jnp.where(det == 0, 1.0, det))
    adjugate = jnp.stack([jnp.stack([d, -b], -1), jnp.stack([-c, a], -1)], -2)
    return adjugate * inv_det[:, None, None]


def _model(flushing_batched_inverse: bool) -> Case:
    """inv(A^T A) flattened, (4,) -> (4,), as in the report (``jnp.linalg.inv(x.T @ x)``)."""

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (4,) -> (4,)
        return jnp.linalg.inv(_gram(params, x)).reshape(4)

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 4) -> (n, 4)
        gram = _gram(params, x)
        inverse = (
            _inverse_flushing_zero_pivots(gram)
            if flushing_batched_inverse
            else jnp.linalg.inv(gram)
        )
        return inverse.reshape(x.shape[0], 4)

    model = Model(
        name="gram_inverse",
        in_features=4,
        out_features=4,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
        trainable=False,
    )
    # The report's two matrices, [[1, 3], [-5, 1]] (invertible) and [[1, 1], [1, 1]]
    # (singular), with scale 1 so the second stays singular.
    examples = np.array([[1.0, 3.0, -5.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    return model, {"scale": jnp.ones((4,), jnp.float32)}, examples


BUGS = (
    RealBug(
        name="batched_inverse_of_singular_matrix",
        kind="linear algebra batched vs unbatched",
        source=Source(
            repo="jax-ml/jax",
            number=15429,
            title="vmap behaving unexpected with function that inverts singular matrix",
            fixed_by=(
                "an XLA CPU fault (jakevdp: root cause openxla/xla#3891, batched "
                "TriangularSolve of a singular matrix), fixed by openxla/xla PR #15026"
            ),
        ),
        what="jnp.linalg.inv(x.T @ x) of a singular matrix gives inf alone but finite, "
        "wrong numbers under vmap.",
        bug=lambda: _model(flushing_batched_inverse=True),
        fix=lambda: _model(flushing_batched_inverse=False),
        # The batched path is finite where the loop is infinite: a disagreement on that row.
        caught_by=CaughtBy("batching", "loop_eager-vs-direct"),
        # Fixed, every path is infinite on the singular row: a model problem, not a
        # batching one (issue 42 lists the false alarm this gets today).
        fix_may_fail=("model",),
    ),
)
