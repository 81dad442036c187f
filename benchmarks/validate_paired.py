"""Measure the paired verdict's false-alarm and detection rates on this machine, under load.

Builds two project folders in a work dir: A (``model=mlp``) and B (``model=mlp_slow``,
the same params and cases: its ``direct`` paths compute 25% more rows, outputs
identical; ``vmap``/``loop`` are untouched), each through the real ``prepare`` and
``train`` stages (``train.steps=0``: the timing does not depend on trained weights).
Optionally starts a bounded background load itself (``--load N`` busy processes, each
ending by itself after ``--load-seconds``, all killed when the script ends). Then
alternates, ``--comparisons`` times each:

- A/A: :func:`vmapcheck.bench.verdict.paired.run_paired` with A as both sides (the same folder
  loaded twice, as verdict-paired does: in each process, or with ``--no-share`` in two):
  any ``regression`` is a false alarm;
- A/B: A as baseline, B as current: a ``regression`` on a ``direct`` cell is a detection,
  one on a ``vmap`` cell a false alarm.

Each comparison records the 1-minute load average measured during its rounds. A
comparison that fails (a worker error) is counted with its reason; the paired verdict has
no ``inconclusive`` of its own (sides that are not comparable are named instead).

Usage (from the project root). ``model.hidden=[128,128]``: at the default width (32) the
network is dispatch-bound at 256 rows, and 25% more rows cost only 5-10% of the time::

    python benchmarks/validate_paired.py --comparisons 50 --load 2 \\
        --override 'model.hidden=[128,128]' --out benchmarks/paired_validation_load_40.json
    python benchmarks/validate_paired.py --comparisons 50 \\
        --override 'model.hidden=[128,128]' --out benchmarks/paired_validation_quiet_40.json

``--minutes`` stops starting new comparisons after that long and tabulates what was done.
``--looks`` sets the group-sequential test's looks (default: ``bench.early_stop.
paired_looks`` of the composed defaults; 1: every pair), ``--kinds A/A`` runs the A/A
comparisons only, and ``--extra-work 0.08`` plants a smaller slowdown in B (a share of
extra rows in ``direct``, under the factor). The tables add each kind's wall time per
comparison (median, quartiles, range), the labels per cell and the pairs each cell took.
The early-stopping figures of 2026-12-04 (docs/benchmark.md)::

    python benchmarks/validate_paired.py --comparisons 50 --kinds A/A --looks 4 \
        --batch-sizes 256,1024 --override 'model.hidden=[128,128]' \
        --out benchmarks/paired_validation_aa_sequential.json
    python benchmarks/validate_paired.py --comparisons 6 --kinds A/A --looks 1 \
        --batch-sizes 256,1024 --override 'model.hidden=[128,128]' \
        --out benchmarks/paired_validation_aa_fixed.json
    python benchmarks/validate_paired.py --comparisons 6 --kinds A/B --extra-work 0.08 \
        --batch-sizes 256,1024 --override 'model.hidden=[128,128]' \
        --out benchmarks/paired_validation_slow10.json

The figures in docs/benchmark.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PLANTED = ("direct_eager", "direct_jit")  # the paths mlp_slow slows down
SMALL_PROJECT = ["train.steps=0", "data.n_rows=240", "data.standard_batch=8"]
# A busy process that ends by itself after argv[1] seconds, so that no load outlives
# the script even when the script is killed before its finally.
BUSY = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass\n"


def make_project(
    folder: Path, model: str, data_from: Path | None = None, overrides: tuple[str, ...] = ()
) -> Path:
    """A project folder for ``model``: params.yaml composed from conf/ (with Hydra
    ``overrides``), data/ from the prepare and train stages (or copied from
    ``data_from``, whose params fit the model). A folder already built with the same
    params.yaml is reused as it is."""
    from vmapcheck.compose import compose_yaml

    folder.mkdir(parents=True, exist_ok=True)
    params = compose_yaml(ROOT / "conf", [f"model={model}", *SMALL_PROJECT, *overrides])
    built = (folder / "params.yaml").is_file() and (folder / "data" / "params").is_dir()
    if built and (folder / "params.yaml").read_text() == params and data_from is None:
        return folder
    (folder / "params.yaml").write_text(params)
    if data_from is not None:
        shutil.copytree(data_from / "data", folder / "data", dirs_exist_ok=True)
        return folder
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for stage in ("prepare", "train"):
        subprocess.run(
            [sys.executable, "-m", f"vmapcheck.stages.{stage}"], cwd=folder, env=env, check=True
        )
    return folder


def start_load(n: int, seconds: float) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)], stdout=subprocess.DEVNULL)
        for _ in range(n)
    ]


def summary(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """What the tables need from one comparison."""
    return {
        "kind": kind,
        "verdict": result["verdict"],
        "regressions": result["regressions"],
        "improvements": result["improvements"],
        "load": result.get("load"),
        "cells": {
            c: {
                k: v[k]
                for k in (
                    "ratio",
                    "ci_low",
                    "ci_high",
                    "p_slower_adjusted",
                    "p_faster_adjusted",
                    "process_ratios",
                    "pair_ratios",
                    "p_slower",
                    "status",
                    "pairs",
                    "stopped",
                )
                if k in v
            }
            for c, v in result.get("cells", {}).items()
        },
        "pairs_taken": result.get("pairs_taken"),
        "looks": (result.get("sequential") or {}).get("looks", 1),
        "wall_s": result.get("wall_s"),
    }


def _detected(
    comparison: dict[str, Any],
    cell: str,
    slowdown: float,
    factor: float,
    alpha: float,
    processes: int,
) -> bool:
    """Whether ``cell`` of an A/A ``comparison``, its pairs made ``slowdown`` times
    slower, is a regression by verdict-paired's rule (vmapcheck.bench.verdict.paired).

    The ratio, p and per-process ratios as ``pairs.paired_cell`` computes them, without
    its bootstrap CI: the rule does not use the CI, and the search calls this thousands
    of times."""
    from scipy import stats

    from vmapcheck.bench.verdict.pairs import is_regression, process_of_pair

    logs = np.log(np.asarray(comparison["cells"][cell]["pair_ratios"])) + np.log(slowdown)
    ratio = float(np.exp(np.median(logs)))
    raw = {c: v["p_slower"] for c, v in comparison["cells"].items()}
    raw[cell] = float(stats.wilcoxon(logs, alternative="greater").pvalue)
    names = sorted(raw)
    adjusted = dict(zip(names, stats.false_discovery_control([raw[c] for c in names]), strict=True))
    by_process = np.array([process_of_pair(i, processes) for i in range(logs.size)])
    within = [float(np.exp(np.median(logs[by_process == k]))) for k in range(processes)]
    return is_regression(ratio, adjusted[cell], within, factor, alpha)


def tables(
    done: list[dict[str, Any]], factor: float, alpha: float, processes: int
) -> dict[str, Any]:
    """A/A false-alarm rate, A/B detection per cell, failures and the load measured."""
    aa = [d for d in done if d["kind"] == "A/A" and "error" not in d]
    ab = [d for d in done if d["kind"] == "A/B" and "error" not in d]
    cells = sorted({c for d in aa + ab for c in d["cells"]})
    planted = [c for c in cells if c.split("/")[0] in PLANTED]
    untouched = [c for c in cells if c not in planted]
    loads = [d["load"]["load_avg_1m_mean"] for d in aa + ab]

    def load_range(ds: list[dict[str, Any]]) -> list[float] | None:
        if not ds:
            return None
        return [
            min(d["load"]["load_avg_1m_min"] for d in ds),
            max(d["load"]["load_avg_1m_max"] for d in ds),
        ]

    def median_ratio(ds: list[dict[str, Any]], cell: str) -> float | None:
        values = sorted(d["cells"][cell]["ratio"] for d in ds if cell in d["cells"])
        return values[len(values) // 2] if values else None

    def min_detectable(cell: str) -> float | None:
        """The smallest slowdown (a step of 0.01) found as a regression in at least 90%
        of the A/A comparisons when planted into their own pairs: every pair of ``cell``
        made that much slower, then judged by verdict-paired's rule (ratio beyond the
        factor, BH-adjusted one-sided Wilcoxon p below alpha with the other cells' p as
        they were, a majority of the process pairs beyond the factor). It measures the
        noise of this machine and load; None without the pairs' ratios."""
        runs = [d for d in aa if "pair_ratios" in d["cells"].get(cell, {})]
        if len(runs) < 10:
            return None
        for slowdown in np.arange(factor, 3.0, 0.01):
            found = sum(_detected(d, cell, float(slowdown), factor, alpha, processes) for d in runs)
            if found >= 0.9 * len(runs):
                return round(float(slowdown), 2)
        return None

    def walls(ds: list[dict[str, Any]]) -> dict[str, float] | None:
        values = sorted(d["wall_s"] for d in ds if d.get("wall_s") is not None)
        if not values:
            return None
        return {
            "median": float(np.median(values)),
            "min": values[0],
            "max": values[-1],
            "q25": float(np.quantile(values, 0.25)),
            "q75": float(np.quantile(values, 0.75)),
        }

    def labels(ds: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for d in ds:
            for c, v in d["cells"].items():
                status = v.get("status", "?")
                out.setdefault(c, {})[status] = out.setdefault(c, {}).get(status, 0) + 1
        return out

    def pairs_taken(ds: list[dict[str, Any]]) -> dict[str, list[int]]:
        return {
            c: sorted(d["cells"][c].get("pairs", 0) for d in ds if c in d["cells"]) for c in cells
        }

    one_look = [d for d in done if d["kind"] == "A/A1" and "error" not in d]
    return {
        "label_counts": {"A/A": label_counts(aa, alpha), "A/B": label_counts(ab, alpha)},
        "wall_s": {"A/A": walls(aa), "A/A1": walls(one_look), "A/B": walls(ab)},
        "load_1m": {"A/A1": load_range(one_look)},
        "aa_one_look_regressions": sum(d["verdict"] == "regression" for d in one_look),
        "labels": {"A/A": labels(aa), "A/B": labels(ab)},
        "pairs_by_cell": {"A/A": pairs_taken(aa), "A/B": pairs_taken(ab)},
        "aa": {
            "min_detectable_90": {c: min_detectable(c) for c in cells},
            "comparisons": len(aa),
            "verdict_regression": sum(d["verdict"] == "regression" for d in aa),
            "cells_flagged": sum(len(d["regressions"]) for d in aa),
            "cells": sum(len(d["cells"]) for d in aa),
            "load_1m": load_range(aa),
            "median_ratio": {c: median_ratio(aa, c) for c in cells},
        },
        "ab": {
            "comparisons": len(ab),
            "verdict_regression": sum(d["verdict"] == "regression" for d in ab),
            "detected_by_cell": {c: sum(c in d["regressions"] for d in ab) for c in planted},
            "untouched_flagged_by_cell": {
                c: sum(c in d["regressions"] for d in ab) for c in untouched
            },
            "load_1m": load_range(ab),
            "median_ratio": {c: median_ratio(ab, c) for c in cells},
        },
        "failed": [{"kind": d["kind"], "error": d["error"]} for d in done if "error" in d],
        "inconclusive": 0,  # the paired verdict has none (module docstring)
        "mean_load_1m": {"min": min(loads), "max": max(loads)} if loads else None,
    }


def label_counts(ds: list[dict[str, Any]], alpha: float) -> dict[str, Any]:
    """Every label (:data:`vmapcheck.bench.verdict.labels.LABELS`, a label never given counted 0)
    over all cells of ``ds``, and the direction labels whose own adjusted p (p slower for
    ``slower (below the factor)`` and ``regression``, p faster for ``faster``) is not below
    ``alpha``: each one a direction said without significance (issue 35; none expected)."""
    from vmapcheck.bench.verdict.labels import FASTER, LABELS, REGRESSION, SLOWER

    counts = dict.fromkeys(LABELS, 0)
    unsupported = []
    direction = {FASTER: "p_faster_adjusted", SLOWER: "p_slower_adjusted"}
    direction[REGRESSION] = "p_slower_adjusted"
    for i, d in enumerate(ds):
        for c, v in d["cells"].items():
            status = v.get("status", "?")
            counts[status] = counts.get(status, 0) + 1
            key = direction.get(status)
            # Older files lack p_faster_adjusted: such a cell cannot be checked, it is named.
            if key is not None and not (v.get(key) is not None and v[key] < alpha):
                unsupported.append({"comparison": i, "cell": c, "status": status, key: v.get(key)})
    return {
        "cells": sum(counts.values()),
        "by_label": counts,
        "direction_without_significance": unsupported,
    }


def markdown(report: dict[str, Any]) -> str:
    t = report["tables"]
    aa, ab = t["aa"], t["ab"]
    lines = [
        f"A/A: verdict regression {aa['verdict_regression']} of {aa['comparisons']} "
        f"({aa['cells_flagged']} of {aa['cells']} cells), load {aa['load_1m']}",
        f"A/B: verdict regression {ab['verdict_regression']} of {ab['comparisons']}, "
        f"load {ab['load_1m']}",
        "",
        "| cell | A/B regression | median ratio A/B | median ratio A/A | min. detectable (A/A) |",
        "|---|---|---|---|---|",
    ]
    for cell, ratio in ab["median_ratio"].items():
        found = ab["detected_by_cell"].get(cell, ab["untouched_flagged_by_cell"].get(cell))
        role = "planted +25%" if cell in ab["detected_by_cell"] else "untouched"
        detectable = aa["min_detectable_90"].get(cell)
        lines.append(
            f"| {cell} ({role}) | {found} of {ab['comparisons']} | "
            f"{ratio or float('nan'):.3f} | "
            f"{aa['median_ratio'].get(cell) or float('nan'):.3f} | "
            f"{f'{detectable:.2f}x' if detectable else 'n/a'} |"
        )
    lines.append(f"failed comparisons: {len(t['failed'])}; inconclusive: {t['inconclusive']}")
    for kind, wall in (t.get("wall_s") or {}).items():
        if wall:
            lines.append(
                f"{kind} wall s: median {wall['median']:.1f} (quartiles {wall['q25']:.1f}-"
                f"{wall['q75']:.1f}, {wall['min']:.1f}-{wall['max']:.1f})"
            )
    for kind, by_cell in (t.get("labels") or {}).items():
        for cell, counts in by_cell.items():
            lines.append(f"{kind} {cell}: {counts}")
    for kind, total in (t.get("label_counts") or {}).items():
        if not total["cells"]:
            continue
        lines += ["", f"{kind}: every label over {total['cells']} cells", "", "| label | cells |"]
        lines.append("|---|---:|")
        lines += [f"| {label} | {n} |" for label, n in total["by_label"].items()]
        wrong = total["direction_without_significance"]
        lines.append(f"{kind}: direction labels without adjusted significance: {len(wrong)}")
    return "\n".join(lines)


def _cpu_model() -> str | None:
    from vmapcheck.bench.timing.machine import conditions

    return conditions().get("cpu_model")


def main() -> int:
    from vmapcheck.bench.verdict.paired import DEFAULT_ROUNDS, DEFAULT_SAMPLES
    from vmapcheck.bench.verdict.worker import BLOCKS, INTERLEAVED

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=10, help="of each kind (A/A, A/B)")
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per side (verdict-paired's)"
    )
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help="samples per cell and round"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--paths", default="vmap_jit,direct_jit")
    parser.add_argument(
        "--order", choices=(INTERLEAVED, BLOCKS), default=BLOCKS, help="within a round"
    )
    parser.add_argument("--batch-sizes", default="256,1024,4096")
    parser.add_argument("--processes", type=int, default=3, help="process pairs")
    parser.add_argument(
        "--no-share",
        dest="share",
        action="store_false",
        help="one process a side (default: both sides in each process, as verdict-paired "
        "does for same-code sides)",
    )
    parser.add_argument("--factor", type=float, help="default: conf/bench/quick.yaml's")
    parser.add_argument("--alpha", type=float, help="default: conf/bench/quick.yaml's")
    parser.add_argument("--load", type=int, default=0, help="busy processes to start (0: none)")
    parser.add_argument(
        "--load-seconds", type=float, default=3600, help="each busy process ends after this"
    )
    parser.add_argument("--minutes", type=float, help="start no comparison after this long")
    parser.add_argument(
        "--looks",
        type=int,
        help="looks of the group-sequential test (default: conf/bench/quick.yaml's "
        "early_stop.paired_looks; 1: every pair, the design before early stopping)",
    )
    parser.add_argument(
        "--kinds",
        default="A/A,A/B",
        help="which comparisons to alternate: A/A, A/B (default: both), and A/A1 (an A/A "
        "comparison with one look, to time the looks' saving under the same load)",
    )
    parser.add_argument(
        "--extra-work",
        type=float,
        help="B's model.factory.extra_work (mlp_slow's share of extra rows in direct; "
        "default 0.25). About 0.08 makes a slowdown under the factor 1.1",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="a Hydra override for both projects, e.g. model.hidden=[256,256] (a wider "
        "network, where the planted rows cost their share of the time at 256 rows)",
    )
    parser.add_argument(
        "--retabulate",
        type=Path,
        help="recompute the tables of this earlier --out file (nothing is timed) and rewrite it",
    )
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/vmapcheck-validate-paired"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/paired_validation.json")
    args = parser.parse_args()

    import yaml

    from vmapcheck.io import atomic_write_json

    if args.retabulate:
        report = json.loads(args.retabulate.read_text())
        report["tables"] = tables(
            report["comparisons"], report["factor"], report["alpha"], report["process_pairs"]
        )
        atomic_write_json(args.retabulate, report)
        print(markdown(report))
        return 0

    from vmapcheck.bench.verdict.paired import run_paired
    from vmapcheck.bench.verdict.pairs import BASELINE, CURRENT
    from vmapcheck.bench.verdict.sides import side_spec
    from vmapcheck.compose import compose_yaml
    from vmapcheck.errors import VmapcheckError

    composed = yaml.safe_load(compose_yaml(ROOT / "conf", []))["bench"]
    regression = composed["regression"]
    looks = args.looks or composed["early_stop"]["paired_looks"]
    factor = args.factor or regression["factor"]
    alpha = args.alpha or regression["alpha"]
    paths = args.paths.split(",")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    a_dir, b_dir = args.work_dir / "a", args.work_dir / "b"
    overrides = tuple(args.override)
    make_project(a_dir, "mlp", overrides=overrides)
    slow = (f"model.factory.extra_work={args.extra_work}",) if args.extra_work else ()
    make_project(b_dir, "mlp_slow", data_from=a_dir, overrides=overrides + slow)
    a, b = side_spec(BASELINE, a_dir), side_spec(CURRENT, b_dir)
    a_cur = side_spec(CURRENT, a_dir)
    started = time.time()
    done: list[dict[str, Any]] = []
    load = start_load(args.load, args.load_seconds)
    try:
        for i in range(args.comparisons):
            if args.minutes and time.time() - started > 60 * args.minutes:
                print(f"stopping after {len(done)} comparisons: --minutes {args.minutes} reached")
                break
            kinds = args.kinds.split(",")
            # "A/A1": an A/A comparison with one look (every pair), right after the A/A
            # one: the time the looks save, under the same load.
            for kind, current in (("A/A", a_cur), ("A/A1", a_cur), ("A/B", b)):
                if kind not in kinds:
                    continue
                try:
                    result = run_paired(
                        a,
                        current,
                        paths,
                        sizes,
                        factor,
                        alpha,
                        args.rounds,
                        args.samples,
                        args.warmup,
                        order=args.order,
                        processes=args.processes,
                        share=args.share,
                        looks=1 if kind == "A/A1" else looks,
                    )
                    entry = summary(kind, result)
                except VmapcheckError as exc:
                    entry = {"kind": kind, "error": str(exc)}
                done.append(entry)
                shown = entry.get("error") or (
                    f"{entry['verdict']} {entry['regressions']} load "
                    f"{entry['load']['load_avg_1m_min']:.1f}-{entry['load']['load_avg_1m_max']:.1f}"
                    "; ratios "
                    + " ".join(
                        f"{c} {v['ratio']:.2f} ({v.get('pairs')} pairs, {v['status']})"
                        for c, v in entry["cells"].items()
                    )
                    + f"; {entry['wall_s']:.1f} s"
                )
                print(f"{i + 1}/{args.comparisons} {kind}: {shown} ({time.time() - started:.0f} s)")
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    report = {
        "factor": factor,
        "alpha": alpha,
        "rounds_per_side": args.rounds,
        "samples_per_round": args.samples,
        "order_within_round": args.order,
        "process_pairs": args.processes,
        "one_process_for_both": args.share,
        "paths": paths,
        "batch_sizes": sizes,
        "looks": looks,
        "extra_work": args.extra_work or 0.25,
        "kinds": args.kinds,
        "background_load_processes": args.load,
        "overrides": list(overrides),
        "usable_cores": len(os.sched_getaffinity(0)),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpu_model": _cpu_model(),
        "wall_s": time.time() - started,
        "tables": tables(done, factor, alpha, args.processes),
        "comparisons": done,
    }
    atomic_write_json(args.out, report)
    print(markdown(report))
    print(json.dumps(report["tables"]["failed"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
