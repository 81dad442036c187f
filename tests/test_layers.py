"""The package's floors (docs/development.md, "Dependency rules"): every module imports
only from its own floor or the floors below, and no two modules import each other, even
through others. Read from the source with ``ast``, lazy imports inside functions
included: an import inside a function is still an arrow between concepts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "vmapcheck"
DOC = ROOT / "docs" / "development.md"
TESTS = ROOT / "tests"

# Arrows up a floor still to take down, each a debt with its reason (none since issue
# 36 took the last four down): a new one fails the test.
KNOWN_UP: set[tuple[str, str]] = set()


def floors() -> dict[str, int]:
    """Room -> floor (0 at the bottom), from the ```floors block of docs/development.md:
    one line a floor, bottom first, rooms separated by spaces."""
    found = re.search(r"```floors\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"{DOC}: expected a ```floors block listing the package's floors"
    lines = [line.split("#")[0].split() for line in found.group(1).splitlines()]
    return {room: i for i, rooms in enumerate(r for r in lines if r) for room in rooms}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """``vmapcheck.bench.timing.run`` -> ``bench``; ``vmapcheck.io`` -> ``io``; the package
    itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[str, set[str]]:
    """Module -> the vmapcheck modules it imports (``from a import b`` counts ``a.b``
    when that is a module, else ``a``)."""
    modules = {module_of(p): p for p in PACKAGE.rglob("*.py")}
    arrows: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        arrows[module] = {m for m in found if m in modules and m != module}
    return arrows


def modules_no_test_imports(package: Path, tests: Path) -> list[str]:
    """The package's modules that no test file under ``tests`` imports: by its dotted
    name (``import vmapcheck.io``, ``from vmapcheck.io import x``, lazy imports included)
    or as ``from vmapcheck.bench import timing``. A package counts as imported when a
    test imports it or one of its modules (that runs its ``__init__``). A test that only
    starts a module in a subprocess (``python -m``) or names it in a string does not
    count."""
    modules = {module_of(p) for p in package.rglob("*.py")}
    imported: set[str] = set()
    for path in tests.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:  # a corpus file of a planted bug, read as text
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
                imported |= {f"{node.module}.{a.name}" for a in node.names}
    reached = set()
    for name in imported & modules:
        parts = name.split(".")
        reached |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return sorted(modules - reached)


def untested_reasons() -> dict[str, str]:
    """Module -> why no test file imports it, from the ```untested block of
    docs/development.md: one module a line, its reason after ``#``."""
    found = re.search(r"```untested\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"{DOC}: expected an ```untested block (modules no test imports, why)"
    reasons = {}
    for line in found.group(1).splitlines():
        module, _, reason = line.partition("#")
        if module.strip():
            assert reason.strip(), f"{DOC.name}: {module.strip()} has no reason"
            reasons[module.strip()] = reason.strip()
    return reasons


def test_every_module_has_a_test_file_that_imports_it_or_a_reason():
    """A new module needs a test that imports it (and asserts its behaviour), or a line
    in the ```untested block saying why not (run only as ``python -m``, tested through
    the package that re-exports it, ...)."""
    untested = set(modules_no_test_imports(PACKAGE, TESTS))
    reasons = untested_reasons()
    assert sorted(untested - set(reasons)) == [], (
        f"modules no test file imports, with no reason in {DOC.name}'s ```untested block"
    )
    assert sorted(set(reasons) - untested) == [], (
        f"imported by a test now (or gone): remove from {DOC.name}'s ```untested block"
    )


def test_every_room_of_the_package_has_a_floor():
    level = floors()
    rooms = {room_of(m) for m in imports()}
    assert rooms - set(level) == set(), f"rooms with no floor in {DOC.name}"
    assert set(level) - rooms == set(), f"floors in {DOC.name} name rooms that do not exist"


def test_no_module_imports_from_a_floor_above_its_own():
    level = floors()
    up = {
        (module, target)
        for module, targets in imports().items()
        for target in targets
        if level[room_of(target)] > level[room_of(module)]
    }
    assert up - KNOWN_UP == set(), "new imports up a floor: move the concept down"
    assert KNOWN_UP - up == set(), "taken down: remove these from KNOWN_UP"


def test_no_import_cycle_between_modules():
    arrows = imports()

    def reach(start: str) -> set[str]:
        """Every module ``start`` imports, directly or through others."""
        seen: set[str] = set()
        stack = list(arrows[start])
        while stack:
            module = stack.pop()
            if module not in seen:
                seen.add(module)
                stack += arrows[module]
        return seen

    # A module on a cycle reaches itself (core.state and params_io did, issue 36).
    on_cycle = sorted(m for m in arrows if m in reach(m))
    assert on_cycle == [], f"modules on an import cycle: {on_cycle}"


@pytest.mark.parametrize("module", ["vmapcheck.core.state", "vmapcheck.core.forms"])
def test_core_reads_no_file_format(module):
    """core is pure JAX: the leaf naming it needs lives in core.state, params_io
    (safetensors) imports it from there."""
    assert not {m for m in imports()[module] if room_of(m) == "params_io"}


@pytest.mark.parametrize(
    "module",
    [
        "vmapcheck.cli",  # `vmapcheck --help` and the verbs that run no JAX
        "vmapcheck.tracking.review",  # `vmapcheck summary`
        "vmapcheck.report.summary",  # `vmapcheck summary`
        "vmapcheck.report.html",
        "vmapcheck.core.paths",  # the registry's facts
        "vmapcheck.pipeline.stage",  # every stage, code and track included
        "vmapcheck.pipeline.track",  # the track stage: MLflow and the reports, no JAX
        "vmapcheck.project.code",
    ],
)
def test_what_runs_no_jax_does_not_import_it(module):
    """Importing JAX costs 0.5-1.5 s on these machines: `vmapcheck summary` took 1.3-1.6 s
    with it and 0.4 s without (2026-12-06, 2 cores, load 7)."""
    import subprocess
    import sys

    probe = f"import sys, {module}; print('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", f"importing {module} loads JAX"
