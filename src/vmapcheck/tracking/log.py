"""Log one pipeline run to MLflow: config as params, figures as metrics, versions as tags.

Metric names follow one sortable scheme (documented in docs/tracking.md):
``agree/<case>/<pathA>-vs-<pathB>/max_abs``, ``latency_ms/<path>/b<batch>/p50``,
``speedup/b<batch>/vmap_over_loop``, ``composition/<case>/<path>/passed``,
``check/passed``, ``train/val_loss``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.check.schema import CheckDetails
from vmapcheck.config import Config, flatten
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.tracking import store
from vmapcheck.tracking.provenance import git_state
from vmapcheck.tracking.store import experiment_name, resolve_artifact_root, resolve_tracking_uri

MAX_BATCH = 1000  # MLflow's per-request limit for metrics (params: 100)


def metric_name(name: str) -> str:
    """A name MLflow accepts (alphanumerics, _ - . space : /): ``layers[0].W`` -> ``layers.0.W``."""
    name = re.sub(r"\[(\w+)\]", r".\1", name).replace("..", ".")
    return re.sub(r"[^\w.\- :/]", "_", name)


def collect_metrics(
    check: CheckDetails, bench: dict[str, Any], train: dict[str, Any]
) -> dict[str, float]:
    """Flatten the stage reports into MLflow metric names (numbers only)."""
    metrics: dict[str, float] = {
        "check/passed": float(check["passed"]),
        "check/n_failures": float(len(check["failures"])),
    }
    for case, report in check["cases"].items():
        metrics[f"agree/{case}/passed"] = float(report["passed"])
        for pair, result in report["pairs"].items():
            for stat in ("max_abs", "max_rel"):
                if result[stat] is not None:
                    metrics[f"agree/{case}/{pair}/{stat}"] = result[stat]
        for path, result in report.get("oracle", {}).items():
            for stat in ("max_abs", "max_rel"):
                if result[stat] is not None:
                    metrics[f"oracle/{case}/{path}/{stat}"] = result[stat]
        for path, value in report.get("loss", {}).items():
            metrics[f"loss/{case}/{path}"] = value
    gradients = check.get("gradients", {})
    if gradients.get("status") == "ok":
        metrics["gradients/passed"] = float(gradients["passed"])
        metrics["gradients/loss"] = float(gradients["loss"])
        metrics["gradients/nan_probe_detected"] = float(not gradients["nan_probe"]["loss_finite"])
        for leaf, result in gradients["per_example_vs_batch"].items():
            for stat in ("max_abs", "max_rel"):
                if result[stat] is not None:
                    metrics[f"gradients/{leaf}/{stat}"] = result[stat]
    reference = check["reference"]
    metrics["reference/passed"] = float(reference["passed"])
    for case, by_path in reference.get("cases", {}).items():
        for path, result in by_path.items():
            for stat in ("max_abs", "max_rel"):
                if result[stat] is not None:
                    metrics[f"reference/{case}/{path}/{stat}"] = result[stat]
    for case, loss in reference.get("losses", {}).items():
        metrics[f"reference/{case}/loss_abs_diff"] = abs(loss["current"] - loss["reference"])
    # Each batch path on the batch regrouped against itself on the batch as it is:
    # max_abs is the worst over the regroupings (vmapcheck.core.composition).
    for case, by_path in check.get("composition", {}).items():
        for path, result in by_path.items():
            metrics[f"composition/{case}/{path}/passed"] = float(result["passed"])
            values = [result[g]["max_abs"] for g in REGROUPINGS if result[g]["max_abs"] is not None]
            if values:
                metrics[f"composition/{case}/{path}/max_abs"] = max(values)
    for case, report in check["negative"].items():
        metrics[f"negative/{case}/passed"] = float(report["passed"])
        metrics[f"negative/{case}/refused_paths"] = float(
            sum(p["refused"] for p in report["paths"].values())
        )
    for path, by_batch in bench["latency_ms"].items():
        for label, stats in by_batch.items():
            for stat, value in stats.items():
                if stat == "rows_per_s":
                    metrics[f"throughput_rows_per_s/{path}/{label}"] = float(value)
                else:
                    metrics[f"latency_ms/{path}/{label}/{stat}"] = float(value)
    for path, by_batch in bench.get("figures", {}).items():
        for label, figures in by_batch.items():
            for stat in (
                "first_call_ms",
                "compile_ms",
                "flops",
                "bytes_accessed",
                "temp_bytes",
                "gflops",
                "roofline",
            ):
                value = figures.get(stat)
                if value is not None and np.isfinite(value):
                    metrics[f"{stat}/{path}/{label}"] = float(value)
    if "peak" in bench:
        metrics["peak_gflops"] = float(bench["peak"]["gflops"])
    for name, value in bench.get("replay", {}).get("figures", {}).items():
        metrics[f"replay/{name}"] = float(value)
    for label, ratios in bench["speedup"].items():
        for name, value in ratios.items():
            metrics[f"speedup/{label}/{name}"] = float(value)
    for name in ("train_loss", "val_loss", "test_loss", "best_step"):
        if name in train:
            metrics[f"train/{name}"] = float(train[name])
    return {metric_name(k): v for k, v in metrics.items()}


def run_name(config: Config, runtime: dict[str, Any], git: dict[str, str]) -> str:
    commit = git["git_commit"][:7] if git["git_commit"] != "unknown" else "nogit"
    return (
        f"{config.model.name}-{config.backend.name}-{config.precision.name}"
        f"-jax{runtime['jax_version']}-{commit}"
    )


def log_run(
    config: Config,
    root: Path,
    check: CheckDetails,
    bench: dict[str, Any],
    train: dict[str, Any],
    artifacts: list[Path],
    contract: dict[str, Any] | None = None,
    extra_tags: dict[str, str] | None = None,
    datasets: list[Any] | None = None,
    finish: bool = True,
) -> dict[str, Any]:
    """Create one MLflow run holding everything; return its ids and where to find it.

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
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(config.tracking, root)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment_label = experiment_name(config)
    # Created if missing; another process (a parallel experiment) may create it too.
    experiment_id = store.ensure_experiment(
        uri, experiment_label, resolve_artifact_root(config.tracking, root)
    )
    runtime = check["runtime"]
    git = git_state(root)
    verdict = "passed" if check["passed"] else "failed"
    tags = {
        "verdict": verdict,
        "model": config.model.name,
        "backend": runtime["backend"],
        "platform": runtime["platform"],
        "device_kind": runtime["device_kind"],
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
                "sharded.devices": str(check["sharded"]["devices"]),
                "sharded.mesh_shape": ",".join(
                    f"{axis}={size}" for axis, size in check["sharded"]["mesh_shape"].items()
                ),
            }
            if check.get("sharded")
            else {}
        ),
        "bench_noisy": str(bench["machine"]["noisy"]).lower(),
        **git,
        "mlflow.source.git.commit": git["git_commit"],
        **(extra_tags or {}),
        **store.owner_tags(),
    }
    run = client.create_run(experiment_id, run_name=run_name(config, runtime, git), tags=tags)
    run_id = run.info.run_id
    try:
        params = [Param(k, str(v)) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):
            client.log_batch(run_id, params=params[i : i + 100])
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in collect_metrics(check, bench, train).items()]
        for i in range(0, len(metrics), MAX_BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + MAX_BATCH])
        if datasets:
            client.log_inputs(run_id, datasets=datasets)
        for path in artifacts:
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=path.name)
            elif path.is_file():
                client.log_artifact(run_id, str(path))
        if finish:
            client.set_terminated(run_id, status="FINISHED")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    return {
        "run_id": run_id,
        "run_name": run.info.run_name,
        "experiment": experiment_label,
        "experiment_id": experiment_id,
        "tracking_uri": uri,
        "verdict": verdict,
        # Which outputs this run judged: make_reference links a reference to this run
        # only when it is made from the same outputs.
        "forward_outputs_sha256": check.get("forward_outputs_sha256"),
        **git,
    }


def perf_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The regression verdict as metrics: ``perf/<path>/b<batch>/ratio`` etc."""
    metrics: dict[str, float] = {"perf/regressions": float(len(result["regressions"]))}
    if result.get("machine_slowdown") is not None:
        metrics["perf/machine_slowdown"] = float(result["machine_slowdown"])
    for path, by_batch in result["cells"].items():
        for label, cell in by_batch.items():
            for stat in ("ratio", "ci_low", "ci_high", "p_slower_adjusted"):
                metrics[f"perf/{path}/{label}/{stat}"] = float(cell[stat])
    return {metric_name(k): v for k, v in metrics.items()}


def log_perf_verdict(tracking_uri: str, run_id: str, result: dict[str, Any]) -> None:
    """Attach a benchmark verdict (vmapcheck.bench.verdict.compare, or why there was none) to
    run ``run_id``: tags ``perf_verdict``/``perf_baseline`` and ``perf/...`` metrics."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    baseline = result.get("baseline", {}).get("source") or result.get("why", "")
    tags = [RunTag("perf_verdict", result["verdict"]), RunTag("perf_baseline", baseline[:5000])]
    now = int(time.time() * 1000)
    metrics = (
        [Metric(k, v, now, 0) for k, v in perf_metrics(result).items()] if "cells" in result else []
    )
    client.log_batch(run_id, metrics=metrics[:MAX_BATCH], tags=tags)
    for i in range(MAX_BATCH, len(metrics), MAX_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + MAX_BATCH])


def log_diagnosis(tracking_uri: str, run_id: str, diagnosis: dict[str, Any]) -> None:
    """Tag run ``run_id`` with the diagnosis of its check (reports/diagnosis.json, logged
    as an artifact): ``diagnosis.status``, and where the first divergence is, so failed
    runs can be searched by stage and layer."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    first = diagnosis.get("first_divergence") or {}
    tags = {"diagnosis.status": diagnosis["status"]}
    for key in ("stage", "layer", "leaf"):
        if first.get(key):
            tags[f"diagnosis.{key}"] = str(first[key])
    if first.get("paths"):
        tags["diagnosis.paths"] = ",".join(first["paths"])
    MlflowClient(tracking_uri=tracking_uri).log_batch(
        run_id, tags=[RunTag(k, v[:5000]) for k, v in tags.items()]
    )
