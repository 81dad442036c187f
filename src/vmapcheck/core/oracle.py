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

from vmapcheck.core.cases import Case, kind_of
from vmapcheck.core.contract import cast_floats, rows, take
from vmapcheck.core.forms import Keyed, cast_tree, forward_keys, keyed_model, row_keys, with_keys
from vmapcheck.core.jit_cache import cached
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
    cases: dict[str, Case],
    run_dtype: Any,
    max_rows: int | None = None,
    key: jax.Array | None = None,
) -> dict[str, np.ndarray] | None:
    """case name -> float64 output for every case whose kind has the oracle
    (:data:`vmapcheck.core.cases.CASE_KINDS`); x is one example or a batch (axis 0 on every
    leaf). ``max_rows`` (``budget.oracle_max_rows``; None: every row): of a batch, only
    the first this many rows are computed, so its output has ``min(rows, max_rows)`` rows
    (the check compares the paths with it on those rows and reports the cap).

    A stochastic model (``Model.stochastic``) is run with the keys the paths gave each
    row (split from ``key``, the run's :func:`~vmapcheck.core.forms.forward_keys`; None:
    seed 0's), when its draws are the same numbers in float64 as in the run
    (:func:`draw_problem`: every ``jax.random`` draw takes as many bits). Else None: under
    x64 ``jax.random`` draws other numbers from the same keys, so the float64 run would
    be another sample, not the same computation more precisely; the check says so
    (:data:`vmapcheck.core.record.ORACLE_NOT_JUDGED`), with no figure and no failure."""
    if not jax.config.jax_enable_x64:
        raise RuntimeError("the float64 oracle needs jax_enable_x64 (configure_cpu_float64)")
    judged = {name: case for name, case in cases.items() if kind_of(case, name).oracle}
    base = key if key is not None else forward_keys(0)
    if model.stochastic and judged:
        # One example of the first case (unbatched) shows what every draw takes.
        name, case = next(iter(judged.items()))
        example = case["x"] if kind_of(case, name).takes == "vector" else take(case["x"], 0)
        if draw_problem(model, params, example, run_dtype):
            return None
    params64 = jax.tree_util.tree_map(lambda leaf: to_f64(leaf, run_dtype), params)
    # One jitted forward per model (and x64/device settings) in this process: a
    # stochastic model's keyed_model is a new closure each time, compiled again without it.
    forward = cached(model, "oracle", None, lambda: jax.jit(keyed_model(model).forward_one))
    out: dict[str, np.ndarray] = {}
    for name, case in judged.items():
        kind = kind_of(case, name)
        x64 = jax.tree.map(lambda leaf: to_f64(leaf, run_dtype), case["x"])
        if kind.takes == "vector":
            out[name] = np.asarray(forward(params64, with_keys(model, x64, base, example=True)))
        else:
            n = rows(x64) if max_rows is None else min(rows(x64), max_rows)
            # Row i's key is the paths' (split is prefix-stable: the first n rows' keys).
            x64 = with_keys(model, take(x64, slice(0, n)), base)
            out[name] = np.stack([np.asarray(forward(params64, take(x64, i))) for i in range(n)])
    return out


def _draws(fn: Any, *args: Any) -> list[tuple[int, tuple[int, ...]]]:
    """Every ``jax.random`` draw of ``fn(*args)``, traced (no compute), in trace order,
    nested programs included: each ``random_bits`` primitive's bit width and shape."""
    found: list[tuple[int, tuple[int, ...]]] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "random_bits":
                found.append((int(eqn.params["bit_width"]), tuple(eqn.params["shape"])))
            for value in eqn.params.values():
                for sub in value if isinstance(value, list | tuple) else (value,):
                    inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def draw_problem(model: Model, params: Params, example: Any, run_dtype: Any) -> str | None:
    """Why a stochastic ``model``'s float64 run would draw other numbers than its run at
    ``run_dtype`` from the same key, or None when it draws the same: ``forward_one`` on
    one ``example`` (unbatched) traced both ways (x64 off at ``run_dtype``, x64 on in
    float64), every ``jax.random`` draw compared by its bits and shape. The same bits
    from the same key are the same numbers (the key's derivation is 32-bit either way);
    a draw whose dtype follows the default float takes 64 bits under x64."""
    keyed = keyed_model(model)
    key = row_keys(forward_keys(0), 1)[0]  # the bits drawn do not depend on the key
    with jax.enable_x64(False):
        x = Keyed(cast_floats(example, run_dtype), key)
        run = _draws(keyed.forward_one, cast_tree(params, run_dtype), x)
    with jax.enable_x64(True):
        params64 = jax.tree_util.tree_map(lambda leaf: to_f64(leaf, run_dtype), params)
        x64 = jax.tree.map(lambda leaf: to_f64(leaf, run_dtype), example)
        wide = _draws(keyed.forward_one, params64, Keyed(x64, key))
    if run == wide:
        return None
    return (
        f"forward_one draws {len(wide)} time(s) in float64 taking "
        f"{sorted({bits for bits, _ in wide})} bits, where the run's draws take "
        f"{sorted({bits for bits, _ in run})}"
    )
