"""benchmarks/version_table.py's pure parts: the rows, the pip list reading, the table.

Creating the venvs and installing into them is the script's job (minutes, PyPI), not CI's.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "version_table.py"


@pytest.fixture(scope="module")
def vt():
    spec = importlib.util.spec_from_file_location("version_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_rows_parse_in_the_order_given(vt):
    assert [r.key for r in vt.parse_rows(None)] == ["1", "2", "3", "4"]
    assert [r.key for r in vt.parse_rows("")] == ["1", "2", "3", "4"]
    assert [r.key for r in vt.parse_rows("3,1")] == ["3", "1"]
    assert [r.key for r in vt.parse_rows("2 4,2")] == ["2", "4"]
    with pytest.raises(ValueError, match=r"unknown row\(s\) 7: expected some of 1, 2, 3, 4"):
        vt.parse_rows("1,7")


def test_the_rows_are_the_issues_stacks(vt):
    assert vt.ROWS["1"].python == "3.11" and "jax==0.10.2" in vt.ROWS["1"].before
    assert vt.ROWS["3"].before == ("jax==0.12.0.1", "jaxlib==0.12.0.1")
    # mlflow alone: jax is whatever pip picks.
    assert vt.ROWS["4"].before == ("mlflow==3.16.1",)


def test_the_newest_python_of_a_minor_is_found(vt, tmp_path):
    for version in ("3.12.1", "3.12.10", "3.11.7"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "python").touch()
    assert vt.find_python("3.12", str(tmp_path)) == f"{tmp_path}/3.12.10/bin/python"
    with pytest.raises(FileNotFoundError, match=r"no Python 3\.13"):
        vt.find_python("3.13", str(tmp_path))


def test_pip_list_is_read_by_normalized_name(vt):
    listed = json.dumps(
        [{"name": "jax", "version": "0.10.2"}, {"name": "MLflow", "version": "3.17.2"}]
    )
    assert vt.pip_versions(listed, ("jax", "mlflow", "dvc")) == {
        "jax": "0.10.2",
        "mlflow": "3.17.2",
        "dvc": None,
    }


def test_a_cell_says_kept_added_or_moved(vt):
    assert vt.change("0.10.2", "0.10.2") == "0.10.2 kept"
    assert vt.change(None, "3.17.2") == "- -> 3.17.2"
    assert vt.change("0.9.2", "0.12.1") == "0.9.2 -> 0.12.1"
    assert vt.change(None, None) == "-"


def test_the_table_has_one_line_a_row(vt):
    step = {"wall_s": 61.4, "cpu_s": 30.2}
    result = {
        "rows": [
            {
                "key": "1",
                "python": "/x/python",
                "python_version": "3.11.7",
                "before": {"jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6"},
                "after": {"jax": "0.10.2", "jaxlib": "0.10.2", "mlflow": "3.17.2"},
                "check": {"good": {"passed": True}, "planted": {"raised": True}},
                "steps": {"install_wheel": step, "check": {"wall_s": 9.0, "cpu_s": 12.0}},
                "load_before": [2.04, 1.5, 1.25],
            },
            {"key": "4", "python": "/y/python", "error": "venv failed (rc 2)", "steps": {}},
        ]
    }
    lines = vt.markdown_table(result).splitlines()
    assert len(lines) == 4
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert lines[2] == (
        "| 1 | 3.11.7 | 0.10.2 kept | 0.10.2 kept | - -> 3.17.2 | - | 2.4.6 -> - "
        "| passes / raises | 61 / 30 | 9 / 12 | 2.0 1.5 1.2 |"
    )
    assert "venv failed (rc 2)" in lines[3]


def test_the_json_is_written_whole(vt, tmp_path):
    out = tmp_path / "sub" / "table.json"
    vt.write_json(out, {"rows": []})
    assert json.loads(out.read_text()) == {"rows": []}


def test_what_pip_kept_and_installed_is_read_from_its_output(vt):
    output = (
        "Processing /tmp/w/vmapcheck-0.1.0-py3-none-any.whl\n"
        "Requirement already satisfied: jax<0.13,>=0.10.2 in ./row1/lib/python3.11/"
        "site-packages (from vmapcheck==0.1.0) (0.10.2)\n"
        "Requirement already satisfied: six>=1.5 in ./row1/lib (from x) (1.17.0)\n"
        "Successfully installed dvc-3.67.1 mlflow-3.17.2 vmapcheck-0.1.0\n"
    )
    assert vt.install_summary(output) == {
        "already_satisfied": ["jax<0.13,>=0.10.2"],
        "installed": ["dvc-3.67.1", "mlflow-3.17.2", "vmapcheck-0.1.0"],
    }
