"""Log one pipeline run to MLflow: config as params, figures as metrics, versions as tags.

Metric names follow one sortable scheme (documented in docs/tracking.md):
``_summary/worst_max_rel`` (the reviewer's figures, sorted first),
``agree/<case>/<pathA>-vs-<pathB>/max_abs``, ``latency_ms/<path>/b0128/p50``,
``speedup/b0128/vmap_over_loop``, ``composition/<case>/<path>/passed``,
``check/passed``, ``train/val_loss``, ``timeline/<stage>_s``. Batch labels in metric
names are zero-padded (:func:`vmapcheck.report.headline.batch_label`) so that they sort
in numeric order; the reports on disk keep their own labels.

A run also carries what the MLflow UI shows about it: a name that says which
configuration and bench profile it is (unique), the verdict as its description
(``mlflow.note.content``), who ran it and from where (``mlflow.user``,
``mlflow.source.*``), and its own start and end: from the first stage that ran in this
``dvc repro`` (not a stage DVC skipped, which keeps an earlier run's time) to the end of
``track`` (:func:`run_start`).
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vmapcheck.check.kinds import all_kind_counts, failing_kinds, finding_lines, verdict_words
from vmapcheck.check.rules import metrics as rule_metrics
from vmapcheck.check.schema import CheckDetails, DiagnosisReport
from vmapcheck.config import Config, flatten
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.paths import mesh_label, speedup_text
from vmapcheck.core.record import TRAIN_METRICS, TrainMetrics
from vmapcheck.core.runtime import runtime_tags
from vmapcheck.errors import ConfigError, first_line
from vmapcheck.params_io import ModelContract, contract_digest
from vmapcheck.provenance import git_state
from vmapcheck.report.check_sections import verdict_sentence
from vmapcheck.report.headline import (
    batch_from_label,
    batch_label,
    bench_headline,
    check_headline,
    noisy_caveat,
    summary_metrics,
)
from vmapcheck.report.summary import bench_budget_caveat
from vmapcheck.tracking import store
from vmapcheck.tracking.clock import checked_start_ms
from vmapcheck.tracking.experiment import NOTE_TAG, describe_experiment
from vmapcheck.tracking.records import TrackReport
from vmapcheck.tracking.store import (
    MODEL_CONTRACT_TAG,
    experiment_name,
    resolve_artifact_root,
    resolve_tracking_uri,
)

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchDetails
    from vmapcheck.bench.verdict.records import PerfOutcome, PerfVerdict
    from vmapcheck.core.record import RuntimeRecord
    from vmapcheck.running import StageTime

MAX_BATCH = 1000  # MLflow's per-request limit for metrics (params: 100)
# The config keys logged as params: the knobs runs are compared and searched by (the
# last-verified baseline matches bench.name). MLflow's compare view lists params before
# metrics, so the whole config (87 keys) pushed the figures a screen down; it is the
# run's artifact params.yaml.
COMPARED_PARAMS = (
    "model.name",
    "backend.name",
    "backend.num_devices",
    "backend.processes",  # the forward stage's processes (docs/multiprocess.md)
    "precision.name",
    "precision.dtype",
    "precision.matmul_precision",
    "precision.tolerance.rtol",
    "precision.tolerance.atol",
    "precision.tolerance.scale",
    "bench.name",
    "bench.batch_sizes",
    "bench.repeats",
    "bench.loop_max_batch",
    "data.source",
    "train.steps",
    "seed",
)
# Logged where the composed config has them: the generated sources' size (data=synthetic,
# images32); a table read from a file (digits, diabetes, csv) has as many rows as it holds.
COMPARED_IF_PRESENT = ("data.n_rows",)
# The description's length: well under MLflow's limit on a run tag's value
# (mlflow.utils.validation.MAX_TAG_VAL_LENGTH, 8000 in MLflow 3.17); it is read on screen.
MAX_NOTE_CHARS = 5000


# The figure a verdict is decided by and the tolerance it is read against, logged first
# and in this order: MLflow's compare view (3.17) opens its parallel coordinates plot on
# one metric, the first that every compared run has in the order the store returns them,
# the order they were logged. The tolerance is also a metric (beside the param
# precision.tolerance.*), so that the runs table and the charts can show it as a number.
DECIDING_METRICS = (
    "_summary/worst_bound_ratio",
    "_summary/tolerance_rtol",
    "_summary/tolerance_atol",
)


def padded_label(label: str) -> str:
    """A report's batch label as metric names carry it: ``b128`` -> ``b0128``."""
    return batch_label(batch_from_label(label))


def summary_metric_name(name: str) -> str:
    """A :func:`vmapcheck.report.headline.summary_metrics` name as MLflow logs it:
    ``summary/vmap_over_loop@b0128`` -> ``_summary/vmap_over_loop_at_b0128``.

    The leading ``_`` makes the summary sort before every other metric (``agree/...``)
    where MLflow sorts names as text, e.g. its compare-runs page; MLflow refuses ``@``
    in a metric name."""
    return metric_name("_" + name.replace("@", "_at_"))


def metric_name(name: str) -> str:
    """A name MLflow accepts (alphanumerics, _ - . space : /): ``layers[0].W`` -> ``layers.0.W``."""
    name = re.sub(r"\[(\w+)\]", r".\1", name).replace("..", ".")
    return re.sub(r"[^\w.\- :/]", "_", name)


def _worst(values: Any) -> float | None:
    """The largest of the numbers given (None left out); None when there are none."""
    found = [float(v) for v in values if v is not None and np.isfinite(v)]
    return max(found) if found else None


# The latency statistics logged as metrics (the others, p90 and the median's CI among
# them, are in the bench_details.json artifact and the HTML report).
LATENCY_METRICS: tuple[Literal["p50", "p99"], ...] = ("p50", "p99")
# A case's agreement figures logged as metrics (agree/<case>/<figure>), where measured.
AGREEMENT_METRICS: tuple[Literal["max_abs", "max_rel", "bound_ratio"], ...] = (
    "max_abs",
    "max_rel",
    "bound_ratio",
)
# The guard replay's figures logged as metrics (every one is in bench_details.json).
REPLAY_METRICS = (
    "passed",
    "compiles",
    "unbucketed_compiles",
    "bucketed_p99_ms",
    "padding_overhead",
)


def bitwise_metrics(check: CheckDetails) -> dict[str, float]:
    """Bitwise batch invariance (:mod:`vmapcheck.core.bitwise`), when measured:
    ``bitwise/<path>/bitwise`` (1: the same bits alone, permuted and split),
    ``bitwise/<path>/max_ulp``, ``bitwise/paths_bitwise`` (how many paths are) and, for
    class outputs, ``bitwise/argmax_flip_share`` (rows whose argmax is not the same in
    every output, of the rows)."""
    section = check.get("bitwise")
    if section is None:
        return {}
    metrics: dict[str, float] = {}
    for path, p in section["paths"].items():
        metrics[f"bitwise/{path}/bitwise"] = float(p["bitwise"])
        metrics[f"bitwise/{path}/max_ulp"] = float(p["max_ulp"])
    metrics["bitwise/paths_bitwise"] = float(sum(p["bitwise"] for p in section["paths"].values()))
    flips = section["argmax_flips"]
    if flips is not None and flips["rows"]:
        metrics["bitwise/argmax_flip_share"] = flips["flipped"] / flips["rows"]
    return metrics


def collect_metrics(
    check: CheckDetails, bench: BenchDetails, train: TrainMetrics
) -> dict[str, float]:
    """The stage reports as MLflow metrics: the figures a reviewer compares across runs,
    a few hundred at most (about 150 for bench=quick), never one per pair of paths.

    - ``_summary/*``: the headline (vmapcheck.report.headline), named to sort first, and
      the tolerance (``_summary/tolerance_rtol``, ``_summary/tolerance_atol``); the
      :data:`DECIDING_METRICS` come first;
    - per regression case, its worst figures: ``agree/<case>/{passed,max_abs,max_rel,
      bound_ratio}`` over every pair of paths, ``oracle/<case>/max_rel`` over the paths,
      ``reference/<case>/max_rel``, ``composition/<case>/{passed,max_abs}``;
    - ``bitwise/<path>/{bitwise,max_ulp}``, ``bitwise/paths_bitwise``,
      ``bitwise/argmax_flip_share`` (:func:`bitwise_metrics`);
    - ``negative/refused`` and ``negative/cases``; the gradients' verdict and worst leaf;
    - ``latency_ms/<path>/<batch>/{p50,p99}``, ``speedup/<batch>/<name>``, the machine's
      peak, the guard replay's verdict and compile counts, the training losses.

    Every per-pair, per-path and per-leaf figure is in the run's artifacts
    (``reports/check_details.json``, ``bench_details.json``) and its HTML report.
    """
    summary = {summary_metric_name(k): v for k, v in summary_metrics(check, bench).items()}
    tolerance = check.get("tolerance")  # absent from hand-made reports only
    if tolerance is not None:
        summary["_summary/tolerance_rtol"] = float(tolerance["rtol"])
        summary["_summary/tolerance_atol"] = float(tolerance["atol"])
    metrics: dict[str, float] = {k: summary.pop(k) for k in DECIDING_METRICS if k in summary}
    metrics |= summary
    metrics |= {
        "check/passed": float(check["passed"]),
        "check/n_failures": float(len(check["failures"])),
        # Every kind, 0 included, so that runs compare on the same keys; failing or
        # only reported (verdict.fail_on), each finding counts.
        **{f"check/findings/{kind}": float(n) for kind, n in all_kind_counts(check).items()},
    }
    for case, report in check["cases"].items():
        metrics[f"agree/{case}/passed"] = float(report["passed"])
        for stat in AGREEMENT_METRICS:
            value = report.get(stat)
            if value is not None:
                metrics[f"agree/{case}/{stat}"] = float(value)
        oracle = _worst(r["max_rel"] for r in report.get("oracle", {}).values())
        if oracle is not None:
            metrics[f"oracle/{case}/max_rel"] = oracle
    metrics |= rule_metrics(check["cases"])  # the rules case kinds add
    gradients = check.get("gradients", {})
    if gradients.get("status") == "ok":
        metrics["gradients/passed"] = float(gradients["passed"])
        metrics["gradients/loss"] = float(gradients["loss"])
        metrics["gradients/nan_probe_detected"] = float(not gradients["nan_probe"]["loss_finite"])
        worst = _worst(r["max_rel"] for r in gradients["per_example_vs_batch"].values())
        if worst is not None:
            metrics["gradients/max_rel"] = worst
    reference = check["reference"]
    metrics["reference/passed"] = float(reference["passed"])
    for case, by_path in reference.get("cases", {}).items():
        worst = _worst(r["max_rel"] for r in by_path.values())
        if worst is not None:
            metrics[f"reference/{case}/max_rel"] = worst
    losses = [abs(x["current"] - x["reference"]) for x in reference.get("losses", {}).values()]
    if losses:
        metrics["reference/loss_abs_diff"] = max(losses)
    # Each batch path on the batch regrouped against itself on the batch as it is, the
    # worst over the paths and regroupings (vmapcheck.core.composition).
    for case, regrouped in check.get("composition", {}).items():
        metrics[f"composition/{case}/passed"] = float(all(r["passed"] for r in regrouped.values()))
        worst = _worst(r[g]["max_abs"] for r in regrouped.values() for g in REGROUPINGS)
        if worst is not None:
            metrics[f"composition/{case}/max_abs"] = worst
    metrics |= bitwise_metrics(check)
    negative = check["negative"]
    metrics["negative/refused"] = float(sum(r["passed"] for r in negative.values()))
    metrics["negative/cases"] = float(len(negative))
    for path, by_batch in bench["latency_ms"].items():
        for label, stats in by_batch.items():
            for figure in LATENCY_METRICS:
                measured = stats.get(figure)
                if measured is not None:
                    metrics[f"latency_ms/{path}/{padded_label(label)}/{figure}"] = float(measured)
    if "peak" in bench:
        metrics["peak_gflops"] = float(bench["peak"]["gflops"])
    if "control" in bench:
        metrics["control_matmul_gflops"] = float(bench["control"]["gflops"])
    # Where a path's time is flat in batch size (vmapcheck.bench.timing.bounds.launch_bound).
    for path, entry in bench.get("launch_bound", {}).items():
        metrics[f"launch_bound/{path}/up_to_rows"] = float(entry["up_to_rows"])
        metrics[f"launch_bound/{path}/rows_per_s"] = float(entry["rows_per_s"])
    replay = bench.get("replay", {}).get("figures", {})
    for name in REPLAY_METRICS:
        if replay.get(name) is not None:
            metrics[f"replay/{name}"] = float(replay[name])
    for label, ratios in bench["speedup"].items():
        for name, value in ratios.items():
            metrics[f"speedup/{padded_label(label)}/{name}"] = float(value)
    # A train.json read back has every key (TrainMetrics); a caller's may have fewer.
    for name in TRAIN_METRICS:
        if name in train:
            metrics[f"train/{name}"] = float(train[name])
    return {metric_name(k): v for k, v in metrics.items()}


def run_name(
    config: Config,
    runtime: RuntimeRecord,
    git: dict[str, str],
    exp_name: str | None = None,
    when: datetime.datetime | None = None,
) -> str:
    """``<model>-<backend>-<precision>-<bench>-jax<version>-<commit>[-<dvc exp>]-<time>``,
    e.g. ``mlp-cpu-f32-quick-jax0.11.2-d79d813-exp-3f2a1-1201T214501``.

    The bench profile tells apart runs of the same code and config timed differently; the
    DVC experiment name (``exp_name``, under ``dvc exp run``) ties the run to its
    ``dvc exp show`` row; the UTC time ``when`` (default now, to the second) keeps two
    runs of one state (e.g. a failed attempt and its rerun) apart."""
    commit = git["git_commit"][:7] if git["git_commit"] != "unknown" else "nogit"
    stamp = (when or datetime.datetime.now(datetime.UTC)).strftime("%m%dT%H%M%S")
    exp = f"-{exp_name}" if exp_name else ""
    return (
        f"{config.model.name}-{config.backend.name}-{config.precision.name}-{config.bench.name}"
        f"-jax{runtime['jax_version']}-{commit}{exp}-{stamp}"
    )


def verdict_note(check: CheckDetails, bench: BenchDetails, perf: PerfOutcome | None = None) -> str:
    """The run's description (tag ``mlflow.note.content``, Markdown): the verdict and the
    figures a reviewer reads first (vmapcheck.report.headline), the same as the HTML
    report's first screen."""
    head = check_headline(check)
    lines = [f"**{verdict_words(check)}**: {verdict_sentence(check)}", ""]
    for caveat in (noisy_caveat(bench), bench_budget_caveat(bench)):
        if caveat:
            lines.append(f"- caveat: {caveat}")
    worst = head["worst"]
    if worst is not None:
        lines.append(
            f"- worst agreement: max_rel {worst['max_rel']:.3g} ({worst['pair']}, "
            f"case {worst['case']})"
        )
    reference = head["vs_reference"]
    lines.append(
        f"- vs stored reference: max_rel {reference['max_rel']:.3g}"
        if reference["max_rel"] is not None
        else f"- vs stored reference: {reference['status']}"
    )
    f64 = head["vs_float64"]
    if f64 is not None:
        lines.append(
            f"- vs float64: max_rel {f64['max_rel']:.3g} ({f64['path']}, case {f64['case']})"
        )
    lines.append(
        f"- invalid inputs refused by every path: {head['invalid_refused']}/{head['invalid_total']}"
    )
    speed = bench_headline(bench)
    if speed["batch"] is not None:
        shown = ", ".join(
            f"{name.replace('_', ' ')} {speedup_text(f['ratio'], f['ci'])}"
            for name, f in speed["speedups"].items()
        )
        lines.append(f"- at {speed['batch']} rows: {shown}")
    if perf is not None:
        # Here, not at the top: stages that import this module only to name metrics
        # (check) do not load the verdict's statistics (scipy).
        from vmapcheck.bench.verdict.labels import verdict_headline

        lines.append(f"- benchmark vs baseline: {verdict_headline(perf)}")
        if perf.get("why"):  # e.g. bench not rerun: where the timing came from
            lines.append(f"  ({perf['why']})")
    findings_shown = finding_lines(check, 5)
    lines += [f"- {line}" for line in findings_shown]
    hidden = len(check.get("findings", check["failures"])) - len(findings_shown)
    if hidden > 0:
        lines.append(f"- ... {hidden} more finding(s) in check.json")
    lines += ["", "Every figure: the metrics below; the full report: artifact `report.html`."]
    text = "\n".join(lines)
    return text if len(text) <= MAX_NOTE_CHARS else text[: MAX_NOTE_CHARS - 3] + "..."


def compared_params(config: Config) -> dict[str, Any]:
    """The :data:`COMPARED_PARAMS` of ``config``, flattened (``precision.tolerance.rtol``),
    then those of :data:`COMPARED_IF_PRESENT` that it has.

    Raises:
        ConfigError: a name in COMPARED_PARAMS is no longer a config key (renamed).
    """
    flat = flatten(config)
    missing = [k for k in COMPARED_PARAMS if k not in flat]
    if missing:
        raise ConfigError(
            f"vmapcheck.tracking.log.COMPARED_PARAMS names no config key: {', '.join(missing)}"
        )
    return {k: flat[k] for k in (*COMPARED_PARAMS, *COMPARED_IF_PRESENT) if k in flat}


def source_tags(root: Path) -> dict[str, str]:
    """Who made the run and from what, as the MLflow UI shows them (Created by, Source):
    ``MlflowClient.create_run`` sets none of these itself."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (e.g. a container's unnamed uid)
        user = "unknown"
    return {
        "mlflow.user": user,
        # The pipeline is the source: the UI shows the file's name, the path on hover.
        "mlflow.source.name": str(root / "dvc.yaml"),
        "mlflow.source.type": "LOCAL",
    }


def run_tags(
    config: Config,
    root: Path,
    check: CheckDetails,
    bench: BenchDetails,
    contract: ModelContract | None,
    git: dict[str, str],
    note: str | None = None,
    extra_tags: dict[str, str] | None = None,
) -> dict[str, str]:
    """The tags a run is created with: its verdict and note, who made it, what it ran
    (model, contract, bench, runtime, precision, reference, mesh), the git state,
    ``extra_tags`` and the tags naming this process (vmapcheck.tracking.store.owner_tags).
    """
    runtime = check["runtime"]
    sharded = check.get("sharded")
    return {
        "verdict": "passed" if check["passed"] else "failed",
        # The kinds of the findings that failed it (batching, numerical, model, contract).
        "verdict_kinds": ",".join(failing_kinds(check)) or "none",
        NOTE_TAG: note if note is not None else verdict_note(check, bench),
        **source_tags(root),
        "model": config.model.name,
        # What the model is (vmapcheck.params_io.contract_digest): last-verified matches it.
        **({MODEL_CONTRACT_TAG: contract_digest(contract)} if contract is not None else {}),
        "bench": config.bench.name,
        "backend": runtime["backend"],
        "platform": runtime["platform"],
        "device_kind": runtime["device_kind"],
        # Device count, memory, platform version and libtpu/CUDA plugin versions, where
        # the run recorded them (not in a report older than them; no memory on CPU).
        **runtime_tags(runtime),
        "precision": config.precision.name,
        "dtype": config.precision.dtype,
        "tolerance.rtol": repr(config.precision.tolerance.rtol),
        "tolerance.atol": repr(config.precision.tolerance.atol),
        "jax_version": runtime["jax_version"],
        "jaxlib_version": runtime["jaxlib_version"],
        "python_version": runtime["python_version"],
        "os_platform": runtime["os_platform"],
        "cpu_model": bench["machine"]["before"]["cpu_model"],
        "reference.status": check["reference"]["status"],
        **(
            {
                "contract.features": ",".join(contract["inputs"]["features"]),
                "contract.outputs": ",".join(contract["outputs"]["names"]),
                "contract.params_leaves": str(len(contract["params"])),
                "contract.batched_forward": str(contract["batched_forward"]).lower(),
            }
            if contract
            else {}
        ),
        **{f"reference.{k}": str(v) for k, v in check["reference"].get("made_with", {}).items()},
        **(
            {  # the data-parallel path's mesh: sharded_jit is not vmap
                "sharded.devices": str(sharded["devices"]),
                "sharded.mesh_shape": ",".join(
                    f"{axis}={size}" for axis, size in sharded["mesh_shape"].items()
                ),
            }
            if sharded
            else {}
        ),
        # Every mesh path's parallelism and mesh (none is vmap), where the run recorded them.
        **{f"mesh.{path}": mesh_label(about) for path, about in check.get("meshes", {}).items()},
        "bench_noisy": str(bench["machine"]["noisy"]).lower(),
        **git,
        "mlflow.source.git.commit": git["git_commit"],
        **(extra_tags or {}),
        **store.owner_tags(),
    }


def fill_run(
    client: Any,
    run_id: str,
    config: Config,
    metrics: dict[str, float],
    artifacts: list[Path],
    datasets: list[Any] | None,
    finish: bool,
) -> None:
    """Log the compared params, ``metrics`` (in batches of :data:`MAX_BATCH`), the
    datasets and the artifacts (a folder under its own name) to run ``run_id``; set it
    FINISHED when ``finish``. Any error sets it FAILED, then propagates."""
    try:
        from mlflow.entities import Metric, Param

        params = [Param(k, str(v)) for k, v in compared_params(config).items()]
        client.log_batch(run_id, params=params)
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, 0) for k, v in metrics.items()]
        for i in range(0, len(batch), MAX_BATCH):
            client.log_batch(run_id, metrics=batch[i : i + MAX_BATCH])
        if datasets:
            client.log_inputs(run_id, datasets=datasets)
        for path in artifacts:
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=path.name)
            elif path.is_file():
                client.log_artifact(run_id, str(path))
        if finish:
            client.set_terminated(run_id, status="FINISHED")
    except BaseException as exc:
        # FAILED is also a failed check's status: the tag says it was the logging that
        # failed (`vmapcheck compare` shows "log failed", not the verdict).
        with contextlib.suppress(Exception):  # the store may be what failed
            client.set_tag(run_id, store.LOG_FAILED_TAG, log_failure(exc))
        client.set_terminated(run_id, status="FAILED")
        raise


def log_failure(exc: BaseException) -> str:
    """The :data:`~vmapcheck.tracking.store.LOG_FAILED_TAG` value for ``exc``: which error
    stopped the logging (not the check's verdict)."""
    return f"logging the run failed: {type(exc).__name__}: {first_line(exc)}"[:5000]


def log_run(
    config: Config,
    root: Path,
    check: CheckDetails,
    bench: BenchDetails,
    train: TrainMetrics,
    artifacts: list[Path],
    contract: ModelContract | None = None,
    extra_tags: dict[str, str] | None = None,
    datasets: list[Any] | None = None,
    finish: bool = True,
    name: str | None = None,
    start_time: int | None = None,
    note: str | None = None,
) -> TrackReport:
    """Create one MLflow run holding everything; return its ids and where to find it.

    ``name``: the run's name (None: :func:`run_name` now); ``start_time``: its start in
    ms since the epoch (None: now; ``track`` passes :func:`run_start`, the start of the
    first stage that ran in this pipeline run); ``note``: its description (None:
    :func:`verdict_note`). The run ends when it is set FINISHED (by ``track``, last).

    The run is created with tags naming this process (vmapcheck.tracking.store.owner_tags),
    so a later ``track`` can tell a run left RUNNING by a killed process from one still
    being logged. ``finish`` False leaves it RUNNING for the caller's last writes
    (``track`` ends it with ``store.mark_complete``); an error marks it FAILED either way.

    ``extra_tags`` and ``datasets`` (MLflow ``DatasetInput`` objects) come from
    :func:`vmapcheck.tracking.run_inputs.gather_run_inputs`, and ``extra_tags`` also carry
    vmapcheck.tracking.store's ``pipeline_key``, set when the run is created so that an attempt
    that dies half-way can be found and replaced.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(config.tracking, root)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment_label = experiment_name(config)
    # Created if missing; another process (a parallel experiment) may create it too.
    experiment_id = store.ensure_experiment(
        uri, experiment_label, resolve_artifact_root(config.tracking, root)
    )
    git = git_state(root)
    collected = collect_metrics(check, bench, train)
    describe_experiment(
        client, experiment_id, config, [k for k in collected if k.startswith("_summary/")]
    )
    tags = run_tags(config, root, check, bench, contract, git, note, extra_tags)
    if name is None:
        name = run_name(config, check["runtime"], git, (extra_tags or {}).get("dvc_exp_name"))
    # Filed after the newest run in the store, whatever the clock says (tracking.clock).
    start_time, clock_tags = checked_start_ms(client, start_time)
    run = client.create_run(
        experiment_id, start_time=start_time, run_name=name, tags={**tags, **clock_tags}
    )
    run_id = run.info.run_id
    fill_run(client, run_id, config, collected, artifacts, datasets, finish)
    return {
        "run_id": run_id,
        "run_name": run.info.run_name,
        "experiment": experiment_label,
        "experiment_id": experiment_id,
        "tracking_uri": uri,
        "verdict": "passed" if check["passed"] else "failed",
        # Which outputs this run judged: make_reference links a reference to this run
        # only when it is made from the same outputs.
        "forward_outputs_sha256": check.get("forward_outputs_sha256"),
        "git_commit": git["git_commit"],
        "git_dirty": git["git_dirty"],
        "git_outputs_rewritten": git["git_outputs_rewritten"],
    }


def perf_metrics(result: PerfVerdict) -> dict[str, float]:
    """The regression verdict as metrics: the count, the control's slowdown and each
    cell's ratio, ``perf/<path>/b<batch>/ratio`` (its interval and p-value are in the
    run's perf_verdict.json artifact and the HTML report)."""
    metrics: dict[str, float] = {"perf/regressions": float(len(result["regressions"]))}
    slowdown = result.get("machine_slowdown")
    if slowdown is not None:
        metrics["perf/machine_slowdown"] = float(slowdown)
    for path, by_batch in result["cells"].items():
        for label, cell in by_batch.items():
            metrics[f"perf/{path}/{padded_label(label)}/ratio"] = float(cell["ratio"])
    return {metric_name(k): v for k, v in metrics.items()}


def log_perf_verdict(tracking_uri: str, run_id: str, result: PerfOutcome) -> None:
    """Attach a benchmark verdict (vmapcheck.bench.verdict.regression.compare, or why
    there was none) to run ``run_id``: tags ``perf_verdict``/``perf_baseline`` and
    ``perf/...`` metrics."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    compared = result.get("baseline", {}).get("source") if "baseline" in result else None
    baseline = compared or result.get("why", "")
    tags = [RunTag("perf_verdict", result["verdict"]), RunTag("perf_baseline", baseline[:5000])]
    now = int(time.time() * 1000)
    metrics = (
        [Metric(k, v, now, 0) for k, v in perf_metrics(result).items()] if "cells" in result else []
    )
    client.log_batch(run_id, metrics=metrics[:MAX_BATCH], tags=tags)
    for i in range(MAX_BATCH, len(metrics), MAX_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + MAX_BATCH])


def log_diagnosis(tracking_uri: str, run_id: str, diagnosis: DiagnosisReport) -> None:
    """Tag run ``run_id`` with the diagnosis of its check (reports/diagnosis.json, logged
    as an artifact): ``diagnosis.status``, and where the first divergence is, so failed
    runs can be searched by stage and layer."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    first: Mapping[str, Any] = diagnosis.get("first_divergence") or {}
    tags: dict[str, str] = {"diagnosis.status": diagnosis["status"]}
    for key in ("stage", "layer", "leaf"):
        if first.get(key):
            tags[f"diagnosis.{key}"] = str(first[key])
    if first.get("paths"):
        tags["diagnosis.paths"] = ",".join(first["paths"])
    MlflowClient(tracking_uri=tracking_uri).log_batch(
        run_id, tags=[RunTag(k, v[:5000]) for k, v in tags.items()]
    )


# The longest pause between one stage's end and the next one's start within one pipeline
# run (DVC hashes and caches a stage's outputs in between: seconds, a minute for large
# ones). A stage that ended longer before is of an earlier run: DVC skipped it this time,
# or restored its outputs (and its time record) from the cache.
RUN_GAP_S = 120.0


def run_start(stages: Mapping[str, StageTime], now: float, gap_s: float = RUN_GAP_S) -> float:
    """When this pipeline run started (seconds since the epoch), for the MLflow run's start
    time: the start of the first stage of the chain of stages that ran one after the other
    up to ``track`` (the stage time records, :func:`vmapcheck.pipeline.stage.
    read_stage_times`), each starting at most ``gap_s`` after the one before it ended with
    exit code 0. A stage that DVC skipped keeps the time of the run that made its outputs,
    possibly days earlier: it is not part of this run. ``now`` when ``track`` has no
    record (its body was called without the stage runner)."""
    ordered = sorted((r for name, r in stages.items() if name != "track"), key=lambda r: r["start"])
    own = stages.get("track")
    if own is None:
        return now
    start = float(own["start"])
    for record in reversed([r for r in ordered if r["start"] < start]):
        end = record.get("end")
        if end is None or record.get("exit_code") != 0 or not 0 <= start - end <= gap_s:
            break
        start = float(record["start"])
    return start


def timeline(stages: Mapping[str, StageTime], now: float) -> dict[str, StageTime]:
    """The stage time records (vmapcheck.pipeline.stage.read_stage_times), the one still
    running (``track`` itself: no ``end``) ended at ``now`` (seconds since the epoch)."""
    out: dict[str, StageTime] = {}
    for stage, record in stages.items():
        if record.get("end") is None:
            record = {**record, "end": now, "wall_s": round(now - record["start"], 3)}
        out[stage] = record
    return out


def timeline_metrics(stages: Mapping[str, StageTime]) -> dict[str, float]:
    """``timeline/<stage>_s``: each stage's wall time in seconds (as last run: a stage
    that DVC restored from its cache keeps the time of the run that made its outputs)."""
    walls = {stage: record.get("wall_s") for stage, record in stages.items()}
    return {
        metric_name(f"timeline/{stage}_s"): float(wall)
        for stage, wall in walls.items()
        if wall is not None
    }


def log_timeline(
    tracking_uri: str, run_id: str, stages: Mapping[str, StageTime], now: float
) -> None:
    """Attach the pipeline's per-stage wall time to run ``run_id``: metrics
    ``timeline/<stage>_s`` and the artifact ``timeline.json`` (every stage's start, end,
    wall time and exit code, the records of ``reports/stages/``)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    records = timeline(stages, now)
    stamp = int(now * 1000)
    metrics = [Metric(k, v, stamp, 0) for k, v in timeline_metrics(records).items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    client.log_dict(run_id, {"stages": records}, "timeline.json")
