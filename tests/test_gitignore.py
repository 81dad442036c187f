"""Raw inputs stay out of git: a user's table put in data/raw/ (as the docs say) is ignored,
so neither a commit nor `dvc exp run` (which commits untracked files into its experiment
refs) can carry it; the tracked README and synthetic example still keep data/raw/, a dep
of the prepare stage, in every clone."""

import shutil
import subprocess

import pytest
import yaml

from tests.helpers.config import PACKAGE_CONF, ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout of the project",
)


def _ignored(path: str) -> bool:
    """Whether .gitignore ignores ``path`` (--no-index: whether or not it is tracked)."""
    result = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True
    )
    assert result.returncode in (0, 1), result.stderr.decode()
    return result.returncode == 0


@pytest.mark.parametrize(
    "path",
    ["data/raw/customers.csv", "data/raw/yours.csv", "data/raw/2026/export.parquet"],
)
def test_a_users_own_table_in_data_raw_is_ignored(path):
    assert _ignored(path), f".gitignore: expected {path} to be ignored, found it is not"


def test_the_readme_and_the_synthetic_example_stay_tracked():
    tracked = subprocess.run(
        ["git", "ls-files", "data/raw"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked == ["data/raw/README.md", "data/raw/example.csv"]
    for path in tracked:
        assert not _ignored(path), f".gitignore: expected {path} not ignored, found it is"
    # What the prepare stage and data=csv rely on.
    assert (
        "data/raw" in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["prepare"]["deps"]
    )
    csv = yaml.safe_load((PACKAGE_CONF / "data" / "csv.yaml").read_text())
    assert csv["path"] in tracked
