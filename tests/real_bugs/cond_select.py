"""cond/select under vmap: the branch a ``jnp.where`` (what ``lax.cond`` becomes under
vmap) does not take still runs, and its NaN reaches the gradient.

The forward outputs are finite and every path agrees: only the gradient check (issue 42,
item 4: ``check_batching(..., gradients=True)``, the loss the MSE of the outputs against
zeros) can see these, hence ``requires=("gradients",)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model


def _init(key: jax.Array) -> dict[str, jax.Array]:
    """One dense layer 3 -> 2, float32."""
    return {"W": jax.random.normal(key, (3, 2), jnp.float32)}


def _examples() -> np.ndarray:
    """4 rows, (4, 3), batch axis 0; row 2 is all zeros, where the untaken branch is NaN."""
    rows = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    rows[2] = 0.0
    return rows


def _model(name: str, head: Any) -> Case:
    """``head`` maps the dense layer's output h (..., 2) to the output (..., 2)."""

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return head(x @ params["W"])

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 3) -> (n, 2)
        return head(x @ params["W"])

    model = Model(
        name=name,
        in_features=3,
        out_features=2,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
    )
    return model, _init(jax.random.key(0)), _examples()


# --- jax#1052: arctan2 in the untaken branch --------------------------------------------


def _angle_unsafe(h: jax.Array) -> jax.Array:
    """0 where h is 0, else arctan2(h, h): the taken value is finite, but arctan2's
    gradient at (0, 0) is 0/0 and the where passes it on (times a zero cotangent: NaN)."""
    return jnp.where(h == 0, 0.0, jnp.arctan2(h, h))


def _angle_double_where(h: jax.Array) -> jax.Array:
    """The double-where trick: the untaken branch sees a safe input (1), never (0, 0)."""
    safe = jnp.where(h == 0, 1.0, h)
    return jnp.where(h == 0, 0.0, jnp.arctan2(safe, safe))


# --- jax#347: sqrt before the where -----------------------------------------------------


def _norm_unsafe(h: jax.Array) -> jax.Array:
    """sqrt(sum h^2) where it is over 0.5, else 1: sqrt'(0) is inf, and inf * 0 is NaN."""
    s = jnp.sum(h**2, axis=-1, keepdims=True)
    return h + jnp.where(s > 0.25, jnp.sqrt(s), 1.0)


def _norm_where_first(h: jax.Array) -> jax.Array:
    """The report's own working form: the where before the sqrt, so sqrt never sees 0."""
    s = jnp.sum(h**2, axis=-1, keepdims=True)
    return h + jnp.sqrt(jnp.where(s > 0.25, s, 1.0))


NAN_GRADIENT = CaughtBy("model", "gradients are not finite")

BUGS = (
    RealBug(
        name="where_arctan2_nan_gradient",
        kind="cond/select under vmap",
        source=Source(
            repo="jax-ml/jax",
            number=1052,
            title="gradients through np.where when one of branches is nan, #347 except with "
            "arctan2",
            fixed_by=(
                "the 'double-where trick' (JAX FAQ: gradients contain NaN where using "
                "where); mattjj's PR #5658 applies it when vmap turns a cond into a select"
            ),
        ),
        what="The gradient through np.where is NaN although the branch that is NaN "
        "(arctan2 at 0, 0) is not the one taken.",
        bug=lambda: _model("where_arctan2", _angle_unsafe),
        fix=lambda: _model("where_arctan2", _angle_double_where),
        caught_by=NAN_GRADIENT,
        requires=("gradients",),
    ),
    RealBug(
        name="where_sqrt_nan_gradient",
        kind="cond/select under vmap",
        source=Source(
            repo="jax-ml/jax",
            number=347,
            title="Issue taking gradients through np.where when one of branches is nan.",
            fixed_by=(
                "closed as a bug report whose own test_succeed is the remedy: apply the "
                "where before the sqrt, so the untaken branch never differentiates sqrt(0)"
            ),
        ),
        what="If you take gradients through np.where and one of the branches is nan, the "
        "gradient is nan even if the branch is not taken.",
        bug=lambda: _model("where_sqrt", _norm_unsafe),
        fix=lambda: _model("where_sqrt", _norm_where_first),
        caught_by=NAN_GRADIENT,
        requires=("gradients",),
    ),
)
