"""The two reports later stages read by key: ``data/forward/record.json`` (what each
path did with each case) and ``reports/check_details.json`` (the check's verdict).

One typed schema for each, used by every module that writes or reads them. Reading
goes through :func:`read_record` / :func:`read_check_details`, which refuse a file
missing a top-level key (an older or foreign file) with an error naming the file and
the key, instead of a ``KeyError`` deep in a later stage.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations (as strings, every key counted as required: a report without
# `composition` or `budget`, written before they existed, was refused).
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar, cast

from vmapcheck.core.record import ForwardRecord
from vmapcheck.errors import ArtifactError
from vmapcheck.io import read_json


class Comparison(TypedDict):
    """One comparison under the rule of :mod:`vmapcheck.core.compare`."""

    max_abs: float | None
    max_rel: float | None
    passed: bool
    reason: str


class CaseReport(TypedDict):
    """One valid case: every pair of paths, the oracle, the contract, finiteness."""

    kind: str
    shape: list[int]
    about: str
    max_abs: float | None
    max_rel: float | None
    contract: dict[str, list[str]]  # path -> problems (empty: kept the contract)
    finite: dict[str, bool]
    pairs: dict[str, Comparison]  # "<path>-vs-<path>" -> comparison
    oracle: NotRequired[dict[str, Comparison]]
    loss: NotRequired[dict[str, float]]
    # What a budget capped on this case: "oracle", "magnitude" or a path ->
    # {"rows_run", "rows_of", "capped_by"}; absent when nothing was capped.
    capped: NotRequired[dict[str, dict[str, Any]]]
    passed: bool


class NegativeReport(TypedDict):
    """One invalid case: did every path refuse it with the expected message?"""

    about: str
    expect: list[str]
    runs_on: str
    passed: bool
    paths: dict[str, dict[str, Any]]


class CheckDetails(TypedDict):
    """``reports/check_details.json``, written by the check stage."""

    passed: bool
    failures: list[str]
    dtype: str
    tolerance: dict[str, float]
    cross_run_tolerance: dict[str, float]
    oracle: str
    runtime: dict[str, Any]
    not_provided: dict[str, str]
    sharded: dict[str, Any] | None
    cases: dict[str, CaseReport]
    negative: dict[str, NegativeReport]
    reference: dict[str, Any]
    gradients: dict[str, Any]
    inputs: dict[str, Any]
    # case -> path -> {<regrouping>: Comparison with the path's own outputs on the
    # original batch, "passed"} (vmapcheck.core.composition); absent when not judged.
    composition: NotRequired[dict[str, dict[str, dict[str, Any]]]]
    # The budgets (vmapcheck.config.BudgetConfig) and, per case, what each capped:
    # {"limits": {key: rows}, "cases": {case: {"oracle" | "magnitude" | "<path>" |
    # "gradients": {"rows_run", "rows_of", "capped_by"}}}}.
    budget: NotRequired[dict[str, Any]]
    # Added by the check stage after judging: what `make reference` verifies.
    config_digest: NotRequired[str]
    forward_outputs_sha256: NotRequired[str]


# A TypeVar, not `def _read[T]`: PEP 695 syntax needs Python 3.12, vmapcheck runs on 3.11.
_T = TypeVar("_T")


def _read(path: Path, schema: type[_T]) -> _T:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(data).__name__}")
    missing = sorted(schema.__required_keys__ - set(data))  # type: ignore[attr-defined]
    if missing:
        raise ArtifactError(
            f"{path}: expected the keys of a {schema.__name__}, missing {', '.join(missing)} "
            "(written by an older vmapcheck? rerun `dvc repro`)"
        )
    return cast(_T, data)


def read_record(path: Path) -> ForwardRecord:
    """``data/forward/record.json``, its top-level keys checked."""
    return _read(path, ForwardRecord)


def read_check_details(path: Path) -> CheckDetails:
    """``reports/check_details.json``, its top-level keys checked."""
    return _read(path, CheckDetails)
