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
