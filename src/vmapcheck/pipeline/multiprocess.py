"""A stage run as N local processes (``backend.processes``; docs/multiprocess.md).

The stage's own process becomes the launcher: it starts N copies of the stage
(``python -m vmapcheck.stages.<stage>``), each told its place in the group by its
environment (vmapcheck.core.distributed: the coordinator on 127.0.0.1 at a free port, the
process count, its index, its emulated CPU devices), and watches them. The copies join
through ``jax.distributed.initialize`` and run the stage's body; process 0 writes the
records. The launcher writes the stage's time record (vmapcheck.pipeline.stage), once.

It is the local stand-in for what a cluster does (a TPU slice's workers, SLURM, GKE):
start one process per host with the same command. No scheduler of its own: it starts,
waits and, when one process fails, stops the others at once and names the one that
failed, so none waits for ever on a peer that is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from vmapcheck.config import BackendConfig
from vmapcheck.core.distributed import (
    CLUSTER_ENV,
    COORDINATOR_ENV,
    LOCAL_DEVICES_ENV,
    PROCESS_ID_ENV,
    PROCESSES_ENV,
)
from vmapcheck.errors import ConfigError, ProcessGroupError

HOST = "127.0.0.1"
# The launcher's process id, given to each process it starts (follow_launcher).
LAUNCHER_PID_ENV = "VMAPCHECK_LAUNCHER_PID"
# How often the launcher looks at its processes.
POLL_S = 0.2
# How long a process stopped with SIGTERM has to end before SIGKILL.
STOP_GRACE_S = 10.0


def free_port() -> int:
    """A TCP port on :data:`HOST` that nothing listens on now (the system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    """Refuse ``port`` when something on this machine already holds it.

    Raises:
        ConfigError: the port is taken (names ``backend.coordinator_port`` and the
            system's reason)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise ConfigError(
                f"backend.coordinator_port={port}: expected a free TCP port on {HOST} for "
                f"the coordinator, found it taken ({exc.strerror or exc}); choose another, "
                "or null for a free one"
            ) from None


def coordinator_port(backend: BackendConfig) -> int:
    """The port the group's coordinator listens on: ``backend.coordinator_port`` when
    free, else a free one."""
    if backend.coordinator_port is None:
        return free_port()
    check_port_free(backend.coordinator_port)
    return backend.coordinator_port


def check_launchable(backend: BackendConfig) -> None:
    """Refuse a local group on a backend whose devices one process at a time may hold.

    Raises:
        ConfigError: ``backend.platform`` is not cpu (one TPU chip or GPU is not split
            between processes here; a cluster starts one process per host instead)."""
    if backend.platform != "cpu":
        raise ConfigError(
            f"backend.processes={backend.processes} on backend.platform="
            f"{backend.platform!r}: vmapcheck starts local processes on cpu only (their "
            "devices are emulated); on a TPU slice or a GPU cluster, the cluster starts one "
            f"process per host with {CLUSTER_ENV}=cluster (docs/multiprocess.md)"
        )


def process_env(
    backend: BackendConfig, port: int, process_id: int, base: dict[str, str] | None = None
) -> dict[str, str]:
    """Process ``process_id``'s environment: ``base`` (default: this one's) with its
    place in the group."""
    env = dict(os.environ if base is None else base)
    env.pop(CLUSTER_ENV, None)
    per_process = (backend.num_devices or backend.processes) // backend.processes
    env.update(
        {
            COORDINATOR_ENV: f"{HOST}:{port}",
            PROCESSES_ENV: str(backend.processes),
            PROCESS_ID_ENV: str(process_id),
            LOCAL_DEVICES_ENV: str(per_process),
            LAUNCHER_PID_ENV: str(os.getpid()),
            # Each process's output as it comes: a process that dies says why first.
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def exit_said(code: int) -> str:
    """An exit status as a person reads it: ``exit code 2`` or ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def follow_launcher(env: Mapping[str, str] | None = None) -> None:
    """In a process of a local group, before anything else: on Linux, be killed when the
    launcher dies, whatever kills it (the out-of-memory killer's SIGKILL leaves it no
    time to stop its processes), so that no process of the group outlives it to write
    the outputs of a stage that has failed (every write is atomic: a kill leaves none
    half-written). Set here, in the process itself, not between fork and exec: a
    ``preexec_fn`` makes ``subprocess`` fork a process where JAX's threads run. Nothing
    when ``env`` (default: ``os.environ``) names no launcher (alone, or a cluster's
    process); off Linux, only the check that the launcher is still there.

    Raises:
        ProcessGroupError: the launcher had already died when this process got here.
        ConfigError: :data:`LAUNCHER_PID_ENV` is no process id."""
    env = os.environ if env is None else env
    text = env.get(LAUNCHER_PID_ENV)
    if text is None:
        return
    if not text.isdigit():
        raise ConfigError(f"{LAUNCHER_PID_ENV}: expected a process id, found {text!r}")
    # The parent is checked before the signal is set (a launcher gone already) and after
    # (one that died meanwhile): this process's parent is then another, from which no
    # signal will come.
    for when in ("before", "after"):
        if os.getppid() != int(text):
            raise ProcessGroupError(
                f"the launcher of this group (pid {text}) is not this process's parent: "
                "it has ended"
            )
        if when == "before" and sys.platform == "linux":
            import ctypes

            set_parent_death_signal = 1  # prctl(2): PR_SET_PDEATHSIG
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(set_parent_death_signal, int(signal.SIGKILL))


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to each process still running, SIGKILL to those alive after
    :data:`STOP_GRACE_S`; waits for every one."""
    for proc in processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in processes:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def run_group(stage: str, backend: BackendConfig, root: Path) -> int:
    """Run stage ``stage`` as ``backend.processes`` local processes in ``root``; 0 when
    every one exited 0.

    Raises:
        ConfigError: not on cpu (:func:`check_launchable`), or the coordinator's port
            is taken (:func:`check_port_free`).
        ProcessGroupError: a process failed: the first to fail named, with its exit
            code (the others stopped at once; its own error is on stderr above).
            Process 0 writes only after every process has computed its part
            (vmapcheck.core.distributed.barrier): a process that fails first leaves
            no record of the run."""
    check_launchable(backend)
    port = coordinator_port(backend)
    n = backend.processes
    command = [sys.executable, "-m", f"vmapcheck.stages.{stage}"]
    processes: list[subprocess.Popen] = []
    try:
        for k in range(n):
            processes.append(subprocess.Popen(command, cwd=root, env=process_env(backend, port, k)))
        while True:
            codes = [proc.poll() for proc in processes]
            failed = [(k, c) for k, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                k, code = failed[0]
                running = sum(c is None for c in codes)
                _stop(processes)
                raise ProcessGroupError(
                    f"{stage}: process {k} of {n} (pid {processes[k].pid}) ended with "
                    f"{exit_said(code)} (its error is above); the {running} still running "
                    "were stopped"
                )
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    finally:
        _stop(processes)  # Ctrl-C, SIGTERM or an error here: no process is left behind
