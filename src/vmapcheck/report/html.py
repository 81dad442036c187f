"""One self-contained HTML page for a pipeline run: verdict, environment, agreement,
batch composition, negative cases, gradients, latency tables and plots, machine
conditions and the limits.

The page needs nothing but itself: the CSS is inline and the plots are PNG data URIs
(matplotlib, via :mod:`vmapcheck.bench.plots`), so it opens from the MLflow artifact store, a
mail attachment or a CI artifact alike. Every value taken from a report goes through
:func:`html.escape` (case, path, leaf and feature names can come from the user); only
fragments built by the report's modules are marked
:class:`~vmapcheck.report.elements.Markup` and inserted as they are.

Inputs are the stage reports as written: ``check`` = ``reports/check_details.json``
(:class:`~vmapcheck.check.schema.CheckDetails`), ``bench`` =
``reports/bench_details.json``, ``train`` = ``reports/train.json``, ``contract`` =
``data/params/contract.json``.

The page is put together here from :mod:`vmapcheck.report.elements` (escaping, tables,
CSS), :mod:`vmapcheck.report.check_sections` (what the check found) and
:mod:`vmapcheck.report.bench_sections` (benchmark, machine, training, limits).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from vmapcheck.check.schema import CheckDetails
from vmapcheck.report import bench_sections, check_sections
from vmapcheck.report.elements import CSS, esc


def render_report(
    check: CheckDetails,
    bench: dict[str, Any],
    train: dict[str, Any],
    contract: dict[str, Any] | None = None,
    *,
    git: dict[str, str] | None = None,
    run: dict[str, Any] | None = None,
    generated_at: datetime | None = None,
) -> str:
    """The whole report as one HTML document (str, UTF-8 text).

    ``git``: {"git_commit", "git_dirty"} (:func:`vmapcheck.tracking.provenance.git_state`);
    ``run``: extra rows shown first in the environment table (e.g. model, MLflow run name).
    """
    git = git or {"git_commit": "unknown", "git_dirty": "unknown"}
    run = run or {}
    runtime = check["runtime"]
    model = (contract or {}).get("model", run.get("model", "model"))
    title = (
        f"{model} on {runtime['backend']} ({runtime['device_kind']}), {check['dtype']}, "
        f"jax {runtime['jax_version']}"
    )
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    verdict = "PASSED" if check["passed"] else "FAILED"
    body = "\n".join(
        [
            f"<h1>vmapcheck: {esc(title)}</h1>",
            check_sections.verdict(check, bench),
            check_sections.environment(check, bench, contract, git, run),
            check_sections.agreement(check),
            check_sections.oracle(check),
            check_sections.reference(check),
            check_sections.composition(check),
            check_sections.negative(check),
            check_sections.gradients(check),
            bench_sections.latency(bench, title),
            bench_sections.machine(bench),
            bench_sections.training(train),
            bench_sections.limits(bench),
            f"<footer>Generated {esc(when)} by vmapcheck from reports/check_details.json, "
            "reports/bench_details.json, reports/train.json and data/params/contract.json."
            "</footer>",
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>vmapcheck {verdict}: {esc(title)}</title>"
        f"<style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n"
    )
