"""`dvc repro` of the shipped demo beside the repository's load generator (issue 44): are
the quick bench's 128-row cells timed (or does the verdict name what is missing), and how
far do the matmul peak and a path's share of it spread across runs?

Each run copies this repository's project (what ``vmapcheck init`` wrote: dvc.yaml,
params.yaml, conf/, stages/, data/, ...) into a fresh git repository, starts
``scripts/load SPINNERS`` beside it, runs ``dvc repro`` there with this checkout's
``.venv`` first on PATH, and reads back what a user reads: the verdict (``vmapcheck
summary``), ``reports/bench_details.json`` and ``reports/bench.json``. The load is
sampled every 5 s over the run.

Usage (from the project root, after ``make setup``)::

    .venv/bin/python benchmarks/repro_under_load.py --spinners 8 --runs 4 \
        --json benchmarks/repro_under_load_<date>.json

Nothing here is mocked: DVC, MLflow and JAX run as ``make demo`` runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILES = (
    "dvc.yaml",
    "params.yaml",
    "conf",
    "stages",
    "data",
    "reports",
    "requirements.lock",
    "VMAPCHECK.md",
    ".dvc",
    ".dvcignore",
    ".gitignore",
)
LABEL = "b128"
HEADLINE_PATHS = ("loop_jit", "vmap_jit", "direct_jit", "map_jit")


def new_project(dest: Path) -> None:
    """A copy of this repository's project in its own git repository at ``dest``, without
    the DVC cache or any run's outputs tracked by DVC."""
    dest.mkdir(parents=True)
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("cache", "tmp"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "demo"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every_s`` seconds until :meth:`stop`."""

    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._stop_event.set()
        self.join()
        return self.samples


def one_run(work: Path, spinners: int) -> dict[str, Any]:
    """One ``dvc repro`` of a fresh copy of the project beside ``spinners`` busy processes."""
    project = work / "project"
    new_project(project)
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env["DVC_NO_ANALYTICS"] = "1"
    load = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "load"), str(spinners)])
    sampler = LoadSampler()
    try:
        time.sleep(20)  # the 1-minute average rises towards the load before the run
        sampler.start()
        began = time.perf_counter()
        repro = subprocess.run(
            ["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - began
    finally:
        loads = sampler.stop() if sampler.is_alive() else sampler.samples
        load.terminate()
        load.wait()
    summary = subprocess.run(
        ["vmapcheck", "summary", "--repro-status", str(repro.returncode)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    details_path = project / "reports" / "bench_details.json"
    details = json.loads(details_path.read_text()) if details_path.exists() else {}
    headline_path = project / "reports" / "bench.json"
    headline = json.loads(headline_path.read_text()) if headline_path.exists() else {}
    peak = details.get("peak", {})
    figures = details.get("figures", {})
    verdict = summary.stdout.splitlines()
    return {
        "dvc_repro_status": repro.returncode,
        "dvc_repro_wall_s": round(wall, 1),
        "load_avg_1m": {"min": round(min(loads), 1), "max": round(max(loads), 1)},
        "bench_phases_s": details.get("phases_s"),
        "budget_clock": details.get("early_stop", {}).get("budget_clock"),
        "timed_at_128": {
            p: LABEL in details.get("latency_ms", {}).get(p, {}) for p in HEADLINE_PATHS
        },
        "left_out_at_128": {
            p: why
            for p in HEADLINE_PATHS
            if (why := details.get("skipped", {}).get(p, {}).get(LABEL))
        },
        "bench_json": headline,
        "peak_gflops": round(peak["gflops"], 1) if peak else None,
        "peak_sweeps_gflops": [round(g, 1) for g in peak.get("sweeps_gflops", [])],
        "peak_stopped": peak.get("stopped"),
        "peak_contended": peak.get("contended"),
        "vmap_jit_share_at_128": figures.get("vmap_jit", {}).get(LABEL, {}).get("roofline"),
        "verdict_first_line": verdict[0] if verdict else None,
        "verdict_lines_on_budget_or_peak": [
            line.strip()
            for line in verdict
            if any(word in line for word in ("budget", "left out", "peak", "not timed"))
        ],
        "stderr_tail": repro.stderr.strip().splitlines()[-5:] if repro.returncode else [],
    }


def spread(values: list[float]) -> dict[str, float] | None:
    """min, max and max/min of the values that are there (None: fewer than two)."""
    there = [v for v in values if v is not None]
    if len(there) < 2:
        return None
    return {
        "min": min(there),
        "max": max(there),
        "max_over_min": round(max(there) / min(there), 2),
        "median": statistics.median(there),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spinners", type=int, default=8, help="scripts/load's N")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--json", type=Path, help="where to write the runs")
    args = parser.parse_args()
    if not 0 <= args.spinners <= 256 or args.runs < 1:
        parser.error(f"--spinners must be 0-256 and --runs >= 1, got {args.spinners}, {args.runs}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="vmapcheck-repro-load-") as work:
            runs.append(one_run(Path(work), args.spinners))
        print(json.dumps({"run": i + 1, **runs[-1]}), flush=True)
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": commit,
        "machine": f"{os.cpu_count()} cores, {os.uname().machine}",
        "usable_cores": len(os.sched_getaffinity(0)),
        "spinners": args.spinners,
        "runs": runs,
        "peak_gflops_spread": spread([r["peak_gflops"] for r in runs]),
        "vmap_jit_share_at_128_spread": spread([r["vmap_jit_share_at_128"] for r in runs]),
        "runs_with_every_128_row_cell_timed": sum(all(r["timed_at_128"].values()) for r in runs),
    }
    text = json.dumps(out, indent=2) + "\n"
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.json)
    print(text)


if __name__ == "__main__":
    main()
