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

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.chromium import find_chromium
from tests.helpers.config import ROOT
from tests.helpers.inprocess import STAGES, run_stage, write_params
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = project.root / "mlflow-ui.log"
    with log.open("wb") as out:
        # A session of its own: stopping it stops the workers it starts, and only them.
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "ui",
                "--backend-store-uri",
                tracking_uri(config.tracking, project.root),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=project.root,
            # No background job workers: this UI only reads (they also slow its start).
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mlflow ui did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        # Ctrl-C, as a user stops it (its workers ignore SIGTERM for a while).
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _client(project: Layout):
    from mlflow.tracking import MlflowClient

    from vmapcheck.config import load_config

    config = load_config(project.params_yaml)
    return MlflowClient(tracking_uri=tracking_uri(config.tracking, project.root))


def _browse(url: str, out: Path, name: str) -> str:
    """Open ``url`` in headless Chromium: a screenshot ``out/<name>.png`` and the text
    the page showed once the app rendered (the DOM's text, tags and scripts left out)."""
    browser = find_chromium()
    assert browser is not None, "no headless Chromium: run scripts/ensure-chromium"
    out.mkdir(parents=True, exist_ok=True)
    common = [
        browser,
        "--headless",
        "--no-sandbox",  # tests may run as root (CI containers)
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        "--window-size=1920,1200",
        # Run the app until its requests to the server are answered and it rendered.
        "--virtual-time-budget=30000",
    ]
    shot = out / f"{name}.png"
    for args in (
        [f"--user-data-dir={out / 'profile-shot'}", f"--screenshot={shot}", url],
        [f"--user-data-dir={out / 'profile-dom'}", "--dump-dom", url],
    ):
        result = subprocess.run(
            [*common, *args], capture_output=True, text=True, timeout=240, check=False
        )
        assert result.returncode == 0, result.stderr[-3000:]
    for profile in ("profile-shot", "profile-dom"):
        shutil.rmtree(out / profile, ignore_errors=True)
    print(f"screenshot: {shot}")
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", result.stdout, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


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
    assert "model `mlp`" in experiment.tags[NOTE_TAG]
    view = json.loads(experiment.tags["mlflow.sharedViewState.vmapcheck-summary"])
    assert view["name"] == "vmapcheck summary"
    columns = json.loads(view["state"])["selectedColumns"]
    assert columns[:2] == [
        "metrics.`_summary/worst_max_rel`",
        "metrics.`_summary/worst_vs_reference_max_rel`",
    ]


def test_the_printed_urls_open_the_ml_view_with_the_summary_metrics(
    project, server, tmp_path_factory
):
    track = read_json(project.track_report)
    out = tmp_path_factory.mktemp("mlflow-ui-screenshots")
    runs_list = _browse(experiment_url(server, track["experiment_id"]), out, "runs-list")
    run_page = _browse(run_url(server, track["experiment_id"], track["run_id"]), out, "run-page")
    for text in (runs_list, run_page):
        assert "Model training" in text and " Runs " in text and " Models " in text
        shown = [word for word in GENAI_ONLY if f" {word} " in text]
        assert not shown, f"MLflow's GenAI view is shown: {shown}"
    # The runs table's columns: the saved view vmapcheck stores on the experiment.
    assert "vmapcheck summary" in runs_list  # its name, on the Views menu
    for name in ("_summary/worst_max_rel", "_summary/vmap_over_loop_at_b0008"):
        assert name in runs_list and name in run_page
    assert track["run_name"] in run_page and "Created by" in run_page
    assert "dvc.yaml" in run_page and "PASSED" in run_page  # source, description
    for png in ("runs-list.png", "run-page.png"):
        assert (out / png).stat().st_size > 10_000
