"""DVC stage `track`: one MLflow run with config, metrics, versions and artifacts.

This is where a failed check becomes a non-zero exit: after it has been logged.
"""

from vmapcheck.config import Config
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.stage import DATA, REPORTS, ROOT, stage_main
from vmapcheck.tracking import log_run


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
    atomic_write_json(REPORTS / "track.json", info)
    print(f"track: logged run {info['run_id']} ({info['run_name']}) to {info['tracking_uri']}")
    if info["verdict"] != "passed":
        print("track: the check FAILED (logged above); exiting non-zero", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
