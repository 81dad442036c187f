"""Batch composition: the same rows run in another order, and in two halves.

The loop and vmap forms compute each row from that row alone: they never see the row's
batch-mates. A hand-batched form (``forward_batch``) or a distributed one may: a
normalization with the batch's own statistics, a reduction over axis 0, an off-by-one
in an index. Such a path gives a row a different output when the rows around it
change. So the forward stage runs every batch path of the registry on each case that
:func:`applies` also under each regrouping of :data:`REGROUPINGS`, puts the outputs back
in the original row order, and the check compares them with the path's own outputs on
the original batch (the one tolerance rule, :mod:`vmapcheck.core.compare`): a path whose
outputs move beyond it "depends on batch composition".

To add a regrouping: one entry below (the forward stage runs it, the check judges it,
tracking and the report list it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vmapcheck.core.paths import Forward, output_key

if TYPE_CHECKING:
    from vmapcheck.core.cases import Case, CaseEntry

# REGROUPINGS is read by the report (check_sections), which runs no JAX: JAX and the
# case and contract helpers are imported where a regrouping runs or a case is judged.


@dataclass(frozen=True)
class Regrouping:
    """One way of regrouping a batch's rows.

    Attributes:
        name: the key's suffix in data/forward/composition.npz (``standard.vmap_jit.<name>``)
            and the field of check_details.json's ``composition`` entries.
        about: one line for reports: what is run.
        plan: ``rows -> what is run`` (JSON-ready, recorded in data/forward/record.json).
        run: ``(path, params, x) -> y`` in ``x``'s row order, whatever order or grouping
            the path was run in.
    """

    name: str
    about: str
    plan: Callable[[int], dict[str, Any]]
    run: Callable[[Forward, Any, Any], Any]


def permutation(rows: int) -> np.ndarray:
    """The fixed permutation: the rows reversed (row ``i`` of the permuted batch is row
    ``rows - 1 - i``). Deterministic, so every run and every path sees the same one, and
    it moves every row of a batch of 2 or more but the middle one of an odd count."""
    return np.arange(rows)[::-1].copy()


def split_at(rows: int) -> int:
    """Where the batch is split: the first half is ``x[:rows // 2]``."""
    return rows // 2


def _permuted(path: Forward, params: Any, x: Any) -> Any:
    import jax.numpy as jnp

    from vmapcheck.core.contract import rows, take

    order = permutation(rows(x))
    out = path(params, take(x, order))
    return jnp.asarray(out)[np.argsort(order)]  # back to x's row order


def _split(path: Forward, params: Any, x: Any) -> Any:
    import jax.numpy as jnp

    from vmapcheck.core.contract import rows, take

    k = split_at(rows(x))
    first, second = path(params, take(x, slice(None, k))), path(params, take(x, slice(k, None)))
    return jnp.concatenate([jnp.asarray(first), jnp.asarray(second)])


REGROUPINGS: dict[str, Regrouping] = {
    g.name: g
    for g in [
        Regrouping(
            "permuted",
            "the batch's rows in reversed order, run as one batch, un-permuted",
            lambda rows: {"order": permutation(rows).tolist()},
            _permuted,
        ),
        Regrouping(
            "split",
            "the batch split in two halves, x[:rows // 2] and x[rows // 2:], each run "
            "as a batch of its own, concatenated",
            lambda rows: {"halves": [[0, split_at(rows)], [split_at(rows), rows]]},
            _split,
        ),
    ]
}


def applies(case: Case | CaseEntry, name: str = "") -> bool:
    """Whether ``case`` (a case or its manifest entry) is regrouped: its kind
    (:data:`~vmapcheck.core.cases.CASE_KINDS`) is judged on its outputs and takes a
    batch, and the batch has at least 2 rows (one row has no batch-mates)."""
    from vmapcheck.core.cases import case_rows, kind_of

    kind = kind_of(case, name)
    if not (kind.valid and kind.takes == "batch"):
        return False
    return case_rows(case) >= 2


def composition_key(case: str, path: str, regrouping: str) -> str:
    """Key of one output in data/forward/composition.npz: ``standard.vmap_jit.split``."""
    return f"{output_key(case, path)}.{regrouping}"


def composition_line(case: str, by_path: dict[str, dict[str, Any]]) -> str:
    """The verdict line of one case's composition check, as the check stage and
    ``vmapcheck.testing`` print it; ``by_path``: path -> {"passed", ...}."""
    failed = [path for path, result in by_path.items() if not result["passed"]]
    return f"  {'FAIL' if failed else 'ok  '} composition      {case}: " + (
        f"outputs depend on batch composition in {', '.join(failed)}"
        if failed
        else f"{len(by_path)} paths agree with themselves {' and '.join(REGROUPINGS)}"
    )
