"""Measure the tool's own speed: wall and CPU seconds per stage, for the two scenarios of
docs/development.md ("The tool's own times").

1. cold: a fresh copy of the project (no outputs, no DVC cache, no MLflow store; the
   ``.venv`` is the one this script runs in), ``dvc repro`` of the committed params;
2. tolerance: then ``precision.tolerance.rtol`` doubled in params.yaml, ``dvc repro``
   again (DVC reruns ``check`` and ``track`` only).

Each stage's process is timed from outside through a ``python`` shim first on PATH
(the stages' cmd is ``python -m vmapcheck.stages.<name>``): ``/usr/bin/time`` records its wall,
user and system seconds (interpreter start, imports, compile and the work itself). The
body alone is the stage's own record, ``reports/stages/<name>.json`` (``wall_s``). What
``dvc repro`` spends outside every stage (deciding, hashing, caching outputs) is its
total minus the stages'. CPU seconds are user+system of the process and its children:
on a shared machine they move much less with the load than wall seconds do.

Usage (from the project root)::

    python benchmarks/tool_speed.py            # both scenarios, a table on stdout
    python benchmarks/tool_speed.py --json out.json --keep /tmp/speed-copy
    python benchmarks/tool_speed.py --source ../other-checkout   # time another version

``--source``: the checkout to copy (default: the one holding this script), so that two
versions can be timed one after the other on the same machine and load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers
TIME = "/usr/bin/time"


def copy_project(source: Path, dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of ``source`` (a git checkout of
    the project), committed as a new git repository at ``dest``."""
    from tests.helpers import project

    project.copy_project(dest, source)
    project.commit_all(dest, "copy")


def _env(project: Path, shim: Path | None) -> dict[str, str]:
    from tests.helpers import project as helpers

    env = helpers.project_env(project)
    if shim is not None:  # the timing shim's `python` before the real one
        env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    return env


def write_shim(folder: Path, log: Path) -> Path:
    """A ``python`` that runs the real interpreter under ``/usr/bin/time``, appending
    ``<wall> <user> <sys> <args>`` to ``log``."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python"
    shim.write_text(f'#!/bin/sh\nexec {TIME} -a -o {log} -f "%e %U %S $*" {sys.executable} "$@"\n')
    shim.chmod(0o755)
    return folder


def repro(project: Path, shim: Path, log: Path) -> dict:
    """``dvc repro`` in ``project``; its wall and CPU, and each stage process's."""
    log.write_text("")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        ["dvc", "repro"], cwd=project, env=_env(project, shim), capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"dvc repro exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    stages = {}
    for line in log.read_text().splitlines():
        found = re.match(r"([\d.]+) ([\d.]+) ([\d.]+) .*-m (?:vmapcheck\.)?stages\.(\w+)", line)
        if found is None:
            continue
        name = found.group(4)
        # The code stage keeps no wall-time record of its own: its process is all it does.
        record_file = project / "reports" / "stages" / f"{name}.json"
        record = json.loads(record_file.read_text()) if record_file.is_file() else {}
        stages[name] = {
            "wall_s": float(found.group(1)),
            "cpu_s": round(float(found.group(2)) + float(found.group(3)), 2),
            "body_wall_s": record.get("wall_s", float(found.group(1))),
        }
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "dvc_wall_s": round(wall - sum(s["wall_s"] for s in stages.values()), 2),
        "dvc_cpu_s": round(cpu - sum(s["cpu_s"] for s in stages.values()), 2),
        "stages": stages,
    }


def double_tolerance(params: Path) -> None:
    """Double ``precision.tolerance.rtol`` in params.yaml, leaving every other line."""
    text = params.read_text()
    pattern = re.compile(r"(\n  tolerance:\n    rtol: )([0-9.eE+-]+)\n")
    found = pattern.search(text)
    if found is None:
        raise SystemExit(f"{params}: no precision.tolerance.rtol line to edit")
    doubled = f"{float(found.group(2)) * 2:.1e}"
    params.write_text(text[: found.start(2)] + doubled + text[found.end(2) :])


def print_table(name: str, result: dict) -> None:
    print(f"\n{name}: dvc repro {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} s CPU")
    print(f"  {'stage':<10}{'wall_s':>8}{'cpu_s':>8}{'body_wall_s':>13}")
    for stage, figures in result["stages"].items():
        print(
            f"  {stage:<10}{figures['wall_s']:>8.1f}{figures['cpu_s']:>8.1f}"
            f"{figures['body_wall_s']:>13.1f}"
        )
    print(f"  {'dvc':<10}{result['dvc_wall_s']:>8.1f}{result['dvc_cpu_s']:>8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", type=Path, help="build the copy here and keep it")
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the checkout to copy (default: this one)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vmapcheck-speed-"))
    project = args.keep or work / "project"
    if project.exists():
        raise SystemExit(f"{project}: exists; give a new folder to --keep")
    try:
        copy_project(args.source.resolve(), project)
        log = work / "stage_times.log"
        shim = write_shim(work / "shim", log)
        load = os.getloadavg()[0]
        results = {"load_1min_at_start": load, "cold": repro(project, shim, log)}
        double_tolerance(project / "params.yaml")
        results["tolerance"] = repro(project, shim, log)
        results["load_1min_at_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("cold", "tolerance"):
        print_table(name, results[name])
    print(f"\nload average (1 min): {load:.2f} at start, {results['load_1min_at_end']:.2f} at end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
