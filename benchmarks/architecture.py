"""The package's shape in figures (issue 36): import cycles and arrows up a floor, module
and function sizes, the ``dict[str, Any]`` count, and start-up times of the CLI and of
the track stage, as JSON on stdout (``--out`` writes it too).

    .venv/bin/python benchmarks/architecture.py [--rev REV] [--repeat 7] [--out F.json]

``--rev`` measures the static figures of another commit (``git archive`` into a
temporary folder; the floors are read from that commit's docs/development.md when it
has them, else from this checkout's). Start-up times are measured on this checkout only
(``--rev`` skips them): median and p90 over ``--repeat`` fresh processes, with the load
average beside them, since the machine is shared.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LIMIT = 700
FUNCTION_LIMIT = 120


def _layer_rules():
    """tests/test_layers.py, whose ``imports``/``floors`` this script reuses."""
    spec = importlib.util.spec_from_file_location("test_layers", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in arrows.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def static_figures(root: Path, floors_doc: Path) -> dict:
    rules = _layer_rules()
    rules.PACKAGE = root / "src" / "vmapcheck"
    text = floors_doc.read_text()
    block = re.search(r"```floors\n(.*?)```", text, re.S)
    lines = [line.split("#")[0].split() for line in block.group(1).splitlines()]
    level = {room: i for i, rooms in enumerate(r for r in lines if r) for room in rooms}
    arrows = rules.imports()
    up = sorted(
        f"{m} -> {t}"
        for m, targets in arrows.items()
        for t in targets
        if level.get(rules.room_of(t), -1) > level.get(rules.room_of(m), 10**6)
    )
    modules, functions, dict_any = {}, [], 0
    for path in sorted(rules.PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(rules.PACKAGE))
        modules[name] = source.count("\n")
        dict_any += source.count("dict[str, Any]")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    functions.sort(reverse=True)
    return {
        "modules": len(modules),
        "arrows": sum(len(t) for t in arrows.values()),
        "cycles": _cycles(arrows),
        "up_arrows": up,
        "dict_str_any": dict_any,
        f"modules_over_{MODULE_LIMIT}": {
            k: v for k, v in sorted(modules.items(), key=lambda kv: -kv[1]) if v > MODULE_LIMIT
        },
        f"functions_over_{FUNCTION_LIMIT}": {f: n for n, f in functions if n > FUNCTION_LIMIT},
        "functions_over_80": sum(1 for n, _ in functions if n > 80),
        "largest_module_lines": max(modules.values()),
        "largest_function_lines": functions[0][0],
    }


def _timed(argv: list[str], repeat: int, env: dict | None = None) -> dict:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT, env=env)
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "p50_s": round(statistics.median(times), 3),
        "p90_s": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        "n": repeat,
    }


def startup_figures(repeat: int, src: Path | None = None) -> dict:
    """Start-up times of this checkout's package, or of the one in ``src`` (another
    commit's ``src/`` folder, put first on ``PYTHONPATH``), with this checkout's venv."""
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    jax_loaded = (
        "import sys, importlib; importlib.import_module(sys.argv[1]); print('jax' in sys.modules)"
    )

    def loads_jax(module: str) -> bool:
        out = subprocess.run(
            [python, "-c", jax_loaded, module], capture_output=True, text=True, check=True, env=env
        )
        return out.stdout.strip() == "True"

    return {
        "load_before": os.getloadavg()[0],
        "vmapcheck --help": _timed([python, "-m", "vmapcheck", "--help"], repeat, env),
        "track stage import": _timed(
            [python, "-c", "import vmapcheck.pipeline.track, vmapcheck.pipeline.stage"],
            repeat,
            env,
        ),
        "jax loaded by": {
            m: loads_jax(m)
            for m in ("vmapcheck.cli", "vmapcheck.pipeline.track", "vmapcheck.report.summary")
        },
        "load_after": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="measure another commit's static figures")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--startup-src",
        type=Path,
        help="time the start-up of the package in this src/ folder (another commit's)",
    )
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", args.rev or "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.strip()
    result: dict = {"commit": head, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.startup_src:
        result["startup"] = startup_figures(args.repeat, args.startup_src.resolve())
    if args.rev:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "archive", args.rev, "src", "docs"],
                capture_output=True,
                check=True,
                cwd=ROOT,
            ).stdout
            with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            doc = Path(tmp) / "docs" / "development.md"
            if "```floors" not in doc.read_text():
                doc = ROOT / "docs" / "development.md"
            result["static"] = static_figures(Path(tmp), doc)
    else:
        result["static"] = static_figures(ROOT, ROOT / "docs" / "development.md")
        if not args.startup_src:
            result["startup"] = startup_figures(args.repeat)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
