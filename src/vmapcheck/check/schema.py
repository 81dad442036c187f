"""The reports later stages read by key: ``data/forward/record.json`` (what each path
did with each case), ``reports/check_details.json`` (the check's verdict) and
``reports/diagnosis.json`` (where a failed check first diverged).

One typed schema for each, used by every module that writes or reads them. Reading
goes through :func:`read_record` / :func:`read_check_details` / :func:`read_diagnosis`,
which refuse a file missing a key its type requires (an older or foreign file), at
every level the type describes, with an error naming the file and the key's path,
instead of a ``KeyError`` deep in a later stage.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations (as strings, every key counted as required: a report without
# `composition` or `budget`, written before they existed, was refused).
from pathlib import Path
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    TypedDict,
)

from vmapcheck.core.record import (
    BitwiseReport,
    Capped,
    Comparison,
    ForwardRecord,
    MeshRecord,
    NanProbe,
    RuntimeRecord,
    ToleranceRecord,
    ToleranceUsed,
)
from vmapcheck.io import read_json_typed


class RuleRecord(TypedDict):
    """A case rule's result (:class:`vmapcheck.check.rules.RuleResult`, as JSON)."""

    passed: bool
    figures: dict[str, float | None]
    text: str
    failures: NotRequired[list[str]]


class JudgedBy(TypedDict):
    """The rule a case's pairs were judged by (``"output"`` or ``"terms"``), the
    primitives whose terms' magnitude fell back to |y| (vmapcheck.core.magnitude), and
    why the magnitude could not be had, when its forward failed."""

    rule: str
    fallbacks: list[str]
    magnitude_error: NotRequired[str]


class BuiltinFields(TypedDict, total=False):
    """What the built-in rules (:attr:`vmapcheck.check.rules.CaseRule.every_case`) record
    in a case's own fields (:attr:`vmapcheck.check.rules.RuleResult.fields`): the one
    type where they are made, in :class:`CaseReport` (which extends it) and where the
    report reads them. ``finite`` (rule ``finite``, which judges every valid case):
    path -> its output finite on every row; ``non_finite_rows``: path -> the rows (batch
    axis 0) with a NaN or Inf, only where any."""

    finite: dict[str, bool]
    non_finite_rows: dict[str, list[int]]


class CaseReport(BuiltinFields):
    """One valid case: every pair of paths, the oracle, the contract, finiteness (the
    built-in rules' fields, :class:`BuiltinFields`), and the rules its kind adds."""

    kind: str
    shape: Any  # a list of ints, or per leaf (a dict contract)
    about: str
    max_abs: float | None
    max_rel: float | None
    contract: dict[str, list[str]]  # path -> problems (empty: kept the contract)
    pairs: dict[str, Comparison]  # "<path>-vs-<path>" -> comparison
    # JudgedBy and WorstElement (vmapcheck.check.checks): the check writes them all,
    # and the readers take a report older than them.
    rule: NotRequired[str]
    fallbacks: NotRequired[list[str]]
    magnitude_error: NotRequired[str]
    bound_ratio: NotRequired[float | None]
    scale_at_worst: NotRequired[float | None]
    worst_pair: NotRequired[str | None]
    oracle: NotRequired[dict[str, Comparison]]
    # Why the float64 oracle judged nothing (its output is not float64), where so.
    oracle_not_judged: NotRequired[str]
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


class LossAgainstReference(TypedDict):
    """A case's loss (mean squared error against its targets) on the stored reference
    and recomputed now by the plain path, and whether they agree within the
    cross-run tolerance."""

    reference: float
    current: float
    passed: bool


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
    tolerance_used: NotRequired[ToleranceRecord]
    rules: NotRequired[dict[str, JudgedBy]]  # case -> the rule its outputs were judged by
    cases: NotRequired[dict[str, dict[str, Comparison]]]  # case -> path -> comparison
    losses: NotRequired[dict[str, LossAgainstReference]]  # case -> its loss, both runs
    max_abs: NotRequired[float | None]
    max_rel: NotRequired[float | None]


class GradientsReport(TypedDict):
    """The gradient probe (the forward record's ``gradients``) judged: finite, the NaN
    probe detected, per-example mean against the batch gradient per leaf."""

    status: str  # "ok", "not run", or "error" (the probe raised: ``error`` says why)
    passed: bool
    error: NotRequired[str]
    # The probe's own figures (vmapcheck.core.record.GradientProbe), when it ran.
    loss: NotRequired[float]
    loss_finite: NotRequired[bool]
    grads_finite: NotRequired[bool]
    per_example_finite: NotRequired[bool]
    nan_probe: NotRequired[NanProbe]
    nonfinite_leaves: NotRequired[list[str]]
    case: NotRequired[str]
    rows: NotRequired[int]
    capped: NotRequired[Capped]
    per_example_vs_batch: NotRequired[dict[str, Comparison]]
    max_abs: NotRequired[float | None]
    max_rel: NotRequired[float | None]
    bound_ratio: NotRequired[float | None]
    scale_at_worst: NotRequired[float | None]
    worst_pair: NotRequired[str | None]


class InputStage(TypedDict):
    """One diagnosis stage judged as a check (:func:`vmapcheck.check.probes.judge_inputs`)."""

    status: str  # a StageStatus, or "not run"
    summary: str


class InputsReport(TypedDict):
    """The diagnosis stages judged as checks: ``status`` ("ok", "not run"), one
    :class:`InputStage` per stage given (the key stream, the only one the pipeline
    gives: :func:`vmapcheck.check.diagnosis.inputs.key_stream_stage`), and ``passed``."""

    status: str
    key_stream: NotRequired[InputStage]
    passed: bool


class BudgetReport(TypedDict):
    """The budgets (vmapcheck.config.BudgetConfig; None: the Python API, none) and, per
    case, what each capped."""

    limits: dict[str, int] | None
    cases: dict[str, dict[str, Capped]]  # case -> what (a path, the gradients, ...) -> cap


class CheckFinding(TypedDict):
    """One failure line of the check and its kind (:data:`vmapcheck.check.kinds.
    FINDING_KINDS`): ``fails`` when the kind is in ``verdict.fail_on``, else it is
    reported only."""

    kind: str
    line: str
    fails: bool


class CheckDetails(TypedDict):
    """``reports/check_details.json``, written by the check stage."""

    passed: bool
    failures: list[str]  # the lines of the findings that fail the verdict
    # Every finding, each with its kind; the kinds that fail (verdict.fail_on). Absent
    # in reports older than the kinds.
    findings: NotRequired[list[CheckFinding]]
    fail_on: NotRequired[list[str]]
    dtype: str
    tolerance: ToleranceRecord
    cross_run_tolerance: ToleranceRecord
    oracle: str
    runtime: RuntimeRecord  # vmapcheck.core.runtime.RuntimeInfo
    not_provided: dict[str, str]
    sharded: MeshRecord | None
    # Every distributed path's mesh (vmapcheck.core.paths.describe_meshes); absent in
    # reports older than the mesh paths.
    meshes: NotRequired[dict[str, MeshRecord]]
    cases: dict[str, CaseReport]
    negative: dict[str, NegativeReport]
    reference: ReferenceReport
    gradients: GradientsReport
    inputs: InputsReport
    # case -> path -> {<regrouping>: Comparison with the path's own outputs on the
    # original batch, "passed"} (vmapcheck.core.composition); absent when not judged.
    # A plain mapping: keys named by the REGROUPINGS registry beside "passed" and
    # "rows", which a TypedDict cannot hold both of (PEP 728, not in this mypy).
    composition: NotRequired[dict[str, dict[str, dict[str, Any]]]]
    budget: NotRequired[BudgetReport]
    # Bitwise batch invariance (vmapcheck.core.bitwise); absent when not measured.
    bitwise: NotRequired[BitwiseReport]
    # Added by the check stage after judging: what `make reference` verifies.
    config_digest: NotRequired[str]
    forward_outputs_sha256: NotRequired[str]


class AgreedLayer(TypedDict):
    """A layer before the first divergence, where every pair of paths still agreed, and
    how close they came (the largest over the pairs)."""

    layer: str
    max_abs: float | None
    max_ulp: int | None


class Finding(TypedDict):
    """Where a diagnosis stage saw the first divergence
    (:func:`vmapcheck.check.diagnosis.subject.make_finding`): every key below present,
    None where it does not apply to the stage."""

    stage: str
    message: str
    what: str | None  # the kind of divergence ("activation", "path raised", ...)
    input: str | None  # the probe it was seen on
    layer: str | None
    leaf: str | None
    params_leaves: list[str] | None  # the params leaves feeding the layer
    paths: list[str] | None
    pair: str | None  # "<left>-vs-<right>"
    element: list[int] | None  # the worst element's index
    # The measurement at the divergence (vmapcheck.core.record.Measurement), the
    # deciding figure first: the largest |a - b| over its allowed error (a finding
    # written before it was kept lacks it: still read).
    bound_ratio: NotRequired[float | None]
    max_abs: float | None
    max_rel: float | None
    max_ulp: int | None
    ulp_dtype: str | None
    tolerance: ToleranceUsed | None
    # A stage's own: the draw of a reused key, the feature, what was expected and found,
    # each path's dtype, the layers that agreed before it, notes on what it rules out.
    key: NotRequired[str]
    feature: NotRequired[str | None]
    expected: NotRequired[Any]
    found: NotRequired[Any]
    changed: NotRequired[Any]
    dtypes: NotRequired[dict[str, str]]
    agreed_before: NotRequired[list[AgreedLayer]]
    notes: NotRequired[list[str]]


class Evidence(TypedDict, total=False):
    """One observation of a diagnosis stage (a ``StageResult``'s ``evidence``): what was
    looked at and whether it held (None: could not be looked at, ``reason`` says why;
    absent where the observation is a status: the stored reference's),
    with the figures of the comparison where one was made (a :class:`vmapcheck.core.
    record.Measurement`, or :func:`vmapcheck.core.compare.exact`'s), and a stage's own
    details (the pair, the path and its output's shape and dtype, what was expected and
    found, the correlation of two draws over ``values`` values)."""

    what: Required[str]
    passed: bool | None
    status: str  # the stored reference's, when not "ok"
    reason: str | None
    pair: str
    path: str
    shape: list[int]
    dtype: str
    expected: Any  # the leaf's {"shape", "dtype"}
    found: Any
    correlation: float
    values: int
    # A case's loss on the stored reference and now (LossAgainstReference).
    reference: float
    current: float
    # The comparison's figures (vmapcheck.core.record.Measurement).
    max_abs: float | None
    max_rel: float | None
    rule: str
    bound_ratio: float | None
    element: list[int] | None
    scale_at_worst: float | None
    rows: int
    terms_rows: int
    stored_path: str
    same_non_finite_rows: list[int]
    max_ulp: int | None
    ulp_dtype: str | None
    tolerance: ToleranceUsed
    non_finite: dict[str, int]


class ProbeRecord(TypedDict):
    """A probe the diagnosis ran on (``inputs`` of diagnosis.json): its label, its rows
    and whether it has targets (the gradients' stage needs them)."""

    label: str
    rows: int
    targets: bool


StageStatus = Literal["ruled_out", "diverged", "skipped", "error"]


class StageResult(TypedDict):
    """One stage of the diagnosis protocol
    (:func:`vmapcheck.check.diagnosis.subject.stage_result`)."""

    stage: str
    title: str
    status: StageStatus
    summary: str
    finding: Finding | None  # when it diverged
    # What the stage looked at, one entry per observation (its own keys per stage).
    evidence: list[Evidence]


class DiagnosisTolerance(TypedDict):
    """The tolerances a diagnosis compared at: the run's own, never widened."""

    between_paths: ToleranceRecord
    cross_run: ToleranceRecord
    note: NotRequired[str]  # what "never widened" means, in words


class DiagnosisReport(TypedDict):
    """``reports/diagnosis.json`` (:mod:`vmapcheck.check.diagnosis.protocol`): the
    protocol's report, or the short one of a check that passed (``not needed``) or of a
    diagnosis that could not run (``error``)."""

    status: Literal["diverged", "no divergence found", "not needed", "error"]
    trigger: str
    first_divergence: Finding | None
    ruled_out: list[dict[str, str]]  # {"stage", "title", "evidence"}
    skipped: list[dict[str, str]]  # {"stage", "why"}
    not_reached: list[str]
    stages: list[StageResult]
    summary: str  # the readable text, written beside it as diagnosis.txt
    # The protocol's run: what it diagnosed, and under which settings.
    check_failed: NotRequired[bool | None]
    model: NotRequired[str]
    dtype: NotRequired[str]
    tolerance: NotRequired[DiagnosisTolerance]
    activations: NotRequired[str]
    not_provided: NotRequired[dict[str, str]]
    inputs: NotRequired[list[ProbeRecord]]  # the probes
    check_passed: NotRequired[bool]  # "not needed"
    error: NotRequired[str]  # "error": why the protocol could not run


class ReplacedReference(TypedDict):
    """What a reference replaced (``replaces`` of its meta.json), each key as the old
    meta.json held it (None where it had none)."""

    created_at: str | None
    reason: str | None
    from_run: str | None
    runtime: RuntimeRecord | None
    dtype: str | None


class ComparisonWithReplaced(TypedDict):
    """How the run that became the reference compared with the one it replaced (the
    check's ``reference`` section; None where it had no such key: a missing one)."""

    status: str | None
    passed: bool | None
    message: str | None


class ReferenceCase(TypedDict):
    """A case the reference stores (its ``x`` and ``y`` in inputs.npz)."""

    kind: str  # a CASE_KINDS entry (vmapcheck.core.cases)
    shape: Any  # x's shape: a list of ints, or per leaf


class ReferenceMeta(TypedDict):
    """``data/reference/<model>/meta.json`` (:func:`vmapcheck.check.reference.
    make_reference`): when, from which run and why the reference was made, what with,
    the tolerances, the config digest and the sha256 of every file."""

    model: str
    created_at: str  # ISO 8601, UTC
    reason: str
    from_run: str | None  # the MLflow run whose outputs it stores, when tracked
    git: dict[str, str]  # vmapcheck.provenance.git_state
    replaces: ReplacedReference | None  # None: the model's first reference
    comparison_with_replaced: ComparisonWithReplaced
    runtime: RuntimeRecord
    dtype: str
    tolerance: ToleranceRecord
    cross_run_tolerance: ToleranceRecord
    config_digest: str
    params_sha256: str
    cases: dict[str, ReferenceCase]
    losses: dict[str, float]  # case -> its mean squared error on the plain path
    sha256: dict[str, str]  # file -> digest (vmapcheck.check.reference.FILES)


def read_reference_meta(path: Path) -> ReferenceMeta:
    """A reference's ``meta.json``, its keys checked down to each case."""
    return read_json_typed(path, ReferenceMeta)


def read_record(path: Path) -> ForwardRecord:
    """``data/forward/record.json``, its top-level keys checked."""
    return read_json_typed(path, ForwardRecord)


def read_check_details(path: Path) -> CheckDetails:
    """``reports/check_details.json``, its top-level keys checked."""
    return read_json_typed(path, CheckDetails)


def read_diagnosis(path: Path) -> DiagnosisReport:
    """``reports/diagnosis.json``, its keys checked down to each stage's finding."""
    return read_json_typed(path, DiagnosisReport)
