"""The nightly workflow (.github/workflows/scheduled.yml): it fits GitHub's workflow
schema, and it has the shape docs/scheduled-ci.md promises (nightly + manual, pinned and
newest JAX, runs `dvc repro`, logs to the MLflow server named by a secret, uploads
reports even on failure). The CI workflow (ci.yml) fits the schema too and runs lint and
the unit tests on every push and pull request.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S

WORKFLOW = ROOT / ".github" / "workflows" / "scheduled.yml"
CI_WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
# Installed into the venv by the dev extra, next to the interpreter.
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def job(workflow: dict[Any, Any]) -> dict[str, Any]:
    jobs = workflow["jobs"]
    assert len(jobs) == 1, f"expected one job, found {sorted(jobs)}"
    return next(iter(jobs.values()))


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job["steps"]


@pytest.mark.parametrize("path", [WORKFLOW, CI_WORKFLOW], ids=lambda p: p.name)
def test_workflow_validates_against_the_github_workflow_schema(path: Path) -> None:
    # check-jsonschema ships SchemaStore's GitHub workflow schema: no network needed.
    result = subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"check-jsonschema exited {result.returncode}:\n{output}"


def test_runs_nightly_and_on_demand(workflow: dict[Any, Any]) -> None:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    triggers = workflow.get("on", workflow.get(True))
    assert isinstance(triggers, dict), f"no `on:` triggers in {WORKFLOW.name}"
    assert "workflow_dispatch" in triggers
    crons = [entry["cron"] for entry in triggers["schedule"]]
    assert crons, "schedule has no cron"
    for cron in crons:
        assert len(cron.split()) == 5, f"cron {cron!r} should have 5 fields"


def test_matrix_has_pinned_and_newest_jax_and_does_not_fail_fast(job: dict[str, Any]) -> None:
    strategy = job["strategy"]
    assert strategy["fail-fast"] is False
    legs = strategy["matrix"]["jax"]
    assert set(legs) == {"pinned", "newest"}
    upgrades = [s for s in _steps(job) if "pip install --upgrade jax jaxlib" in s.get("run", "")]
    assert len(upgrades) == 1, "exactly one step should upgrade jax/jaxlib"
    assert upgrades[0].get("if") == "matrix.jax == 'newest'"


def test_sets_up_python_312_from_the_lock(job: dict[str, Any]) -> None:
    setup = [s for s in _steps(job) if s.get("uses", "").startswith("actions/setup-python@")]
    assert len(setup) == 1
    assert str(setup[0]["with"]["python-version"]) == "3.12"
    assert setup[0]["with"]["cache-dependency-path"] == "requirements.lock"
    assert any(s.get("run", "").strip() == "make setup" for s in _steps(job))


def test_runs_dvc_repro_logging_to_the_mlflow_secret(
    workflow: dict[Any, Any], job: dict[str, Any]
) -> None:
    repro = [s for s in _steps(job) if "dvc repro" in s.get("run", "")]
    assert len(repro) == 1, "exactly one step should run dvc repro"
    step = repro[0]
    # A failed check makes dvc repro exit non-zero: the step must not swallow it.
    assert "continue-on-error" not in step
    assert "|| true" not in step["run"]
    env = {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}
    assert env["MLFLOW_TRACKING_URI"].replace(" ", "") == "${{secrets.MLFLOW_TRACKING_URI}}"
    assert str(env["DVC_NO_ANALYTICS"]) == "1"


def test_uploads_reports_even_when_the_pipeline_fails(job: dict[str, Any]) -> None:
    steps = _steps(job)
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(uploads) == 1
    upload = uploads[0]
    assert upload.get("if") == "always()", "upload reports with if: always()"
    assert upload["with"]["path"].rstrip("/") == "reports"
    # One artifact per matrix leg: names must be unique within a run.
    assert "matrix.jax" in upload["with"]["name"]
    repro_index = next(i for i, s in enumerate(steps) if "dvc repro" in s.get("run", ""))
    assert steps.index(upload) > repro_index


def test_is_bounded_and_read_only(workflow: dict[Any, Any], job: dict[str, Any]) -> None:
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["concurrency"]["group"]
    assert 0 < job["timeout-minutes"] <= 120


def test_ci_runs_lint_and_unit_tests_on_every_push_and_pull_request() -> None:
    ci = yaml.safe_load(CI_WORKFLOW.read_text())
    triggers = ci.get("on", ci.get(True))
    assert isinstance(triggers, dict), f"no `on:` triggers in {CI_WORKFLOW.name}"
    assert {"push", "pull_request"} <= set(triggers)
    # No branch or path filter: every push and every pull request runs it.
    for event in ("push", "pull_request"):
        assert not triggers[event], f"{CI_WORKFLOW.name}: on.{event}: expected no filter"
    assert ci["permissions"] == {"contents": "read"}
    ci_job = ci["jobs"]["test-fast"]
    assert 0 < ci_job["timeout-minutes"] <= 120
    steps = ci_job["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    setup = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert len(setup) == 1 and str(setup[0]["with"]["python-version"]) == "3.12"
    assert setup[0]["with"]["cache-dependency-path"] == "requirements.lock"
    runs = [s.get("run", "").strip() for s in steps]
    assert runs.index("make setup") < runs.index("make test-fast")
    # The wheel in a user's own repository (tests/e2e/test_own_repository.py).
    wheel_runs = [s.get("run", "").strip() for s in ci["jobs"]["wheel"]["steps"]]
    assert wheel_runs.index("make setup") < wheel_runs.index("make test-wheel")
