"""The protocol: the stages run in order, stopping at the first that diverges.

:func:`diagnose` runs it on a :class:`~vmapcheck.check.diagnosis.subject.Subject`;
:func:`diagnose_project` on a project's outputs (a :class:`~vmapcheck.layout.Layout`);
:func:`for_check` is what the ``check`` stage writes, :func:`on_demand` what
``vmapcheck diagnose`` (``make diagnose``) runs; :func:`render_text` and
:func:`write_report` give the report its readable summary and write both.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.check.diagnosis.inputs import data_stage, key_stream_stage, shapes_stage
from vmapcheck.check.diagnosis.numerics import (
    forward_stage,
    gradients_stage,
    jit_stage,
    loss_stage,
    update_stage,
)
from vmapcheck.check.diagnosis.runs import backend_stage, reference_stage, sharding_stage
from vmapcheck.check.diagnosis.subject import (
    STAGE_NAMES,
    DataSources,
    Probe,
    StoredRun,
    Subject,
    error_line,
    measurement_text,
    stage_result,
)
from vmapcheck.check.schema import read_check_details, read_record
from vmapcheck.config import BackendConfig, Config, load_config
from vmapcheck.core.cases import CasesManifest, kind_of
from vmapcheck.core.contract import InputSpec, rows, take, tree_map
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import not_provided
from vmapcheck.core.record import tolerance_record
from vmapcheck.core.runtime import configure_jax
from vmapcheck.core.training import make_optimizer
from vmapcheck.data.regression import STANDARD_CASE, read_cases_manifest, x_from_arrays
from vmapcheck.errors import VmapcheckError
from vmapcheck.io import atomic_write_json, atomic_write_text, load_npz
from vmapcheck.layout import Layout
from vmapcheck.params_io import load_model_params

if TYPE_CHECKING:
    from vmapcheck.check.schema import CheckDetails, DiagnosisReport, StageResult

# --- the protocol ---------------------------------------------------------------------


def diagnose(
    subject: Subject,
    *,
    sources: DataSources | None = None,
    stored: StoredRun | None = None,
    check: CheckDetails | None = None,
    key_stream: StageResult | None = None,
    trigger: str = "on demand",
) -> DiagnosisReport:
    """Run the protocol's stages in order, stopping at the first that diverges.

    ``key_stream``: the check's own key-stream result, reused (None: run it here).
    Returns the report written as reports/diagnosis.json (see :func:`render_text`).
    """
    plan: list[tuple[str, Callable[[], StageResult]]] = [
        ("data", lambda: data_stage(sources, subject)),
        (
            "key_stream",
            lambda: (
                key_stream
                if key_stream is not None
                else key_stream_stage(subject.model, subject.seed)
            ),
        ),
        ("shapes", lambda: shapes_stage(subject, check)),
        ("forward", lambda: forward_stage(subject)),
        ("loss", lambda: loss_stage(subject)),
        ("gradients", lambda: gradients_stage(subject)),
        ("update", lambda: update_stage(subject)),
        ("jit", lambda: jit_stage(subject)),
        ("backend", lambda: backend_stage(subject, stored)),
        ("sharding", lambda: sharding_stage(subject, stored)),
        ("reference", lambda: reference_stage(check)),
    ]
    stages: list[StageResult] = []
    first = None
    for name, run in plan:
        try:
            result = run()
        except Exception as exc:  # a stage that cannot run is reported, the rest still run
            result = stage_result(name, [], skipped=f"could not run: {error_line(exc)}")
            result["status"] = "error"
        stages.append(result)
        if result["status"] == "diverged":
            first = result["finding"]
            break
    reached = {s["stage"] for s in stages}
    model = subject.model
    activations = (
        f"model {model.name} exposes its activations: compared layer by layer"
        if model.activations_one is not None
        else f"model {model.name} exposes no activations (Model.activations_one): the "
        "forward stages compare outputs only, so they name no layer inside the model"
    )
    report: DiagnosisReport = {
        "status": "diverged" if first else "no divergence found",
        "trigger": trigger,
        "check_failed": None if check is None else not check["passed"],
        "model": model.name,
        "dtype": np.dtype(subject.dtype).name,
        "tolerance": {
            "between_paths": tolerance_record(subject.tolerance),
            "cross_run": tolerance_record(subject.cross_run_tolerance),
            "note": "the run's own settings (precision.tolerance, "
            "precision.cross_run_tolerance), never widened; stored data are compared "
            "exactly; non-finite values are located, never masked",
        },
        "activations": activations,
        # Paths the model cannot have (no hand-batched forward, ...): named, not compared.
        "not_provided": not_provided(model),
        "inputs": [
            {"label": p.label, "rows": rows(p.x), "targets": p.y is not None}
            for p in subject.probes
        ],
        "first_divergence": first,
        "ruled_out": [
            {"stage": s["stage"], "title": s["title"], "evidence": s["summary"]}
            for s in stages
            if s["status"] == "ruled_out"
        ],
        "skipped": [
            {"stage": s["stage"], "why": s["summary"]}
            for s in stages
            if s["status"] in ("skipped", "error")
        ],
        "not_reached": [name for name in STAGE_NAMES if name not in reached],
        "stages": stages,
        "summary": "",  # written from the rest, below
    }
    report["summary"] = render_text(report)
    return report


def not_needed(check: CheckDetails) -> DiagnosisReport:
    """What reports/diagnosis.json holds when every check passed."""
    return {
        "status": "not needed",
        "trigger": "the check passed: nothing to diagnose",
        "first_divergence": None,
        "ruled_out": [],
        "skipped": [],
        "not_reached": list(STAGE_NAMES),
        "stages": [],
        "check_passed": bool(check.get("passed")),
        "summary": (
            "vmapcheck diagnosis: not needed, the check passed "
            "(run `vmapcheck diagnose` to run the protocol anyway)\n"
        ),
    }


def render_text(report: DiagnosisReport) -> str:
    """The readable summary: the first divergence, then what was ruled out before it."""
    lines = [f"vmapcheck diagnosis of model {report.get('model')} ({report.get('dtype')})"]
    lines.append(f"trigger: {report['trigger']}")
    first = report.get("first_divergence")
    if first:
        where = [f"stage {first['stage']}"]
        if first.get("layer"):
            where.append(f"layer {first['layer']}")
        if first.get("leaf"):
            where.append(f"leaf {first['leaf']}")
        if paths := first.get("paths"):
            where.append(f"path(s) {', '.join(paths)}")
        lines.append("FIRST DIVERGENCE: " + ", ".join(where))
        lines.append(f"  {first['message']}")
        if leaves := first.get("params_leaves"):
            lines.append(f"  params feeding it: {', '.join(leaves)}")
        # The figures, unless the message already gave them (the deciding one first).
        if first.get("max_abs") is not None and "max_abs" not in first["message"]:
            lines.append(f"  {first.get('pair') or 'compared'}: {measurement_text(first)}")
        if first.get("agreed_before"):
            lines.append(
                "  before it, the paths agree at: "
                + ", ".join(f"{a['layer']} ({a['max_ulp']} ULP)" for a in first["agreed_before"])
            )
        for note in first.get("notes") or []:
            lines.append(f"  note: {note}")
    elif report.get("check_failed"):
        lines.append(
            "no stage diverged: the failure is not localized by the protocol "
            "(see reports/check_details.json)"
        )
    else:
        lines.append("no stage diverged: every stage agrees")
    lines.append("ruled out before it:" if first else "ruled out:")
    for entry in report["ruled_out"] or [{"stage": "(none)", "evidence": ""}]:
        lines.append(f"  {entry['stage']:<11} {entry['evidence']}")
    for entry in report["skipped"]:
        lines.append(f"  skipped {entry['stage']}: {entry['why']}")
    if report["not_reached"]:
        lines.append(f"not reached: {', '.join(report['not_reached'])}")
    if report.get("activations"):
        lines.append(report["activations"])
    for path, reason in (report.get("not_provided") or {}).items():
        lines.append(f"not provided by the model, so not compared: {path} ({reason})")
    if report.get("tolerance"):
        lines.append(f"tolerances: {report['tolerance']['note']}")
    return "\n".join(lines) + "\n"


def write_report(report: DiagnosisReport, json_path: Path) -> Path:
    """Write ``report`` to ``json_path`` and its summary beside it (.txt), atomically."""
    json_path = Path(json_path)
    atomic_write_json(json_path, report)
    text_path = json_path.with_suffix(".txt")
    atomic_write_text(text_path, report["summary"])
    return text_path


# --- on a project's outputs -----------------------------------------------------------


def _failing_case(check: CheckDetails | None, manifest: CasesManifest) -> str:
    """The first valid case the check failed on (else the standard batch)."""
    if check is None:
        return STANDARD_CASE
    for name, report in check["cases"].items():
        if not report.get("passed", True):
            return name
    for failure in check["failures"]:
        parts = failure.split("/")
        if parts[0] == "reference" and len(parts) > 1 and parts[1] in manifest["cases"]:
            return parts[1]
    return STANDARD_CASE


def probes_for(
    manifest: CasesManifest, cases: dict[str, dict[str, np.ndarray]], check: CheckDetails | None
) -> tuple[Probe, ...]:
    """The input ladder: one row of the failing case (minimal), then the whole case, then
    the standard batch's first row and the batch when the failing case has no targets."""
    failing = _failing_case(check, manifest)
    order = [failing] + ([STANDARD_CASE] if "y" not in cases.get(failing, {}) else [])
    probes: list[Probe] = []
    for name in dict.fromkeys(order):
        if name not in cases:
            continue
        x = cases[name]["x"]
        if kind_of(manifest["cases"][name], name).takes == "vector":
            x = tree_map(lambda leaf: np.asarray(leaf)[None], x)  # one example: a batch of 1
        y = cases[name].get("y")
        probes.append(
            Probe(
                f"minimal input (row 0 of case {name})",
                take(x, slice(0, 1)),
                None if y is None else np.asarray(y)[:1],
            )
        )
        if rows(x) > 1:
            probes.append(Probe(f"case {name} ({rows(x)} rows)", x, y))
    return tuple(probes)


def diagnose_project(
    layout: Layout,
    config: Config,
    check: CheckDetails | None,
    *,
    key_stream: StageResult | None = None,
    trigger: str = "on demand",
) -> DiagnosisReport:
    """Run the protocol on the pipeline outputs of the project ``layout`` (its data and
    reports).

    Recomputation runs on this machine's CPU at the run's dtype, x64 and matmul
    precision; the backend stage compares with the outputs the run's backend stored.
    """
    model = build_model(config.model)
    params, _ = load_model_params(model, layout.params)
    manifest = read_cases_manifest(layout.cases_manifest)
    # Loaded without the sha256 gate: the data stage judges the files, it does not stop.
    cases = {}
    for name, entry in manifest["cases"].items():
        if kind_of(entry, name).valid and (layout.cases / entry["file"]).is_file():
            arrays = load_npz(layout.cases / entry["file"])
            cases[name] = {
                "x": x_from_arrays(arrays),
                **({"y": arrays["y"]} if "y" in arrays else {}),
            }
    probes = probes_for(manifest, cases, check)
    precision = config.precision
    subject = Subject(
        model=model,
        params=params,
        dtype=jnp.dtype(precision.dtype),
        tolerance=precision.tolerance,
        cross_run_tolerance=precision.cross_run_tolerance,
        probes=probes,
        optimizer=make_optimizer(config.train) if model.trainable else None,
        seed=config.seed,
    )
    failing = _failing_case(check, manifest)
    stored_cases = {n: cases[n]["x"] for n in dict.fromkeys([failing, STANDARD_CASE]) if n in cases}
    stored = (
        StoredRun(
            outputs=load_npz(layout.outputs),
            record=read_record(layout.record),
            cases=stored_cases,
        )
        if layout.outputs.is_file()
        else None
    )
    sources = DataSources(
        cases=layout.cases,
        prepared=layout.prepared,
        config=config.data,
        seed=config.seed,
        root=layout.root,
        contract=InputSpec.from_config(config.model),
    )
    with (
        jax.enable_x64(precision.enable_x64),
        jax.default_matmul_precision(precision.matmul_precision),
    ):
        return diagnose(
            subject,
            sources=sources,
            stored=stored,
            check=check,
            key_stream=key_stream,
            trigger=trigger,
        )


def for_check(
    layout: Layout, config: Config, check: CheckDetails, key_stream: StageResult | None
) -> DiagnosisReport:
    """What the check stage writes: "not needed" when it passed, else the protocol's
    report. The diagnosis never hides the check's own verdict: if it cannot run, its
    report says why (status "error") and the check's reports stand."""
    if check["passed"]:
        return not_needed(check)
    failures = check["failures"]
    trigger = f"the check failed ({len(failures)} failure(s); first: {failures[0]})"
    try:
        return diagnose_project(layout, config, check, key_stream=key_stream, trigger=trigger)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        error = error_line(exc)
        return {
            "status": "error",
            "trigger": trigger,
            "error": error,
            "first_divergence": None,
            "ruled_out": [],
            "skipped": [],
            "not_reached": list(STAGE_NAMES),
            "stages": [],
            "summary": (
                f"vmapcheck diagnosis could not run ({error}); the check's own "
                "reports stand (reports/check_details.json)\n"
            ),
        }


def on_demand(layout: Layout, out: Path) -> int:
    """``vmapcheck diagnose`` (``make diagnose``): the protocol on the current outputs of
    the project ``layout``, on CPU, its report written to ``out`` (its summary beside it
    as .txt; the check stage's own diagnosis is :attr:`Layout.diagnosis`). Returns the
    exit status: 0: no divergence found, 1: a divergence localized, 2: the diagnosis
    could not run."""
    try:
        config = load_config(layout.params_yaml)
        # On CPU, like check: one device, the run's precision settings.
        configure_jax(BackendConfig(name="cpu", platform="cpu", num_devices=None), config.precision)
        details = layout.check_details
        # Absent is "no check report"; anything else there (a folder, a FIFO, a link to
        # nowhere it can read) is read, and refused by name.
        there = details.exists() or details.is_symlink()
        check = read_check_details(details) if there else None
        state = (
            "no check report"
            if check is None
            else ("the last check PASSED" if check["passed"] else "the last check FAILED")
        )
        report = diagnose_project(layout, config, check, trigger=f"on demand ({state})")
    except VmapcheckError as exc:
        print(f"diagnosis: error: {exc}", file=sys.stderr)
        return 2
    text = write_report(report, out)
    print(report["summary"], end="")
    print(f"diagnosis: written to {out} and {text}")
    return 1 if report["status"] == "diverged" else 0
