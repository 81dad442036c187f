"""Print the verdict of the last pipeline run and where its MLflow run is (``make demo``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vmapcheck.bench.timing.bounds import launch_bound_text, peak_caveat, ratio_launch_bound
from vmapcheck.bench.timing.budget import budget_caveat
from vmapcheck.bench.timing.records import BenchDetails, read_bench_details
from vmapcheck.check.kinds import finding_lines, verdict_words
from vmapcheck.check.rules import summary_lines as rule_lines
from vmapcheck.check.schema import (
    CaseReport,
    CheckDetails,
    NegativeReport,
    ReferenceReport,
    read_check_details,
)
from vmapcheck.core.paths import speedup_text
from vmapcheck.io import read_json_object
from vmapcheck.layout import Layout
from vmapcheck.report.check_sections import (
    budget_lines,
    leaves_text,
    not_provided_lines,
    verdict_sentence,
)
from vmapcheck.report.elements import atol_decided, figure_text, shape_text
from vmapcheck.report.headline import batch_from_label, bench_headline, noisy_caveat

if TYPE_CHECKING:
    from vmapcheck.core.record import Comparison


def verdict_line(check: CheckDetails, bench: BenchDetails | None = None) -> str:
    """The first line: PASSED or FAILED and the verdict's sentence (the forms compared,
    backend and device (its memory and libtpu or CUDA plugin where recorded: nothing
    more on CPU), dtype, tolerance, JAX: :func:`verdict_sentence`); and the caveats of a
    benchmark timed on a busy machine and of one whose time budget left paths untimed
    (``bench``: bench_details.json)."""
    caveats = [noisy_caveat(bench or {}), bench_budget_caveat(bench)]
    return f"verdict: {verdict_words(check)} - {verdict_sentence(check)}" + "".join(
        f"; {caveat}" for caveat in caveats if caveat
    )


def bench_budget_caveat(bench: BenchDetails | None) -> str | None:
    """The caveat of a bench whose time budget left paths untimed: too little to compare
    speeds when no headline speed-up was measured (:func:`budget_caveat`)."""
    if not bench:
        return None
    return budget_caveat(bench, measured=bool(bench_headline(bench)["speedups"]))


def case_line(name: str, case: CaseReport, tolerance: Mapping[str, Any] | None = None) -> str:
    """One regression case: its worst pair's bound ratio first (the fraction of its bound
    used: it decides; ``(atol decided)`` where the bound there is mostly atol, given the
    ``tolerance`` it was judged at), then max_rel and max_abs; the float64 oracle."""
    if case["max_abs"] is None:
        return f"  FAIL {name:<16} no comparable outputs"
    oracle = [r["max_rel"] for r in case.get("oracle", {}).values() if r["max_rel"] is not None]
    # The rows with a NaN/Inf on every path, apart from the figures of the others.
    everywhere = non_finite_everywhere(case)
    figures = figure_text(
        case.get("bound_ratio"),
        case["max_rel"],
        case["max_abs"],
        decided_by_atol=tolerance is not None
        and atol_decided(tolerance, case.get("scale_at_worst")),
    )
    return (
        f"  {'ok  ' if case['passed'] else 'FAIL'} {name:<16} [{shape_text(case['shape'])}] "
        f"worst pair: {figures}"
        + (f" (rule {case.get('rule')})" if case.get("bound_ratio") is not None else "")
        + (f"; vs float64: max_rel={max(oracle):.3g}" if oracle else "")
        + (
            "; vs float64: not judged (the output under x64 is not float64)"
            if case.get("oracle_not_judged")
            else ""
        )
        + (f"; non-finite on every path: row(s) {everywhere}" if everywhere else "")
    )


def non_finite_everywhere(case: CaseReport) -> str:
    """The rows non-finite on every path of a case, as text (``3, 7``); "" when none."""
    by_path = case.get("non_finite_rows", {})
    if not by_path or len(by_path) < len(case.get("finite", {})):
        return ""
    common = sorted(set.intersection(*(set(rows) for rows in by_path.values())))
    return ", ".join(str(r) for r in common)


def reference_line(reference: ReferenceReport) -> str:
    """The stored reference's line; a failed comparison adds its worst figure: the case
    and path furthest from the stored outputs, by the fraction of the cross-run bound."""
    line = f"  {'ok  ' if reference['passed'] else 'FAIL'} reference        {reference['message']}"
    worst: tuple[str, str, Comparison] | None = None
    worst_ratio = 0.0
    for case, by_path in reference.get("cases", {}).items():
        for path, result in by_path.items():
            ratio = result.get("bound_ratio")
            if ratio is not None and (worst is None or ratio > worst_ratio):
                worst, worst_ratio = (case, path, result), ratio
    if reference["passed"] or worst is None:
        return line
    case, path, result = worst
    figures = figure_text(result["bound_ratio"], result["max_rel"], result["max_abs"])
    return f"{line}; worst: {case}/{path} {figures} (rule {result.get('rule')})"


def refusals_line(negative: Mapping[str, NegativeReport]) -> str:
    """How many invalid inputs every path refused."""
    refused = sum(n["passed"] for n in negative.values())
    return (
        f"  {'ok  ' if refused == len(negative) else 'FAIL'} invalid inputs   "
        f"{refused}/{len(negative)} refused by every path, the problem named"
    )


def bitwise_lines(check: CheckDetails) -> list[str]:
    """The bitwise batch invariance line (:func:`vmapcheck.core.bitwise_verdict.marked_line`),
    none when the run did not measure it."""
    from vmapcheck.core.bitwise_verdict import marked_line

    return [marked_line(check["bitwise"])] if "bitwise" in check else []


def summarize(layout: Layout, tracked: Sequence[str] = ()) -> str:
    """The verdict of the last run in ``layout`` as text: one line per case, the
    benchmark's figures, then ``tracked`` (where the MLflow run is: the tracking floor
    above writes those lines, :func:`vmapcheck.tracking.review.tracked_lines`) and the
    HTML report."""
    check = read_check_details(layout.check_details)
    bench = read_bench_details(layout.bench_details) if layout.bench_details.exists() else None
    lines = [verdict_line(check, bench)]
    lines += [f"  -    {line}" for line in not_provided_lines(check)]
    if layout.contract.exists():
        inputs = read_json_object(layout.contract, ("inputs",))["inputs"]
        lines.append(
            "  inputs: "
            + (
                leaves_text(inputs["leaves"])
                if "leaves" in inputs
                else f"one float vector ({inputs['n_features']},)"
            )
            + ", batch axis 0"
        )
    tol = check["tolerance"]
    lines += [case_line(name, case, tol) for name, case in check["cases"].items()]
    lines += rule_lines(check["cases"])  # the rules case kinds add (vmapcheck.check.rules)
    # What a budget capped (src/vmapcheck/conf/budget/), never left unsaid.
    lines += [f"  cap  {line}" for line in budget_lines(check)]
    lines.append(refusals_line(check["negative"]))
    lines += bitwise_lines(check)
    lines.append(reference_line(check["reference"]))
    lines += [f"  {line}" for line in finding_lines(check)]
    # The benchmark's figures: bench_details.json (bench.json holds the headline only).
    if bench:
        if "peak" in bench:
            peak = bench["peak"]
            sized = f" ({peak['size']}^3 {peak['dtype']})" if "dtype" in peak else ""
            contention = peak_caveat(peak)
            lines.append(
                f"  matmul peak measured in the same run: {peak['gflops']:.1f} GFLOP/s{sized}"
                + (f"; {contention}" if contention else "")
            )
        intervals = bench.get("speedup_ci", {})
        launch = bench.get("launch_bound", {})
        for label, ratios in bench["speedup"].items():
            if not ratios:  # no ratio's two paths both ran at this size
                continue
            ci = intervals.get(label, {})
            rows = batch_from_label(label)
            shown = ", ".join(
                f"{k} {speedup_text(v, ci.get(k))}"
                + (" (both launch-bound)" if ratio_launch_bound(launch, k, rows) else "")
                for k, v in ratios.items()
            )
            lines.append(
                f"  speed at batch {batch_from_label(label)} (p50 ratios, same run): {shown}"
            )
        # A headline figure the bench left out is said, with why (bench.json keeps its
        # key, empty).
        head = bench_headline(bench)
        for name, why in head["left_out"].items():
            lines.append(f"  left out: {name} at batch {head['batch']}: {why}")
        for path, entry in launch.items():
            lines.append(f"  launch-bound: {path} {launch_bound_text(entry)}")
    lines += tracked  # the MLflow run's lines (vmapcheck.tracking.review)
    html_path = layout.html_report
    if html_path.exists():
        lines.append(f"HTML report: {html_path} (open it in a browser)")
    return "\n".join(lines)
