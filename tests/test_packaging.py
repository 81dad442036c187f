"""pyproject.toml declares every third-party package src/ imports, each with a version
range (a tested lower bound and an upper one), and requirements.lock pins each declared
package at a version inside its range."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

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


def _declared(dev: bool = False) -> dict[str, SpecifierSet]:
    """Runtime dependencies and the optional extras (flax, equinox examples; dev too when
    asked), each with its range."""
    lines = list(PYPROJECT["dependencies"])
    for extra, deps in PYPROJECT["optional-dependencies"].items():
        if dev or extra != "dev":
            lines += deps
    return {_canonical(r.name): r.specifier for r in map(Requirement, lines)}


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


def test_every_declared_package_has_a_lower_and_an_upper_bound():
    for name, specifier in _declared(dev=True).items():
        operators = {s.operator for s in specifier}
        assert operators == {">=", "<"}, (
            f"pyproject.toml: {name}: expected a range '>=tested,<untested', found "
            f"{str(specifier) or 'none'}"
        )


def test_the_lock_pins_every_declared_package_inside_its_range():
    lock_lines = [
        line
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "-"))
    ]
    lock = _pins(lock_lines, "requirements.lock")
    for name, specifier in _declared(dev=True).items():
        assert name in lock, f"requirements.lock: expected a pin for {name}, found none"
        assert specifier.contains(lock[name], prereleases=True), (
            f"requirements.lock: {name}: expected a version in pyproject.toml's range "
            f"{specifier}, found {lock[name]}"
        )


def _extra(name: str) -> dict[str, SpecifierSet]:
    return {
        _canonical(r.name): r.specifier
        for r in map(Requirement, PYPROJECT["optional-dependencies"][name])
    }


def test_the_pytest_extra_brings_the_pytest_range_the_tests_pass_with():
    """vmapcheck[pytest]: the batching_check fixture's pytest, the very range the project's
    own tests run under (the dev extra; requirements.lock pins one inside it)."""
    assert _extra("pytest") == {"pytest": _extra("dev")["pytest"]}, (
        "pyproject.toml: expected the pytest extra to hold exactly the dev extra's pytest "
        f"range {_extra('dev')['pytest']}, found {PYPROJECT['optional-dependencies']['pytest']}"
    )


def test_the_installed_metadata_offers_the_extras_and_registers_the_plugin():
    """What pip reads from the wheel (here the editable install's metadata, rewritten by
    make setup whenever pyproject.toml changes): the extras docs/python-api.md and
    docs/keras.md name, and the pytest11 entry point that loads the fixture."""
    from importlib.metadata import entry_points, metadata

    meta = metadata("vmapcheck")
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"pytest", "keras"} <= extras, f"expected extras pytest and keras, found {extras}"
    requires = [Requirement(line) for line in meta.get_all("Requires-Dist") or []]
    pytest_req = [
        r
        for r in requires
        if r.name == "pytest" and r.marker and r.marker.evaluate({"extra": "pytest"})
    ]
    assert pytest_req and not pytest_req[0].marker.evaluate({"extra": ""}), (
        f"expected pytest required by the pytest extra only, found {pytest_req}"
    )
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("vmapcheck") == "vmapcheck.pytest_plugin", plugins


def test_the_plugin_imported_without_pytest_names_the_extra():
    """The pytest11 entry point loads the plugin only inside pytest; a direct import where
    pytest is missing (here made unimportable: None in sys.modules) names the fix."""
    import subprocess

    code = "import sys; sys.modules['pytest'] = None; import vmapcheck.pytest_plugin"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: vmapcheck.pytest_plugin (the batching_check"), last
    assert "pip install 'vmapcheck[pytest]'" in last, last
