"""End to end: verified params in the MLflow Model Registry, with the real pipeline.

Two passing `dvc repro` runs register versions 1 and 2 (`verified` -> 2); a failing run
registers nothing and leaves the alias; the rollback verb moves `verified` back to 1;
then `train.params_source=models:/vmapcheck-mlp@verified` feeds version 1's params,
checked again, through the whole pipeline; last, `dvc exp run -S precision=f64` passes
off the deployment target and leaves `verified` where it was, until `vmapcheck promote`.
Nothing is mocked.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from tests.helpers.project import (
    FAST_RUN,
    MISSING_OUTPUT_BIAS,
    commit_all,
    committed_project,
    compose_params,
    planted,
    run,
)

pytestmark = pytest.mark.e2e

NAME = "vmapcheck-mlp"
TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]


def client(project: Path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{project / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def verified(project: Path) -> str:
    return str(client(project).get_model_version_by_alias(NAME, "verified").version)


def track(project: Path) -> dict:
    return json.loads((project / "reports" / "track.json").read_text())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return committed_project(tmp_path_factory.mktemp("vmapcheck-registry") / "repo", *TINY)


def test_two_passing_runs_then_a_failing_one_then_rollback(project):
    run(project, "dvc", "repro")
    first = track(project)
    assert first["registry"]["status"] == "registered" and first["registry"]["version"] == "1"
    assert verified(project) == "1"

    # Other params (a learning rate), committed: the second passing run registers them.
    compose_params(project, *TINY, "train.learning_rate=0.02")
    commit_all(project, "second run")
    result = run(project, "dvc", "repro")
    assert f"track: registry: params registered as models:/{NAME}/2" in result.stdout
    second = track(project)
    assert (second["registry"]["version"], second["registry"]["previous"]) == ("2", "1")
    assert verified(project) == "2"
    v1, v2 = (client(project).get_model_version(NAME, v) for v in ("1", "2"))
    assert v1.tags["params_sha256"] != v2.tags["params_sha256"]
    assert v2.tags["verified_by_run"] == second["run_id"] == v2.run_id
    assert v2.tags["git_commit"] == second["git_commit"] != v1.tags["git_commit"]

    # A planted fault (the hand-batched path drops the output bias): logged, not registered.
    with planted(project / "src" / "vmapcheck" / "core" / "models.py", *MISSING_OUTPUT_BIAS):
        result = run(project, "dvc", "repro", check=False)
    assert result.returncode != 0 and "track: the check FAILED" in result.stdout
    failed = track(project)
    assert failed["verdict"] == "failed"
    assert failed["registry"]["status"] == "not registered"
    assert len(client(project).search_model_versions(f"name = '{NAME}'")) == 2
    assert verified(project) == "2"  # the failing run never moves the alias

    result = run(project, sys.executable, "-m", "vmapcheck", "rollback")
    assert f"models:/{NAME}@verified moved from version 2" in result.stdout
    assert f"to version 1 (run {first['run_id']}" in result.stdout
    assert verified(project) == "1"
    shown = run(project, sys.executable, "-m", "vmapcheck", "registry").stdout
    assert "version 1 @verified" in shown and "(rolled back from)" in shown


def test_params_load_by_alias_and_are_checked_again_through_the_pipeline(project):
    """After the rollback: models:/vmapcheck-mlp@verified is version 1."""
    compose_params(project, *TINY, f"train.params_source=models:/{NAME}@verified")
    commit_all(project, "params from the registry")
    result = run(project, "dvc", "repro")
    assert f"train: models:/{NAME}@verified is version 1" in result.stdout
    v1 = client(project).get_model_version(NAME, "1")
    manifest = json.loads((project / "data" / "params" / "manifest.json").read_text())
    assert manifest["source"]["version"] == "1"
    assert manifest["source"]["params_sha256"] == v1.tags["params_sha256"] == manifest["sha256"]
    # Checked and passed again: recorded on version 1, not registered as a new version.
    after = track(project)
    assert after["verdict"] == "passed" and after["registry"]["status"] == "re-verified"
    tags = client(project).get_model_version(NAME, "1").tags
    assert tags["reverified_by_run"] == after["run_id"]
    assert len(client(project).search_model_versions(f"name = '{NAME}'")) == 2
    assert verified(project) == "1"
    shown = run(project, sys.executable, "-m", "vmapcheck", "registry").stdout
    assert "holds version 1, where models:/vmapcheck-mlp@verified points" in shown


def served_dtype(project: Path, version: str):
    """The float dtype of the signature version ``version`` of NAME serves (its MLmodel)."""
    from mlflow.models import Model

    from tests.helpers.registry import local_path

    source = client(project).get_model_version(NAME, version).source
    return Model.load(str(local_path(source) / "MLmodel")).signature.inputs.inputs[0].type


def test_a_passing_experiment_off_the_deployment_target_leaves_verified_then_promote(project):
    """`dvc exp run -S precision=f64` passes and registers its params, but @verified stays
    at version 1: f64 is not the deployment target (registry.target in conf/config.yaml),
    so what serves keeps its float32 signature. `vmapcheck promote` moves the alias on
    purpose, and rollback brings it back."""
    import numpy as np

    tiny = [arg for override in TINY for arg in ("-S", override)]
    result = run(project, "dvc", "exp", "run", "-n", "f64-exp", "-S", "precision=f64", *tiny)
    registered = track(project)["registry"]
    assert track(project)["verdict"] == "passed"
    # Another precision, as a DVC experiment: compared with the float32 reference.
    details = json.loads((project / "reports" / "check_details.json").read_text())
    reference = details["reference"]
    assert reference["made_with"]["dtype"] == "float32"
    assert reference["compared_with"]["dtype"] == "float64" and reference["passed"]
    table = run(project, "dvc", "exp", "show", "--csv").stdout
    rows = {row["Experiment"]: row for row in csv.DictReader(io.StringIO(table))}
    assert rows["f64-exp"]["precision.dtype"] == "float64", rows.get("f64-exp")
    assert rows["f64-exp"]["passed"] == "True"
    tags = client(project).get_run(track(project)["run_id"]).data.tags
    assert (tags["precision"], tags["model"], tags["dvc_exp_name"]) == ("f64", "mlp", "f64-exp")
    assert (registered["status"], registered["verified_alias"]) == ("registered", "stays")
    number = registered["version"]
    assert number == "3"
    assert (
        f"track: registry: registered as models:/{NAME}/3; @verified stays at version 1: "
        "this run's precision is f64 (float64), the deployment target's is f32 (float32) "
        "(registry.target in conf/config.yaml); promote it with: vmapcheck promote --version 3"
    ) in result.stdout
    assert verified(project) == "1"
    assert served_dtype(project, "1") == np.dtype(np.float32)
    assert served_dtype(project, "3") == np.dtype(np.float64)
    tags = client(project).get_model_version(NAME, "3").tags
    assert "precision is f64" in tags["off_deployment_target"]
    assert "verified_alias_pending" not in tags

    result = run(project, sys.executable, "-m", "vmapcheck", "promote", "--version", "3")
    assert f"models:/{NAME}@verified moved from version 1" in result.stdout
    assert "version 3 is off the deployment target" in result.stdout
    assert verified(project) == "3"
    result = run(project, sys.executable, "-m", "vmapcheck", "rollback")
    assert f"models:/{NAME}@verified moved from version 3" in result.stdout
    assert verified(project) == "1"
