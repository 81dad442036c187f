"""pyproject.toml declares every third-party package src/ imports, pinned exactly, and
requirements.lock pins each declared package at the same version."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.helpers.config import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
_PIN = re.compile(r"([A-Za-z0-9_.-]+)==(\S+)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines: list[str], where: str) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = _PIN.fullmatch(line.split("#")[0].strip())
        assert match, f"{where}: expected an exact pin name==version, found {line!r}"
        pins[_canonical(match[1])] = match[2]
    return pins


def _declared() -> dict[str, str]:
    """Runtime dependencies and the optional extras (flax, equinox examples)."""
    lines = list(PYPROJECT["dependencies"])
    for extra, deps in PYPROJECT["optional-dependencies"].items():
        if extra != "dev":
            lines += deps
    return _pins(lines, "pyproject.toml [project] dependencies")


def _imported_top_level_modules() -> set[str]:
    names = set()
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"vmapcheck", "__future__"}


def test_every_third_party_import_of_src_is_declared():
    declared = _declared()
    distributions = packages_distributions()
    for module in sorted(_imported_top_level_modules()):
        owners = {_canonical(d) for d in distributions.get(module, [])}
        assert owners, f"src imports {module!r}, which no installed distribution provides"
        assert owners & set(declared), (
            f"pyproject.toml: src imports {module!r} (from {sorted(owners)}); expected it among "
            "[project] dependencies or an extra, found it in neither"
        )


def test_the_lock_pins_every_declared_package_at_its_declared_version():
    lock_lines = [
        line
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    ]
    lock = _pins(lock_lines, "requirements.lock")
    for name, version in _declared().items():
        assert name in lock, f"requirements.lock: expected a pin for {name}, found none"
        assert lock[name] == version, (
            f"requirements.lock: {name}: expected {version} as in pyproject.toml, "
            f"found {lock[name]}"
        )
