"""Run every forward path on every regression case, recording outputs and refusals."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vmapcheck.core import contract
from vmapcheck.core.cases import Case, case_input, kind_of
from vmapcheck.core.composition import REGROUPINGS, applies, composition_key
from vmapcheck.core.forms import cast_tree, forward_keys, with_keys
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import PATHS, Forward, build, output_key, row_cap
from vmapcheck.core.record import PathRun, RaisedError, RowCap
from vmapcheck.errors import InvalidInputError, known_model_fault

Built = dict[str, dict[str, Forward]]  # takes ("batch", "vector") -> path -> forward


def _storable(host: np.ndarray) -> np.ndarray:
    # bfloat16 has no pickle-free .npz encoding; its values are exactly float32 values.
    return host.astype(np.float32) if host.dtype == jnp.bfloat16 else host


def build_all(
    model: Model, dtype: Any, mesh: Mesh | None = None, key: jax.Array | None = None
) -> Built:
    """Every path built for ``model`` at ``dtype``, by what it takes (compiled once: a
    jit path reused on the same shape is not compiled again). ``key``: a stochastic
    model's base key (:func:`vmapcheck.core.forms.forward_keys` of the run's seed)."""
    return {
        "batch": build(model, dtype, "batch", mesh=mesh, key=key),
        "vector": build(model, dtype, "vector", key=key),
    }


def capped_rows(path_name: str, case: Case, name: str, x: Any, budget: Any) -> int | None:
    """The rows ``path_name`` runs of valid batch case ``name`` when ``budget`` caps it
    (:func:`vmapcheck.core.paths.row_cap`), else None: it runs every row. An invalid
    case is never cut: its rows are part of what makes it invalid."""
    path = PATHS[path_name]
    if path.takes != "batch" or not kind_of(case, name).valid:
        return None
    return row_cap(path, budget, contract.rows(x))


def cap_entry(path_name: str, cap: int, rows: int) -> RowCap:
    """What the forward record says of a path the budget capped: the rows it ran, of
    how many, and the setting that capped it."""
    return {"rows_run": cap, "rows_of": rows, "capped_by": f"budget.{PATHS[path_name].forward_cap}"}


def run_forward(
    model: Model,
    params: Params,
    cases: dict[str, Case],
    dtype: Any,
    mesh: Mesh | None = None,
    built: Built | None = None,
    budget: Any = None,
    key: jax.Array | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, PathRun]]]:
    """Run each case through the paths its kind calls for (:data:`CASE_KINDS`), at ``dtype``.

    A batch case goes through every path taking a batch (distributed ones over ``mesh``;
    None: every device present), a vector case through those taking one example, and
    each invalid case through the paths named by its ``runs_on``. ``budget`` (a
    :class:`vmapcheck.config.BudgetConfig`, None: none): a path with a ``forward_cap``
    runs only the first rows of a valid batch case it allows.

    Returns ``(outputs, record)``: ``outputs["<case>.<path>"]`` is the output of a valid
    case (bfloat16 stored as float32, exactly), ``(rows run, out_features)`` for a capped
    path; ``record[case][path]`` says the output's shape and dtype, or whether and how
    the path refused the input, and for a capped path ``rows_run``, ``rows_of`` and
    ``capped_by`` (:func:`cap_entry`). ``built``: the paths of :func:`build_all` (None:
    built here).
    """
    built = built if built is not None else build_all(model, dtype, mesh, key)
    every = {name: fn for takes in built.values() for name, fn in takes.items()}
    run_params = cast_tree(params, dtype)
    outputs: dict[str, np.ndarray] = {}
    record: dict[str, dict[str, PathRun]] = {}
    for case_name, case in cases.items():
        kind = kind_of(case, case_name)
        paths = {name: every[name] for name in kind.paths(case) if name in every}
        x = case_input(case, dtype)
        per_path: dict[str, PathRun] = {}
        for path_name, path in paths.items():
            cap = capped_rows(path_name, case, case_name, x, budget)
            try:
                run_x = x if cap is None else contract.take(x, slice(0, cap))
                out = jax.block_until_ready(path(run_params, run_x))
            except InvalidInputError as exc:
                per_path[path_name] = {
                    "refused": True,
                    "error": type(exc).__name__,
                    "message": str(exc),
                }
                continue
            except Exception as exc:  # recorded and judged by check: a crash is no refusal
                per_path[path_name] = {
                    "refused": False,
                    "crashed": True,
                    "error": type(exc).__name__,
                    # A fault whose fix is known is said with it (errors.known_model_fault).
                    "message": known_model_fault(exc, model.name) or str(exc),
                }
                continue
            host = np.asarray(out)
            per_path[path_name] = {
                "refused": False,
                "shape": list(host.shape),
                "dtype": str(host.dtype),
                **({} if cap is None else cap_entry(path_name, cap, contract.rows(x))),
            }
            if kind.valid:
                outputs[output_key(case_name, path_name)] = _storable(host)
        record[case_name] = per_path
    return outputs, record


def run_composition(
    model: Model,
    params: Params,
    cases: dict[str, Case],
    dtype: Any,
    outputs: dict[str, np.ndarray],
    mesh: Mesh | None = None,
    built: Built | None = None,
    budget: Any = None,
    key: jax.Array | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every batch path on every case that :func:`~vmapcheck.core.composition.applies`
    again, under each regrouping of :data:`~vmapcheck.core.composition.REGROUPINGS` (its
    rows reversed; in two halves), the outputs in the case's original row order. A path
    the ``budget`` caps (:func:`run_forward`) is regrouped on the rows it ran: its first
    ``rows_run`` rows, reversed and halved (``capped`` in the case's record).

    Only the paths with an output on the original batch (``outputs``, from
    :func:`run_forward`) are regrouped: one that refused or crashed there is the
    contract's failure already. Returns ``(outputs, record)``: ``outputs["<case>.<path>.
    <regrouping>"]`` (bfloat16 stored as float32, exactly); ``record``: what each
    regrouping is, and per case its rows, each regrouping's plan, and the paths that
    raised under one (type and message). A stochastic model's batch is regrouped with
    its row keys (:func:`vmapcheck.core.forms.with_keys` from ``key``, the one ``built``
    was built with): each row keeps its key wherever it moves.
    """
    paths = (built if built is not None else build_all(model, dtype, mesh, key))["batch"]
    base = key if key is not None else forward_keys(0)
    run_params = cast_tree(params, dtype)
    regrouped: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {
        "regroupings": {g.name: g.about for g in REGROUPINGS.values()},
        "cases": {},
    }
    for case_name, case in cases.items():
        if not applies(case, case_name):
            continue
        x = with_keys(model, case_input(case, dtype), base)
        rows = contract.rows(x)
        raised: dict[str, dict[str, RaisedError]] = {}  # path -> regrouping -> error
        capped: dict[str, dict[str, Any]] = {}
        ran = []
        for path_name in kind_of(case, case_name).paths(case):
            if path_name not in paths or output_key(case_name, path_name) not in outputs:
                continue
            ran.append(path_name)
            cap = capped_rows(path_name, case, case_name, x, budget)
            run_x = x
            if cap is not None:
                run_x = contract.take(x, slice(0, cap))
                capped[path_name] = {
                    **cap_entry(path_name, cap, rows),
                    **{g.name: g.plan(cap) for g in REGROUPINGS.values()},
                }
            for g in REGROUPINGS.values():
                try:
                    out = jax.block_until_ready(g.run(paths[path_name], run_params, run_x))
                except Exception as exc:  # judged by check: no output under this regrouping
                    raised.setdefault(path_name, {})[g.name] = {
                        "error": type(exc).__name__,
                        "message": str(exc),
                    }
                    continue
                regrouped[composition_key(case_name, path_name, g.name)] = _storable(
                    np.asarray(out)
                )
        record["cases"][case_name] = {
            "rows": rows,
            **{g.name: g.plan(rows) for g in REGROUPINGS.values()},
            "paths": ran,
            "raised": raised,
            # The paths regrouped on fewer rows (budget), and their plans there.
            "capped": capped,
        }
    return regrouped, record
