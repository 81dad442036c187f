"""What one ``check_batching`` call costs on the real-bug corpus (issue 42, item 7).

For every entry of ``tests/real_bugs`` (the acceptance corpus, docs/real-bugs.md), its
bug and its fix are each checked in a fresh Python process, as one pytest test of the
corpus meets it: the child imports JAX and vmapcheck (timed apart: the import), builds
the entry's model, then times one ``check_batching`` call:

- CPU seconds: ``time.process_time`` (every thread of the process) plus the CPU of any
  child processes it waited for (``resource.getrusage(RUSAGE_CHILDREN)``);
- wall seconds: ``time.perf_counter``.

``--second`` times a second call of the same check in the same process (compilations
cached, what a test file with several checks of one model pays after the first). The
machine is shared: the 1-minute load average is read before and after each child and
for the whole run, and the CPU model, cores, JAX version and git commit are recorded.
Entries whose feature is not in the installed vmapcheck (``RealBug.missing()``) are
listed as skipped. Prints a table and median / p90 / worst; ``--json`` writes it all.

Usage (from the repository root)::

    python benchmarks/api_cost.py --second --json benchmarks/api_cost_<YYYYMMDD>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.real_bugs
sys.path.insert(0, str(ROOT / "benchmarks"))  # api_speed's helpers

from api_speed import machine  # noqa: E402

SIDES = ("bug", "fix")
LAZY_IMPORTS = (
    "vmapcheck.testing",
    "vmapcheck.testing.run",
    "vmapcheck.check.checks",
    "vmapcheck.core.forward",
    "vmapcheck.core.oracle",
    "vmapcheck.core.composition",
    "vmapcheck.data.regression",
    "vmapcheck.report.summary",
    "jax.experimental.multihost_utils",
    "jax.extend",
)


def _cpu_now() -> float:
    """CPU seconds of this process (all threads) and of its waited-for children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _timed_check(entry: Any, side: str) -> dict[str, Any]:
    from vmapcheck.testing import check_batching

    model, params, examples = entry.bug() if side == "bug" else entry.fix()
    wall, cpu = time.perf_counter(), _cpu_now()
    report = check_batching(model, params, examples, **dict(entry.check_kwargs))
    return {
        "cpu_s": _cpu_now() - cpu,
        "wall_s": time.perf_counter() - wall,
        "passed": report.passed,
        "failures": len(report.failures),
    }


def child(name: str, side: str, second: bool) -> dict[str, Any]:
    """One entry's bug or fix, in this (fresh) process: the import, then the check(s)."""
    wall, cpu = time.perf_counter(), _cpu_now()
    import importlib

    import jax

    # vmapcheck.testing imports its machinery on the first call (a test suite's collection
    # stays cheap): import it here so the check's figure holds no import. The modules a
    # first check_batching call loaded on 2026-12-07 (sys.modules before and after).
    for module in LAZY_IMPORTS:
        importlib.import_module(module)
    imported = {"cpu_s": _cpu_now() - cpu, "wall_s": time.perf_counter() - wall}
    from tests.real_bugs import REAL_BUGS

    entry = REAL_BUGS[name]
    out: dict[str, Any] = {
        "jax": jax.__version__,
        "import": imported,
        "first": _timed_check(entry, side),
    }
    if second:
        out["second"] = _timed_check(entry, side)
    return out


def spread(values: list[float]) -> dict[str, float]:
    """Median, 90th percentile and worst of ``values`` (seconds)."""
    array = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(array)),
        "p90": float(np.percentile(array, 90)),
        "worst": float(array.max()),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--second", action="store_true", help="also time a second call")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these corpus entries only")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.second)))
        return 0

    from tests.real_bugs import REAL_BUGS

    names = args.only or list(REAL_BUGS)
    unknown = sorted(set(names) - set(REAL_BUGS))
    if unknown:
        parser.error(f"--only: no corpus entry named {unknown}; entries: {sorted(REAL_BUGS)}")
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git_commit": _git_commit(),
        "what": "one check_batching call per corpus entry and side, each in a fresh process "
        "(float32 on the CPU unless the entry's check_kwargs say otherwise)",
        "load_1min": {"before": _load()},
        "rows": [],
        "skipped": {},
    }
    print(
        f"{'entry':44} {'side':4} {'check CPU s':>11} {'wall s':>7} {'import CPU s':>12}"
        f" {'2nd CPU s':>9} {'load':>5}  verdict"
    )
    for name in names:
        missing = REAL_BUGS[name].missing()
        if missing:
            doc["skipped"][name] = f"needs vmapcheck feature(s) {list(missing)}"
            continue
        for side in SIDES:
            before = _load()
            command = [sys.executable, __file__, "--child", name, side]
            done = subprocess.run(
                command + (["--second"] if args.second else []),
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            row = {"entry": name, "side": side, **json.loads(done.stdout.strip().splitlines()[-1])}
            row["load_1min"] = [before, _load()]
            doc["rows"].append(row)
            second = f"{row['second']['cpu_s']:9.2f}" if "second" in row else f"{'-':>9}"
            print(
                f"{name:44} {side:4} {row['first']['cpu_s']:11.2f} {row['first']['wall_s']:7.2f}"
                f" {row['import']['cpu_s']:12.2f} {second} {before:5.1f}  "
                f"{'PASSED' if row['first']['passed'] else 'FAILED'}",
                flush=True,
            )
    doc["load_1min"]["after"] = _load()
    rows = doc["rows"]
    if rows:
        doc["jax"] = rows[0]["jax"]
        doc["summary"] = {
            "checks": len(rows),
            "check_cpu_s": spread([row["first"]["cpu_s"] for row in rows]),
            "check_wall_s": spread([row["first"]["wall_s"] for row in rows]),
            "import_cpu_s": spread([row["import"]["cpu_s"] for row in rows]),
            "import_wall_s": spread([row["import"]["wall_s"] for row in rows]),
        }
        if args.second:
            doc["summary"]["second_check_cpu_s"] = spread([row["second"]["cpu_s"] for row in rows])
        print()
        for key, figures in doc["summary"].items():
            if isinstance(figures, dict):
                print(
                    f"{key:20} median {figures['median']:6.2f}  p90 {figures['p90']:6.2f}"
                    f"  worst {figures['worst']:6.2f}"
                )
    for name, why in doc["skipped"].items():
        print(f"skipped {name}: {why}")
    print(f"load (1 min) {doc['load_1min']['before']} before, {doc['load_1min']['after']} after")
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
