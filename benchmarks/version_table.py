"""Which versions vmapcheck installs beside (issue 33): a user's stack first, then the
wheel, and the Python API check in the result.

For each row: a fresh venv in a temporary folder (never in the repository), the row's
"before" stack installed into it (``uv pip install``, for speed), then ``pip install
<the vmapcheck wheel>`` with no constraint file, as a user would. ``pip list`` is read
before and after, for python, jax, jaxlib, mlflow, dvc and numpy. Then a small script
runs in that venv: ``vmapcheck.assert_batching_consistent`` on a small model that passes,
and on the same model with a softmax over the batch axis planted in its hand-batched
forward, which must raise ``BatchingCheckError``. Each step's wall seconds, its CPU
seconds (``getrusage`` of the child) and the load average are recorded.

Usage (from the project root; a few minutes a row on two cores, PyPI reachable)::

    .venv/bin/python benchmarks/version_table.py --out benchmarks/version_table_<date>.json
    .venv/bin/python benchmarks/version_table.py --rows 1,4 --wheel dist/vmapcheck-0.1.0-*.whl
    .venv/bin/python benchmarks/version_table.py --installer uv   # the wheel with uv instead

The JSON is written atomically; a markdown table of it is printed.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
UV = ROOT / ".venv" / "bin" / "uv"
PYENV = "/root/.pyenv/versions"
# What pip list is read for, in the table's order.
PACKAGES = ("jax", "jaxlib", "mlflow", "dvc", "numpy")
INSTALL_TIMEOUT_S = 1800
CHECK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Row:
    """One stack a user may already have: a Python and what is installed before vmapcheck."""

    key: str
    python: str  # major.minor, found under PYENV
    before: tuple[str, ...]  # requirements installed first
    label: str


ROWS: dict[str, Row] = {
    row.key: row
    for row in (
        Row("1", "3.11", ("jax==0.10.2", "jaxlib==0.10.2"), "Python 3.11 + jax 0.10.2"),
        Row("2", "3.12", ("jax==0.11.2", "jaxlib==0.11.2"), "Python 3.12 + jax 0.11.2"),
        Row("3", "3.12", ("jax==0.12.0.1", "jaxlib==0.12.0.1"), "Python 3.12 + jax 0.12.0.1"),
        Row("4", "3.12", ("mlflow==3.16.1",), "Python 3.12 + mlflow 3.16.1"),
    )
}

# Runs in the row's venv, from its temporary folder (the repository is not on sys.path).
# Prints one JSON line: each check's outcome and wall seconds, and what jax says it is.
CHECK_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
import vmapcheck
from vmapcheck import Model, assert_batching_consistent
from vmapcheck.testing import BatchingCheckError
imported = time.perf_counter() - t0

IN, HIDDEN, OUT, ROWS = 4, 16, 3, 8

def init(key):
    k1, k2 = jax.random.split(key)
    return {"W1": jax.random.normal(k1, (IN, HIDDEN), jnp.float32) * 0.5,
            "b1": jnp.full((HIDDEN,), 0.1, jnp.float32),
            "W2": jax.random.normal(k2, (HIDDEN, OUT), jnp.float32) * 0.25,
            "b2": jnp.zeros((OUT,), jnp.float32)}

def forward_one(params, x):
    h = jnp.tanh(x @ params["W1"] + params["b1"])
    return jax.nn.softmax(h @ params["W2"] + params["b2"])

def batched(softmax_axis):
    def forward_batch(params, X):
        h = jnp.tanh(X @ params["W1"] + params["b1"][None, :])
        return jax.nn.softmax(h @ params["W2"] + params["b2"][None, :], axis=softmax_axis)
    return forward_batch

def model(softmax_axis):
    return Model(name="tiny", in_features=IN, out_features=OUT, forward_one=forward_one,
                 forward_batch=batched(softmax_axis), init=init)

params = init(jax.random.key(0))
examples = np.random.default_rng(0).normal(size=(ROWS, IN))
result = {"jax": jax.__version__, "vmapcheck": vmapcheck.__version__,
          "import_s": round(imported, 2)}

t0 = time.perf_counter()
try:
    report = assert_batching_consistent(model(-1), params, examples)
    result["good"] = {"passed": True, "paths": len(report.paths),
                      "worst_bound_ratio": float(report.worst_bound_ratio)}
except Exception as exc:
    result["good"] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
result["good"]["wall_s"] = round(time.perf_counter() - t0, 2)

t0 = time.perf_counter()
try:
    assert_batching_consistent(model(0), params, examples)  # softmax over the batch axis
    result["planted"] = {"raised": False}
except BatchingCheckError as exc:
    failures = exc.report.failures
    result["planted"] = {"raised": True, "failures": len(failures),
                         "first_failure": str(failures[0])[:300] if failures else ""}
except Exception as exc:
    result["planted"] = {"raised": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
result["planted"]["wall_s"] = round(time.perf_counter() - t0, 2)
print("VERSION_TABLE " + json.dumps(result))
"""


# --- pure parts (tests/test_version_table.py) -------------------------------------------


def parse_rows(text: str | None) -> list[Row]:
    """``"1,3"`` (or ``"1 3"``; None or empty: all) -> those rows, in the order given.

    Raises:
        ValueError: a key that is not a row, naming the keys there are.
    """
    if not text or not text.strip():
        return list(ROWS.values())
    keys = [k for k in text.replace(",", " ").split() if k]
    unknown = [k for k in keys if k not in ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {', '.join(unknown)}: expected some of {', '.join(ROWS)}")
    return [ROWS[k] for k in dict.fromkeys(keys)]


def find_python(minor: str, root: str = PYENV) -> str:
    """The newest ``<root>/<minor>.*/bin/python``.

    Raises:
        FileNotFoundError: none there.
    """

    def patch(path: str) -> int:
        version = Path(path).parents[1].name.split(".")
        return int(version[2]) if len(version) > 2 and version[2].isdigit() else -1

    found = sorted(glob.glob(f"{root}/{minor}.*/bin/python"), key=patch)
    if not found:
        raise FileNotFoundError(f"no Python {minor} under {root}")
    return found[-1]


def pip_versions(pip_list_json: str, names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """``pip list --format json``'s text -> ``{name: version or None}`` for ``names``."""
    entries = {e["name"].lower().replace("_", "-"): e["version"] for e in json.loads(pip_list_json)}
    return {name: entries.get(name) for name in names}


def change(before: str | None, after: str | None) -> str:
    """One cell: ``0.10.2 kept``, ``- -> 3.17.2`` (added), ``0.9.2 -> 0.12.1`` (moved)."""
    if before == after:
        return f"{before} kept" if before else "-"
    return f"{before or '-'} -> {after or '-'}"


def _check_cell(row: dict[str, Any]) -> str:
    check = row.get("check") or {}
    if not check:
        return row.get("error", "not run")[:60]
    good = "passes" if check.get("good", {}).get("passed") else "FAILS"
    planted = "raises" if check.get("planted", {}).get("raised") else "DOES NOT RAISE"
    return f"{good} / {planted}"


def _seconds(step: dict[str, Any] | None) -> str:
    if not step:
        return "-"
    return f"{step['wall_s']:.0f} / {step['cpu_s']:.0f}"


def markdown_table(result: dict[str, Any]) -> str:
    """The rows of a result as a markdown table: versions before -> after, the checks,
    the wheel's install and the check's wall / CPU seconds, the load average."""
    header = (
        "| row | python | "
        + " | ".join(PACKAGES)
        + " | good / planted | install s (wall / CPU) | check s (wall / CPU) | load |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in result["rows"]:
        before, after = row.get("before") or {}, row.get("after") or {}
        cells = [row["key"], row.get("python_version") or row["python"]]
        cells += [change(before.get(p), after.get(p)) for p in PACKAGES]
        cells += [
            _check_cell(row),
            _seconds(row.get("steps", {}).get("install_wheel")),
            _seconds(row.get("steps", {}).get("check")),
            " ".join(f"{x:.1f}" for x in row.get("load_before", [])),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, obj: Any) -> None:
    """Atomically: vmapcheck.io.atomic_write_json when importable, else temp + os.replace."""
    try:
        from vmapcheck.io import atomic_write_json
    except ImportError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    else:
        atomic_write_json(path, obj)


# --- running -----------------------------------------------------------------------------


def run(cmd: list[str], *, timeout: float, cwd: Path | None = None) -> dict[str, Any]:
    """One child, its wall and CPU seconds (user + system of it and what it waited for)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return {
        "cmd": " ".join(cmd),
        "rc": proc.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


def install_summary(output: str, names: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """What pip said of an install: the ``Requirement already satisfied`` lines of
    ``names`` (what it kept) and its ``Successfully installed`` line, split."""
    kept, installed = [], []
    for line in output.splitlines():
        if line.startswith("Requirement already satisfied: "):
            requirement = line.removeprefix("Requirement already satisfied: ").split(" in ")[0]
            name = requirement.split("<")[0].split(">")[0].split("=")[0].split("[")[0]
            if name.strip().lower() in names:
                kept.append(requirement.strip())
        elif line.startswith("Successfully installed "):
            installed = line.removeprefix("Successfully installed ").split()
    return {"already_satisfied": kept, "installed": installed}


def _kept(step: dict[str, Any], tail: int = 3000) -> dict[str, Any]:
    """A step as stored: its output's tail, without this machine's pip warnings about
    find-links folders that are not there."""
    out = {k: v for k, v in step.items() if k not in ("stdout", "stderr")}
    lines = (step["stdout"] + step["stderr"]).splitlines()
    useful = [ln for ln in lines if not ln.startswith("WARNING: Location ")]
    out["output_tail"] = "\n".join(useful)[-tail:]
    return out


def build_wheel(into: Path) -> Path:
    step = run(
        [str(VENV_PYTHON), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(into), str(ROOT)],
        timeout=600,
    )  # fmt: skip
    if step["rc"] != 0:
        raise SystemExit(f"building the wheel failed:\n{step['stdout']}{step['stderr']}")
    (wheel,) = into.glob("vmapcheck-*.whl")
    return wheel


def run_row(row: Row, wheel: Path, installer: str, workdir: Path) -> dict[str, Any]:
    python = find_python(row.python)
    venv = workdir / f"row{row.key}"
    vpy = str(venv / "bin" / "python")
    out: dict[str, Any] = {
        "key": row.key,
        "label": row.label,
        "python": python,
        "before_stack": list(row.before),
        "load_before": list(os.getloadavg()),
        "steps": {},
    }
    steps = out["steps"]
    start = time.perf_counter()

    def step(name: str, cmd: list[str], timeout: float = INSTALL_TIMEOUT_S, **kw: Any) -> dict:
        steps[name] = result = run(cmd, timeout=timeout, **kw)
        if result["rc"] != 0:
            out["error"] = f"{name} failed (rc {result['rc']})"
        return result

    def pip_list() -> dict[str, str | None]:
        listed = run([vpy, "-m", "pip", "list", "--format", "json"], timeout=120)
        versions = pip_versions(listed["stdout"]) if listed["rc"] == 0 else {}
        version = run([vpy, "-c", "import platform; print(platform.python_version())"], timeout=60)
        return {"python": version["stdout"].strip(), **versions}

    try:
        # --seed: pip in the venv, for pip list and (by default) the wheel's install.
        if step("venv", [str(UV), "venv", "--seed", "--python", python, str(venv)])["rc"]:
            return out
        if step("install_before", [str(UV), "pip", "install", "--python", vpy, *row.before])["rc"]:
            return out
        out["before"] = pip_list()
        out["python_version"] = out["before"]["python"]
        if installer == "pip":
            cmd = [vpy, "-m", "pip", "install", str(wheel)]
        else:
            cmd = [str(UV), "pip", "install", "--python", vpy, str(wheel)]
        installed = step("install_wheel", cmd)
        out["pip_said"] = install_summary(installed["stdout"] + installed["stderr"])
        out["after"] = pip_list()
        out["pip_check"] = run([vpy, "-m", "pip", "check"], timeout=300)["stdout"][-2000:]
        if installed["rc"]:
            return out
        script = workdir / "check_api.py"
        script.write_text(CHECK_SCRIPT)
        out["load_before_check"] = list(os.getloadavg())
        checked = step("check", [vpy, str(script)], timeout=CHECK_TIMEOUT_S, cwd=workdir)
        for line in checked["stdout"].splitlines():
            if line.startswith("VERSION_TABLE "):
                out["check"] = json.loads(line.removeprefix("VERSION_TABLE "))
        if "check" not in out:
            out.setdefault("error", "the check printed no result")
        return out
    finally:
        out["load_after"] = list(os.getloadavg())
        out["row_wall_s"] = round(time.perf_counter() - start, 2)
        out["steps"] = {name: _kept(s) for name, s in steps.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="the vmapcheck wheel (default: build one)")
    parser.add_argument("--rows", help=f"rows to run, e.g. 1,3 (default: all of {', '.join(ROWS)})")
    parser.add_argument("--out", type=Path, help="the JSON to write")
    parser.add_argument(
        "--installer",
        choices=("pip", "uv"),
        default="pip",
        help="what installs the wheel: pip (a user's default) or uv pip",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary venvs")
    args = parser.parse_args(argv)
    try:
        rows = parse_rows(args.rows)
    except ValueError as exc:
        parser.error(str(exc))

    workdir = Path(tempfile.mkdtemp(prefix="vmapcheck-version-table-"))
    try:
        wheel = args.wheel.resolve() if args.wheel else build_wheel(workdir / "wheel")
        result: dict[str, Any] = {
            "what": "what pip keeps or installs beside a stack, then the Python API check",
            "date": datetime.date.today().isoformat(),
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python_running": sys.version.split()[0],
            },
            "wheel": wheel.name,
            "installer": installer_text(args.installer),
            "command": "python benchmarks/version_table.py " + " ".join(argv or sys.argv[1:]),
            "rows": [],
        }
        for row in rows:
            print(f"row {row.key}: {row.label} ...", file=sys.stderr, flush=True)
            result["rows"].append(run_row(row, wheel, args.installer, workdir))
            done = result["rows"][-1]
            print(
                f"row {row.key}: {done.get('error') or 'done'} in {done['row_wall_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            if args.out:
                write_json(args.out, result)  # after each row: a partial run keeps its rows
        print(markdown_table(result))
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all("error" not in r for r in result["rows"]) else 1


def installer_text(installer: str) -> str:
    """How each row installs, as recorded."""
    wheel = "pip install <wheel>" if installer == "pip" else "uv pip install <wheel>"
    return f"before stack: uv pip install; then {wheel}, no constraint file"


if __name__ == "__main__":
    sys.exit(main())
