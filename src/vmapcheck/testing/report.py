"""The Python API's report (:mod:`vmapcheck.testing`): per-pair figures over the caller's
examples and, apart, over the edge cases; the verdict as the pipeline prints it; the
error a failed check raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vmapcheck.check.schema import CheckDetails
from vmapcheck.config import PrecisionConfig
from vmapcheck.core.bitwise_verdict import PathBitwise, marked_line, per_path
from vmapcheck.core.cases import kind_of

if TYPE_CHECKING:
    from vmapcheck.core.models import Model

# The failures an AssertionError lists, like the pipeline's verdict (`vmapcheck summary`);
# every one is in the report's ``failures``.
SHOWN_FAILURES = 10


@dataclass(frozen=True)
class PairFigures:
    """One pair of paths, its worst figures over a group of cases (the examples the
    caller passed, or the edge cases), each figure with the case it comes from.

    ``pair``: ``"<pathA>-vs-<pathB>"`` as the check names it (``one_jit-vs-single.
    vmap_jit``: ``forward_one`` on the first example against row 0 of a batch path on the
    batch of one). ``bound_ratio``: the largest fraction of its bound that a difference
    uses (``compare``'s ``bound_ratio``; at most 1 when they agree), reached on case
    ``case``; ``max_rel`` / ``max_abs``: the largest errors, reached on ``max_rel_case`` /
    ``max_abs_case`` (a figure is never shown beside another case's name: a
    large_magnitude case's absolute error of 1e12 is its own); ``passed``: agreed on
    every case of the group.
    """

    pair: str
    max_abs: float | None
    max_rel: float | None
    bound_ratio: float | None
    case: str | None
    passed: bool
    max_abs_case: str | None = None
    max_rel_case: str | None = None

    def __str__(self) -> str:
        """``bound_ratio=0.031 (examples) max_rel=2.1e-07 (single) max_abs=2.4e-07
        (examples)``: the deciding figure first, each with its case."""
        from vmapcheck.report.elements import figure_text  # no JAX at import (module doc)

        return figure_text(
            self.bound_ratio,
            self.max_rel,
            self.max_abs,
            cases=(self.case, self.max_rel_case, self.max_abs_case),
        )


@dataclass(frozen=True)
class FindingLine:
    """One finding of the check: its ``kind`` (``batching``, ``numerical``, ``model`` or
    ``contract``: :data:`vmapcheck.check.kinds.FINDING_KINDS`), the ``line`` in the
    pipeline's wording, and whether it ``fails`` the verdict (its kind is in
    ``fail_on``)."""

    kind: str
    line: str
    fails: bool

    def __str__(self) -> str:
        from vmapcheck.check.kinds import tagged  # no JAX at import (module doc)

        return tagged({"kind": self.kind, "line": self.line, "fails": self.fails})


@dataclass(frozen=True)
class GradientFigures:
    """The loss and gradient check (``gradients=True``), as the pipeline's check judges
    the forward stage's gradient probe (:func:`vmapcheck.core.gradients.gradient_probe`)
    on the caller's examples.

    ``checked``: False when ``gradients=False`` left it out (every other figure None or
    empty). ``passed``: the loss and every gradient finite, the mean of the
    per-example gradients within ``tolerance`` of the batch gradient on every leaf, and
    the NaN planted in one target not masked. ``loss``: the mean squared error of
    ``forward_one`` against the targets over the examples; ``loss_finite``,
    ``grads_finite`` (the batch gradient), ``per_example_finite`` (the per-example
    gradients under vmap); ``nonfinite_leaves``: the trainable leaves whose gradients
    hold NaN or Inf, in tree order. ``leaves``: leaf -> ``{"bound_ratio", "max_rel",
    "max_abs", "passed"}`` of the per-example mean against the batch gradient;
    ``worst_leaf`` the leaf of the largest ``bound_ratio`` (at most 1 when they agree),
    ``max_rel`` / ``max_abs`` the largest over the leaves.
    """

    checked: bool
    passed: bool
    loss: float | None = None
    loss_finite: bool | None = None
    grads_finite: bool | None = None
    per_example_finite: bool | None = None
    nonfinite_leaves: tuple[str, ...] = ()
    leaves: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    worst_leaf: str | None = None
    bound_ratio: float | None = None
    max_rel: float | None = None
    max_abs: float | None = None


# The summary's line when gradients=False left the check out.
GRADIENTS_NOT_CHECKED = "  -    gradients: not checked (gradients=False)"


def _gradient_figures(details: CheckDetails, checked: bool) -> GradientFigures:
    grads = details["gradients"]
    if not checked or grads.get("status") == "not run":
        return GradientFigures(checked=False, passed=bool(grads["passed"]))
    leaves = grads.get("per_example_vs_batch") or {}
    return GradientFigures(
        checked=True,
        passed=bool(grads["passed"]),
        loss=grads.get("loss"),
        loss_finite=grads.get("loss_finite"),
        grads_finite=grads.get("grads_finite"),
        per_example_finite=grads.get("per_example_finite"),
        nonfinite_leaves=tuple(grads.get("nonfinite_leaves") or ()),
        leaves={
            leaf: {k: r.get(k) for k in ("bound_ratio", "max_rel", "max_abs", "passed")}
            for leaf, r in leaves.items()
        },
        worst_leaf=grads.get("worst_pair"),
        bound_ratio=grads.get("bound_ratio"),
        max_rel=grads.get("max_rel"),
        max_abs=grads.get("max_abs"),
    )


@dataclass(frozen=True)
class BatchingReport:
    """What :func:`assert_batching_consistent` found (returned when every check passed).

    Attributes:
        passed: every check passed.
        precision: the option's name (``f32``); ``dtype`` the float dtype the paths ran in;
            ``tolerance`` / ``cross_run_tolerance``: ``{"rtol", "atol", "scale"}`` used
            between paths and against the float64 oracle.
        paths: the paths run, in registry order; ``not_run``: path -> why not (not
            provided by the model, or left out by ``paths=``).
        pairs: ``"<pathA>-vs-<pathB>"`` -> :class:`PairFigures`, worst over the cases
            of the examples the caller passed (``examples``, its first row as a batch of
            one, ``single``, and unbatched, ``single_vector``), each figure naming its case.
        edge_pairs: the same over the edge cases (those of :data:`EDGE_KINDS`, with
            ``edge_cases=True``; else empty): reported apart, so that an edge batch's
            figures (a large_magnitude case's absolute errors) never read as the
            examples'.
        oracle: path -> worst ``max_rel`` against the float64 oracle over the examples'
            cases (empty for f64); ``edge_oracle`` the same over the edge cases.
        composition: path -> regrouping (``permuted``, ``split``) -> ``max_abs`` of the
            path's outputs on the regrouped batch against its own on the batch as given,
            over the examples' cases; ``edge_composition`` the same over the edge cases.
        refused / invalid_total: invalid inputs refused by every path, of how many.
        gradients: the loss and gradient check (:class:`GradientFigures`): finite loss
            and gradients, the worst per-example-vs-batch figure by leaf; its
            ``checked`` is False with ``gradients=False``.
        failures: every failed check, in the pipeline's wording (the lines of the
            findings that fail).
        findings: every finding, failing or reported, each with its kind
            (:class:`FindingLine`); ``kinds``: kind -> how many, of those that fail.
        summary: the verdict as text (the lines an AssertionError shows).
        details: the check's whole report, as ``reports/check_details.json`` holds it
            for a pipeline run (:class:`vmapcheck.check.schema.CheckDetails`).
        bitwise: batch path -> :class:`~vmapcheck.core.bitwise_verdict.PathBitwise`, its bitwise
            batch invariance on the examples (empty with ``bitwise="off"``); the whole
            measurement, argmax flips over every path included, is ``details["bitwise"]``.
    """

    passed: bool
    precision: str
    dtype: str
    tolerance: Mapping[str, Any]
    cross_run_tolerance: Mapping[str, Any]
    paths: tuple[str, ...]
    not_run: Mapping[str, str]
    pairs: Mapping[str, PairFigures]
    oracle: Mapping[str, float]
    composition: Mapping[str, Mapping[str, float | None]]
    refused: int
    invalid_total: int
    failures: tuple[str, ...]
    summary: str = field(repr=False)
    details: CheckDetails = field(repr=False)
    edge_pairs: Mapping[str, PairFigures] = field(default_factory=dict)
    edge_oracle: Mapping[str, float] = field(default_factory=dict)
    edge_composition: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    findings: tuple[FindingLine, ...] = ()

    @property
    def kinds(self) -> dict[str, int]:
        """Kind -> how many findings of it fail the verdict (only the kinds found)."""
        counts: dict[str, int] = {}
        for f in self.findings:
            if f.fails:
                counts[f.kind] = counts.get(f.kind, 0) + 1
        return counts

    gradients: GradientFigures = field(
        default_factory=lambda: GradientFigures(checked=False, passed=True)
    )
    bitwise: Mapping[str, PathBitwise] = field(default_factory=dict)

    @property
    def worst(self) -> PairFigures | None:
        """The pair closest to (or furthest past) its bound: the largest ``bound_ratio``,
        over :attr:`pairs` and :attr:`edge_pairs` (its ``case`` says which)."""
        judged = [
            (ratio, p)
            for p in (*self.pairs.values(), *self.edge_pairs.values())
            if (ratio := p.bound_ratio) is not None
        ]
        worst = max(judged, key=lambda judged_pair: judged_pair[0], default=None)
        return worst[1] if worst else None

    @property
    def worst_bound_ratio(self) -> float | None:
        """The largest fraction of its bound used, over every pair and case."""
        worst = self.worst
        return worst.bound_ratio if worst is not None else None

    def __str__(self) -> str:
        return self.summary


class BatchingCheckError(AssertionError):
    """A batching check failed. The message is the verdict in the pipeline's wording
    (:attr:`BatchingReport.summary`): the forms, backend and tolerance; the first pair of
    paths that disagrees and the paths that disagree with the plain loop; one line per
    case (``[shape] worst pair: max_abs= max_rel= (<fraction> of its bound, rule ...)``);
    the invalid inputs refused; then the first ten ``failure:`` lines of the check.
    ``report`` holds every figure and every failure."""

    def __init__(self, report: BatchingReport) -> None:
        super().__init__(report.summary)
        self.report = report


def _pair_figures(details: CheckDetails, cases: Iterable[str]) -> dict[str, PairFigures]:
    """Every pair's worst figures over ``cases`` (names of ``details["cases"]``), each
    figure with the case where it was reached."""
    merged: dict[str, dict[str, Any]] = {}
    for case_name in cases:
        for pair, result in details["cases"][case_name]["pairs"].items():
            entry = merged.setdefault(pair, {"ok": True})
            for stat, where in (
                ("max_abs", "max_abs_case"),
                ("max_rel", "max_rel_case"),
                ("bound_ratio", "case"),
            ):
                value = result.get(stat)
                if value is not None and (entry.get(stat) is None or value > entry[stat]):
                    entry[stat], entry[where] = value, case_name
            if not result["passed"]:
                entry["ok"] = False
                entry["case"] = entry.get("case") or case_name
    return {
        pair: PairFigures(
            pair=pair,
            max_abs=e.get("max_abs"),
            max_rel=e.get("max_rel"),
            bound_ratio=e.get("bound_ratio"),
            case=e.get("case"),
            passed=e["ok"],
            max_abs_case=e.get("max_abs_case"),
            max_rel_case=e.get("max_rel_case"),
        )
        for pair, e in merged.items()
    }


def _oracle_figures(details: CheckDetails, cases: Iterable[str]) -> dict[str, float]:
    """Every path's worst ``max_rel`` against the float64 oracle over ``cases``."""
    oracle: dict[str, float] = {}
    for case_name in cases:
        for path, result in details["cases"][case_name].get("oracle", {}).items():
            if (max_rel := result.get("max_rel")) is not None:
                oracle[path] = max(oracle.get(path, 0.0), max_rel)
    return oracle


def _composition_figures(
    details: CheckDetails, cases: Iterable[str]
) -> dict[str, dict[str, float | None]]:
    """Every batch path's worst ``max_abs`` against itself regrouped, per regrouping,
    over ``cases``."""
    composition: dict[str, dict[str, float | None]] = {}
    judged = details.get("composition", {})
    for case_name in cases:
        for path, result in judged.get(case_name, {}).items():
            into = composition.setdefault(path, {})
            for regrouping, figures in result.items():
                if regrouping == "passed":
                    continue
                value = figures.get("max_abs")
                before = into.get(regrouping)
                into[regrouping] = (
                    value if before is None else before if value is None else max(before, value)
                )
    return composition


def _groups(details: CheckDetails) -> tuple[list[str], list[str]]:
    """The judged cases split: (the examples the caller passed, the edge cases)."""
    cases = details["cases"]
    edge = [name for name, case in cases.items() if kind_of(case, name).edge]
    return [name for name in cases if name not in edge], edge


def first_diverging_pair(details: CheckDetails) -> str | None:
    """``"<case>/<pathA>-vs-<pathB>"``: the first pair that disagrees, in case and
    registry order (the order of the check's ``failures``); None when every pair agrees."""
    for case_name, case in details["cases"].items():
        for pair, result in case["pairs"].items():
            if not result["passed"]:
                return f"{case_name}/{pair}"
    return None


def diverging_from_plain(details: CheckDetails) -> list[str]:
    """The paths that disagree with the plain per-example path (``loop_eager``) on some
    case, in registry order: usually the culprits, since the loop sees one row at a time."""
    from vmapcheck.core.paths import PATHS, plain_path

    plain = plain_path()
    found = set()
    for case in details["cases"].values():
        for pair, result in case["pairs"].items():
            if result["passed"]:
                continue
            left, _, right = pair.partition("-vs-")
            if plain in (left, right):
                found.add(right if left == plain else left)
    return [name for name in PATHS if name in found]


def _summary(
    model: Model, details: CheckDetails, precision: PrecisionConfig, gradients: bool = True
) -> str:
    """The verdict as the pipeline prints it (``vmapcheck summary``; the composition line
    as the check stage prints it), without what this API does not run (reference,
    benchmark, MLflow), with the first diverging pair named."""
    from vmapcheck.check.kinds import finding_lines
    from vmapcheck.check.rules import summary_lines as rule_lines
    from vmapcheck.core.composition import composition_line
    from vmapcheck.core.paths import PATHS, mesh_axis_blamed, mesh_label, not_provided, plain_path
    from vmapcheck.report.check_sections import leaves_text, not_provided_lines
    from vmapcheck.report.summary import case_line, refusals_line, verdict_line

    lines = [f"{verdict_line(details)} (precision {precision.name}, vmapcheck.testing)"]
    first = first_diverging_pair(details)
    if first is not None:
        lines.append(f"  first diverging pair: {first}")
        culprits = diverging_from_plain(details)
        if culprits:
            lines.append(
                f"  disagree with {plain_path()} (the plain per-example loop): "
                + ", ".join(culprits)
            )
        # A mesh path among them: which parallelism it is (none is vmap) and the mesh
        # axis its divergence lies on, cleared along an axis another mesh path agreed on.
        meshes = details.get("meshes") or {}
        agreeing = {name for name in meshes if name not in culprits}
        for name in (c for c in culprits if c in meshes):
            axis = mesh_axis_blamed(PATHS[name], meshes[name].get("mesh_shape", {}), agreeing)
            lines.append(f"  {mesh_label(meshes[name])} diverges on {axis}")
    # Paths the model lacks, as the pipeline words them; those left out by ``paths=``
    # (also skipped by the check) on one line.
    lacking = not_provided(model)
    lines += [f"  -    {line}" for line in not_provided_lines({"not_provided": lacking})]
    left_out = [name for name in details["not_provided"] if name not in lacking]
    if left_out:
        lines.append(f"  -    left out by paths=: {', '.join(left_out)}")
    contract = model.contract
    lines.append(
        "  inputs: "
        + (
            f"one float vector ({model.in_features},)"
            if contract.flat
            else leaves_text(contract.describe())
        )
        + ", batch axis 0"
    )
    # The caller's examples first, the edge batches built from them apart: a figure of
    # one group is never read as the other's.
    examples, edges = _groups(details)
    tol = details["tolerance"]
    lines += [case_line(name, details["cases"][name], tol) for name in examples]
    if edges:
        lines.append("  edge cases (edge_cases=True), built from the examples:")
        lines += [case_line(name, details["cases"][name], tol) for name in edges]
    lines += rule_lines(details["cases"])  # the rules case kinds add
    lines += [
        composition_line(name, by_path) for name, by_path in details.get("composition", {}).items()
    ]
    lines.append(refusals_line(details["negative"]))
    if details["oracle"].startswith("not judged"):  # a stochastic model (record's keys)
        lines.append(f"  -    float64 oracle   {details['oracle']}")
    # The check stage's gradient line (the loss, the per-example mean against the batch
    # gradient), or why there is none.
    from vmapcheck.pipeline.check import gradients_line

    grads = details["gradients"]
    not_run = not gradients or grads.get("status") == "not run"
    lines.append(GRADIENTS_NOT_CHECKED if not_run else gradients_line(grads, tol))
    if "bitwise" in details:
        lines.append(marked_line(details["bitwise"]))
    findings = details.get("findings", [])
    lines += [f"  {line}" for line in finding_lines(details, SHOWN_FAILURES)]
    if len(findings) > SHOWN_FAILURES:
        lines.append(
            f"  ... and {len(findings) - SHOWN_FAILURES} more finding(s) "
            "(report.findings lists them all)"
        )
    return "\n".join(lines)


def build_report(
    model: Model,
    precision: PrecisionConfig,
    details: CheckDetails,
    selected: Sequence[str],
    gradients: bool = True,
) -> BatchingReport:
    """The report of one check; ``gradients``: whether the loss and gradients were
    checked (``gradients=False`` says so in the summary)."""
    examples, edges = _groups(details)
    negative = details["negative"]
    return BatchingReport(
        passed=bool(details["passed"]),
        precision=precision.name,
        dtype=details["dtype"],
        tolerance=details["tolerance"],
        cross_run_tolerance=details["cross_run_tolerance"],
        paths=tuple(selected),
        not_run=details["not_provided"],
        pairs=_pair_figures(details, examples),
        oracle=_oracle_figures(details, examples),
        composition=_composition_figures(details, examples),
        refused=sum(bool(n["passed"]) for n in negative.values()),
        invalid_total=len(negative),
        failures=tuple(details["failures"]),
        summary=_summary(model, details, precision, gradients),
        details=details,
        edge_pairs=_pair_figures(details, edges),
        edge_oracle=_oracle_figures(details, edges),
        edge_composition=_composition_figures(details, edges),
        findings=tuple(
            FindingLine(f["kind"], f["line"], f["fails"]) for f in details.get("findings", [])
        ),
        gradients=_gradient_figures(details, gradients),
        bitwise=per_path(details["bitwise"]) if "bitwise" in details else {},
    )
