"""prepare refuses a raw table that git carries or would carry (vmapcheck.data.git_guard).

Each test builds a real git repository in a temporary folder with the project's own
.gitignore, so the rules tested are the shipped ones."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.config import ROOT
from vmapcheck.data.git_guard import SHIPPED_EXAMPLES, refuse_if_git_would_carry
from vmapcheck.errors import SourceError

ROW = "id,email\n1,planted-person@example.invalid\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "data" / "raw").mkdir(parents=True)
    shutil.copy(ROOT / "data" / "raw" / "example.csv", tmp_path / "data" / "raw" / "example.csv")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "init")
    return tmp_path


def test_the_shipped_example_is_allowed_and_its_hash_is_current(repo):
    refuse_if_git_would_carry(repo / "data" / "raw" / "example.csv", repo)
    # The hash in the code is the committed file's (a stale one would refuse the demo's data).
    digest = hashlib.sha256((ROOT / "data" / "raw" / "example.csv").read_bytes()).hexdigest()
    assert SHIPPED_EXAMPLES["data/raw/example.csv"] == digest


def test_a_users_table_in_data_raw_is_ignored_so_allowed(repo):
    table = repo / "data" / "raw" / "customers.csv"
    table.write_text(ROW)
    refuse_if_git_would_carry(table, repo)


def test_a_table_outside_the_repository_is_allowed(repo, tmp_path_factory):
    table = tmp_path_factory.mktemp("elsewhere") / "customers.csv"
    table.write_text(ROW)
    refuse_if_git_would_carry(table, repo)


def test_an_unignored_table_in_the_repository_is_refused_with_the_fix(repo):
    table = repo / "data" / "customers.csv"
    table.write_text(ROW)
    with pytest.raises(SourceError) as err:
        refuse_if_git_would_carry(table, repo)
    message = str(err.value)
    assert "data.path: data/customers.csv is inside the repository and not ignored" in message
    assert "dvc exp run" in message and ".gitignore" in message
    assert "planted-person" not in message


def test_a_tracked_table_is_refused_even_under_data_raw(repo):
    table = repo / "data" / "raw" / "customers.csv"
    table.write_text(ROW)
    _git(repo, "add", "-f", "data/raw/customers.csv")
    with pytest.raises(SourceError, match=r"data/raw/customers\.csv is tracked by git"):
        refuse_if_git_would_carry(table, repo)


def test_rows_written_over_the_shipped_example_are_refused(repo):
    example = repo / "data" / "raw" / "example.csv"
    example.write_text(ROW)
    with pytest.raises(SourceError, match=r"git rm --cached data/raw/example\.csv"):
        refuse_if_git_would_carry(example, repo)


def test_no_git_work_tree_means_nothing_to_check(tmp_path):
    table = tmp_path / "customers.csv"
    table.write_text(ROW)
    refuse_if_git_would_carry(table, tmp_path)
