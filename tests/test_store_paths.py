"""What the store refuses rather than doing silently (issue 45): a store path that is a
symlink loop, a dangling symlink or in a missing folder; an in-memory database; a store
made by a newer MLflow; an experiment deleted in MLflow, or keeping its artifacts where
tracking.artifact_root no longer points (a copied project), and relinking a copied store;
an artifact folder that cannot be written; a run whose logging failed; ``vmapcheck ui``
on a taken port; the alias move while the DVC cache has no room. Real sqlite stores and
sockets, no mocks."""

from __future__ import annotations

import shutil
import socket
import sqlite3
from pathlib import Path

import pytest

from tests.helpers.config import compose_config
from vmapcheck import cli
from vmapcheck.config import TrackingConfig
from vmapcheck.errors import ConfigError, ResourceError, TrackingStoreError
from vmapcheck.layout import Layout
from vmapcheck.pipeline.track import dvc_cache_folder, dvc_cache_problem
from vmapcheck.tracking.log import fill_run
from vmapcheck.tracking.runs import shown_verdict
from vmapcheck.tracking.sqlite_store import (
    require_usable_store,
    store_path_problem,
)
from vmapcheck.tracking.store import (
    LOG_FAILED_TAG,
    artifact_location,
    ensure_experiment,
    incomplete_because,
    open_store,
    tracking_uri,
)
from vmapcheck.tracking.ui import require_free_port


def tracking(**changes) -> TrackingConfig:
    base = compose_config().tracking.model_dump()
    return TrackingConfig.model_validate(base | changes)


@pytest.fixture(autouse=True)
def _own_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)


# --- the store's path -------------------------------------------------------------------


def test_store_paths_that_would_open_the_wrong_store_are_named(tmp_path):
    loop = tmp_path / "loop.db"
    loop.symlink_to(loop)
    assert "is a symlink loop" in store_path_problem(loop)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "gone" / "x.db")
    problem = store_path_problem(dangling)
    assert f"is a symlink to {tmp_path / 'gone' / 'x.db'}, which does not exist" in problem
    missing = tmp_path / "typo" / "mlflow.db"
    assert "nor its folder" in store_path_problem(missing)
    assert store_path_problem(missing, create_folder=True) is None  # store init, asked
    (tmp_path / "afile").write_text("x")
    assert "is not a folder" in store_path_problem(tmp_path / "afile" / "m.db", True)
    # A fresh project's first run: no file yet, in a folder that exists.
    assert store_path_problem(tmp_path / "mlflow.db") is None


def test_a_symlinked_store_file_is_kept_a_symlink_in_its_uri(tmp_path):
    # Resolving the file followed a dangling link to a new store at its target.
    (tmp_path / "mlflow.db").symlink_to(tmp_path / "elsewhere.db")
    assert tracking_uri(tracking(), tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    (tmp_path / "mlflow.db").unlink()
    (tmp_path / "mlflow.db").symlink_to("mlflow.db")  # a loop: no RuntimeError here
    assert tracking_uri(tracking(), tmp_path).endswith("/mlflow.db")


@pytest.mark.parametrize(
    "target", ["dangling", "loop", "missing folder"], ids=lambda t: t.replace(" ", "-")
)
def test_track_creates_no_store_where_the_path_is_wrong(target, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    settings = tracking()
    if target == "dangling":
        (project / "mlflow.db").symlink_to(tmp_path / "unmounted" / "mlflow.db")
    elif target == "loop":
        (project / "mlflow.db").symlink_to("mlflow.db")
    else:
        settings = tracking(tracking_uri=f"sqlite:///{tmp_path}/typo/mlflow.db")
    with pytest.raises(TrackingStoreError, match=r"tracking\.tracking_uri") as refused:
        open_store(settings, project)
    assert "symlink" in str(refused.value) or "nor its folder" in str(refused.value)
    assert not (tmp_path / "unmounted").exists() and not (tmp_path / "typo").exists()


def test_store_init_makes_a_missing_folder_when_asked(tmp_path, root, monkeypatch, capsys):
    from vmapcheck.compose import compose_yaml

    where = tmp_path / "stores" / "new" / "mlflow.db"
    overrides = [f"tracking.tracking_uri=sqlite:///{where}"]
    (tmp_path / "params.yaml").write_text(compose_yaml(root / "conf", overrides))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["registry"]) == 2  # reading: never made
    assert "no MLflow store at" in capsys.readouterr().err and not where.parent.exists()
    assert cli.main(["store", "init"]) == 0
    assert "store ready" in capsys.readouterr().out and where.is_file()


@pytest.mark.parametrize(
    "uri", ["sqlite:///:memory:", "sqlite://", "sqlite:", "sqlite:///file:x?mode=memory"]
)
def test_an_in_memory_database_is_refused_naming_the_key(uri, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="in-memory") as refused:
        tracking(tracking_uri=uri)
    assert "tracking_uri" in str(refused.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError, match=r"MLFLOW_TRACKING_URI: .*in-memory"):
        tracking_uri(tracking(), tmp_path)
    assert not (tmp_path / ":memory:").exists()


def test_a_store_made_by_a_newer_mlflow_is_left_alone_and_named(tmp_path, empty_mlflow_store):
    db = tmp_path / "mlflow.db"
    uri = empty_mlflow_store(db)
    require_usable_store(uri)  # this MLflow's own store
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    before = db.read_bytes()
    with pytest.raises(TrackingStoreError, match="made by a newer MLflow") as refused:
        open_store(tracking(tracking_uri=uri), tmp_path)
    assert "revision ffffffffffff" in str(refused.value)
    with pytest.raises(TrackingStoreError, match="newer MLflow"):
        require_usable_store(uri, write=False)  # the readers: registry, compare
    assert db.read_bytes() == before and not list(tmp_path.glob("mlflow.db.bak-*"))


# --- the experiment and its artifacts ---------------------------------------------------


def test_a_deleted_experiment_is_refused_with_the_way_to_restore_it(tmp_path, empty_mlflow_store):
    from mlflow.tracking import MlflowClient

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    location = artifact_location(tracking(), tmp_path)
    experiment_id = ensure_experiment(uri, "vmapcheck", location)
    MlflowClient(tracking_uri=uri).delete_experiment(experiment_id)
    with pytest.raises(TrackingStoreError) as refused:
        ensure_experiment(uri, "vmapcheck", location)
    said = str(refused.value)
    assert f"experiment 'vmapcheck' (id {experiment_id})" in said and "is deleted" in said
    assert f"mlflow experiments restore --experiment-id {experiment_id}" in said
    MlflowClient(tracking_uri=uri).restore_experiment(experiment_id)
    assert ensure_experiment(uri, "vmapcheck", location) == experiment_id


def test_an_artifact_folder_that_cannot_be_written_is_refused_before_a_run(
    tmp_path, empty_mlflow_store
):
    from mlflow.tracking import MlflowClient

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    (tmp_path / "mlartifacts").write_text("a file")
    with pytest.raises(TrackingStoreError, match="is a file, not a folder"):
        ensure_experiment(uri, "vmapcheck", (tmp_path / "mlartifacts").as_uri())
    with pytest.raises(TrackingStoreError, match="does not exist, nor its parent"):
        ensure_experiment(uri, "vmapcheck", "file:///nonexistent/a/b")
    assert not Path("/nonexistent").exists()
    with pytest.raises(TrackingStoreError, match="/proc/nope cannot be written"):
        ensure_experiment(uri, "vmapcheck", "file:///proc/nope")
    # Nothing was made in the store for them.
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("vmapcheck") is None


def test_a_changed_artifact_root_or_a_copied_store_is_refused_and_relinked(
    tmp_path, root, monkeypatch, capsys, empty_mlflow_store
):
    from mlflow.tracking import MlflowClient

    from vmapcheck.compose import compose_yaml

    original = tmp_path / "original"
    original.mkdir()
    uri = empty_mlflow_store(original / "mlflow.db")
    location = artifact_location(tracking(), original)
    experiment_id = ensure_experiment(uri, "vmapcheck", location)
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(experiment_id)
    (original / "data.txt").write_text("logged")
    client.log_artifact(run.info.run_id, str(original / "data.txt"))
    # tracking.artifact_root changed: the run's artifacts would go to the old folder.
    with pytest.raises(TrackingStoreError, match=r"tracking\.artifact_root names"):
        ensure_experiment(uri, "vmapcheck", (tmp_path / "other").as_uri())

    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    (copy / "params.yaml").write_text(compose_yaml(root / "conf", []))
    copy_uri = tracking_uri(tracking(), copy)
    with pytest.raises(TrackingStoreError, match="store relink") as refused:
        ensure_experiment(copy_uri, "vmapcheck", artifact_location(tracking(), copy))
    assert f"keeps its artifacts in {original.resolve() / 'mlartifacts'}" in str(refused.value)
    monkeypatch.chdir(copy)
    assert cli.main(["store", "relink"]) == 0
    out = capsys.readouterr().out
    assert f"now under {copy.resolve() / 'mlartifacts'}" in out and "runs.artifact_uri 1" in out
    assert list(copy.glob("mlflow.db.bak-*"))  # the store before the rewrite
    assert ensure_experiment(copy_uri, "vmapcheck", artifact_location(tracking(), copy))
    moved = MlflowClient(tracking_uri=copy_uri).get_run(run.info.run_id)
    assert moved.info.artifact_uri.startswith((copy.resolve() / "mlartifacts").as_uri())
    # The original's store is untouched.
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith(location)
    assert cli.main(["store", "relink"]) == 0
    assert "nothing to change" in capsys.readouterr().out


def test_a_run_whose_logging_failed_says_so_not_a_failed_check(tmp_path, empty_mlflow_store):
    from mlflow.tracking import MlflowClient

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    experiment_id = ensure_experiment(uri, "vmapcheck", (tmp_path / "art").as_uri())
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(experiment_id, tags={"verdict": "passed"}).info.run_id
    # A file where MLflow makes the run's artifact folder: logging the artifact fails
    # (as root too, which writes through file modes).
    (tmp_path / "art" / run_id).write_text("in the way")
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(OSError):
        fill_run(client, run_id, compose_config(), {}, [tmp_path / "report.json"], None, True)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[LOG_FAILED_TAG].startswith("logging the run failed: ")
    assert shown_verdict(run) == "log failed"
    assert "logging the run failed" in incomplete_because(run)


# --- vmapcheck ui, the DVC cache --------------------------------------------------------


def test_ui_refuses_a_port_another_process_listens_on():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(ResourceError, match=f"--port {port}: .*another process listens"):
            require_free_port(port)
    require_free_port(port)  # free again


def test_the_dvc_cache_is_found_and_its_room_judged(tmp_path):
    layout = Layout(tmp_path)
    assert dvc_cache_folder(layout) is None and dvc_cache_problem(layout) is None  # no DVC
    (tmp_path / ".dvc").mkdir()
    assert dvc_cache_folder(layout) == tmp_path / ".dvc" / "cache"
    (tmp_path / ".dvc" / "config.local").write_text(f"[cache]\n    dir = {tmp_path / 'c'}\n")
    assert dvc_cache_folder(layout) == tmp_path / "c"
    assert dvc_cache_problem(layout) is None
    free = shutil.disk_usage(tmp_path).free
    problem = dvc_cache_problem(layout, need=free * 2)
    assert problem is not None and f"the DVC cache {tmp_path / 'c'} has" in problem


def test_track_leaves_the_alias_move_pending_while_the_dvc_cache_is_full(
    tmp_path, monkeypatch, capsys
):
    from vmapcheck.pipeline import track

    # complete_run's last step, with the run complete: a cache with no room keeps the move
    # pending (the next track makes it), and says so.
    layout = Layout(tmp_path)
    (tmp_path / ".dvc").mkdir()
    monkeypatch.setattr(track, "CACHE_SLACK_BYTES", shutil.disk_usage(tmp_path).free * 2)
    moved = []
    monkeypatch.setattr(track, "move_verified_alias", lambda uri, reg: moved.append(reg))
    for step in ("log_perf_verdict", "log_diagnosis", "log_timeline", "mark_complete"):
        monkeypatch.setattr(track, step, lambda *a, **k: None)
    monkeypatch.setattr(track, "read_diagnosis", lambda path: None)
    monkeypatch.setattr(
        track,
        "register_if_verified",
        lambda *a, **k: {"verified_alias": "pending", "uri": "models:/m/3", "version": "3"},
    )
    monkeypatch.setattr(track, "registry_url", lambda info: None)
    info = {"tracking_uri": "sqlite:///x.db", "run_id": "r", "verdict": "passed"}
    track.complete_run(compose_config(), layout, info, {"runtime": {}}, {"verdict": "none"}, {})
    assert not moved and info["registry"]["verified_alias"] == "pending"
    out = capsys.readouterr().out
    assert "alias verified NOT moved to it yet: the DVC cache" in out and "pending" in out
