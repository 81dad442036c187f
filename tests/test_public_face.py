"""The package's public face (issue 47): every package's ``__init__`` names what other
floors and users are meant to import in ``__all__``, a module named ``_x`` is its
package's own, and importing a package loads no JAX where its modules are not imported.

Read from the source with ``ast`` (``tests/test_layers.py``'s import graph), except where
the question is what an import does.
"""

from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys

import pytest

from tests.test_layers import PACKAGE, module_of
from tests.test_layers import imports as _imports

PACKAGES = sorted(module_of(p) for p in PACKAGE.rglob("__init__.py"))
# Packages whose __init__ re-exports names from modules that import JAX: importing the
# package loads it (the diagnosis is only run where JAX is, by check and `vmapcheck
# diagnose`).
LOADS_JAX = {"vmapcheck.check.diagnosis"}


@functools.cache
def imports() -> dict[str, set[str]]:
    """Module -> the vmapcheck modules it imports, parsed once for every test here."""
    return _imports()


def declared_all(package: str) -> list[str] | None:
    """The package's ``__all__`` as its ``__init__`` writes it (a literal list), or None."""
    path = PACKAGE.parent / package.replace(".", "/") / "__init__.py"
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            value = ast.literal_eval(node.value)  # [*_EXPORTS] of the top level is no literal
            return list(value)
    return None


def submodules(package: str) -> set[str]:
    """The modules and packages directly in ``package``, by their last name."""
    return {m.rsplit(".", 1)[1] for m in imports() if "." in m and m.rsplit(".", 1)[0] == package}


def test_every_package_declares_its_public_names():
    missing = []
    for package in PACKAGES:
        try:
            found = declared_all(package)
        except ValueError:  # a computed __all__ (the top level's): resolved below
            found = list(importlib.import_module(package).__all__)
        if found is None:
            missing.append(package)
    assert missing == [], "packages with no __all__ in their __init__"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_there(package):
    """Each name of ``__all__`` is a module of the package or a name its ``__init__``
    provides (the top level's lazily): a name left after a rename fails here."""
    module = importlib.import_module(package)
    gone = [
        name
        for name in module.__all__
        if name not in submodules(package) and not hasattr(module, name)
    ]
    assert gone == [], f"{package}.__all__ names what it does not have"
    assert not [n for n in module.__all__ if n.startswith("_") and n != "__version__"]


def test_a_module_another_package_imports_is_public():
    """Where a package's ``__all__`` lists its modules, every module of it that a module
    outside the package imports is listed, and never one named ``_x``. (A package that
    lists names, such as ``vmapcheck.config``, re-exports them from its ``__init__``.)"""
    unlisted = []
    for module, targets in imports().items():
        for target in targets:
            package, _, name = target.rpartition(".")
            if package not in PACKAGES or module == package or module.startswith(package + "."):
                continue
            listed = declared_all(package) if package != "vmapcheck" else None
            if listed is not None and set(listed) <= submodules(package) and name not in listed:
                unlisted.append(f"{module} imports {target}")
    assert unlisted == [], "add the module to its package's __all__, or import it no more"


def test_a_private_module_is_imported_only_by_its_own_package():
    private = {m for m in imports() if m.rsplit(".", 1)[-1].startswith("_") and "__" not in m}
    assert private, "expected the private modules (testing._run, ...) to exist"
    outside = sorted(
        f"{module} imports {target}"
        for module, targets in imports().items()
        for target in targets & private
        if not module.startswith(target.rsplit(".", 1)[0] + ".")
        and module != target.rsplit(".", 1)[0]
    )
    assert outside == [], "a module named _x is its package's own: rename it, or import it not"


@pytest.mark.parametrize("package", sorted(set(PACKAGES) - LOADS_JAX))
def test_importing_a_package_loads_no_jax(package):
    """``__init__`` stays light: a package lists its modules rather than re-exporting
    names of modules that import JAX (``vmapcheck summary`` and the track stage import
    packages without JAX)."""
    probe = f"import sys, {package}; print('jax' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False", f"importing {package} loads JAX"
