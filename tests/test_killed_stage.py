"""A stage the system kills (SIGKILL: the out-of-memory killer, a job's limit) is named as
killed, by `vmapcheck summary` and by the stage's next run (issue 34, case 6). DVC itself
says only "failed to run: python stages/train.py, exited with -9".

The kill is real: a stage process (``run_stage``, as stages/<name>.py calls it) held at
its pause point (vmapcheck.pause) and SIGKILLed there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.helpers.inprocess import write_params
from tests.helpers.wait import HANG_S, polls
from vmapcheck import running
from vmapcheck.io import read_json
from vmapcheck.layout import Layout
from vmapcheck.pause import PAUSE_AT, PAUSE_FILE
from vmapcheck.pipeline.stage import run_stage
from vmapcheck.running import killed_stage, killed_stages
from vmapcheck.tracking.review import run_summary

STAGE = (
    "import sys\n"
    "from vmapcheck.pipeline.stage import run_stage\n"
    "sys.exit(run_stage('train', lambda config, layout: 0, sys.argv[1]))\n"
)


def sigkill_a_stage(
    root: Path,
    before_reaped: Callable[[], None] | None = None,
    sig: signal.Signals = signal.SIGKILL,
) -> int:
    """Start stage ``train`` in a process of its own, hold it once it has started (its
    time record written), SIGKILL it there; its exit status (-9). ``before_reaped``:
    called while the killed process is a zombie (killed, not yet waited for: what a stage
    whose DVC was killed with it stays, where nothing reaps orphans)."""
    paused = root / "paused.json"
    env = {**os.environ, PAUSE_AT: "train:start#1", PAUSE_FILE: str(paused)}
    proc = subprocess.Popen([sys.executable, "-c", STAGE, str(root)], env=env)
    try:
        for _ in polls("the stage reaching its pause point"):
            if paused.exists():
                break
            assert proc.poll() is None, f"the stage ended ({proc.returncode}) before its pause"
        assert json.loads(paused.read_text())["pid"] == proc.pid
        proc.send_signal(sig)
        if before_reaped is not None:
            for _ in polls("the killed stage becoming a zombie"):
                if psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE:
                    break
            before_reaped()
        return proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stage_killed_by_sigkill_is_named_as_killed_by_summary_and_its_next_run(tmp_path, capsys):
    write_params(tmp_path)
    layout = Layout(tmp_path)
    assert sigkill_a_stage(tmp_path) == -signal.SIGKILL
    record = read_json(layout.stage_time("train"))
    assert record["end"] is None and record["exit_code"] is None

    (line,) = killed_stages(layout)
    assert line.startswith("stage train (started ")
    assert "was killed before it finished, without an error" in line
    assert "memory" in line and ("SIGKILL" in line or "out-of-memory killer" in line)

    # make demo: `vmapcheck summary --repro-status 1` after dvc repro failed.
    capsys.readouterr()
    run_summary(layout, repro_status=1)
    out = capsys.readouterr().out
    assert f"summary: {line}" in out.splitlines(), out

    # The stage's next run says it once, then its record is whole again.
    assert run_stage("train", lambda config, layout: 0, tmp_path) == 0
    err = capsys.readouterr().err
    assert f"train: note: its previous run: {line}" in err.splitlines(), err
    assert killed_stages(layout) == []


def test_a_stage_that_ended_or_still_runs_is_not_called_killed(tmp_path):
    write_params(tmp_path)
    layout = Layout(tmp_path)
    # An error of its own: the record has its end and exit code.
    assert run_stage("check", lambda config, layout: 1, tmp_path) == 1
    assert read_json(layout.stage_time("check"))["exit_code"] == 1
    assert killed_stages(layout) == []
    # A record without an end whose process (this one) still runs: a stage running now.
    running_now = read_json(layout.stage_time("check")) | {
        "end": None,
        "exit_code": None,
        "pid": os.getpid(),
    }
    assert killed_stage(running_now) is None
    # Its pid reused by a process started after it: not the stage's, so it was killed.
    reused = running_now | {"start": time.time() - 10**7}
    assert killed_stage(reused) is not None


def test_the_out_of_memory_killers_count_names_memory(tmp_path, monkeypatch):
    """When the kernel's oom_kill count rose while the stage ran, the line says so."""
    counter = tmp_path / "memory.events"
    counter.write_text("low 0\noom 3\noom_kill 3\n")
    monkeypatch.setattr(running, "OOM_COUNTERS", ((counter, "oom_kill"),))
    start = running.oom_kills()
    assert start == {"source": str(counter), "count": 3}
    record = {"stage": "bench", "start": time.time() - 5, "end": None, "pid": None}
    counter.write_text("low 0\noom 4\noom_kill 4\n")
    line = killed_stage(record | {"oom_kills": start})
    assert line is not None
    assert "the system's out-of-memory killer ended 1 process(es) since it started" in line
    assert f"{counter}: oom_kill 3 -> 4" in line
    # Unchanged: killed, most likely for memory, said without the certainty.
    line = killed_stage(record | {"oom_kills": {"source": str(counter), "count": 4}})
    assert line is not None and "most likely the system, for lack of memory" in line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stage_sent_sigterm_is_said_to_be_terminated_not_out_of_memory(tmp_path, capsys, sig):
    from vmapcheck.pipeline.stage import TERMINATED

    write_params(tmp_path)
    layout = Layout(tmp_path)
    assert TERMINATED == 143
    assert sigkill_a_stage(tmp_path, sig=sig) == 128 + sig
    record = read_json(layout.stage_time("train"))
    assert record["end"] is not None and record["exit_code"] == 128 + sig
    assert killed_stages(layout) == []
    capsys.readouterr()
    run_summary(layout, repro_status=1)
    out = capsys.readouterr().out
    assert "train (started " in out and f"failed: Terminated: terminated ({sig.name}" in out, out
    assert "memory" not in out.replace("out-of-memory killer", ""), out
    assert "SIGKILL" not in out, out


def test_a_killed_stage_not_yet_reaped_is_named_as_killed(tmp_path):
    """DVC killed with its stage leaves the stage a zombie where nothing reaps orphans
    (PID 1 of a container): it has ended, and is named so."""
    write_params(tmp_path)
    seen: list[list[str]] = []
    code = sigkill_a_stage(tmp_path, lambda: seen.append(killed_stages(Layout(tmp_path))))
    assert code == -signal.SIGKILL
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith("stage train ")
