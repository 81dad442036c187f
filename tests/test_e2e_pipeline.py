"""End to end: the real pipeline (DVC + Hydra + JAX + MLflow) in a temporary copy.

The steps share one copy of the repository and run in file order, as a user would:
repro, repro again, read metrics and plots, change a tolerance, ask for a missing
backend, plant a fault, and run experiments with -S overrides. Nothing is mocked.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

# Small enough to run the whole pipeline in ~30 s on two cores; every stage still runs.
TINY = [
    "data.n_rows=200",
    "data.standard_batch=8",
    "train.steps=30",
    "train.eval_every=10",
    "bench.batch_sizes=[1,8]",
    "bench.warmup=1",
    "bench.repeats=5",
    "bench.loop_max_batch=8",
]


def _env(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # The copy's own library, not the editable install of the original checkout.
        PYTHONPATH=str(project / "src"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="e2e",
        GIT_AUTHOR_EMAIL="e2e@vmapcheck.invalid",
        GIT_COMMITTER_NAME="e2e",
        GIT_COMMITTER_EMAIL="e2e@vmapcheck.invalid",
    )
    env.pop("JAX_PLATFORMS", None)  # the pipeline selects the backend itself
    return env


def run(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        list(args), cwd=project, env=_env(project), capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def compose(project: Path, *overrides: str) -> None:
    run(project, sys.executable, "-m", "vmapcheck.compose", *TINY, *overrides)


def stages_run(result: subprocess.CompletedProcess) -> set[str]:
    return set(re.findall(r"Running stage '(\w+)'", result.stdout + result.stderr))


def mlflow_client(project: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A fresh copy of the tracked files (no outputs, no store), as a new git repo."""
    dest = tmp_path_factory.mktemp("vmapcheck") / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    run(dest, "git", "init", "-q")
    compose(dest)
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-qm", "e2e copy")
    return dest


def test_repro_runs_every_stage_and_logs_a_complete_mlflow_run(project):
    result = run(project, "dvc", "repro")
    assert stages_run(result) == {"prepare", "train", "forward", "check", "bench", "track"}
    import json

    import jax

    track = json.loads((project / "reports" / "track.json").read_text())
    assert track["verdict"] == "passed"
    run_ = mlflow_client(project).get_run(track["run_id"])
    params, metrics, tags = run_.data.params, run_.data.metrics, run_.data.tags
    assert params["model.name"] == "mlp"
    assert params["precision.tolerance.rtol"] == "1e-05"
    assert params["bench.batch_sizes"] == "[1, 8]"
    assert metrics["check/passed"] == 1.0
    assert "agree/standard/loop_eager-vs-vmap_jit/max_abs" in metrics
    assert "agree/boundary/vmap_jit-vs-direct_jit/max_rel" in metrics
    assert metrics["negative/invalid_shape/refused_paths"] == 6.0
    assert metrics["latency_ms/vmap_jit/b8/p50"] > 0
    assert metrics["latency_ms/loop_eager/b1/p99"] >= metrics["latency_ms/loop_eager/b1/p50"]
    assert tags["jax_version"] == jax.__version__ and tags["jaxlib_version"] == jax.__version__
    assert tags["python_version"] == sys.version.split()[0]
    assert tags["backend"] == "cpu" and tags["device_kind"] == "cpu"
    assert tags["tolerance.rtol"] == "1e-05" and tags["tolerance.atol"] == "1e-06"
    assert tags["verdict"] == "passed"
    assert len(tags["git_commit"]) == 40
    artifacts = {a.path for a in mlflow_client(project).list_artifacts(track["run_id"])}
    assert {"check.json", "bench.json", "params.yaml", "plots", "params"} <= artifacts
    plots = {a.path for a in mlflow_client(project).list_artifacts(track["run_id"], "plots")}
    assert "plots/latency.png" in plots
    summary = run(project, sys.executable, "-m", "vmapcheck.summary").stdout
    assert summary.startswith("verdict: PASSED")
    assert f"MLflow run: {track['run_id']}" in summary


def test_second_repro_runs_no_stage(project):
    result = run(project, "dvc", "repro")
    assert stages_run(result) == set()
    assert "Data and pipelines are up to date" in result.stdout


def test_metrics_and_plots_show(project, tmp_path):
    shown = run(project, "dvc", "metrics", "show").stdout
    for name in ("agreement.standard.max_abs", "latency_ms.vmap_jit.b8.p50", "speedup.b1"):
        assert name in shown
    out = tmp_path / "plots"
    run(project, "dvc", "plots", "show", "-o", str(out))
    html = (out / "index.html").read_text()
    assert "latency_p50_ms_vs_batch_size" in html and "vmap_jit.csv" in html


def test_changing_only_a_tolerance_reruns_check_and_track(project):
    compose(project, "precision.tolerance.rtol=2e-05")
    result = run(project, "dvc", "repro")
    assert stages_run(result) == {"check", "track"}


def test_missing_gpu_fails_with_the_backends_that_exist(project):
    compose(project, "backend=gpu")
    try:
        result = run(project, "dvc", "repro", check=False)
    finally:
        compose(project)
    output = result.stdout + result.stderr
    if "Backends present" not in output and result.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert result.returncode != 0
    assert "forward: error: backend.name='gpu' (JAX platform 'cuda') is not available" in output
    assert "Backends present: cpu" in output


def test_planted_fault_is_logged_as_failed_before_the_pipeline_fails(project):
    models = project / "src" / "vmapcheck" / "models.py"
    original = models.read_text()
    # The hand-batched path forgets the output bias: only `direct` is wrong.
    planted = original.replace(
        'return hidden @ last["W"] + last["b"][None, :]', 'return hidden @ last["W"]'
    )
    assert planted != original
    models.write_text(planted)
    try:
        result = run(project, "dvc", "repro", check=False)
    finally:
        models.write_text(original)
    assert result.returncode != 0
    assert "track: the check FAILED" in result.stdout
    import json

    track = json.loads((project / "reports" / "track.json").read_text())
    run_ = mlflow_client(project).get_run(track["run_id"])
    assert run_.data.tags["verdict"] == "failed"
    assert run_.data.metrics["check/passed"] == 0.0
    assert run_.data.metrics["agree/standard/loop_eager-vs-vmap_jit/max_abs"] < 1e-5
    assert run_.data.metrics["agree/standard/vmap_jit-vs-direct_jit/max_abs"] > 1e-3
    run(project, "dvc", "repro")  # the fault removed, the pipeline is green again


def test_exp_run_with_overrides_appears_in_exp_show(project):
    run(project, "git", "add", "-A")
    run(project, "git", "commit", "-qm", "after repro", check=False)
    tiny = [arg for override in TINY for arg in ("-S", override)]
    run(project, "dvc", "exp", "run", "-n", "toy-exp", "-S", "model=toy", *tiny)
    params = (project / "params.yaml").read_text()
    assert "name: toy" in params and "in_features: 3" in params
    run(project, "dvc", "exp", "run", "-n", "f64-exp", "-S", "precision=f64", *tiny)
    table = run(project, "dvc", "exp", "show", "--csv").stdout
    rows = {row["Experiment"]: row for row in csv.DictReader(io.StringIO(table))}
    assert {"toy-exp", "f64-exp"} <= set(rows)
    for name in ("toy-exp", "f64-exp"):
        # The metrics are readable for each experiment (committed, not just cached).
        assert rows[name]["passed"] == "True" and rows[name]["n_failures"] == "0", rows[name]
    assert rows["f64-exp"]["precision.dtype"] == "float64"
    assert rows["toy-exp"]["model.in_features"] == "3"
    runs = mlflow_client(project).search_runs(
        [mlflow_client(project).get_experiment_by_name("vmapcheck").experiment_id]
    )
    names = {r.data.tags["precision"] + "/" + r.data.tags["model"] for r in runs}
    assert {"f32/toy", "f64/mlp"} <= names
