"""Measure the real-size model (issue 23 item 7): the whole pipeline on ``model=resnet
data=images32 guard=images bench=big`` (a 3.3 M-parameter CNN, 4,096 rows in the
standard case, benchmarked up to 4,096 rows), and apart from it the parts the budget
caps (``src/vmapcheck/conf/budget/default.yaml``): the float64 oracle, the magnitude
forward, the loop paths and the gradient probe.

1. **Pipeline.** A fresh copy of the project (no outputs, no DVC cache, no MLflow store;
   the ``.venv`` is the one this script runs in), ``vmapcheck params`` with the options
   above, then ``dvc repro``. Each stage's process runs under ``/usr/bin/time`` through a
   ``python`` shim first on PATH: its wall, user and system seconds and its peak resident
   set (``%M``). The check and bench figures at 4,096 rows are read from the copy's
   reports afterwards.
2. **Phases.** In the same copy, after the pipeline, each costly part alone in a fresh
   process of its own (its peak RSS from ``getrusage``), on the prepared cases and params:
   the oracle and the magnitude forward on the standard case's rows within the budget and
   on all 4,096 (what the budget saves), the loop paths on the budget's rows and
   ``loop_jit``'s compile time at growing row counts (why it is capped), the gradient probe
   at the budget's rows.

Usage (from the project root; minutes on two cores)::

    python benchmarks/big_model.py                       # writes benchmarks/big_model_<date>.json
    python benchmarks/big_model.py --keep /tmp/big-copy  # and keeps the copy
    python benchmarks/big_model.py --phases-only /tmp/big-copy   # phases on a kept copy
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers
TIME = "/usr/bin/time"
OPTIONS = ("model=resnet", "data=images32", "guard=images", "bench=big")
# Row counts at which loop_jit's first call (its compile) is timed, each on a freshly
# built path: it unrolls one forward per row.
LOOP_JIT_ROWS = (8, 16, 32, 64)


def _env(project: Path, shim: Path | None = None) -> dict[str, str]:
    from tests.helpers import project as helpers

    env = helpers.project_env(project)
    if shim is not None:
        env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    return env


def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


# --- 1. the pipeline --------------------------------------------------------------------


def pipeline(project: Path, work: Path) -> dict[str, Any]:
    """``dvc repro`` of the big model's params in ``project``: per stage wall, CPU and
    peak RSS, and the whole run's."""
    subprocess.run(
        [str(Path(sys.executable).parent / "vmapcheck"), "params", *OPTIONS],
        cwd=project,
        env=_env(project),
        check=True,
        capture_output=True,
    )
    log = work / "stage_times.log"
    log.write_text("")
    shim = work / "shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "python").write_text(
        f'#!/bin/sh\nexec {TIME} -a -o {log} -f "%e %U %S %M $*" {sys.executable} "$@"\n'
    )
    (shim / "python").chmod(0o755)
    load_before = _load()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        ["dvc", "repro"], cwd=project, env=_env(project, shim), capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (work / "dvc_repro.log").write_text(result.stdout + result.stderr)
    stages: dict[str, Any] = {}
    for line in log.read_text().splitlines():
        found = re.match(
            r"([\d.]+) ([\d.]+) ([\d.]+) (\d+) .*-m (?:vmapcheck\.)?stages\.(\w+)", line
        )
        if found is None:
            continue
        name = found.group(5)
        record_file = project / "reports" / "stages" / f"{name}.json"
        record = json.loads(record_file.read_text()) if record_file.is_file() else {}
        stages[name] = {
            "wall_s": float(found.group(1)),
            "cpu_s": round(float(found.group(2)) + float(found.group(3)), 2),
            "peak_rss_mib": round(int(found.group(4)) / 1024, 1),
            "body_wall_s": record.get("wall_s"),
        }
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "options": list(OPTIONS),
        "exit_code": result.returncode,
        "tail": (result.stdout + result.stderr)[-4000:],
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_mib": max((s["peak_rss_mib"] for s in stages.values()), default=None),
        "load_before": load_before,
        "load_after": _load(),
        "stages": stages,
    }


def figures(project: Path) -> dict[str, Any]:
    """The check and bench figures of the run, at the standard case's 4,096 rows."""
    reports = project / "reports"
    out: dict[str, Any] = {}
    details = reports / "check_details.json"
    if details.is_file():
        check = json.loads(details.read_text())
        standard = check["cases"]["standard"]
        oracle = standard.get("oracle", {})
        out["check"] = {
            "passed": check["passed"],
            "failures": check["failures"][:10],
            "standard_shape": standard["shape"],
            "standard_worst_pair": standard["worst_pair"],
            "standard_max_abs": standard["max_abs"],
            "standard_max_rel": standard["max_rel"],
            "standard_bound_ratio": standard["bound_ratio"],
            "standard_vs_float64_max_rel": max(
                (r["max_rel"] for r in oracle.values() if r.get("max_rel") is not None),
                default=None,
            ),
            "standard_pairs_rows": {k: r.get("rows", "all") for k, r in standard["pairs"].items()},
            "budget": check.get("budget"),
            "composition_passed": {
                p: r["passed"] for p, r in check.get("composition", {}).get("standard", {}).items()
            },
        }
    bench_file = reports / "bench_details.json"
    if bench_file.is_file():
        bench = json.loads(bench_file.read_text())
        sizes = bench["batch_sizes"]
        out["bench"] = {
            "batch_sizes": sizes,
            "p50_ms": {
                path: {f"b{b}": cells[f"b{b}"]["p50"] for b in sizes if f"b{b}" in cells}
                for path, cells in bench["latency_ms"].items()
            },
            "rows_per_s_at_largest": {
                path: cells[f"b{sizes[-1]}"]["rows_per_s"]
                for path, cells in bench["latency_ms"].items()
                if f"b{sizes[-1]}" in cells
            },
            "compile_ms_at_largest": {
                path: cells[f"b{sizes[-1]}"].get("compile_ms")
                for path, cells in bench["figures"].items()
                if f"b{sizes[-1]}" in cells
            },
            "speedup": bench["speedup"],
            "speedup_ci": bench["speedup_ci"],
            "skipped": bench["skipped"],
            "peak_gflops": bench["peak"]["gflops"],
            "replay_requests": bench["replay"]["requests"],
        }
    return out


# --- 2. the phases, each in a process of its own ----------------------------------------


def _phase_oracle(project: Path) -> dict[str, Any]:
    import jax.numpy as jnp

    from vmapcheck.config import load_config
    from vmapcheck.core.magnitude import case_magnitudes
    from vmapcheck.core.models import build_model
    from vmapcheck.core.oracle import float64_outputs
    from vmapcheck.core.runtime import configure_cpu_float64
    from vmapcheck.data.regression import STANDARD_CASE, load_cases
    from vmapcheck.layout import Layout
    from vmapcheck.params_io import load_model_params

    layout = Layout(project)
    config = load_config(project / "params.yaml")
    configure_cpu_float64()
    model = build_model(config.model)
    params, _ = load_model_params(model, layout.params)
    standard = {STANDARD_CASE: load_cases(layout.cases)[STANDARD_CASE]}
    rows = int(standard[STANDARD_CASE]["x"]["image"].shape[0])
    dtype = jnp.dtype(config.precision.dtype)
    out: dict[str, Any] = {"rows": rows}
    for what, fn, budget in (
        ("oracle", float64_outputs, config.budget.oracle_max_rows),
        ("magnitude", None, config.budget.magnitude_max_rows),
    ):
        for label, limit in (("budget", budget), ("all_rows", None)):
            start = time.perf_counter()
            if what == "oracle":
                fn(model, params, standard, dtype, max_rows=limit)
            else:
                case_magnitudes(model.forward_one, params, standard, dtype, max_rows=limit)
            seconds = time.perf_counter() - start
            n = rows if limit is None else min(rows, limit)
            out[f"{what}_{label}"] = {
                "rows": n,
                "seconds": round(seconds, 2),
                "ms_per_row": round(1000 * seconds / n, 2),
            }
    return out


def _phase_loop(project: Path) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from vmapcheck.config import load_config
    from vmapcheck.core import contract
    from vmapcheck.core.cases import case_input
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.gradients import gradient_probe
    from vmapcheck.core.models import build_model
    from vmapcheck.core.paths import build
    from vmapcheck.core.runtime import configure_jax
    from vmapcheck.data.regression import STANDARD_CASE, load_cases
    from vmapcheck.layout import Layout
    from vmapcheck.params_io import load_model_params

    layout = Layout(project)
    config = load_config(project / "params.yaml")
    configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, _ = load_model_params(model, layout.params)
    dtype = jnp.dtype(config.precision.dtype)
    params = cast_tree(params, dtype)
    standard = load_cases(layout.cases)[STANDARD_CASE]
    x = case_input(standard, dtype)
    built = build(model, dtype, "batch")
    out: dict[str, Any] = {}

    def timed(fn: Any, *args: Any) -> float:
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return time.perf_counter() - start

    budget = config.budget.loop_max_rows
    head = contract.take(x, slice(0, budget))
    for name in ("loop_eager", "loop_jit"):
        first = timed(built[name], params, head)
        again = timed(built[name], params, head)
        out[name] = {
            "rows": budget,
            "first_call_s": round(first, 2),
            "second_call_s": round(again, 3),
            "ms_per_row": round(1000 * again / budget, 2),
        }
    out["loop_jit_first_call_s_by_rows"] = {
        str(n): round(
            timed(build(model, dtype, "batch")["loop_jit"], params, contract.take(x, slice(0, n))),
            2,
        )
        for n in LOOP_JIT_ROWS
    }
    for name in ("vmap_jit", "direct_jit"):
        first = timed(built[name], params, x)
        out[f"{name}_all_rows"] = {
            "rows": contract.rows(x),
            "first_call_s": round(first, 2),
            "second_call_s": round(timed(built[name], params, x), 2),
        }
    n = config.budget.gradient_max_rows
    start = time.perf_counter()
    gradient_probe(
        model,
        params,
        contract.take(x, slice(0, n)),
        jnp.asarray(standard["y"][:n], dtype=dtype),
    )
    out["gradient_probe"] = {"rows": n, "seconds": round(time.perf_counter() - start, 2)}
    return out


PHASES = {"oracle": _phase_oracle, "loop": _phase_loop}


def phases(project: Path) -> dict[str, Any]:
    """Each phase in a fresh interpreter: its figures, wall and peak RSS."""
    out: dict[str, Any] = {}
    for name in PHASES:
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, __file__, "--phase", name, str(project)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        if result.returncode != 0:
            out[name] = {"error": result.stderr[-3000:]}
            continue
        out[name] = {
            **json.loads(result.stdout.strip().splitlines()[-1]),
            "process_wall_s": round(time.perf_counter() - start, 1),
        }
    return out


def _run_phase(name: str, project: Path) -> None:
    figures_ = PHASES[name](project)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({**figures_, "peak_rss_mib": round(peak, 1)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the copy here and keep it")
    parser.add_argument("--phases-only", type=Path, help="only the phases, on this kept copy")
    parser.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    parser.add_argument("project", nargs="?", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--json",
        type=Path,
        default=ROOT / "benchmarks" / f"big_model_{datetime.date.today():%Y%m%d}.json",
    )
    args = parser.parse_args()
    if args.phase:
        _run_phase(args.phase, args.project)
        return 0
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "load_at_start": _load(),
    }
    if args.phases_only:
        # The phases again on a kept copy: the pipeline's figures in --json are kept.
        kept = json.loads(args.json.read_text()) if args.json.is_file() else {}
        results = {
            **kept,
            "phases_measured_at": results["date"],
            "load_at_phases_start": results["load_at_start"],
            "phases": phases(args.phases_only),
        }
    else:
        work = Path(tempfile.mkdtemp(prefix="vmapcheck-big-"))
        project = args.keep or work / "project"
        if project.exists():
            raise SystemExit(f"{project}: exists; give a new folder to --keep")
        try:
            from tests.helpers import project as helpers

            helpers.copy_project(project, ROOT)
            helpers.commit_all(project, "copy")
            results["pipeline"] = pipeline(project, work)
            results["figures"] = figures(project)
            results["phases"] = phases(project)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    results["load_at_phases_end" if args.phases_only else "load_at_end"] = _load()
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "figures"}, indent=2)[:6000])
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
