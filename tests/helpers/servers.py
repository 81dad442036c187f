"""Servers the tests start (``mlflow server``, ``mlflow models serve``): on 127.0.0.1, on
a free port, in a process group of their own so that stopping one ends its workers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.helpers.wait import HANG_S, polls
from vmapcheck.tracking.ui import JOB_EXECUTION_ENV


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

    Polled with backoff (:func:`tests.helpers.wait.polls`), each request given longer
    than the last (2 s up to 30 s): on a loaded machine a server that is up may take
    seconds to answer, and a request given up on still occupies its one worker.

    Raises:
        AssertionError: the process exited, or nothing answered within ``wait_s``; the
            message ends with the tail of ``log``.
    """
    request_s = 2.0
    for waited in polls(
        f"an answer on {url}", wait_s, 0.2, 2.0, detail=lambda: log.read_text()[-4000:]
    ):
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:3]} exited:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=request_s) as answer:
            if answer.status == 200:
                return waited
        request_s = min(request_s * 2, 30.0)
    raise AssertionError("unreachable: polls() yields until it raises")


def mlflow_server_command(store: Path, artifacts: Path, port: int) -> list[str]:
    """The ``mlflow server`` command line the tests run: sqlite store ``store``, artifacts
    uploaded through the server (``mlflow-artifacts:/``) into ``artifacts``, on
    127.0.0.1:``port`` with one worker."""
    return [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{store}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(artifacts),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


class MlflowServer:
    """``mlflow server`` (:func:`mlflow_server_command`) over ``workdir``/server.db with
    artifacts in ``workdir``/artifacts, in its own process group, log ``workdir``/server.log.
    Restartable on the same port and store: :meth:`stop` shuts it down, :meth:`kill`
    SIGKILLs it (a crash, not a shutdown)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port if port is not None else free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.store = self.workdir / "server.db"
        self.artifacts = self.workdir / "artifacts"
        self.log = self.workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = HANG_S) -> float:
        """Start it and wait until /health answers; the seconds that took."""
        command = mlflow_server_command(self.store, self.artifacts, self.port)
        # The server's settings are its command line, not this process's MLFLOW_* variables.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        # Without MLflow 3's GenAI job runner (its huey consumers), as `vmapcheck ui` runs.
        env[JOB_EXECUTION_ENV] = "false"
        self.proc = start_in_group(command, self.workdir, env, self.log)
        try:
            return wait_until_ok(self.proc, f"{self.uri}/health", wait_s, self.log)
        except AssertionError:
            self.kill()
            raise

    def stop(self) -> None:
        """SIGTERM its group (SIGKILL after 30 s); return once the port refuses connections."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL its group; return once the port refuses connections."""
        self._end(signal.SIGKILL)

    def _end(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        # Workers may outlive the parent for a moment: wait for the port to close.
        for _ in range(150):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                return
            time.sleep(0.2)
        raise AssertionError(f"{self.uri} still accepts connections after the server ended")
