"""DVC stage `track`: one MLflow run with config, metrics, versions and artifacts.

This is where a failed check becomes a non-zero exit: after it has been logged.
"""

from vmapcheck.config import Config
from vmapcheck.errors import VmapcheckError
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.stage import DATA, REPORTS, ROOT, stage_main
from vmapcheck.tracking import log_perf_verdict, log_run, mark_no_baseline
from vmapcheck.verdict import compare, format_table, read_bench_file, resolve_baseline


def judge_performance(config: Config, info: dict) -> str:
    """Compare this run's benchmark with bench.regression.baseline; log it to the run.

    A regression is reported (and logged), not fatal: latency on a shared machine is
    judged by people, the agreement checks gate the pipeline.
    """
    spec = config.bench.regression.baseline
    out = REPORTS / "perf_verdict.json"
    if spec is None:
        atomic_write_json(
            out, {"verdict": "not compared", "why": "bench.regression.baseline: null"}
        )
        return "not compared"
    tags = {
        "model": config.model.name,
        "backend": config.backend.name,
        "precision": config.precision.name,
    }
    uri, run_id = info["tracking_uri"], info["run_id"]
    current = read_bench_file(REPORTS / "bench_details.json")
    try:
        baseline = resolve_baseline(spec, uri, info["experiment"], tags, exclude=run_id)
    except VmapcheckError as exc:
        print(f"track: no benchmark baseline ({exc})")
        atomic_write_json(out, {"verdict": "no baseline", "why": str(exc)})
        mark_no_baseline(uri, run_id, str(exc))
        return "no baseline"
    regression = config.bench.regression
    result = compare(
        baseline, current, regression.factor, regression.alpha, config.bench.confidence_level
    )
    atomic_write_json(out, result)
    log_perf_verdict(uri, run_id, result, out)
    print(format_table(result))
    return result["verdict"]


@stage_main("track")
def main(config: Config) -> int:
    check = read_json(REPORTS / "check_details.json")
    bench = read_json(REPORTS / "bench_details.json")
    train = read_json(REPORTS / "train.json")
    artifacts = [
        REPORTS / "check.json",
        REPORTS / "check_details.json",
        REPORTS / "bench.json",
        REPORTS / "bench_details.json",
        REPORTS / "train.json",
        REPORTS / "plots",
        DATA / "params",
        DATA / "params" / "contract.json",
        DATA / "cases" / "manifest.json",
        ROOT / "params.yaml",
        ROOT / "dvc.lock",
    ]
    contract = read_json(DATA / "params" / "contract.json")
    info = log_run(config, ROOT, check, bench, train, artifacts, contract)
    print(f"track: logged run {info['run_id']} ({info['run_name']}) to {info['tracking_uri']}")
    info["perf_verdict"] = judge_performance(config, info)
    atomic_write_json(REPORTS / "track.json", info)
    if info["verdict"] != "passed":
        print("track: the check FAILED (logged above); exiting non-zero", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
