"""End to end: the pipeline logging to a real `mlflow server`, which then goes away.

A tracking server runs on 127.0.0.1 (free port, sqlite backend, its own artifact folder,
artifacts uploaded through it), the pipeline logs to it with tracking=server, and the
run is read back through the REST API with plain HTTP. Then the server is stopped:
`track` must fail within 30 s naming the URI, leaving the reports on disk; once the
server is back on the same port and store, `dvc repro` logs exactly one run, even though
an interrupted attempt left a half-made run behind. Nothing is mocked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.project import FAST_RUN, commit_all, compose_params, copy_project, run
from tests.helpers.project import stages_run as project_stages_run
from tests.helpers.servers import MlflowServer
from tests.helpers.wait import HANG_S

pytestmark = pytest.mark.e2e

TINY = ["data.n_rows=200", "data.standard_batch=8", *FAST_RUN]


def stages_run(result: subprocess.CompletedProcess) -> set[str]:
    """The stages DVC ran, less the code stage, which always runs (helpers.project)."""
    return project_stages_run(result.stdout + result.stderr)


class ServerWithApi(MlflowServer):
    """The test's tracking server (tests.helpers.servers), read through its REST API."""

    # -- the REST API, with plain HTTP --

    def get(self, endpoint: str, **query: str) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=HANG_S) as response:
            return json.loads(response.read())

    def post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=HANG_S) as response:
            return json.loads(response.read())

    def experiment_id(self, name: str = "vmapcheck") -> str:  # every model's runs
        return self.get("experiments/get-by-name", experiment_name=name)["experiment"][
            "experiment_id"
        ]

    def runs(self, filter_string: str = "") -> list[dict[str, Any]]:
        """Active runs of experiment vmapcheck matching ``filter_string``."""
        found = self.post(
            "runs/search",
            {"experiment_ids": [self.experiment_id()], "filter": filter_string, "max_results": 100},
        )
        return found.get("runs", [])

    def artifact(self, run: dict[str, Any], path: str) -> bytes:
        """An artifact's bytes through the server's artifact proxy."""
        uri = run["info"]["artifact_uri"]
        assert uri.startswith("mlflow-artifacts:/"), uri
        url = f"{self.uri}/api/2.0/mlflow-artifacts/artifacts/{uri.split(':/', 1)[1].strip('/')}"
        with urllib.request.urlopen(f"{url}/{path}", timeout=HANG_S) as response:
            return response.read()


def as_dict(entries: list[dict[str, str]]) -> dict[str, Any]:
    return {e["key"]: e["value"] for e in entries}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = ServerWithApi(tmp_path_factory.mktemp("mlflow-server"))
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def project(tmp_path_factory, server) -> Path:
    dest = copy_project(tmp_path_factory.mktemp("vmapcheck") / "repo")
    compose(dest, server)
    commit_all(dest)
    return dest


def compose(project: Path, server: ServerWithApi, *overrides: str) -> None:
    compose_params(
        project, *TINY, "tracking=server", f"tracking.tracking_uri={server.uri}", *overrides
    )


def test_the_pipeline_logs_a_complete_run_to_a_tracking_server(project, server):
    result = run(project, "dvc", "repro")
    assert stages_run(result) == {"prepare", "train", "forward", "check", "bench", "track"}
    track = json.loads((project / "reports" / "track.json").read_text())
    assert track["tracking_uri"] == server.uri and track["verdict"] == "passed"
    run_ = server.get("runs/get", run_id=track["run_id"])["run"]
    assert run_["info"]["status"] == "FINISHED"
    params = as_dict(run_["data"]["params"])
    metrics = {m["key"]: m["value"] for m in run_["data"]["metrics"]}
    tags = as_dict(run_["data"]["tags"])
    assert params["model.name"] == "mlp" and params["bench.batch_sizes"] == "[8]"
    # The tracking settings are not compared between runs, so not params: the run's whole
    # config is its artifact params.yaml, uploaded through the server.
    config = yaml.safe_load(server.artifact(run_, "params.yaml"))
    assert config["tracking"]["name"] == "server"
    assert config["tracking"]["tracking_uri"] == server.uri
    assert config["tracking"]["http_timeout_s"] == 10
    assert config["tracking"]["http_max_retries"] == 2
    assert metrics["check/passed"] == 1.0 and metrics["latency_ms/vmap_jit/b0008/p50"] > 0
    assert "agree/standard/max_abs" in metrics
    assert tags["verdict"] == "passed" and tags["perf_verdict"] == "no baseline"
    assert re.fullmatch(r"[0-9a-f]{64}", tags["pipeline_key"])
    assert tags["pipeline_complete"] == "true"
    listed = server.get("artifacts/list", run_id=track["run_id"])
    artifacts = {f["path"] for f in listed["files"]}
    assert {"report.html", "check.json", "bench_details.json", "plots", "params"} <= artifacts
    assert {"dvc.lock", "params.yaml"} <= artifacts
    # Uploaded through the server into its own artifact folder, not into the project.
    logged = server.artifact(run_, "report.html")
    assert logged == (project / "reports" / "report.html").read_bytes()
    assert list(server.artifacts.rglob("report.html"))
    assert not (project / "mlartifacts").exists() and not (project / "mlflow.db").exists()
    summary = run(project, sys.executable, "-m", "vmapcheck", "summary").stdout
    page = f"#/experiments/{track['experiment_id']}/runs/{track['run_id']}"
    # The server's own UI, in MLflow's ML view (vmapcheck.tracking.ui).
    assert f"open it: {server.uri}/{page}?workflowType=machine_learning" in summary


def test_a_stopped_server_fails_track_fast_and_a_later_repro_logs_one_run(project, server):
    from vmapcheck.tracking.attempts import pipeline_key

    server.stop()
    compose(project, server, "precision.tolerance.rtol=2e-05")  # reruns check and track
    run(project, "dvc", "repro", "check")
    started = time.monotonic()
    failed = run(project, "dvc", "repro", check=False)
    elapsed = time.monotonic() - started
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0 and stages_run(failed) == {"track"}, output
    assert f"track: error: the MLflow tracking server {server.uri} does not answer" in output
    # Fast means at the probe: one GET /health, refused, before any MLflow request (each
    # of which would retry with backoff). The stage's own figure for the probe, not the
    # wall time of `dvc repro`: that was asserted under 30 s, and at load 8-15 on two cores
    # starting DVC and the stage's interpreter alone takes longer (issue 44).
    probed = re.search(r"GET /health: connection refused; gave up after ([0-9.]+) s", output)
    assert probed is not None, output
    assert float(probed.group(1)) < 5, f"the probe took {probed.group(1)} s to fail"
    assert "Traceback" not in output
    print(f"track failed in {elapsed:.1f} s (dvc repro included), its probe in {probed.group(1)} s")
    # The reports track logs stay on disk (outputs of earlier stages, untouched).
    details = json.loads((project / "reports" / "check_details.json").read_text())
    assert details["passed"]
    for name in ("check.json", "bench.json", "bench_details.json", "train.json"):
        assert (project / "reports" / name).is_file(), name

    server.start()  # same port, same store
    # An attempt that died after creating its run (status RUNNING, nothing logged in it).
    key = pipeline_key(project)
    planted = server.post(
        "runs/create",
        {
            "experiment_id": server.experiment_id(),
            "run_name": "interrupted-attempt",
            "start_time": int(time.time() * 1000),
            "tags": [{"key": "pipeline_key", "value": key}, {"key": "verdict", "value": "passed"}],
        },
    )["run"]["info"]["run_id"]
    result = run(project, "dvc", "repro")
    assert stages_run(result) == {"track"}
    assert f"track: marked run {planted} (interrupted-attempt) FAILED" in result.stdout
    runs = server.runs(f"tags.pipeline_key = '{key}'")
    assert len(runs) == 2, [r["info"]["run_name"] for r in runs]
    (logged,) = [r for r in runs if r["info"]["run_id"] != planted]
    assert logged["info"]["status"] == "FINISHED"
    assert as_dict(logged["data"]["params"])["precision.tolerance.rtol"] == "2e-05"
    assert as_dict(logged["data"]["tags"])["pipeline_complete"] == "true"
    # The interrupted attempt is marked FAILED, saying why, not deleted.
    attempt = server.get("runs/get", run_id=planted)["run"]
    assert attempt["info"]["lifecycle_stage"] == "active"
    assert attempt["info"]["status"] == "FAILED"
    why = as_dict(attempt["data"]["tags"])["vmapcheck.abandoned"]
    assert why.startswith("an earlier attempt on the same inputs")
    assert len(server.runs()) == 3  # the first test's run, the attempt and this one
    track = json.loads((project / "reports" / "track.json").read_text())
    assert track["run_id"] == logged["info"]["run_id"]


def test_track_rerun_on_the_same_inputs_logs_nothing_twice(project, server):
    before = {r["info"]["run_id"] for r in server.runs()}
    result = run(project, "dvc", "repro", "--force", "--single-item", "track")
    assert stages_run(result) == {"track"}
    assert "the same inputs were logged before (not again)" in result.stdout
    assert {r["info"]["run_id"] for r in server.runs()} == before
