"""The options the installed vmapcheck ships for a config group, and the form of a name
``vmapcheck init`` gives a model or a table (:mod:`vmapcheck.project.options`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmapcheck.project.options import OPTION_NAME, shipped_options

CONF = Path(__file__).resolve().parents[1] / "src" / "vmapcheck" / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and any(p.glob("*.yaml")))


@pytest.mark.parametrize("group", GROUPS)
def test_the_shipped_options_are_the_groups_files_sorted(group):
    options = shipped_options(group)
    assert options == sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert options, f"conf/{group}/ ships no option"


@pytest.mark.parametrize("name", ["mlp", "my_model", "Table-2", "a"])
def test_a_name_of_letters_digits_dash_and_underscore_is_an_option_name(name):
    assert OPTION_NAME.match(name)


# A name starts a file name, a folder and an MLflow run: no path, space or dot in it.
@pytest.mark.parametrize("name", ["", "2mlp", "_mlp", "my model", "a/b", "a.yaml", "../x"])
def test_other_names_are_not(name):
    assert not OPTION_NAME.match(name)
