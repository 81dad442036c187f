"""The quick bench under a load made on purpose (issue 44): are its headline cells (128
rows) timed, how steady is the matmul peak, and a path's share of it?

Each run times the shipped MLP (``src/vmapcheck/conf/model/mlp.yaml``) with the quick
profile (``src/vmapcheck/conf/bench/quick.yaml``) in this process, through
``vmapcheck.bench.timing.run.run_bench`` (the bench stage's timing, without DVC or the guard's
replays), while ``--spinners`` busy Python processes run beside it. Each run records the
load over it, where its time and its budget went, which 128-row cells were timed (or why
not), the headline speed-ups, the peak and its sweeps, and vmap_jit's share of the peak at
128 rows.

To compare with another checkout (e.g. main before this change), run the same script
with ``PYTHONPATH=<checkout>/src``: the fields that checkout does not record are null.

Usage (from the project root)::

    python benchmarks/bench_under_load.py --spinners 8 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

CONF = Path(__file__).resolve().parent.parent / "src" / "vmapcheck" / "conf"
HEADLINE_PATHS = ("loop_jit", "vmap_jit", "direct_jit", "map_jit")


def one_run(label: str = "b128") -> dict[str, Any]:
    """One quick bench of the shipped MLP, summed up."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from vmapcheck.bench.timing.machine import ConditionsSampler
    from vmapcheck.bench.timing.run import run_bench
    from vmapcheck.config import BenchConfig, ModelConfig
    from vmapcheck.core.models import build_model

    bench = BenchConfig(**yaml.safe_load((CONF / "bench" / "quick.yaml").read_text()))
    config = ModelConfig(**yaml.safe_load((CONF / "model" / "mlp.yaml").read_text()))
    model = build_model(config)
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(16, config.in_features))
    began = time.perf_counter()
    with ConditionsSampler() as sampler:
        result = run_bench(model, params, rows.astype(np.float32), bench, jnp.float32)
        load = sampler.summary().get("load_avg_1m") or {}
    peak = result["peak"]
    share = result["figures"].get("vmap_jit", {}).get(label, {}).get("roofline")
    return {
        "wall_s": round(time.perf_counter() - began, 2),
        "load_avg_1m": {k: round(v, 2) for k, v in load.items() if k in ("min", "max")},
        "phases_s": result["phases_s"],
        "budget_clock": result["early_stop"].get("budget_clock"),
        "timed_at_128": {p: label in result["latency_ms"].get(p, {}) for p in HEADLINE_PATHS},
        "left_out_at_128": {
            p: why for p in HEADLINE_PATHS if (why := result["skipped"].get(p, {}).get(label))
        },
        "speedup_at_128": result["speedup"].get(label, {}),
        "peak_gflops": round(peak["gflops"], 1),
        "peak_sweeps_gflops": [round(g, 1) for g in peak.get("sweeps_gflops", [])] or None,
        "peak_contended": peak.get("contended"),
        "vmap_jit_share_at_128": share,
        "launch_bound": {p: e["up_to_rows"] for p, e in result["launch_bound"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spinners", type=int, default=8, help="busy processes beside it")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="where to write the runs")
    args = parser.parse_args()
    if args.spinners < 0 or args.runs < 1:
        parser.error(f"--spinners must be >= 0 and --runs >= 1, got {args.spinners}, {args.runs}")
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spinners)
    ]
    runs = []
    try:
        for i in range(args.runs):
            runs.append(one_run())
            print(json.dumps({"run": i + 1, **runs[-1]}), flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    import vmapcheck

    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "vmapcheck": str(Path(vmapcheck.__file__).parent),
        "usable_cores": len(os.sched_getaffinity(0)),
        "spinners": args.spinners,
        "runs": runs,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
