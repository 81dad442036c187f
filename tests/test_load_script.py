"""scripts/load, the load generator (docs/development.md, "Tests under load"): it starts
the busy processes it is asked for and stops every one of them however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S

LOAD = ROOT / "scripts" / "load"


def _busy_children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone while listed
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry))
    return children


def test_it_stops_after_the_seconds_given() -> None:
    done = subprocess.run(
        [sys.executable, str(LOAD), "2", "0.5"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "load: 2 busy processes" in done.stdout
    assert "stopped 2 busy processes" in done.stdout


def test_sigterm_stops_it_and_its_busy_processes() -> None:
    load = subprocess.Popen([sys.executable, str(LOAD), "2"], stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    assert "load: 2 busy processes" in load.stdout.readline()  # both started
    assert len(_busy_children(load.pid)) == 2
    load.send_signal(signal.SIGTERM)
    out, _ = load.communicate(timeout=HANG_S)  # only guards a hang
    assert load.returncode == 0
    assert "stopped 2 busy processes" in out


def test_its_busy_processes_end_when_it_is_killed() -> None:
    """SIGKILL leaves it no chance to stop them: they notice their parent is gone."""
    load = subprocess.Popen([sys.executable, str(LOAD), "1"], stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    load.stdout.readline()
    (busy,) = _busy_children(load.pid)
    load.kill()
    load.wait()
    load.stdout.close()
    # Reparented and still spinning until its next look at its parent; poll with backoff
    # rather than sleep a fixed time, and give a loaded machine minutes.
    deadline, pause = time.monotonic() + 120, 0.01
    while os.path.exists(f"/proc/{busy}") and _state(busy) != "Z":
        assert time.monotonic() < deadline, f"busy process {busy} still runs after its parent died"
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_wrong_count_is_refused_with_what_was_expected() -> None:
    done = subprocess.run(
        [sys.executable, str(LOAD), "many"], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "N must be a whole number of processes, found 'many'" in done.stderr
