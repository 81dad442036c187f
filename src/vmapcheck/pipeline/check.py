"""Stage `check`: agreement, contract, float64 oracle, reference, refusal of bad input,
batch composition, and the key stream.

Report, then assert: this stage always writes its report and exits 0 on a failed check,
so that `track` logs the failure to MLflow before the pipeline exits non-zero. A failed
check is diagnosed here (reports/diagnosis.json and .txt: the first stage, layer and leaf
that diverge); a passed one writes a diagnosis that says "not needed".
"""

from collections.abc import Mapping
from typing import Any, Required, TypedDict

import jax.numpy as jnp

from vmapcheck.check.checks import run_checks
from vmapcheck.check.diagnosis import for_check, key_stream_stage, write_report
from vmapcheck.check.kinds import all_kind_counts, finding_lines, verdict_words
from vmapcheck.check.reference import ReferenceRun, load_reference, reference_dir
from vmapcheck.check.rules import summary_lines as rule_lines
from vmapcheck.check.schema import CheckDetails, ForwardRecord, read_record
from vmapcheck.config import Config, config_digest
from vmapcheck.core.bitwise_verdict import marked_line
from vmapcheck.core.composition import composition_line
from vmapcheck.core.forms import forward_keys
from vmapcheck.core.magnitude import case_magnitudes
from vmapcheck.core.models import Model, build_model
from vmapcheck.core.oracle import float64_outputs
from vmapcheck.core.runtime import configure_cpu_float64
from vmapcheck.data.regression import load_cases, read_cases_manifest
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_write_json, load_npz, sha256_file
from vmapcheck.layout import Layout
from vmapcheck.params_io import load_model_params
from vmapcheck.report.elements import atol_decided, figure_text
from vmapcheck.report.headline import check_headline, worst_bound_ratio


def _reference(
    config: Config, layout: Layout, record: ForwardRecord, model: Model, run_dtype: Any
) -> ReferenceRun:
    """What the check compares with the stored reference (:class:`~vmapcheck.check.
    reference.ReferenceRun`): the forward stage's status, and when "ok" the reference
    read again (verified) with this run's outputs on its inputs."""
    status = record["reference"]
    if status["status"] != "ok":  # the forward stage's words, all there is to say
        return {"status": status["status"], "message": status["message"]}
    folder = reference_dir(config, layout)
    try:
        stored = load_reference(folder)
        if stored is None:  # removed between forward and check
            return {
                "status": "missing",
                "message": f"{folder}: the reference the forward stage found is gone",
            }
        # The terms' magnitude of the reference's cases: its own params and inputs, the
        # numbers the forward stage ran again.
        magnitudes = None
        if config.precision.uses_terms:
            params, _ = load_model_params(model, folder)
            magnitudes = case_magnitudes(
                model.forward_one,
                params,
                stored["cases"],
                run_dtype,
                max_rows=config.budget.magnitude_max_rows,
                stochastic=model.stochastic,
            )
    except ArtifactError as exc:  # changed between forward and check
        return {"status": "corrupt", "message": str(exc)}
    return {
        **status,
        "meta": stored["meta"],
        "stored": stored["outputs"],
        "cases": stored["cases"],
        "current": load_npz(layout.reference_outputs),
        "magnitudes": magnitudes,
    }


def gradients_line(grads: Mapping[str, Any], tolerance: Mapping[str, Any]) -> str:
    """The gradient check's line: the mean per-example gradient against the batch
    gradient, its bound ratio first (with the leaf where it is reached), then max_rel and
    max_abs; the loss; the NaN probe. ``grads``: check_details.json's ``gradients``."""
    mark = "ok  " if grads["passed"] else "FAIL"
    if grads.get("status") == "not run":
        return f"  {mark} gradients        not run"
    if grads.get("status") == "error":
        return f"  {mark} gradients        the loss cannot be differentiated: {grads.get('error')}"
    # Each figure with its own leaf: the largest max_rel is often another leaf's, of
    # values near 0 (the transformer's: attn.key.bias, about 2e-10).
    leaves = grads.get("per_example_vs_batch") or {}

    def leaf_of(stat: str) -> str | None:
        judged = {k: r[stat] for k, r in leaves.items() if r.get(stat) is not None}
        return max(judged, key=judged.__getitem__) if judged else None

    figures = figure_text(
        grads.get("bound_ratio"),
        grads.get("max_rel"),
        grads.get("max_abs"),
        decided_by_atol=atol_decided(tolerance, grads.get("scale_at_worst")),
        cases=(grads.get("worst_pair"), leaf_of("max_rel"), leaf_of("max_abs")),
    )
    # Said rather than left to the figures (None where a leaf is not finite): the leaves
    # to look at first, and whether the planted NaN came out.
    finite = grads.get("grads_finite", True) and grads.get("per_example_finite", True)
    bad = grads.get("nonfinite_leaves")
    grads_text = (
        "" if finite else f"; gradients not finite (leaves: {', '.join(bad) if bad else '?'})"
    )
    masked = (grads.get("nan_probe") or {}).get("loss_finite", False)
    return (
        f"  {mark} gradients        mean per-example vs batch gradient (leaf by leaf): "
        f"{figures}; loss {grads.get('loss'):.4g}{grads_text}; NaN target "
        f"{'masked (the loss stayed finite)' if masked else 'detected'}"
    )


def _g(value: float | None) -> str:
    """A figure of the printed lines: 3 significant digits (every digit is in
    reports/check_details.json); ``None`` (a figure this case has not) as such."""
    return "None" if value is None else f"{value:.3g}"


class WorstFigures(TypedDict, total=False):
    """The check's worst figures among its DVC metrics, each where this run has it."""

    worst_max_rel_eps: float
    worst_bound_ratio: float
    worst_vs_reference_max_rel_eps: float
    worst_vs_f64_max_rel_eps: float


class CheckMetrics(WorstFigures):
    """``reports/check.json`` (:func:`dvc_metrics`): the check's DVC metrics."""

    passed: Required[bool]
    n_failures: Required[int]
    findings: Required[dict[str, int]]  # finding kind -> count, every kind
    invalid_refused: Required[int]
    invalid_total: Required[int]


def dvc_metrics(report: CheckDetails) -> CheckMetrics:
    """``reports/check.json``, the DVC metrics of the check: only what a user compares
    across experiments (``dvc exp show``, ``dvc metrics diff``).

    The figures of :func:`vmapcheck.report.headline.check_headline`, named as the MLflow
    run's ``summary/*`` metrics without the prefix: ``passed``, ``n_failures``,
    ``worst_bound_ratio``, ``invalid_refused`` of ``invalid_total``, and the relative
    errors in units of the run dtype's machine epsilon (``*_max_rel_eps``:
    ``worst_max_rel_eps``, ``worst_vs_reference_max_rel_eps``, ``worst_vs_f64_max_rel_eps``).
    DVC prints a metric rounded to 5 decimals, so a max_rel of 2e-6 read ``0.0`` in
    ``dvc metrics show`` and ``dvc exp show``; in epsilons it reads 16.4 (float32), and
    the same figure of a float64 or bfloat16 run reads on the same scale. A figure this
    run does not have (no reference, no float64 oracle) is left out, never written as 0.
    Every other figure, and these unscaled, is in ``reports/check_details.json`` and in
    MLflow.
    """
    head = check_headline(report)
    eps = float(jnp.finfo(jnp.dtype(report["dtype"])).eps)
    figures: WorstFigures = {}
    if head["worst"] is not None:
        figures["worst_max_rel_eps"] = head["worst"]["max_rel"] / eps
    # The deciding figure: the largest of any pair, as the summary metric's.
    bound = worst_bound_ratio(report)
    if bound is not None:
        figures["worst_bound_ratio"] = bound
    if head["vs_reference"]["max_rel"] is not None:
        figures["worst_vs_reference_max_rel_eps"] = head["vs_reference"]["max_rel"] / eps
    if head["vs_float64"] is not None:
        figures["worst_vs_f64_max_rel_eps"] = head["vs_float64"]["max_rel"] / eps
    metrics: CheckMetrics = {
        "passed": head["passed"],
        "n_failures": head["n_failures"],
        # Findings by kind, every kind (0 included): dvc exp show compares them run by run.
        "findings": all_kind_counts(report),
        **figures,
        "invalid_refused": head["invalid_refused"],
        "invalid_total": head["invalid_total"],
    }
    return metrics


def run(config: Config, layout: Layout) -> None:
    cases = load_cases(layout.cases)
    record = read_record(layout.record)
    run_dtype = jnp.dtype(config.precision.dtype)
    configure_cpu_float64()
    model = build_model(config.model)
    params, _ = load_model_params(model, layout.params)
    oracle = None
    if run_dtype != jnp.float64:
        oracle = float64_outputs(
            model,
            params,
            cases,
            run_dtype,
            max_rows=config.budget.oracle_max_rows,
            key=forward_keys(config.seed),  # a stochastic model's rows: the paths' keys
        )
    # The magnitude of the terms of every output element (float64, CPU, forward_one row
    # by row on the inputs the paths saw), once per case: what scale "terms" is relative to.
    magnitudes = None
    if config.precision.uses_terms:
        magnitudes = case_magnitudes(
            model.forward_one,
            params,
            cases,
            run_dtype,
            max_rows=config.budget.magnitude_max_rows,
            stochastic=model.stochastic,
        )
    # Each subkey feeds one random draw: a reused key fails the check (diagnosis stage 2).
    key_stream = key_stream_stage(model, config.seed)
    report = run_checks(
        config,
        read_cases_manifest(layout.cases_manifest),
        load_npz(layout.outputs),
        record,
        oracle=oracle,
        targets={name: case["y"] for name, case in cases.items() if "y" in case},
        reference=_reference(config, layout, record, model, run_dtype),
        gradients=load_npz(layout.gradients),
        inputs={"key_stream": key_stream},
        magnitudes=magnitudes,
        composition=load_npz(layout.composition),
        bitwise=config.verdict.bitwise,
    )
    # What make_reference checks before it trusts this report.
    report["config_digest"] = config_digest(config)
    report["forward_outputs_sha256"] = sha256_file(layout.outputs)
    atomic_write_json(layout.check_details, report)
    atomic_write_json(layout.check_report, dvc_metrics(report))
    diagnosis = for_check(layout, config, report, key_stream)
    write_report(diagnosis, layout.diagnosis)
    tol, cross = report["tolerance"], report["cross_run_tolerance"]
    print(
        f"check: {report['dtype']}, between paths rtol={tol['rtol']:g} atol={tol['atol']:g} "
        f"scale={tol['scale']}, against oracle/reference rtol={cross['rtol']:g} "
        f"atol={cross['atol']:g} scale={cross['scale']}"
    )
    for name, case in report["cases"].items():
        mark = "ok  " if case["passed"] else "FAIL"
        fallbacks = f" fallbacks={','.join(case['fallbacks'])}" if case["fallbacks"] else ""
        # The bound ratio first: it decides; max_rel of values within atol does not.
        figures = figure_text(
            case["bound_ratio"],
            case["max_rel"],
            case["max_abs"],
            decided_by_atol=atol_decided(tol, case["scale_at_worst"]),
        )
        print(
            f"  {mark} {name:<16} {figures} (rule {case['rule']}, "
            f"S at worst={_g(case['scale_at_worst'])}){fallbacks}"
        )
    for line in rule_lines(report["cases"]):  # the rules case kinds add
        print(line)
    # What a budget capped: named with the rows covered and the key, never silent.
    for name, capped in report["budget"]["cases"].items():
        for what, cap in capped.items():
            beyond = f"; the rest {cap['beyond']}" if "beyond" in cap else ""
            print(
                f"  cap  {name:<16} {what} on the first {cap['rows_run']} of "
                f"{cap['rows_of']} rows (capped by {cap['capped_by']}){beyond}"
            )
    # A path the model does not have is named as such, never counted as agreeing.
    for path, reason in report["not_provided"].items():
        print(f"  -    {path:<16} not provided, not compared: {reason}")
    for name, negative in report["negative"].items():
        mark = "ok  " if negative["passed"] else "FAIL"
        print(f"  {mark} {name:<16} refused: {' ... '.join(negative['expect'])}")
    if report["oracle"].startswith("not judged"):  # a stochastic model's (record.keys)
        print(f"  -    float64 oracle   {report['oracle']}")
    grads = report["gradients"]
    print(gradients_line(grads, tol))
    for name, by_path in report.get("composition", {}).items():
        print(composition_line(name, by_path))
    # Reported; a failure only in mode "require".
    for line in [marked_line(report["bitwise"])] if "bitwise" in report else []:
        print(line)
    ref = report["reference"]
    print(f"  {'ok  ' if ref['passed'] else 'FAIL'} reference        {ref['message']}")
    ks = report["inputs"]["key_stream"]
    print(f"  {'FAIL' if ks['status'] == 'diverged' else 'ok  '} key stream       {ks['summary']}")
    for line in finding_lines(report, 20):
        print(f"  {line}")
    if not report["passed"]:
        print("check: diagnosis (reports/diagnosis.json, reports/diagnosis.txt):")
        print("".join(f"  | {line}\n" for line in diagnosis["summary"].splitlines()), end="")
    print(f"check: {verdict_words(report)} (track logs it, then exits)")
