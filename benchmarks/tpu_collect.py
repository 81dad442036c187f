"""Collect one accelerator pipeline run's evidence into one JSON (benchmarks/tpu_run.sh).

Reads a project folder after ``dvc repro``: the printed verdict (``vmapcheck summary``),
the check's headline and runtime, and the bench's peak, launch-bound paths, p50 latency
and rows/s per path and batch size, what was left out and why, and where the bench's time
went. Usage: ``python benchmarks/tpu_collect.py PROJECT --out FILE [--repro-status N]
[--wall-s S]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from vmapcheck.io import atomic_write_json


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def bench_figures(details: dict[str, Any]) -> dict[str, Any]:
    """The bench figures a reader of an accelerator run needs, without the samples."""
    return {
        "bench": details["bench"]["name"],
        "batch_sizes": details["batch_sizes"],
        "peak": details.get("peak"),
        "control": {k: v for k, v in (details.get("control") or {}).items() if k != "samples_ms"},
        "launch_bound": details.get("launch_bound"),
        "p50_ms": {
            path: {label: s["p50"] for label, s in by.items()}
            for path, by in details["latency_ms"].items()
        },
        "p99_ms": {
            path: {label: s["p99"] for label, s in by.items()}
            for path, by in details["latency_ms"].items()
        },
        "rows_per_s": {
            path: {label: s["rows_per_s"] for label, s in by.items()}
            for path, by in details["latency_ms"].items()
        },
        "share_of_peak": {
            path: {label: f.get("roofline") for label, f in by.items()}
            for path, by in details["figures"].items()
        },
        "compile_ms": {
            path: {label: f["compile_ms"] for label, f in by.items() if "compile_ms" in f}
            for path, by in details["figures"].items()
        },
        "speedup": details["speedup"],
        "speedup_ci": details["speedup_ci"],
        "skipped": {path: reasons for path, reasons in details["skipped"].items() if reasons},
        "phases_s": details["phases_s"],
        "time_budget_s": details["bench"]["early_stop"]["time_budget_s"],
        "replay": {k: details["replay"].get(k) for k in ("figures", "wall_s", "requests")},
        "machine_before": details["machine"]["before"],
        "runtime": details["runtime"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repro-status", type=int, default=None)
    parser.add_argument("--wall-s", type=float, default=None)
    args = parser.parse_args()
    reports = args.project / "reports"
    summary = subprocess.run(
        ["vmapcheck", "summary"], cwd=args.project, capture_output=True, text=True, check=False
    )
    check = _read(reports / "check_details.json") or {}
    bench = _read(reports / "bench_details.json")
    params = (args.project / "params.yaml").read_text()
    atomic_write_json(
        args.out,
        {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": sys.version.split()[0],
            "dvc_repro_status": args.repro_status,
            "dvc_repro_wall_s": args.wall_s,
            "verdict_printed": summary.stdout.splitlines(),
            "check": _read(reports / "check.json"),
            "check_runtime": check.get("runtime"),
            "bench": bench_figures(bench) if bench else None,
            "params_yaml": params,
        },
    )
    print(f"collected {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
