"""One pipeline run at a time in a workspace (vmapcheck.running): while the
`dvc` process that runs a pipeline lives, composing params.yaml there is refused, before
anything is written; a record left by a run that died refuses nothing.
(tests/e2e/test_experiments.py starts two real `dvc exp run` at once.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers.config import ROOT
from vmapcheck.compose import compose_yaml
from vmapcheck.errors import ConfigError
from vmapcheck.io import atomic_write_json
from vmapcheck.layout import Layout
from vmapcheck.running import PipelineRunningError, idle, running_elsewhere


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Layout:
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # the project is found above the working folder
    return Layout(tmp_path)


# The "other" run: it must outlive the test on a machine at any load (a 60 s sleep could
# end first, and the record would then be a dead run's); each test kills it in `finally`.
_LIVES_UNTIL_KILLED = "import time; time.sleep(3600)"


def _record(layout: Layout, pid: int, create_time: float) -> None:
    atomic_write_json(
        layout.running_record,
        {"pid": pid, "create_time": create_time, "cmdline": "dvc exp run -S seed=1"},
    )


def test_a_live_run_of_another_process_refuses_the_composition(workspace):
    other = subprocess.Popen([sys.executable, "-c", _LIVES_UNTIL_KILLED])
    try:
        _record(workspace, other.pid, psutil.Process(other.pid).create_time())
        assert running_elsewhere(workspace)["pid"] == other.pid
        with pytest.raises(PipelineRunningError, match="a pipeline is running in this workspace"):
            idle(0)
        # vmapcheck params / init compose through the same resolver: refused, named.
        with pytest.raises(ConfigError) as info:
            compose_yaml(ROOT / "conf")
        assert f"pid {other.pid}" in str(info.value) and "dvc queue start" in str(info.value)
    finally:
        other.kill()
        other.wait()
    # The same record once its process is gone: nothing refused.
    assert running_elsewhere(workspace) is None and idle(7) == 7
    assert "seed: 0" in compose_yaml(ROOT / "conf")


def test_the_runs_own_processes_and_a_reused_pid_are_not_refused(workspace):
    me = psutil.Process(os.getppid())
    _record(workspace, me.pid, me.create_time())
    assert running_elsewhere(workspace) is None and idle(3) == 3
    # A pid that a later process took (its start time differs): the run is gone.
    other = subprocess.Popen([sys.executable, "-c", _LIVES_UNTIL_KILLED])
    try:
        _record(workspace, other.pid, psutil.Process(other.pid).create_time() - 100.0)
        assert running_elsewhere(workspace) is None
    finally:
        other.kill()
        other.wait()


def test_no_record_or_no_project_refuses_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert idle(1) == 1
    layout = Layout(tmp_path)
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    layout.running_record.write_text("not json")
    assert running_elsewhere(layout) is None and idle(2) == 2


def test_the_config_reads_seed_through_the_guard():
    """conf/config.yaml (init's template) routes seed through the resolver: every
    composition evaluates it, and params.yaml holds the plain number."""
    text = (ROOT / "conf" / "config.yaml").read_text()
    assert "seed: ${vmapcheck_idle:0}" in text
    assert "\nseed: 0\n" in Path(ROOT / "params.yaml").read_text()


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        ("tracking.tracking_uri=http://alice:s3cretpw@127.0.0.1:9", "http://***@127.0.0.1:9"),
        ("tracking.tracking_uri=https://alice@mlflow.example", "https://***@mlflow.example"),
        ("tracking.tracking_uri='http://h:5000/?access_token=s3cretpw'", "access_token=***"),
        ("tracking.artifact_root=s3://AKIA:s3cretpw@bucket/x", "s3://***@bucket/x"),
    ],
)
def test_a_credential_in_a_setting_is_refused_where_hydra_composes(
    override, shown, tmp_path, monkeypatch
):
    """What `dvc exp run -S` and `vmapcheck params` compose goes through the guard's
    resolver before DVC writes params.yaml: refused, the secret never printed."""
    from vmapcheck.compose import run_params
    from vmapcheck.layout import Layout as ProjectLayout

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        compose_yaml(ROOT / "conf", [override])
    message = str(caught.value)
    assert "s3cretpw" not in message and "alice" not in message and "AKIA" not in message
    assert "a credential given in a setting" in message and shown in message
    assert "so nothing was written" in message
    # `vmapcheck params` leaves params.yaml as it was.
    project = tmp_path / "project"
    (project / "conf").mkdir(parents=True)
    for item in (ROOT / "conf").iterdir():
        (project / "conf" / item.name).symlink_to(item)
    (project / "params.yaml").write_text("untouched\n")
    with pytest.raises(ConfigError):
        run_params(ProjectLayout(project), [override])
    assert (project / "params.yaml").read_text() == "untouched\n"


def test_a_credential_that_reached_params_yaml_is_scrubbed_before_the_refusal(tmp_path, capsys):
    """`-S seed=5` replaces the resolver that refuses it, so DVC writes the URL; the first
    stage replaces the secret by *** before validation refuses the setting."""
    from vmapcheck.project.code import run as code_stage
    from vmapcheck.running import scrub_credentials

    params = tmp_path / "params.yaml"
    text = (ROOT / "params.yaml").read_text()
    params.write_text(
        text.replace("tracking_uri: sqlite:///mlflow.db", "tracking_uri: http://al:s3cretpw@h:9")
    )
    assert "s3cretpw" in params.read_text()
    assert code_stage(tmp_path) == 2
    err = capsys.readouterr().err
    assert "s3cretpw" not in params.read_text() and "s3cretpw" not in err
    assert "tracking_uri: http://***@h:9" in params.read_text()
    assert "a credential given in a setting was replaced by *** in the file" in err
    assert "tracking.tracking_uri: a user or password in the URL" in err
    # A clean file, a FIFO or a missing file is left alone (never read, never blocked on).
    assert not scrub_credentials(params, "code")
    os.mkfifo(tmp_path / "fifo.yaml")
    assert not scrub_credentials(tmp_path / "fifo.yaml", "code")
    assert not scrub_credentials(tmp_path / "missing.yaml", "code")
