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
from typing import (
    Any,
    NotRequired,
    TypedDict,
)

from vmapcheck.core.record import Comparison, ForwardRecord
from vmapcheck.io import read_json_typed


class RuleRecord(TypedDict):
    """A case rule's result (:class:`vmapcheck.check.rules.RuleResult`, as JSON)."""

    passed: bool
    figures: dict[str, float | None]
    text: str
    failures: NotRequired[list[str]]


class Capped(TypedDict):
    """What a budget cut: the first ``rows_run`` of ``rows_of`` rows, by ``capped_by``."""

    rows_run: int
    rows_of: int
    capped_by: str
    beyond: NotRequired[str]  # how the rows past the cap were judged


class CaseReport(TypedDict):
    """One valid case: every pair of paths, the oracle, the contract, finiteness, and
    the rules its kind adds."""

    kind: str
    shape: Any  # a list of ints, or per leaf (a dict contract)
    about: str
    max_abs: float | None
    max_rel: float | None
    contract: dict[str, list[str]]  # path -> problems (empty: kept the contract)
    finite: dict[str, bool]
    pairs: dict[str, Comparison]  # "<path>-vs-<path>" -> comparison
    # The rule the pairs were judged by, the primitives whose terms' magnitude fell back
    # to |y|, and the worst element's figures (vmapcheck.check.checks._worst_element);
    # the check writes them all, and the readers take a report older than them.
    rule: NotRequired[str]
    fallbacks: NotRequired[list[str]]
    magnitude_error: NotRequired[str]
    bound_ratio: NotRequired[float | None]
    scale_at_worst: NotRequired[float | None]
    worst_pair: NotRequired[str | None]
    oracle: NotRequired[dict[str, Comparison]]
    loss: NotRequired[dict[str, float]]
    # What a budget capped: path | "oracle" | "magnitude" -> its cap.
    capped: NotRequired[dict[str, Capped]]
    rules: NotRequired[dict[str, RuleRecord]]  # vmapcheck.check.rules
    passed: bool


class Refusal(TypedDict):
    """What one path did with an input to refuse."""

    passed: bool
    refused: bool
    error: str | None
    message: str


class NegativeReport(TypedDict):
    """One invalid case: every path it runs on must refuse it, naming the problem."""

    about: str
    expect: list[str]
    runs_on: str
    passed: bool
    paths: dict[str, Refusal]


class ReferenceReport(TypedDict):
    """The stored reference's outputs against this run's recomputation of them; only
    ``status``, ``message`` and ``passed`` where none was compared."""

    status: str  # "ok", "missing", "corrupt", ...
    message: str
    passed: bool
    required: NotRequired[bool]
    made_with: NotRequired[dict[str, str]]
    compared_with: NotRequired[dict[str, str]]
    created_at: NotRequired[str]
    reason: NotRequired[str]
    from_run: NotRequired[str | None]
    tolerance_used: NotRequired[dict[str, Any]]
    rules: NotRequired[dict[str, dict[str, Any]]]
    cases: NotRequired[dict[str, dict[str, Comparison]]]  # case -> path -> comparison
    losses: NotRequired[dict[str, dict[str, Any]]]
    max_abs: NotRequired[float | None]
    max_rel: NotRequired[float | None]


class GradientsReport(TypedDict):
    """The gradient probe (the forward record's ``gradients``) judged: finite, the NaN
    probe detected, per-example mean against the batch gradient per leaf."""

    status: str  # "ok" or "not run"
    passed: bool
    per_example_vs_batch: NotRequired[dict[str, Comparison]]
    max_abs: NotRequired[float | None]
    max_rel: NotRequired[float | None]
    bound_ratio: NotRequired[float | None]
    scale_at_worst: NotRequired[float | None]
    worst_pair: NotRequired[str | None]


class InputsReport(TypedDict):
    """The diagnosis stages judged as checks; beside these keys, one ``{"status",
    "summary"}`` per stage (the key stream)."""

    status: str
    passed: bool


class BudgetReport(TypedDict):
    """The budgets (vmapcheck.config.BudgetConfig; None: the Python API, none) and, per
    case, what each capped."""

    limits: dict[str, int] | None
    cases: dict[str, dict[str, Any]]


class CheckDetails(TypedDict):
    """``reports/check_details.json``, written by the check stage."""

    passed: bool
    failures: list[str]
    dtype: str
    tolerance: dict[str, Any]
    cross_run_tolerance: dict[str, Any]
    oracle: str
    runtime: dict[str, Any]  # vmapcheck.core.runtime.RuntimeInfo
    not_provided: dict[str, str]
    sharded: dict[str, Any] | None
    cases: dict[str, CaseReport]
    negative: dict[str, NegativeReport]
    reference: ReferenceReport
    gradients: GradientsReport
    inputs: InputsReport
    # case -> path -> {<regrouping>: Comparison with the path's own outputs on the
    # original batch, "passed"} (vmapcheck.core.composition); absent when not judged.
    composition: NotRequired[dict[str, dict[str, dict[str, Any]]]]
    budget: NotRequired[BudgetReport]
    # Added by the check stage after judging: what `make reference` verifies.
    config_digest: NotRequired[str]
    forward_outputs_sha256: NotRequired[str]


def read_record(path: Path) -> ForwardRecord:
    """``data/forward/record.json``, its top-level keys checked."""
    return read_json_typed(path, ForwardRecord)


def read_check_details(path: Path) -> CheckDetails:
    """``reports/check_details.json``, its top-level keys checked."""
    return read_json_typed(path, CheckDetails)
