"""The jax/jaxlib ranges vmapcheck supports (vmapcheck.versions): read from the installed
vmapcheck's metadata, the same as pyproject.toml's; versions judged against them; an
out-of-range one refused, named, by the stages, the command line and the Python API.

No JAX import is faked: the check is run on given version strings, and on the jax and
jaxlib really installed here.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import jax
import jaxlib
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S
from vmapcheck import cli, testing, versions
from vmapcheck.errors import UnsupportedVersionError, VmapcheckError

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
RANGE = SpecifierSet(">=0.10.2,<0.13")
RANGES = {"jax": RANGE, "jaxlib": RANGE}
# A range that no real jax satisfies, to see each caller refuse the one installed here.
NOWHERE = {"jax": SpecifierSet("<0.0.1")}


def _declared(name: str) -> SpecifierSet:
    (requirement,) = [
        r for r in map(Requirement, PROJECT["dependencies"]) if r.name == name and not r.marker
    ]
    return requirement.specifier


# --- the ranges: one place, pyproject.toml, read back from the installed metadata --------


def test_the_ranges_are_pyprojects_as_the_installed_metadata_has_them():
    # A stale editable install (pyproject.toml changed since) fails here: `make setup`.
    assert versions.supported_ranges() == {name: _declared(name) for name in versions.CHECKED}


def test_the_ranges_admit_the_python_311_jax_and_the_tested_012():
    for name in versions.CHECKED:
        declared = _declared(name)
        assert all(v in declared for v in ("0.10.2", "0.11.2", "0.12.0.1", "0.12.1")), name
        assert not any(v in declared for v in ("0.10.1", "0.13.0")), name


def test_the_stage_gates_python_floor_is_requires_python():
    floor = ".".join(map(str, versions.MIN_PYTHON))
    assert SpecifierSet(PROJECT["requires-python"]) == SpecifierSet(f">={floor}")
    assert sys.version_info >= versions.MIN_PYTHON


# --- judging given versions --------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.10.2", "0.11.2", "0.12.0.1", "0.12.1", "0.12.2.dev1"])
def test_a_version_in_range_passes(version):
    assert versions.out_of_range({"jax": version, "jaxlib": version}, RANGES) is None
    versions.check_versions({"jax": version, "jaxlib": version}, RANGES)


def test_an_older_jax_is_refused_with_its_version_the_range_and_the_fix():
    with pytest.raises(UnsupportedVersionError) as caught:
        versions.check_versions({"jax": "0.9.0", "jaxlib": "0.10.2"}, RANGES)
    message = str(caught.value)
    assert isinstance(caught.value, VmapcheckError)
    assert message.startswith(
        "jax 0.9.0 is outside the range vmapcheck supports (>=0.10.2,<0.13): install one "
        "in range, e.g. pip install 'jax>=0.10.2,<0.13'"
    ), message
    assert "jaxlib" not in message and versions.ALLOW_UNTESTED in message


@pytest.mark.parametrize("version", ["0.13.0", "0.13.0rc1", "1.0", "0.10.1"])
def test_a_version_outside_either_end_is_refused(version):
    message = versions.out_of_range({"jax": version}, RANGES)
    assert message is not None and f"jax {version} is outside" in message


def test_both_outside_are_both_named_with_one_install_line():
    message = versions.out_of_range({"jax": "0.13.1", "jaxlib": "0.13.1"}, RANGES)
    assert message == (
        "jax 0.13.1 is outside the range vmapcheck supports (>=0.10.2,<0.13); jaxlib 0.13.1 "
        "is outside the range vmapcheck supports (>=0.10.2,<0.13): install them in range, "
        "e.g. pip install 'jax>=0.10.2,<0.13' 'jaxlib>=0.10.2,<0.13'"
    )


def test_a_missing_or_unparsable_version_is_refused_and_an_unranged_name_is_not_checked():
    assert "jax is not installed (vmapcheck supports >=0.10.2,<0.13)" in (
        versions.out_of_range({"jax": None}, RANGES) or ""
    )
    assert "jax not-a-version is outside" in (
        versions.out_of_range({"jax": "not-a-version"}, RANGES) or ""
    )
    assert versions.out_of_range({"numpy": "0.1"}, RANGES) is None
    # Nothing to check against (vmapcheck not installed as a distribution): passes.
    assert versions.out_of_range({"jax": "0.1"}, {}) is None


def test_a_range_reads_lower_bound_first():
    assert versions.range_text(SpecifierSet("<0.13,>=0.10.2")) == ">=0.10.2,<0.13"


# --- the jax and jaxlib installed here ---------------------------------------------------


def test_the_installed_jax_and_jaxlib_are_read_without_importing_and_pass():
    installed = versions.installed_versions()
    assert installed == {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    assert versions.out_of_range(installed, versions.supported_ranges()) is None
    versions.require_supported_jax()


def test_an_untested_jax_runs_with_a_warning_when_allowed(monkeypatch):
    monkeypatch.setattr(versions, "supported_ranges", lambda: NOWHERE)
    with pytest.raises(UnsupportedVersionError, match=f"jax {jax.__version__} is outside"):
        versions.require_supported_jax()
    monkeypatch.setenv(versions.ALLOW_UNTESTED, "1")
    with pytest.warns(UserWarning, match=f"jax {jax.__version__} is outside.*running it untested"):
        versions.require_supported_jax()


# --- each entry point refuses it before JAX work starts -----------------------------------


def test_the_python_api_refuses_it_first(monkeypatch):
    monkeypatch.setattr(versions, "supported_ranges", lambda: NOWHERE)
    with pytest.raises(UnsupportedVersionError, match=f"jax {jax.__version__} is outside"):
        testing.assert_batching_consistent(None, None, None)  # refused before the model


def test_a_command_refuses_it_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(versions, "supported_ranges", lambda: NOWHERE)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["store", "where"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"store: error: jax {jax.__version__} is outside the range"), err


def test_a_stage_refuses_it_before_importing_jax():
    code = (
        "import atexit, sys, vmapcheck.versions as v; "
        "from packaging.specifiers import SpecifierSet; "
        "atexit.register(lambda: print('jax imported:', 'jax' in sys.modules)); "
        "v.supported_ranges = lambda: {'jax': SpecifierSet('<0.0.1')}; "
        "import vmapcheck.stages.prepare"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"vmapcheck stage: error: jax {jax.__version__} is outside")
    assert "Traceback" not in done.stderr and done.stdout == "jax imported: False\n"
