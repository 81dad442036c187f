"""MLflow at a glance: a real run, read where users read it, in the MLflow UI.

Every stage runs in this process on a small temporary project (as
tests/test_pipeline_inprocess.py does), so the store holds one real run with its
per-stage timeline. Then ``mlflow ui`` serves that store on 127.0.0.1 (a free port), and
headless Chromium opens the URLs vmapcheck prints: the experiment's runs table (``make
ui``) and the run's page (``make demo``'s summary). The test checks that MLflow shows
its classic ML view (runs, metrics), not the GenAI one (traces, evaluations), with the
``_summary/*`` metrics on screen, and keeps the screenshots: their paths are printed
(``pytest -s``) and they stay under pytest's temporary folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from tests.helpers.config import ROOT
from tests.helpers.inprocess import STAGES, run_stage, write_params
from tests.helpers.mlflow_ui import browse, serving
from tests.helpers.project import FAST_RUN, commit_all, run
from vmapcheck.io import read_json
from vmapcheck.layout import Layout
from vmapcheck.pipeline.stage import read_stage_times
from vmapcheck.tracking.log import NOTE_TAG
from vmapcheck.tracking.store import tracking_uri
from vmapcheck.tracking.ui import experiment_url, run_url

pytestmark = pytest.mark.stages

OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    "backend.num_devices=2",  # this process's emulated CPU devices (tests/conftest.py)
    *FAST_RUN,
)
# What only MLflow's GenAI view shows in an experiment's navigation (its ML view shows
# Runs, Models, Traces).
GENAI_ONLY = ("Sessions", "Judges", "Evaluation runs", "Prompts & versions", "Playground")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Layout:
    """A temporary project (git repository of its inputs) after every stage ran."""
    root = tmp_path_factory.mktemp("glance")
    for name in ("requirements.lock", "dvc.yaml"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "data" / "reference", root / "data" / "reference")
    write_params(root, *OVERRIDES)
    run(root, "git", "init", "-q")
    commit_all(root, "inputs")
    codes = {name: run_stage(root, name) for name in STAGES}
    assert codes == dict.fromkeys(STAGES, 0)
    return Layout(root)


@pytest.fixture(scope="module")
def server(project) -> Iterator[str]:
    """``mlflow ui`` over the project's store on 127.0.0.1; its base URL. Stopped after."""
    from vmapcheck.config import load_config

    config = load_config(project.params_yaml)
    with serving(tracking_uri(config.tracking, project.root), project.root) as base:
        yield base


def _client(project: Layout):
    from mlflow.tracking import MlflowClient

    from vmapcheck.config import load_config

    config = load_config(project.params_yaml)
    return MlflowClient(tracking_uri=tracking_uri(config.tracking, project.root))


def test_the_run_carries_its_summary_description_source_and_timeline(project):
    track = read_json(project.track_report)
    run_ = _client(project).get_run(track["run_id"])
    tags, metrics = run_.data.tags, run_.data.metrics
    assert metrics["_summary/passed"] == 1.0
    worst = max(v for k, v in metrics.items() if k.startswith("agree/") and k.endswith("max_rel"))
    assert metrics["_summary/worst_max_rel"] == worst
    assert metrics["_summary/invalid_refused"] == metrics["_summary/invalid_total"] > 0
    assert "_summary/vmap_over_loop_at_b0008" in metrics
    # Zero-padded batch labels in every metric name that has one.
    assert "latency_ms/vmap_jit/b0008/p50" in metrics and "speedup/b0008/vmap_over_loop" in metrics
    assert not [k for k in metrics if "/b8/" in k or k.endswith("/b8")]
    assert tags[NOTE_TAG].startswith("**PASSED**") and "worst agreement" in tags[NOTE_TAG]
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"] == str(project.root / "dvc.yaml")
    assert tags["bench"] in run_.info.run_name
    stages = read_stage_times(project)
    assert list(stages) == list(STAGES)  # oldest start first
    assert run_.info.start_time == int(1000 * stages["prepare"]["start"])
    assert run_.info.end_time >= int(1000 * stages["track"]["start"])
    for stage in STAGES:
        assert metrics[f"timeline/{stage}_s"] >= 0
    assert stages["track"]["exit_code"] == 0 and stages["track"]["wall_s"] > 0
    experiment = _client(project).get_experiment(run_.info.experiment_id)
    # One experiment for every model (tracking.experiment_per_model false).
    assert experiment.name == "vmapcheck" and "every model" in experiment.tags[NOTE_TAG]
    view = json.loads(experiment.tags["mlflow.sharedViewState.vmapcheck-summary"])
    assert view["name"] == "vmapcheck summary"
    columns = json.loads(view["state"])["selectedColumns"]
    # The verdict and what tells runs apart first, then the summary.
    assert columns[:8] == [
        "tags.`verdict`",
        "tags.`model`",
        "tags.`precision`",
        "tags.`backend`",
        "tags.`bench`",
        "tags.`perf_verdict`",
        "metrics.`_summary/worst_max_rel`",
        "metrics.`_summary/worst_vs_reference_max_rel`",
    ]


def test_the_printed_urls_open_the_ml_view_with_the_summary_metrics(
    project, server, tmp_path_factory
):
    track = read_json(project.track_report)
    out = tmp_path_factory.mktemp("mlflow-ui-screenshots")
    # Wide enough for the view's tag columns and the first summary metrics (the table
    # renders only the columns in sight).
    runs_list = browse(
        experiment_url(server, track["experiment_id"]), out, "runs-list", window="2800,1200"
    )
    run_page = browse(run_url(server, track["experiment_id"], track["run_id"]), out, "run-page")
    for text in (runs_list, run_page):
        assert "Model training" in text and " Runs " in text and " Models " in text
        shown = [word for word in GENAI_ONLY if f" {word} " in text]
        assert not shown, f"MLflow's GenAI view is shown: {shown}"
    # The runs table's columns: the saved view vmapcheck stores on the experiment.
    assert "vmapcheck summary" in runs_list  # its name, on the Views menu
    (out / "runs-list.txt").write_text(runs_list)
    # Its first columns: the verdict, then what tells runs apart (the row's cells, in the
    # order shown: the header cells' order in the page is not the one shown).
    assert " passed mlp f32 cpu quick " in runs_list
    for name in ("_summary/worst_max_rel", "_summary/vmap_over_loop_at_b0008"):
        assert name in runs_list and name in run_page
    assert track["run_name"] in run_page and "Created by" in run_page
    assert "dvc.yaml" in run_page and "PASSED" in run_page  # source, description
    for png in ("runs-list.png", "run-page.png"):
        assert (out / png).stat().st_size > 10_000
