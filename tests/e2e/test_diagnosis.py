"""End to end: a fault planted in the project makes `dvc repro` fail the check, and the
diagnosis written by the check stage names the stage, layer and path, and is logged
with the failing MLflow run. Nothing is mocked: DVC, Hydra, JAX and MLflow run for real
in a temporary copy of the repository."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.project import FAST_RUN, committed_project, planted, run

pytestmark = pytest.mark.e2e

TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]
# The hand-batched MLP's hidden layers; the plant computes layers[1] in bfloat16.
HIDDEN_LINE = (
    '        hidden = tap(f"layers[{i}]", jax.nn.relu(hidden @ layer["W"] + layer["b"][None, :]))'
)
BF16_LAYER = """        w = layer["W"].astype(jnp.bfloat16) if i == 1 else layer["W"]
        pre = (hidden.astype(w.dtype) @ w).astype(hidden.dtype)
        hidden = tap(f"layers[{i}]", jax.nn.relu(pre + layer["b"][None, :]))"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return committed_project(tmp_path_factory.mktemp("vmapcheck") / "repo", *TINY)


def _json(project: Path, name: str) -> dict:
    return json.loads((project / "reports" / name).read_text())


def test_a_planted_fault_is_diagnosed_and_logged_with_the_failing_run(project):
    from mlflow.tracking import MlflowClient

    with planted(project / "src" / "vmapcheck" / "core" / "models.py", HIDDEN_LINE, BF16_LAYER):
        result = run(project, "dvc", "repro", check=False)
    assert result.returncode != 0
    assert "check: diagnosis" in result.stdout, result.stdout + result.stderr
    diagnosis = _json(project, "diagnosis.json")
    first = diagnosis["first_divergence"]
    assert (first["stage"], first["layer"], first["paths"]) == (
        "forward",
        "layers[1]",
        ["direct_eager"],
    ), diagnosis["summary"]
    assert [s["stage"] for s in diagnosis["ruled_out"]] == ["data", "key_stream", "shapes"]
    assert diagnosis["trigger"].startswith("the check failed")
    text = (project / "reports" / "diagnosis.txt").read_text()
    assert "FIRST DIVERGENCE: stage forward, layer layers[1]" in text

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    track = _json(project, "track.json")
    assert track["verdict"] == "failed"
    run_ = client.get_run(track["run_id"])
    assert run_.data.tags["diagnosis.stage"] == "forward"
    assert run_.data.tags["diagnosis.layer"] == "layers[1]"
    assert run_.data.tags["diagnosis.paths"] == "direct_eager"
    artifacts = {a.path for a in client.list_artifacts(track["run_id"])}
    assert {"diagnosis.json", "diagnosis.txt"} <= artifacts

    # The fault removed: the check passes and the diagnosis says it was not needed.
    run(project, "dvc", "repro")
    assert _json(project, "diagnosis.json")["status"] == "not needed"
    healthy = client.get_run(_json(project, "track.json")["run_id"])
    assert healthy.data.tags["diagnosis.status"] == "not needed"

    # On demand (make diagnose): the whole protocol on the current outputs, all ruled out.
    demand = run(project, sys.executable, "-m", "vmapcheck", "diagnose", check=False)
    assert demand.returncode == 0, demand.stdout + demand.stderr
    report = _json(project, "diagnosis-on-demand.json")
    assert report["status"] == "no divergence found", report["summary"]
    assert report["trigger"] == "on demand (the last check PASSED)"
    assert "reference" not in report["not_reached"]
