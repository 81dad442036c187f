"""DVC stage `check`: agreement of every pair, output contract, refusal of invalid input.

Report, then assert: this stage always writes its report and exits 0 on a failed check,
so that `track` logs the failure to MLflow before the pipeline exits non-zero.
"""

from vmapcheck.checks import metrics_summary, run_checks
from vmapcheck.config import Config
from vmapcheck.io import atomic_write_json, load_npz, read_json
from vmapcheck.stage import CASES, FORWARD, REPORTS, stage_main


@stage_main("check")
def main(config: Config) -> None:
    report = run_checks(
        config,
        read_json(CASES / "manifest.json"),
        load_npz(FORWARD / "outputs.npz"),
        read_json(FORWARD / "record.json"),
    )
    atomic_write_json(REPORTS / "check_details.json", report)
    atomic_write_json(REPORTS / "check.json", metrics_summary(report))
    tol = report["tolerance"]
    print(f"check: tolerance rtol={tol['rtol']:g} atol={tol['atol']:g} ({report['dtype']})")
    for name, case in report["cases"].items():
        mark = "ok  " if case["passed"] else "FAIL"
        print(f"  {mark} {name:<14} max_abs={case['max_abs']} max_rel={case['max_rel']}")
    for name, case in report["negative"].items():
        mark = "ok  " if case["passed"] else "FAIL"
        print(f"  {mark} {name:<14} refused by every path: {case['expect']}")
    for failure in report["failures"][:20]:
        print(f"  failure: {failure}")
    print(f"check: {'PASSED' if report['passed'] else 'FAILED'} (track logs it, then exits)")


if __name__ == "__main__":
    raise SystemExit(main())
