"""vmapcheck.tracking.store: where the store is, bounded waiting for a server, creating a sqlite
store once, and logging a pipeline state once (real MLflow sqlite stores, real sockets)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.config import ROOT, compose_config
from tests.helpers.servers import free_port
from tests.helpers.wait import HANG_S
from vmapcheck.compose import compose_yaml
from vmapcheck.config import TrackingConfig, validate_config
from vmapcheck.errors import ConfigError, TrackingStoreError
from vmapcheck.tracking.attempts import pipeline_key, runs_with_key, settle_earlier_attempts
from vmapcheck.tracking.server import (
    HTTP_ENV,
    apply_http_settings,
    health,
    probe,
    reaching,
    worst_request_s,
)
from vmapcheck.tracking.sqlite_store import writer_lock
from vmapcheck.tracking.store import (
    ABANDONED_TAG,
    COMPLETE_TAG,
    PIPELINE_KEY_TAG,
    artifact_location,
    is_complete,
    mark_complete,
    open_store,
    owner_tags,
    store_root,
    tracking_uri,
)
from vmapcheck.tracking.uri import shown


def tracking(**changes) -> TrackingConfig:
    base = compose_config().tracking.model_dump()
    return TrackingConfig.model_validate(base | changes)


# --- where ------------------------------------------------------------------------------


def test_relative_store_is_in_the_project_root(tmp_path, monkeypatch):
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local = tracking()
    assert tracking_uri(local, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert artifact_location(local, tmp_path) == (tmp_path.resolve() / "mlartifacts").as_uri()


def test_a_queued_experiments_temp_copy_logs_to_the_original_repository(tmp_path, monkeypatch):
    """dvc queue start runs each experiment in <repo>/.dvc/tmp/exps/<tmp>/ with DVC_ROOT=<repo>."""
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpabc123"
    copy.mkdir(parents=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    assert store_root(copy) == repo.resolve()
    assert tracking_uri(tracking(), copy) == f"sqlite:///{repo.resolve()}/mlflow.db"
    assert artifact_location(tracking(), copy) == (repo.resolve() / "mlartifacts").as_uri()
    # A plain run in the repository itself, or a DVC_ROOT left over from another project.
    assert store_root(repo) == repo.resolve()
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    assert store_root(elsewhere) == elsewhere.resolve()


def test_a_server_keeps_artifacts_itself(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    server = tracking(name="server", tracking_uri="http://127.0.0.1:5000", artifact_root=None)
    assert artifact_location(server, tmp_path) is None
    # tracking=local with MLFLOW_TRACKING_URI naming a server (the nightly CI job): a
    # folder on this machine would mean nothing to the server.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://ci:secret@mlflow.example:8443")
    assert artifact_location(tracking(), tmp_path) is None
    assert shown(tracking_uri(tracking(), tmp_path)) == "https://mlflow.example:8443"


def test_server_mode_composes_and_validates():
    config = compose_config("tracking=server", "tracking.tracking_uri=http://10.0.0.5:5001")
    assert config.tracking.name == "server" and config.tracking.artifact_root is None
    assert config.tracking.tracking_uri == "http://10.0.0.5:5001"


def _tracking_error(**changes) -> str:
    raw = yaml.safe_load(compose_yaml(ROOT / "conf", ["tracking=server"]))
    raw["tracking"].update(changes)
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    return str(info.value)


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"tracking_uri": "sqlite:///mlflow.db"}, "tracking.tracking_uri must be an http://"),
        ({"tracking_uri": "http://"}, "tracking.tracking_uri must be an http://"),
        ({"artifact_root": "mlartifacts"}, "tracking.artifact_root must be null"),
        ({"http_timeout_s": 0}, "tracking.http_timeout_s"),
        ({"http_max_retries": 11}, "tracking.http_max_retries"),
        ({"http_backoff_factor": -1}, "tracking.http_backoff_factor"),
        ({"http_backoff_jitter": "1"}, "tracking.http_backoff_jitter"),
        ({"name": "local"}, "tracking.tracking_uri names a server but tracking.name='local'"),
    ],
)
def test_impossible_tracking_settings_are_named(changes, expected):
    assert expected in _tracking_error(**changes)


# --- how long ---------------------------------------------------------------------------


def test_http_settings_reach_mlflow(monkeypatch):
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR,
        MLFLOW_HTTP_REQUEST_BACKOFF_JITTER,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
    )

    for name in ("TIMEOUT", "MAX_RETRIES", "BACKOFF_FACTOR", "BACKOFF_JITTER"):
        monkeypatch.setenv(f"MLFLOW_HTTP_REQUEST_{name}", "99")  # replaced by the config
    settings = tracking(
        http_timeout_s=7, http_max_retries=3, http_backoff_factor=2, http_backoff_jitter=0.25
    )
    apply_http_settings(settings)
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 7
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 3
    assert MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get() == 2
    assert MLFLOW_HTTP_REQUEST_BACKOFF_JITTER.get() == 0.25
    # 4 attempts of 7 s; sleeps 0, 2x2, 2x4 s, each plus up to 0.25 s of jitter.
    assert worst_request_s(settings) == 4 * 7 + 4 + 8 + 2 * 0.25
    # The defaults bound one request on a silent server well below MLflow's ~4 minutes.
    assert worst_request_s(compose_config("tracking=server").tracking) < 35


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probe_of_a_stopped_server_fails_fast_naming_the_uri(health_server):
    assert health(health_server, 5) is None
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingStoreError) as info:
        probe(dead, tracking(name="server", tracking_uri=dead, artifact_root=None))
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"the MLflow tracking server {dead} does not answer" in message
    assert "connection refused" in message and "dvc repro" in message


def test_probe_reports_an_unhealthy_server(health_server, monkeypatch):
    monkeypatch.setattr(_Health, "status", 503)
    assert health(health_server, 5) == "HTTP 503"


def test_a_server_that_goes_away_while_logging_is_named(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    settings = tracking(name="server", tracking_uri=dead, artifact_root=None)
    with pytest.raises(TrackingStoreError) as info, reaching(dead, settings):
        raise ConnectionError("Max retries exceeded")
    assert f"{dead} does not answer any more" in str(info.value)
    assert "ConnectionError: Max retries exceeded" in str(info.value)
    # Errors of a local store, or of a server that still answers, pass unchanged.
    with pytest.raises(KeyError), reaching(f"sqlite:///{tmp_path}/m.db", tracking()):
        raise KeyError("x")


# --- creating it once -------------------------------------------------------------------


CREATE = """
import sys
from pathlib import Path
from vmapcheck.config import TrackingConfig
from vmapcheck.tracking.store import ensure_experiment, open_store, artifact_location
t = TrackingConfig(name="local", tracking_uri=sys.argv[1], artifact_root="mlartifacts",
    experiment="vmapcheck", experiment_per_model=False, http_timeout_s=10,
    http_max_retries=2, http_backoff_factor=1, http_backoff_jitter=0.5)
root = Path(sys.argv[2])
uri = open_store(t, root)
from vmapcheck.tracking.sqlite_store import writer_lock
with writer_lock(uri):
    print(ensure_experiment(uri, "vmapcheck", artifact_location(t, root)))
"""


def test_parallel_first_use_creates_one_sound_store(tmp_path, monkeypatch):
    """Three processes open a store that does not exist yet, at once."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE, uri, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(*p.communicate(timeout=HANG_S), p.returncode) for p in procs]
    assert all(code == 0 for _, _, code in results), results
    assert len({out.strip() for out, _, _ in results}) == 1, results  # one experiment
    from mlflow.tracking import MlflowClient

    names = [e.name for e in MlflowClient(uri).search_experiments()]
    assert names.count("vmapcheck") == 1


def test_writer_lock_is_exclusive_between_processes_and_reentrant(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom vmapcheck.tracking.sqlite_store import writer_lock\n"
            # Holds it until killed below: a 30 s hold could end first on a loaded machine.
            "with writer_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(3600)\n",
            uri,
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        locked = pytest.raises(TrackingStoreError, match="stayed locked by another process")
        with locked, writer_lock(uri, wait_s=0.5):
            pass
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes the pipe
    with writer_lock(uri), writer_lock(uri):  # free again; nested use does not deadlock
        pass


# --- logging once -----------------------------------------------------------------------


def _project(tmp_path: Path) -> Path:
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "check.json").write_text('{"passed": true}')
    (tmp_path / "data" / "params").mkdir(parents=True)
    (tmp_path / "data" / "params" / "w.bin").write_bytes(b"\x00\x01")
    (tmp_path / "dvc.yaml").write_text(
        yaml.safe_dump(
            {"stages": {"track": {"cmd": "x", "deps": ["reports/check.json", "data/params"]}}}
        )
    )
    return tmp_path


def test_pipeline_key_follows_the_contents_of_the_stage_deps(tmp_path):
    project = _project(tmp_path)
    key = pipeline_key(project)
    assert key == pipeline_key(project) and len(key) == 64
    (project / "data" / "params" / "w.bin").write_bytes(b"\x00\x02")
    changed = pipeline_key(project)
    assert changed != key
    (project / "unrelated.txt").write_text("not a dep")
    assert pipeline_key(project) == changed


def test_pipeline_key_follows_the_stage_params_and_no_other_key(tmp_path):
    """track's params are vmapcheck's keys (dvc.yaml): a tolerance changes the key, a
    key of the project's own (`-S lr=0.3`) does not: it logged another run."""
    project = _project(tmp_path)
    declared = yaml.safe_load((project / "dvc.yaml").read_text())
    declared["stages"]["track"]["params"] = ["precision", "seed"]
    (project / "dvc.yaml").write_text(yaml.safe_dump(declared))
    params = {"precision": {"tolerance": {"rtol": 1e-5}}, "seed": 0, "lr": 0.01}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    key = pipeline_key(project)
    (project / "params.yaml").write_text(yaml.safe_dump(params | {"lr": 0.3}))
    assert pipeline_key(project) == key
    params["precision"]["tolerance"]["rtol"] = 2e-5
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert pipeline_key(project) != key


def test_an_interrupted_attempt_is_marked_failed_and_a_complete_run_kept(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("vmapcheck", (tmp_path / "a").as_uri())
    assert settle_earlier_attempts(uri, "k1") is None  # nothing logged yet
    # An attempt that died after creating its run, and one that failed half-way. Both
    # carry this process's owner tags: the same state is replaced whether or not it lives.
    mine = owner_tags()
    died = client.create_run(experiment, tags={PIPELINE_KEY_TAG: "k1", **mine}).info.run_id
    failed = client.create_run(experiment, tags={PIPELINE_KEY_TAG: "k1"}).info.run_id
    client.set_terminated(failed, "FAILED")
    other = client.create_run(experiment, tags={PIPELINE_KEY_TAG: "k2", **mine}).info.run_id
    assert settle_earlier_attempts(uri, "k1") is None
    out = capsys.readouterr().out
    for run_id in (died, failed):
        run = client.get_run(run_id)
        # Marked, not deleted: a run may be another run's perf_baseline.
        assert run.info.lifecycle_stage == "active" and run.info.status == "FAILED"
        assert "an earlier attempt on the same inputs" in run.data.tags[ABANDONED_TAG]
        assert f"marked run {run_id} " in out
    # Another pipeline state, RUNNING in a live process (this one): left alone.
    assert client.get_run(other).info.status == "RUNNING"
    assert ABANDONED_TAG not in client.get_run(other).data.tags
    # A complete run of k1 is kept and reported, not logged again.
    done = client.create_run(
        experiment, run_name="mlp-x", tags={PIPELINE_KEY_TAG: "k1", "verdict": "failed"}
    ).info.run_id
    mark_complete(uri, done, "failed")
    # A failed check's run ends FAILED (a red cross in MLflow's runs list), and is complete.
    assert client.get_run(done).info.status == "FAILED"
    info = settle_earlier_attempts(uri, "k1")
    assert info["run_id"] == done and info["verdict"] == "failed" and info["logged_before"]
    assert info["experiment"] == "vmapcheck" and info["run_name"] == "mlp-x"
    assert [r.info.run_id for r in runs_with_key(uri, "k1") if is_complete(r)] == [done]
    assert "marked run" not in capsys.readouterr().out  # the marked ones are not marked again
    assert client.get_run(done).data.tags[COMPLETE_TAG] == "true"


def test_open_store_creates_a_missing_sqlite_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    uri = open_store(tracking(), tmp_path)
    assert uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert (tmp_path / "mlflow.db").stat().st_size > 0


def test_a_store_first_made_by_a_queued_experiment_keeps_nothing_in_its_temp_copy(
    tmp_path, monkeypatch
):
    """A queued run without `store init`: the Default experiment's artifact location used
    to be ./mlruns of the temp copy, deleted when the experiment ended; and track printed
    the copy's report path."""
    from mlflow.tracking import MlflowClient

    from vmapcheck.layout import Layout
    from vmapcheck.pipeline.track import report_line

    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpabc123"
    copy.mkdir(parents=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    monkeypatch.setenv("DVC_EXP_NAME", "picky-yobs")
    monkeypatch.chdir(copy)  # where dvc queue runs the stage
    uri = open_store(tracking(), copy)
    assert uri == f"sqlite:///{repo.resolve()}/mlflow.db"
    default = MlflowClient(tracking_uri=uri).get_experiment("0")
    assert default.artifact_location == (repo.resolve() / "mlartifacts" / "0").as_uri()
    assert not (copy / "mlruns").exists()
    line = report_line(Layout(copy))
    assert str(copy) not in line
    assert line == (
        "track: HTML report: an artifact of the run (report.html); this queued experiment's "
        f"temporary copy goes when it ends: `dvc exp apply picky-yobs` in {repo.resolve()} "
        f"puts it at {repo.resolve() / 'reports' / 'report.html'}"
    )
    # A plain `dvc repro` in the repository names its own report.
    assert report_line(Layout(repo)) == (
        f"track: HTML report: {Layout(repo).html_report} (also an artifact of the run)"
    )


def test_store_command_creates_the_store_once_and_probes_a_server(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from vmapcheck.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert main(["store", "init", "--root", str(tmp_path)]) == 0
    assert main(["store", "init", "--root", str(tmp_path)]) == 0  # a second time changes nothing
    experiments = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_experiments()
    assert [e.name for e in experiments].count("vmapcheck") == 1  # one for every model
    assert main(["store", "where", "--root", str(tmp_path)]) == 0
    assert f"store: sqlite:///{tmp_path.resolve()}/mlflow.db" in capsys.readouterr().out
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    assert main(["store", "probe", "--root", str(tmp_path)]) == 2
    assert f"store: error: the MLflow tracking server {dead} does not answer" in (
        capsys.readouterr().err
    )


def test_a_long_error_is_shortened_at_spaces_keeping_its_cause():
    from vmapcheck.errors import first_line

    line = "word " * 100 + "Connection refused')"
    short = first_line(ValueError(line + "\nsecond line"))
    assert len(short) <= 300 and short.endswith(" word Connection refused')")
    head, tail = short.split(" ... ")
    assert set(head.split(" ")) == {"word"} and set(tail.split(" ")[:-2]) == {"word"}
    assert first_line("fits as it is\nnot this") == "fits as it is"


def test_a_server_that_died_is_reported_with_mlflows_whole_cause(monkeypatch):
    """A real MLflow request to a stopped server, inside reaching(): the message used to be
    cut mid-word ("Failed to est)")."""
    from mlflow.tracking import MlflowClient

    dead = f"http://127.0.0.1:{free_port()}"
    settings = tracking(
        name="server", tracking_uri=dead, artifact_root=None, http_max_retries=0, http_timeout_s=2
    )
    for name in HTTP_ENV.values():
        monkeypatch.delenv(name, raising=False)
    apply_http_settings(settings)
    with pytest.raises(TrackingStoreError) as info, reaching(dead, settings):
        MlflowClient(dead).search_experiments()
    message = str(info.value)
    assert f"{dead} does not answer any more" in message
    failed = message.split("(the request that failed: ", 1)[1]
    assert "Connection refused" in failed, failed
    assert "Failed to est)" not in message


def test_mlflow_tracking_uri_naming_no_supported_store_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://user:pw@127.0.0.1/x")
    with pytest.raises(ConfigError) as info:
        tracking_uri(tracking(), tmp_path)
    assert str(info.value).startswith("MLFLOW_TRACKING_URI: expected sqlite:///<path>")
    assert "not scheme 'ftp'" in str(info.value) and "pw" not in str(info.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path))
    with pytest.raises(ConfigError, match=r"use sqlite:///<path>/mlflow\.db"):
        open_store(tracking(), tmp_path)
    assert sorted(tmp_path.iterdir()) == []  # no store was made


def test_the_printed_run_url_never_carries_the_stores_credentials():
    from vmapcheck.tracking.review import review_url

    track = {"experiment_id": "3", "run_id": "abc"}
    server = review_url(track | {"tracking_uri": "https://ci:secret@mlflow.example:8443"})
    assert server.startswith("https://mlflow.example:8443/#/experiments/3/runs/abc")
    assert "secret" not in server and "ci:" not in server
    local = review_url(track | {"tracking_uri": "sqlite:////tmp/x/mlflow.db"})
    assert local.startswith("vmapcheck ui, then http://127.0.0.1:5000/#/experiments/3/runs/abc")


def test_a_corrupt_store_is_named_by_track_store_probe_and_the_readers(
    tmp_path, monkeypatch, capsys
):
    """`file is not a database` used to be a traceback from track and `vmapcheck registry`,
    and `store probe` said "not a server; nothing to probe" and exited 0."""
    from vmapcheck.cli import main
    from vmapcheck.tracking.sqlite_store import require_existing_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"this is no sqlite database, but text" * 200)
    with pytest.raises(TrackingStoreError) as info:
        open_store(tracking(), tmp_path)
    message = str(info.value)
    assert f"the MLflow store {store} is not a readable SQLite database" in message
    assert "vmapcheck store init" in message and len(message.splitlines()) == 1
    with pytest.raises(TrackingStoreError, match="is not a readable SQLite database"):
        require_existing_store(f"sqlite:///{store}", "vmapcheck registry")
    assert main(["store", "probe", "--root", str(tmp_path)]) == 2
    assert "store: error: the MLflow store" in capsys.readouterr().err
    assert store.read_bytes().startswith(b"this is no sqlite")  # nothing written to it


def test_store_probe_checks_a_sound_local_store(tmp_path, monkeypatch, capsys):
    from vmapcheck.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert main(["store", "probe", "--root", str(tmp_path)]) == 0
    assert "no store there yet" in capsys.readouterr().out
    open_store(tracking(), tmp_path)
    assert main(["store", "probe", "--root", str(tmp_path)]) == 0
    assert "an SQLite store, integrity ok, writable" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file (CI runs as root)")
def test_a_read_only_store_is_refused_before_logging(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    open_store(tracking(), tmp_path)
    (tmp_path / "mlflow.db").chmod(0o444)
    with pytest.raises(TrackingStoreError, match="is read-only here"):
        open_store(tracking(), tmp_path)


FILL_THE_DISK = """
import resource, signal, sys
from pathlib import Path
from vmapcheck.config import TrackingConfig
from vmapcheck.errors import TrackingStoreError
from vmapcheck.tracking.sqlite_store import store_faults
from vmapcheck.tracking.store import open_store
import mlflow
root = Path(sys.argv[1])
tracking = TrackingConfig.model_validate(eval(sys.argv[2]))
uri = open_store(tracking, root)
# As `ulimit -f` does: a write past the limit fails (SIGXFSZ ignored, as MLflow's
# sqlite sees it: a disk I/O error), like a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
size = (root / "mlflow.db").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, size + 4096))
try:
    with store_faults(uri):
        mlflow.set_tracking_uri(uri)
        with mlflow.start_run():
            for i in range(200):
                mlflow.log_param(f"p{i}", "x" * 400)
except TrackingStoreError as exc:
    print("REFUSED", exc)
"""


def test_a_full_disk_while_logging_is_one_line_naming_the_store(tmp_path, monkeypatch):
    """`ulimit -f` during track used to give five tracebacks ending `disk I/O error`."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    settings = repr(tracking().model_dump())
    done = subprocess.run(
        [sys.executable, "-c", FILL_THE_DISK, str(tmp_path), settings],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert "REFUSED the MLflow store" in done.stdout, done.stdout + done.stderr
    line = done.stdout.split("REFUSED ", 1)[1].strip()
    assert "failed while this run was logged" in line and "the next `track` marks it FAILED" in line
    assert "Traceback" not in done.stdout
