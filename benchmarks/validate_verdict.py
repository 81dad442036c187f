"""Measure the regression verdict's false-alarm and detection rates on this machine.

Runs the benchmark ``--runs`` times for the normal model (A) and as many times for the
planted slowdown ``model=mlp_slow`` (B: its ``direct`` paths do ~25% more arithmetic;
``loop``/``vmap`` are untouched), alternating A and B, each run in a fresh process as the
pipeline's ``bench`` stage does. Then judges, with
:func:`vmapcheck.bench.verdict.regression.compare`:

- every pair of A runs (A/A): any regression reported is a false alarm;
- every (A baseline, B current) pair: a regression on a ``direct`` cell is a detection,
  one on a ``loop``/``vmap`` cell is a false alarm;
- and the same pairs again with single samples as the test's unit (``per_sample_test``,
  the method before rounds), and with each round's slowdown common to all cells divided
  out (``rounds_normalized``, ``compare(normalize_rounds=True)``), to show what each
  choice changes.

Usage (from the project root, a few minutes per run pair)::

    python benchmarks/validate_verdict.py --runs 8 --out benchmarks/verdict_validation.json

The figures in docs/benchmark.md come from this script; rerun it on your machine to get yours.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SLOWED = ("direct_eager", "direct_jit")


def bench_once(model_option: str, bench_option: str, out: Path) -> None:
    """One benchmark run in this process (the worker): writes a bench_details-like JSON."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import yaml

    from vmapcheck.bench.timing.run import run_bench
    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import validate_config
    from vmapcheck.core.models import build_model
    from vmapcheck.core.runtime import configure_jax
    from vmapcheck.io import atomic_write_json

    config = validate_config(
        yaml.safe_load(
            compose_yaml(ROOT / "conf", [f"model={model_option}", f"bench={bench_option}"])
        )
    )
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    # The same params and rows for A and B: only the model's code differs.
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(64, model.in_features)).astype(np.float32)
    dtype = jnp.dtype(config.precision.dtype)
    result = run_bench(model, params, rows, config.bench, dtype)
    atomic_write_json(
        out,
        {
            "model": config.model.name,
            "dtype": dtype.name,
            "runtime": runtime.as_dict(),
            "samples_ms": result["samples_ms"],
            "figures": result["figures"],
            "peak": result["peak"],
            "machine": result["machine"],
        },
    )


def _load(path: Path) -> float:
    """The run's 1-minute load average, the higher of before and after."""
    machine = json.loads(path.read_text())["machine"]
    return max(machine["before"]["load_avg_1m"], machine["after"]["load_avg_1m"])


def _cores(path: Path) -> int:
    return json.loads(path.read_text())["machine"]["before"]["usable_cores"] or 1


def rates(results: list[dict[str, Any]], cells: set[str]) -> dict[str, Any]:
    """Share of comparisons (and of cells in ``cells``) that reported a regression."""
    flagged_cells = sum(len([r for r in res["regressions"] if r in cells]) for res in results)
    total_cells = sum(
        len([f"{p}/{b}" for p, by in res["cells"].items() for b in by if f"{p}/{b}" in cells])
        for res in results
    )
    flagged_runs = sum(any(r in cells for r in res["regressions"]) for res in results)
    verdicts = [res["verdict"] for res in results if any(r in cells for r in res["regressions"])]
    return {
        "comparisons": len(results),
        "comparisons_flagged": flagged_runs,
        "comparison_rate": flagged_runs / len(results) if results else float("nan"),
        "cells": total_cells,
        "cells_flagged": flagged_cells,
        "cell_rate": flagged_cells / total_cells if total_cells else float("nan"),
        # Of the flagged comparisons: how many the machine control turned into
        # "inconclusive" (the machine itself changed speed, or a run was noisy).
        "flagged_verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of each model (A and B)")
    parser.add_argument("--bench", default="quick", help="bench config option (conf/bench)")
    parser.add_argument("--factor", type=float, help="default: the bench config's")
    parser.add_argument("--alpha", type=float, help="default: the bench config's")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/verdict_validation.json")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        help="keep each run's JSON here (and reuse those already there) instead of a temp dir",
    )
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        bench_once(args.worker[0], args.bench, Path(args.worker[1]))
        return 0

    import yaml

    from vmapcheck.bench.verdict.baseline import read_bench_file
    from vmapcheck.bench.verdict.regression import compare
    from vmapcheck.compose import compose_yaml
    from vmapcheck.io import atomic_write_json

    regression = yaml.safe_load(compose_yaml(ROOT / "conf", [f"bench={args.bench}"]))["bench"][
        "regression"
    ]
    factor = args.factor or regression["factor"]
    alpha = args.alpha or regression["alpha"]
    runs: dict[str, list[Path]] = {"mlp": [], "mlp_slow": []}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.runs_dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(args.runs):
            for model in ("mlp", "mlp_slow"):
                out = folder / f"{model}-{i}.json"
                runs[model].append(out)
                if out.exists():
                    continue
                subprocess.run(
                    [sys.executable, __file__, "--bench", args.bench, "--worker", model, str(out)],
                    check=True,
                    env={**os.environ, "JAX_PLATFORMS": "cpu"},
                )
                print(f"run {i + 1}/{args.runs} {model}: {time.time() - started:.0f} s", flush=True)
        a_runs = [read_bench_file(p) for p in runs["mlp"]]
        b_runs = [read_bench_file(p) for p in runs["mlp_slow"]]
        loads = [_load(p) for p in runs["mlp"] + runs["mlp_slow"]]
        quiet = {p: _load(p) <= _cores(p) for p in runs["mlp"] + runs["mlp_slow"]}
        flops = {
            model: json.loads(paths[0].read_text())["figures"]["direct_jit"]
            for model, paths in runs.items()
        }
    all_cells = {f"{p}/{b}" for p, by in a_runs[0].samples_ms.items() for b in by}
    slowed_cells = {c for c in all_cells if c.split("/")[0] in SLOWED}
    a_pairs = list(itertools.combinations(range(len(a_runs)), 2))
    b_pairs = list(itertools.product(range(len(a_runs)), range(len(b_runs))))
    aa = [compare(a_runs[i], a_runs[j], factor, alpha) for i, j in a_pairs]
    ab = [compare(a_runs[i], b_runs[j], factor, alpha) for i, j in b_pairs]

    # Ablations: single samples as the test's unit (rounds ignored), and rounds with each
    # round's slowdown common to all cells divided out (verdict.round_index).
    def judge(pairs: list[tuple[int, int]], runs_b: list[Any], **how: Any) -> list[Any]:
        return [compare(a_runs[i], runs_b[j], factor, alpha, **how) for i, j in pairs]

    aa_single = judge(a_pairs, a_runs, blocks=10**9)
    ab_single = judge(b_pairs, b_runs, blocks=10**9)
    aa_norm = judge(a_pairs, a_runs, normalize_rounds=True)
    ab_norm = judge(b_pairs, b_runs, normalize_rounds=True)
    # The same rates over the pairs where both runs had the machine to themselves.
    aa_quiet = [
        r
        for r, (i, j) in zip(aa, a_pairs, strict=True)
        if quiet[runs["mlp"][i]] and quiet[runs["mlp"][j]]
    ]
    ab_quiet = [
        r
        for r, (i, j) in zip(ab, b_pairs, strict=True)
        if quiet[runs["mlp"][i]] and quiet[runs["mlp_slow"][j]]
    ]
    per_cell_detection = {
        cell: sum(cell in res["regressions"] for res in ab) / len(ab)
        for cell in sorted(slowed_cells)
    }
    report = {
        "factor": factor,
        "alpha": alpha,
        "bench": args.bench,
        "runs_per_model": args.runs,
        "load_avg_1m": {"min": min(loads), "max": max(loads)},
        "direct_jit_flops_ratio": {
            label: flops["mlp_slow"][label]["flops"] / flops["mlp"][label]["flops"]
            for label in flops["mlp"]
        },
        "aa_false_alarm": rates(aa, all_cells),
        "ab_detection": rates(ab, slowed_cells),
        "quiet_runs": sum(quiet.values()),
        "aa_false_alarm_quiet": rates(aa_quiet, all_cells),
        "ab_detection_quiet": rates(ab_quiet, slowed_cells),
        "ab_false_alarm_untouched_paths_quiet": rates(ab_quiet, all_cells - slowed_cells),
        "ab_detection_by_cell": per_cell_detection,
        "ab_false_alarm_untouched_paths": rates(ab, all_cells - slowed_cells),
        "per_sample_test": {
            "aa_false_alarm": rates(aa_single, all_cells),
            "ab_detection": rates(ab_single, slowed_cells),
            "ab_false_alarm_untouched_paths": rates(ab_single, all_cells - slowed_cells),
        },
        "rounds_normalized": {
            "aa_false_alarm": rates(aa_norm, all_cells),
            "ab_detection": rates(ab_norm, slowed_cells),
            "ab_false_alarm_untouched_paths": rates(ab_norm, all_cells - slowed_cells),
            "ab_detection_by_cell": {
                cell: sum(cell in res["regressions"] for res in ab_norm) / len(ab_norm)
                for cell in sorted(slowed_cells)
            },
        },
        "median_ratio_by_cell": {
            cell: sorted(
                res["cells"][cell.split("/")[0]][cell.split("/")[1]]["ratio"] for res in ab
            )[len(ab) // 2]
            for cell in sorted(all_cells)
        },
        "machine_slowdown": {
            "aa": sorted(res["machine_slowdown"] for res in aa),
            "ab": sorted(res["machine_slowdown"] for res in ab),
        },
        "wall_s": time.time() - started,
    }
    atomic_write_json(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k != "median_ratio_by_cell"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
