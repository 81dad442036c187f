"""One self-contained HTML page for a pipeline run, reviewer first.

The first screen holds the verdict and the figures a reviewer reads first (the worst
agreement error, the worst against the stored reference and against float64, each with
its case and pair or path; the invalid inputs refused; the vmap speed-ups at the
headline batch with their confidence intervals; the benchmark's verdict against its
baseline), computed by :mod:`vmapcheck.report.headline` as the DVC metrics and the MLflow
``summary/*`` metrics are. Then agreement, latency and plots, the other checks, the
machine, training, the limits; the environment last.

The page is a Jinja2 template (``templates/report.html``, package data) with
autoescaping on: every value is escaped (case, path, leaf and feature names can come
from the user). Python prepares plain data (:mod:`vmapcheck.report.check_sections`,
:mod:`vmapcheck.report.bench_sections`); the template only lays it out. The page needs
nothing but itself: the CSS is inline and the plots are PNG data URIs drawn by
:mod:`vmapcheck.report.plots`, so it opens from the MLflow artifact store, a mail
attachment or a CI artifact alike.

Inputs are the stage reports as written: ``check`` = ``reports/check_details.json``
(:class:`~vmapcheck.check.schema.CheckDetails`), ``bench`` =
``reports/bench_details.json``, ``train`` = ``reports/train.json``, ``contract`` =
``data/params/contract.json``, ``perf`` = ``reports/perf_verdict.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypedDict

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from vmapcheck.bench.verdict.labels import verdict_headline
from vmapcheck.check.schema import CheckDetails
from vmapcheck.core.paths import SPEEDUPS, speedup_text
from vmapcheck.report import bench_sections, check_sections, failures
from vmapcheck.report.elements import code_spans, num
from vmapcheck.report.headline import HEADLINE_SPEEDUPS, bench_headline, check_headline

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchDetails
    from vmapcheck.bench.verdict.records import PerfOutcome
    from vmapcheck.check.schema import DiagnosisReport
    from vmapcheck.core.record import TrainMetrics
    from vmapcheck.params_io import ModelContract

_ENV = Environment(
    loader=PackageLoader("vmapcheck.report", "templates"),
    # Every template and every string escaped, whatever its name.
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,  # a name the data lacks is an error, not an empty cell
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENV.filters["code_spans"] = code_spans

# How many regressions the benchmark card names (all are in perf_verdict.json).
_SHOWN_REGRESSIONS = 4


class Card(TypedDict):
    """A first-screen figure: its id, title, value, lines under it, and ``status``
    (``pass``, ``fail`` or ``""``: neutral)."""

    id: str
    title: str
    value: str
    lines: list[str]
    status: str


def _card(card_id: str, title: str, value: str, lines: list[str], status: str = "") -> Card:
    """A first-screen figure; ``status``: ``pass``, ``fail`` or ``""`` (neutral)."""
    return {"id": card_id, "title": title, "value": value, "lines": lines, "status": status}


def _agreement_cards(check: CheckDetails) -> list[Card]:
    head = check_headline(check)
    worst = head["worst"]
    if worst is None:
        cards = [_card("fs-worst", "Worst agreement error", "none", ["no comparable outputs"])]
    else:
        ratio = worst["bound_ratio"]
        # Coloured by the check of every pair (the worst by max_rel need not be the one
        # that failed: the bound is relative to the terms summed).
        agree = all(r["passed"] for c in check["cases"].values() for r in c["pairs"].values())
        cards = [
            _card(
                "fs-worst",
                "Worst agreement error (between paths)",
                f"max_rel {num(worst['max_rel'])}",
                [
                    f"case {worst['case']}, pair {worst['pair']}",
                    f"max_abs {num(worst['max_abs'])}"
                    + ("" if ratio is None else f", {num(ratio, 2)} of its bound"),
                ],
                "pass" if agree else "fail",
            )
        ]
    ref = head["vs_reference"]
    if ref["status"] == "ok":
        cards.append(
            _card(
                "fs-reference",
                "Worst vs stored reference",
                f"max_rel {num(ref['max_rel'])}",
                [f"case {ref['case']}, path {ref['path']}"] if ref["case"] is not None else [],
                "pass" if ref["passed"] else "fail",
            )
        )
    else:
        message = check["reference"].get("message", "")
        cards.append(
            _card(
                "fs-reference",
                "Worst vs stored reference",
                f"not compared ({ref['status']})",
                [message] if message else [],
                "" if ref["passed"] else "fail",
            )
        )
    f64 = head["vs_float64"]
    if f64 is None:
        cards.append(
            _card(
                "fs-float64",
                "Worst vs float64 oracle",
                "not computed",
                [str(check.get("oracle", "absent"))],
            )
        )
    else:
        passed = all(
            r["passed"] for c in check["cases"].values() for r in c.get("oracle", {}).values()
        )
        cards.append(
            _card(
                "fs-float64",
                "Worst vs float64 oracle",
                f"max_rel {num(f64['max_rel'])}",
                [f"case {f64['case']}, path {f64['path']}"],
                "pass" if passed else "fail",
            )
        )
    refused, total = head["invalid_refused"], head["invalid_total"]
    cards.append(
        _card(
            "fs-invalid",
            "Invalid inputs refused",
            f"{refused}/{total}",
            ["refused by every path, the problem named"],
            "pass" if refused == total else "fail",
        )
    )
    return cards


def _speedup_card(check: CheckDetails, bench: BenchDetails) -> Card:
    speed = bench_headline(bench)
    if speed["batch"] is None:
        return _card("fs-speedups", "vmap speed-ups", "not measured", [])
    missing = check.get("not_provided") or {}
    lines = []
    for entry in SPEEDUPS:
        if entry.name not in HEADLINE_SPEEDUPS:
            continue
        label = entry.name.replace("_", " ")
        figure = speed["speedups"].get(entry.name)
        if figure is not None:
            lines.append(f"{label}: {speedup_text(figure['ratio'], figure['ci'])}")
            continue
        absent = [p for p in (entry.slower, entry.faster) if p in missing]
        if absent:  # say why it is not there: the model has no such path
            lines.append(f"{label}: {', '.join(absent)} not provided by the model")
        elif entry.name in speed["left_out"]:  # the bench left a cell out, and said why
            lines.append(f"{label}: left out ({speed['left_out'][entry.name]})")
    return _card("fs-speedups", f"vmap speed-ups at batch {speed['batch']} (p50)", "", lines)


def _perf_card(perf: PerfOutcome | None) -> Card:
    if perf is None:
        return _card("fs-perf", "Benchmark vs baseline", "not judged", [])
    lines = []
    # The verdict's sentence where it says more than its word: a mixed result (slower at
    # one size, faster at another) is never shown as the one word of the card.
    headline = verdict_headline(perf)
    if headline != perf["verdict"].upper():
        lines.append(headline)
    if perf.get("why"):
        lines.append(str(perf["why"]))
    if "baseline" in perf:  # two runs judged (a NoVerdict has only its word and why)
        regressions = perf.get("regressions") or []
        if regressions:
            shown = ", ".join(regressions[:_SHOWN_REGRESSIONS])
            more = len(regressions) - _SHOWN_REGRESSIONS
            more_text = f" and {more} more" if more > 0 else ""
            lines.append(f"{len(regressions)} regression(s): {shown}{more_text}")
        if perf.get("improvements"):
            lines.append(f"{len(perf['improvements'])} improvement(s)")
        source = (perf.get("baseline") or {}).get("source")
        if source:
            lines.append(f"baseline: {source}")
    status = {"no regression": "pass", "regression": "fail"}.get(perf["verdict"], "")
    return _card("fs-perf", "Benchmark vs baseline", perf["verdict"], lines, status)


def first_screen(check: CheckDetails, bench: BenchDetails, perf: PerfOutcome | None) -> list[Card]:
    """The figures under the verdict, in reading order: ``[{"id", "title", "value",
    "lines", "status"}]`` (ids ``fs-worst``, ``fs-reference``, ``fs-float64``,
    ``fs-invalid``, ``fs-speedups``, ``fs-perf``)."""
    return [*_agreement_cards(check), _speedup_card(check, bench), _perf_card(perf)]


def render_report(
    check: CheckDetails,
    bench: BenchDetails,
    train: TrainMetrics,
    contract: ModelContract | None = None,
    *,
    perf: PerfOutcome | None = None,
    git: dict[str, str] | None = None,
    run: dict[str, str] | None = None,
    generated_at: datetime | None = None,
    drawn_plots: Mapping[str, bytes] | None = None,
    diagnosis: DiagnosisReport | None = None,
) -> str:
    """The whole report as one HTML document (str, UTF-8 text).

    ``perf``: the benchmark's verdict against its baseline (reports/perf_verdict.json;
    None: not judged); ``git``: {"git_commit", "git_dirty"}
    (:func:`vmapcheck.provenance.git_state`); ``run``: extra rows shown first in
    the environment table (e.g. model, MLflow run name); ``drawn_plots``: the bench
    stage's PNGs of the same figures, by plot id (``plot-latency``, ``plot-speedup``),
    embedded as they are (None: drawn here from ``bench``); ``diagnosis``: the check
    stage's diagnosis (reports/diagnosis.json; None: the run has none).
    """
    git = git or {"git_commit": "unknown", "git_dirty": "unknown"}
    run = run or {}
    runtime = check["runtime"]
    model = contract["model"] if contract else run.get("model", "model")
    title = (
        f"{model} on {runtime['backend']} ({runtime['device_kind']}), {check['dtype']}, "
        f"jax {runtime['jax_version']}"
    )
    return _ENV.get_template("report.html").render(
        title=title,
        verdict=check_sections.verdict(check, bench)
        | {
            "deciding": failures.deciding_text(check),
            "kinds": failures.kinds(check),
            "diagnosis": failures.diagnosis_line(diagnosis),
        },
        figures=first_screen(check, bench, perf),
        failures=failures.groups(check),
        failure_lines=failures.lines(check),
        diagnosis=failures.diagnosis(diagnosis),
        agreement=check_sections.agreement(check),
        latency=bench_sections.latency(bench, title, check.get("not_provided"), drawn_plots),
        oracle=check_sections.oracle(check),
        reference=check_sections.reference(check),
        composition=check_sections.composition(check),
        bitwise=check_sections.bitwise(check),
        negative=check_sections.negative(check),
        gradients=check_sections.gradients(check),
        machine=bench_sections.machine(bench),
        training=bench_sections.training(train),
        limits=bench_sections.limits(bench),
        environment=check_sections.environment(check, bench, contract, git, run),
        generated_at=(generated_at or datetime.now(UTC)).isoformat(timespec="seconds"),
    )
