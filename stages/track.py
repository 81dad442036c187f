"""DVC stage `track`: one MLflow run with config, metrics, versions and artifacts.

It also writes the HTML report (reports/report.html), logged with the run, whatever the
verdict. This is where a failed check becomes a non-zero exit: after it has been logged.
"""

from vmapcheck.config import Config
from vmapcheck.html_report import render_report
from vmapcheck.io import atomic_write_json, atomic_write_text, read_json
from vmapcheck.provenance import git_state
from vmapcheck.stage import DATA, REPORTS, ROOT, stage_main
from vmapcheck.tracking import log_run, run_name


@stage_main("track")
def main(config: Config) -> int:
    check = read_json(REPORTS / "check_details.json")
    bench = read_json(REPORTS / "bench_details.json")
    train = read_json(REPORTS / "train.json")
    contract = read_json(DATA / "params" / "contract.json")
    git = git_state(ROOT)
    # Written before logging: a failed check is reported (and logged) like a passed one.
    report = render_report(
        check,
        bench,
        train,
        contract,
        git=git,
        run={
            "MLflow experiment": config.tracking.experiment,
            "MLflow run name": run_name(config, check["runtime"], git),
            "config (model, precision, backend, bench)": (
                f"{config.model.name}, {config.precision.name}, {config.backend.name}, "
                f"{config.bench.name}"
            ),
        },
    )
    atomic_write_text(REPORTS / "report.html", report)
    artifacts = [
        REPORTS / "report.html",
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
    info = log_run(config, ROOT, check, bench, train, artifacts, contract)
    atomic_write_json(REPORTS / "track.json", info)
    print(f"track: logged run {info['run_id']} ({info['run_name']}) to {info['tracking_uri']}")
    print(f"track: HTML report: {REPORTS / 'report.html'} (also an artifact of the run)")
    if info["verdict"] != "passed":
        print("track: the check FAILED (logged above); exiting non-zero", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
