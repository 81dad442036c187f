"""Servers the tests start (``mlflow server``, ``mlflow models serve``): on 127.0.0.1, on
a free port, in a process group of their own so that stopping one ends its workers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_in_group(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen:
    """Start ``command`` in its own session (process group), stdout and stderr appended
    to ``log``."""
    with open(log, "a") as out:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until_ok(proc: subprocess.Popen, url: str, wait_s: float, log: Path) -> float:
    """Poll ``url`` until it answers 200; return the seconds it took.

    Raises:
        AssertionError: the process exited, or nothing answered within ``wait_s``; the
            message ends with the tail of ``log``.
    """
    started = time.monotonic()
    while time.monotonic() - started < wait_s:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:3]} exited:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"no answer on {url} in {wait_s} s:\n{log.read_text()[-4000:]}")
