"""The float64 oracle: each case's output computed in float64, to judge every path.

Agreement between paths cannot tell "all right" from "all wrong in the same way"; an
independent, more precise computation can. Params and inputs are first rounded to the
run's dtype (so the oracle sees exactly the numbers the paths saw), then the model's
``forward_one`` runs in float64 on CPU, one row at a time. Needs ``jax_enable_x64``:
call :func:`vmapcheck.core.runtime.configure_cpu_float64` first.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.core.cases import kind_of
from vmapcheck.core.contract import rows, take
from vmapcheck.core.models import Model, Params


def to_f64(array: Any, run_dtype: Any) -> jax.Array:
    """A float leaf rounded to the run's dtype, then widened to float64; ids and masks
    unchanged (they are exact)."""
    host = np.asarray(array)
    if not np.issubdtype(host.dtype, np.floating) and host.dtype != jnp.bfloat16:
        return jnp.asarray(host)
    rounded = host.astype(run_dtype)
    return jnp.asarray(rounded.astype(np.float64), dtype=jnp.float64)


def float64_outputs(
    model: Model,
    params: Params,
    cases: dict[str, dict[str, Any]],
    run_dtype: Any,
    max_rows: int | None = None,
) -> dict[str, np.ndarray] | None:
    """case name -> float64 output for every case whose kind has the oracle
    (:data:`vmapcheck.core.cases.CASE_KINDS`); x is one example or a batch (axis 0 on every
    leaf). ``max_rows`` (``budget.oracle_max_rows``; None: every row): of a batch, only
    the first this many rows are computed, so its output has ``min(rows, max_rows)`` rows
    (the check compares the paths with it on those rows and reports the cap).

    None for a stochastic model (``Model.stochastic``): under x64 ``jax.random`` draws
    other numbers from the same keys, so its float64 run would be another sample, not
    the same computation more precisely; the check says so
    (:data:`vmapcheck.core.record.ORACLE_NOT_JUDGED`), with no figure and no failure."""
    if model.stochastic:
        return None
    if not jax.config.jax_enable_x64:
        raise RuntimeError("the float64 oracle needs jax_enable_x64 (configure_cpu_float64)")
    params64 = jax.tree_util.tree_map(lambda leaf: to_f64(leaf, run_dtype), params)
    forward = jax.jit(model.forward_one)
    out: dict[str, np.ndarray] = {}
    for name, case in cases.items():
        kind = kind_of(case, name)
        if not kind.oracle:
            continue
        x64 = jax.tree.map(lambda leaf: to_f64(leaf, run_dtype), case["x"])
        if kind.takes == "vector":
            out[name] = np.asarray(forward(params64, x64))
        else:
            n = rows(x64) if max_rows is None else min(rows(x64), max_rows)
            out[name] = np.stack([np.asarray(forward(params64, take(x64, i))) for i in range(n)])
    return out
