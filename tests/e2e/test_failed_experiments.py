"""End to end: a failed run is an experiment, a typo is refused first, a failed stage
leaves what the user had (issue 43), in a temporary copy with real DVC, JAX and MLflow.

In file order, as a user would: a misspelled key (refused by the first stage, with the
key it was meant to be); a passing and a failing experiment (`dvc exp run`), both listed
by `dvc exp show` with the deciding figure, while `dvc repro` and `vmapcheck gate` exit
non-zero on the failing one; a track that cannot reach its tracking server (the last
report stays), then `git add -A` and `dvc repro` (no output taken into git); a key of the
user's own, which reruns no stage of vmapcheck's. Nothing is mocked.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.project import (
    FAST_RUN,
    ROOT,
    committed_project,
    compose_params,
    run,
    stages_run,
)

pytestmark = pytest.mark.e2e

TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]
# A tolerance of 0: float32 never equals the float64 oracle exactly, so the check fails
# whatever the machine.
ZERO_TOLERANCE = ["precision.tolerance.rtol=0", "precision.tolerance.atol=0"]


def _set(*overrides: str) -> list[str]:
    return [arg for override in (*TINY, *overrides) for arg in ("-S", override)]


def _said(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def _make_var(name: str) -> str:
    """A `NAME ?= value` of the Makefile, as make reads it (`$$` is `$`)."""
    found = re.search(rf"^{name} \?= (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, name
    return found.group(1).replace("$$", "$")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return committed_project(tmp_path_factory.mktemp("vmapcheck-failed") / "repo", *TINY)


def test_a_misspelled_key_is_refused_before_prepare_with_the_key_meant(project):
    result = run(project, "dvc", "exp", "run", *_set("+precision.tolerence.rtol=1e-5"), check=False)
    said = _said(result)
    assert result.returncode != 0, said
    assert (
        "  precision.tolerence: unknown key (found a mapping) (did you mean "
        "precision.tolerance?)" in said
    ), said
    assert "code: error: invalid configuration in" in said
    assert "Running stage 'prepare'" not in said


def test_a_failed_experiment_is_kept_beside_a_passing_one_and_repro_fails_on_it(project):
    passing = run(project, "dvc", "exp", "run", "-n", "passing-exp", *_set())
    assert "gate: the check PASSED; worst_bound_ratio " in passing.stdout, _said(passing)

    # The failing run: DVC keeps it (gate exits 0 inside `dvc exp run`, saying so).
    failing = run(project, "dvc", "exp", "run", "-n", "failing-exp", *_set(*ZERO_TOLERANCE))
    said = _said(failing)
    assert "track: the check FAILED (logged above)" in said
    [gate_line] = [line for line in said.splitlines() if line.startswith("gate: ")]
    assert gate_line.startswith("gate: the check FAILED (") and " finding(s)); " in gate_line
    assert "; worst_bound_ratio " in gate_line, gate_line
    assert "The failed run is kept as experiment failing-exp" in said

    # A job that ran `dvc exp run` goes red on it with `vmapcheck gate`.
    gate = run(project, sys.executable, "-m", "vmapcheck", "gate", check=False)
    assert gate.returncode == 1, _said(gate)
    assert gate.stdout.startswith("vmapcheck gate: the check FAILED")

    # Both listed, with the verdict and the deciding figure, in the columns `make exp`
    # keeps (its EXP_METRICS and EXP_PARAMS), the speed-up a number on each row.
    metrics, params = _make_var("EXP_METRICS"), _make_var("EXP_PARAMS")
    shown = run(
        project,
        "dvc",
        "exp",
        "show",
        "--csv",
        "--keep",
        f"^(Experiment|{metrics})$",
        "--drop",
        f"^(?!(Experiment|{metrics}|{params})$)",
    ).stdout
    rows = {row["Experiment"]: row for row in csv.DictReader(io.StringIO(shown))}
    assert {"passing-exp", "failing-exp"} <= set(rows), shown
    speed = [c for c in next(iter(rows.values())) if c.startswith("vmap_over_loop@b")]
    assert speed and "worst_bound_ratio" in rows["passing-exp"], shown
    assert rows["passing-exp"]["passed"] == "True" and rows["failing-exp"]["passed"] == "False"
    assert float(rows["passing-exp"]["worst_bound_ratio"]) <= 1
    assert float(rows["failing-exp"]["worst_bound_ratio"]) > 1
    # The batch is in a speed-up's name (report.headline): a row has its figure in the
    # column of its own headline batch (b0008 here), `-` (empty) in another's (main's
    # b0128): the ratios at two batch sizes are never one column.
    for name in ("passing-exp", "failing-exp"):
        own = [c for c in speed if rows[name][c]]
        assert own == ["vmap_over_loop@b0008"] and float(rows[name][own[0]]) > 0, shown

    # The workspace holds the failing run: a plain `dvc repro` (CI, make demo) is red.
    repro = run(project, "dvc", "repro", check=False)
    assert repro.returncode != 0, _said(repro)
    assert stages_run(_said(repro)) == set(), _said(repro)
    assert "gate: the check FAILED" in repro.stdout and "exiting non-zero" in repro.stdout


def test_a_failed_track_keeps_the_last_report_and_git_add_then_repro_works(project):
    report = project / "reports" / "report.html"
    before = report.read_bytes()
    # A tracking server that does not answer (nothing listens on port 9): track fails.
    compose_params(project, *TINY, "tracking=server", "tracking.tracking_uri=http://127.0.0.1:9")
    result = run(project, "dvc", "repro", check=False)
    said = _said(result)
    assert result.returncode != 0 and "track: error: " in said, said
    assert "Running stage 'track'" in said
    assert report.read_bytes() == before, "the last report was deleted or rewritten"

    # Every output of the failed run is ignored: `git add -A` takes none of them, and the
    # next `dvc repro` does not stop on "already tracked by SCM".
    run(project, "git", "add", "-A")
    staged = run(project, "git", "diff", "--cached", "--name-only").stdout.split()
    assert not [p for p in staged if p.startswith(("reports/code/", "reports/stages/", "data/"))]
    compose_params(project, *TINY)
    repro = run(project, "dvc", "repro", check=False)
    assert "already tracked by SCM" not in _said(repro)
    assert repro.returncode == 0, _said(repro)
    assert "gate: the check PASSED" in repro.stdout


def test_a_key_of_the_users_own_reruns_no_stage_of_vmapcheck(project):
    """`-S lr=0.3` of the project's own params: track depends on vmapcheck's keys only
    (it logged another MLflow run for it)."""
    compose_params(project, *TINY, "+project_keys=[lr]", "+lr=0.3")
    result = run(project, "dvc", "repro")
    assert stages_run(_said(result)) == set(), _said(result)
    assert re.search(r"^code: vmapcheck \S+; no change$", result.stdout, re.M), result.stdout
