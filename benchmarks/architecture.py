"""The package's shape in figures (issues 36 and 47): import cycles and arrows up a floor,
module and function sizes, rooms (modules) per package and the biggest room, the
``dict[str, Any]`` count, mypy's coverage of ``src/``, the public names, the modules no
test file imports, and start-up times of the CLI and of the track stage, as JSON on
stdout (``--out`` writes it too).

    .venv/bin/python benchmarks/architecture.py [--rev REV] [--repeat 7] [--out F.json]

``--rev`` measures the static figures of another commit (``git archive`` of its src/,
docs/, tests/ and pyproject.toml into a temporary folder; the floors are read from that
commit's docs/development.md when it has them, else from this checkout's; the import
rules are always this checkout's tests/test_layers.py). Start-up times are measured on
this checkout only (``--rev`` skips them): median and p90 over ``--repeat`` fresh
processes, with the load average beside them, since the machine is shared.
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
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ``type X = ...`` (Python 3.12); the package supports 3.11, where no module has one.
TYPE_ALIAS = getattr(ast, "TypeAlias", ())


def _test_module(name: str):
    """tests/<name>.py, loaded from this checkout (not as part of the test suite)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer_rules():
    """tests/test_layers.py, whose ``imports``/``floors`` this script reuses."""
    return _test_module("test_layers")


# The size limits and their counting are tests/test_sizes.py's, which fails over them:
# this script reports the same figures (modules_over_700, functions_over_120).
SIZES = _test_module("test_sizes")
MODULE_LIMIT = SIZES.MODULE_LIMIT
FUNCTION_LIMIT = SIZES.FUNCTION_LIMIT


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


def _package_of(module: str, is_init: bool) -> str:
    """``vmapcheck.bench.timing.run`` -> ``vmapcheck.bench.timing``; a package's
    ``__init__`` belongs to the package itself."""
    return module if is_init else module.rsplit(".", 1)[0]


def rooms_per_package(package: Path) -> dict:
    """Per package (a folder with ``__init__.py``, dotted name): its modules (the rooms,
    ``__init__`` included), their lines, and its biggest room with its lines; beside them
    the biggest room of all and the package with most rooms."""
    per: dict[str, dict] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        lines = path.read_text().count("\n")
        room = per.setdefault(
            _package_of(module, is_init), {"modules": 0, "lines": 0, "biggest": ["", -1]}
        )
        room["modules"] += 1
        room["lines"] += lines
        if lines > room["biggest"][1]:
            room["biggest"] = [path.name, lines]
    table = {
        name: {
            "modules": r["modules"],
            "lines": r["lines"],
            "biggest_room": r["biggest"][0],
            "biggest_room_lines": r["biggest"][1],
        }
        for name, r in sorted(per.items())
    }
    most = max(table.items(), key=lambda kv: kv[1]["modules"])
    biggest = max(table.items(), key=lambda kv: kv[1]["biggest_room_lines"])
    return {
        "packages": table,
        "most_rooms": {"package": most[0], "modules": most[1]["modules"]},
        "biggest_room": {
            "module": f"{biggest[0]}/{biggest[1]['biggest_room']}",
            "lines": biggest[1]["biggest_room_lines"],
        },
    }


def mypy_coverage(root: Path) -> dict:
    """The files and lines of ``src/`` that ``[tool.mypy] files`` in pyproject.toml lists
    (a folder: every ``.py`` under it), against all of ``src/``."""
    config = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("mypy", {})
    src = sorted((root / "src").rglob("*.py"))
    covered: set[Path] = set()
    for entry in config.get("files", []):
        target = root / entry
        covered |= set(target.rglob("*.py")) if target.is_dir() else {target}
    covered &= set(src)
    lines = {p: p.read_text().count("\n") for p in src}
    total_lines = sum(lines.values())
    covered_lines = sum(lines[p] for p in covered)
    return {
        "files": len(covered),
        "files_of": len(src),
        "lines": covered_lines,
        "lines_of": total_lines,
        "lines_pct": round(100 * covered_lines / total_lines, 1),
    }


def _top_level(tree: ast.Module):
    """The module's own statements, into ``if`` and ``try`` blocks (``if TYPE_CHECKING:``,
    an optional import), not into functions or classes."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.If):
            stack[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            stack[:0] = [*node.body, *node.orelse, *node.finalbody]
            for handler in node.handlers:
                stack[:0] = handler.body
        else:
            yield node


def public_names(package: Path) -> dict:
    """Module-level names not starting with ``_`` that a module defines (functions,
    classes, assignments, type aliases; imported names not counted), and the modules that
    define ``__all__``, the packages that do not, and the modules named ``_x`` (private to
    their package)."""
    defined = 0
    with_all = []
    for path in sorted(package.rglob("*.py")):
        names: set[str] = set()
        for node in _top_level(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {
                    n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)
                }
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, TYPE_ALIAS) and isinstance(node.name, ast.Name):
                names.add(node.name.id)
        if "__all__" in names:
            with_all.append(str(path.relative_to(package.parent)))
        defined += sum(1 for n in names if not n.startswith("_"))
    packages = sorted(str(p.relative_to(package.parent)) for p in package.rglob("__init__.py"))
    private = sorted(
        str(p.relative_to(package.parent))
        for p in package.rglob("_*.py")
        if not p.name.startswith("__")
    )
    return {
        "module_level": defined,
        "modules_with___all__": len(with_all),
        "with___all__": with_all,
        "packages_without___all__": [p for p in packages if p not in with_all],
        "private_modules": private,
    }


def untested_modules(root: Path, rules) -> tuple[list[str], list[str]]:
    """The package's modules that no test file under ``tests/`` imports (the rule of
    ``tests/test_layers.py``'s ``modules_no_test_imports``: by dotted name or ``from
    package import module``; a package counts when a test imports it or one of its
    modules). The second list holds those of the first that a test names only as text
    (a ``-m`` argument, a string)."""
    untested = rules.modules_no_test_imports(root / "src" / "vmapcheck", root / "tests")
    text = "\n".join(p.read_text() for p in (root / "tests").rglob("*.py"))
    named = [m for m in untested if re.search(re.escape(m) + r"(?![\w.])", text)]
    return untested, named


def doctests(package: Path) -> dict:
    """The docstrings of the package (modules, classes, functions) that hold runnable
    examples (``>>>``), and the examples in them."""
    docstrings = examples = 0
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True) or ""
                found = sum(1 for line in doc.splitlines() if line.lstrip().startswith(">>> "))
                docstrings += found > 0
                examples += found
    return {"docstrings": docstrings, "examples": examples}


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
    modules = SIZES.module_lines(rules.PACKAGE)
    functions = SIZES.function_lines(rules.PACKAGE)
    dict_any = sum(p.read_text().count("dict[str, Any]") for p in rules.PACKAGE.rglob("*.py"))
    untested, named_as_text = untested_modules(root, rules)
    reasons = re.search(r"```untested\n(.*?)```", text, re.S)
    with_reason = {
        line.split("#")[0].strip()
        for line in (reasons.group(1).splitlines() if reasons else [])
        if line.split("#")[0].strip()
    }
    return {
        "modules": len(modules),
        "rooms": rooms_per_package(rules.PACKAGE),
        "arrows": sum(len(t) for t in arrows.values()),
        "cycles": _cycles(arrows),
        "up_arrows": up,
        "up_arrows_count": len(up),
        "dict_str_any": dict_any,
        "mypy_coverage": mypy_coverage(root),
        "public_names": public_names(rules.PACKAGE),
        "modules_with_no_test": {
            "count": len(untested),
            "modules": untested,
            "named_only_as_text": named_as_text,
            "with_a_reason_in_the_floors_doc": len(with_reason & set(untested)),
        },
        "doctests": doctests(rules.PACKAGE),
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
                ["git", "archive", args.rev, "src", "docs", "tests", "pyproject.toml"],
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
