"""How long `bench=quick` takes for each shipped model (issue 25: "bench=quick is not
quick beyond the MLP"): the bench stage's wall and CPU seconds, and where they went
(timing, the bucketed guard replay, the un-bucketed one), with the machine's load.

For each model, a fresh copy of the project (no outputs, no DVC cache, no MLflow store;
the ``.venv`` is the one this script runs in) has its params.yaml recomposed for that
model and its data (``vmapcheck params model=... data=...``), then ``dvc repro`` runs
every stage, each stage's process timed from outside as ``benchmarks/tool_speed.py``
does. The bench profile's budgets are in ``src/vmapcheck/conf/bench/quick.yaml``.

Usage (from the project root)::

    python benchmarks/quick_profile.py                       # the three models
    python benchmarks/quick_profile.py --models mlp:synthetic --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_speed import ROOT, _env, copy_project, repro, write_shim

# model option: data option it runs on (src/vmapcheck/conf/model/<model>.yaml says which).
MODELS = ("mlp:synthetic", "flax_cnn:digits", "flax_transformer:digit_tokens")


def dearest_cells(details: dict, top: int = 5) -> dict[str, dict[str, float]]:
    """The ``top`` cells by timing seconds and by compile seconds, ``path@b<rows>``."""
    timing: dict[str, float] = {}
    compiling: dict[str, float] = {}
    for path, cells in details["latency_ms"].items():
        for label, stats in cells.items():
            samples = details["early_stop"]["cells"][path][label]["samples"]
            timing[f"{path}@{label}"] = 2 * samples * stats["p50"] / 1e3
    for path, cells in details["figures"].items():
        for label, figures in cells.items():
            if "compile_ms" in figures:
                compiling[f"{path}@{label}"] = figures["compile_ms"] / 1e3

    def dearest(costs: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 2) for k, v in sorted(costs.items(), key=lambda kv: -kv[1])[:top]}

    return {"timing": dearest(timing), "compile": dearest(compiling)}


def measure(source: Path, model: str, data: str, work: Path) -> dict:
    """One cold ``dvc repro`` of ``model`` on ``data`` with ``bench=quick``."""
    project = work / f"project-{model}"
    copy_project(source, project)
    env = _env(project, None)
    subprocess.run(
        ["vmapcheck", "params", f"model={model}", f"data={data}", "bench=quick"],
        cwd=project,
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["git", "commit", "-qam", model, "--allow-empty"], cwd=project, env=env, check=True
    )
    log = work / f"stage_times-{model}.log"
    shim = write_shim(work / "shim", log)
    load_start = os.getloadavg()[0]
    result = repro(project, shim, log)
    details = json.loads((project / "reports" / "bench_details.json").read_text())
    replay = details["replay"]
    return {
        "model": model,
        "data": data,
        "load_1min_at_start": load_start,
        "load_1min_at_end": os.getloadavg()[0],
        "repro_wall_s": result["wall_s"],
        "bench": result["stages"]["bench"],
        "bench_phases_s": details["phases_s"],
        "replay_requests": replay["requests"],
        "replay_requests_planned": replay["requests_planned"],
        "replay_stopped_by_budget": replay["stopped_by_budget"],
        "timing_rounds_max": max(
            cell["rounds"]
            for cells in details["early_stop"]["cells"].values()
            for cell in cells.values()
        ),
        # The dearest cells (timing: samples x p50, both ways of a discarded call
        # before each timed one; compile: ahead-of-time compile), where a budget bites.
        "dearest_cells_s": dearest_cells(details),
        "early_stop": sorted(
            {
                cell["stopped"]
                for cells in details["early_stop"]["cells"].values()
                for cell in cells.values()
            }
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="model:data pairs")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the checkout to copy (default: this one)"
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the projects in this new folder (default: removed)"
    )
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="vmapcheck-quick-"))
    rows = []
    try:
        for pair in args.models:
            model, _, data = pair.partition(":")
            started = time.perf_counter()
            rows.append(measure(args.source.resolve(), model, data, work))
            print(f"{model}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'model':<18}{'bench wall':>11}{'CPU':>7}  phases (s)  replay sent   load")
    for row in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in row["bench_phases_s"].items())
        print(
            f"{row['model']:<18}{row['bench']['wall_s']:>10.1f}s{row['bench']['cpu_s']:>7.1f}  "
            f"{phases}  {row['replay_requests']}/{row['replay_requests_planned']}  "
            f"{row['load_1min_at_start']:.1f}-{row['load_1min_at_end']:.1f}"
        )
    if args.json:
        record = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "runs": rows}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
