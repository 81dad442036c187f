"""DVC stage `track`: one MLflow run with config, metrics, versions and artifacts.

Before logging it judges the benchmark against its baseline (bench.regression) and
writes the HTML report (reports/report.html), both logged with the run whatever the
verdict. This is where a failed check becomes a non-zero exit: after it has been logged.

The store is opened first (vmapcheck.store): a tracking server that does not answer fails
the stage within seconds, naming its URI, and the reports stay on disk for the next
`dvc repro`; a run is logged once per pipeline state (tag ``pipeline_key``).
"""

import tempfile
from pathlib import Path
from typing import Any

from vmapcheck.config import Config
from vmapcheck.errors import VmapcheckError
from vmapcheck.html_report import render_report
from vmapcheck.io import atomic_write_json, atomic_write_text, read_json
from vmapcheck.provenance import git_state
from vmapcheck.registry import register_if_verified
from vmapcheck.run_inputs import gather_run_inputs
from vmapcheck.stage import DATA, REPORTS, ROOT, stage_main
from vmapcheck.store import (
    PIPELINE_KEY_TAG,
    mark_complete,
    open_store,
    pipeline_key,
    reaching,
    settle_earlier_attempts,
    writer_lock,
)
from vmapcheck.tracking import (
    experiment_name,
    log_diagnosis,
    log_perf_verdict,
    log_run,
    resolve_tracking_uri,
    run_name,
)
from vmapcheck.verdict import compare, format_table, record_from_details, resolve_baseline


def judge_performance(
    config: Config, bench: dict[str, Any], exclude: str | None = None
) -> dict[str, Any]:
    """This run's benchmark (``bench``: its bench_details.json, parsed) against
    bench.regression.baseline (None: not compared).

    A regression is reported (and logged), not fatal: latency on a shared machine is
    judged by people; the agreement checks gate the pipeline.
    """
    spec = config.bench.regression.baseline
    if spec is None:
        return {"verdict": "not compared", "why": "bench.regression.baseline is null"}
    tags = {
        "model": config.model.name,
        "backend": config.backend.name,
        "precision": config.precision.name,
    }
    uri = resolve_tracking_uri(config.tracking, ROOT)
    current = record_from_details(bench, str(REPORTS / "bench_details.json"))
    try:
        # This run is not logged yet: "last-verified" is the newest earlier one.
        baseline = resolve_baseline(spec, uri, experiment_name(config), tags, exclude)
    except VmapcheckError as exc:
        print(f"track: no benchmark baseline ({exc})")
        return {"verdict": "no baseline", "why": str(exc)}
    regression = config.bench.regression
    result = compare(
        baseline, current, regression.factor, regression.alpha, config.bench.confidence_level
    )
    print(format_table(result))
    return result


def _registry_line(result: dict[str, Any]) -> str:
    if result["status"] == "registered":
        moved = f" (from version {result['previous']})" if result["previous"] else ""
        return f"params registered as {result['uri']}; alias {result['alias']} moved to it{moved}"
    return f"{result['status']}: {result['why']}"


@stage_main("track")
def main(config: Config) -> int:
    # Before any work: a stopped server fails here, naming its URI. The lock makes parallel
    # experiments (dvc queue start -j N) take turns on a sqlite store.
    uri = open_store(config.tracking, ROOT)
    with reaching(uri, config.tracking), writer_lock(uri):
        return track(config)


def track(config: Config) -> int:
    """Judge the benchmark, write the HTML report, log the run (once per pipeline state)."""
    key = pipeline_key(ROOT)
    # A half-logged run from an earlier attempt is deleted; a complete one is kept and
    # nothing is logged twice (vmapcheck.store).
    earlier = settle_earlier_attempts(resolve_tracking_uri(config.tracking, ROOT), key)
    check = read_json(REPORTS / "check_details.json")
    bench = read_json(REPORTS / "bench_details.json")
    train = read_json(REPORTS / "train.json")
    contract = read_json(DATA / "params" / "contract.json")
    git = git_state(ROOT)
    perf = judge_performance(config, bench, exclude=earlier["run_id"] if earlier else None)
    atomic_write_json(REPORTS / "perf_verdict.json", perf)
    # Written before logging: a failed check is reported (and logged) like a passed one.
    report = render_report(
        check,
        bench,
        train,
        contract,
        git=git,
        run={
            "MLflow experiment": experiment_name(config),
            "MLflow run name": run_name(config, check["runtime"], git),
            "config (model, precision, backend, bench)": (
                f"{config.model.name}, {config.precision.name}, {config.backend.name}, "
                f"{config.bench.name}"
            ),
            "benchmark vs baseline": perf["verdict"],
        },
    )
    atomic_write_text(REPORTS / "report.html", report)
    artifacts = [
        REPORTS / "report.html",
        REPORTS / "check.json",
        REPORTS / "check_details.json",
        REPORTS / "bench.json",
        REPORTS / "bench_details.json",
        REPORTS / "perf_verdict.json",
        REPORTS / "train.json",
        # The diagnosis of a failed check (the first stage, layer and leaf that diverge).
        REPORTS / "diagnosis.json",
        REPORTS / "diagnosis.txt",
        REPORTS / "plots",
        DATA / "params",
        DATA / "params" / "contract.json",
        DATA / "cases" / "manifest.json",
        ROOT / "params.yaml",
        ROOT / "dvc.lock",
    ]
    if earlier is None:
        # Datasets (full sha256 digests), dvc.lock digest, DVC experiment name, environment/.
        with tempfile.TemporaryDirectory() as scratch:
            inputs = gather_run_inputs(ROOT, Path(scratch))
            info = log_run(
                config,
                ROOT,
                check,
                bench,
                train,
                [*artifacts, inputs.environment],
                contract,
                extra_tags={**inputs.tags, PIPELINE_KEY_TAG: key},
                datasets=inputs.datasets,
            )
        log_perf_verdict(info["tracking_uri"], info["run_id"], perf)
        log_diagnosis(info["tracking_uri"], info["run_id"], read_json(REPORTS / "diagnosis.json"))
        info["perf_verdict"] = perf["verdict"]
        # Registry: a passing run's params become a new version, alias `verified` moves.
        info["registry"] = register_if_verified(config, info, check["runtime"], DATA / "params")
        print(f"track: registry: {_registry_line(info['registry'])}")
        # The run's last write: an attempt that dies before it is replaced, not duplicated.
        mark_complete(info["tracking_uri"], info["run_id"])
    else:
        info = earlier | {"forward_outputs_sha256": check.get("forward_outputs_sha256")}
    atomic_write_json(REPORTS / "track.json", info)
    logged = "logged" if earlier is None else "the same inputs were logged before (not again):"
    print(f"track: {logged} run {info['run_id']} ({info['run_name']}) to {info['tracking_uri']}")
    print(f"track: HTML report: {REPORTS / 'report.html'} (also an artifact of the run)")
    if info["verdict"] != "passed":
        print("track: the check FAILED (logged above); exiting non-zero", flush=True)
        return 1
    replay = bench.get("replay", {}).get("figures", {})
    if replay and not replay["passed"]:
        print(
            "track: the guard's replay FAILED (compiles above the bucket count, or a request "
            "got another outcome than planted; logged above as replay/*); exiting non-zero",
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
