"""Faults for tests/test_faults.py: SIGKILL a stage, kill the tracking server before or
during an MLflow call, take away write permission, fill a small disk. And the checks made
after each: no output half-written, no run left RUNNING, no state logged twice, the
registry alias only on a version whose run is complete.

Everything here is real: DVC and the stages run as processes, the MLflow server is
``mlflow server``, a small disk is a tmpfs mount, an unwritable folder is refused by the
kernel. (tests/helpers/faults.py is something else: models with a planted numerical fault.)
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from tests.helpers.project import project_env
from tests.helpers.servers import MlflowServer
from tests.helpers.wait import COMMAND_HANG_S
from vmapcheck.pause import PAUSE_AT, PAUSE_FILE, PAUSE_TRACE

# --- processes ---------------------------------------------------------------------------


def running_stages(root_pid: int, stages: tuple[str, ...]) -> set[str]:
    """Which of ``stages`` have a process under ``root_pid`` (dvc.yaml's cmd, ``python
    stages/<stage>.py``, or ``python -m vmapcheck.stages.<stage>`` run directly): one look
    at the process tree for all."""
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    running = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            command = child.cmdline()
            running.update(
                s
                for s in stages
                if f"vmapcheck.stages.{s}" in command or f"stages/{s}.py" in command
            )
    return running


@dataclass
class Watched:
    """A command run in its own process group, and when each stage's process was seen."""

    returncode: int
    output: str
    seen_s: dict[str, tuple[float, float]] = field(default_factory=dict)  # first, last
    killed_stage: bool = False  # the SIGKILL landed while the stage's process ran
    killed_after_s: float | None = None  # seconds after the stage's process appeared
    killed_at: str | None = None  # the pause point it was killed at (vmapcheck.pause)
    events: list[str] = field(default_factory=list)  # the pause points passed (trace=True)

    def durations(self) -> dict[str, float]:
        return {name: last - first for name, (first, last) in self.seen_s.items()}


PAUSED = ".fault-paused.json"  # where a stage held at its pause point says so
TRACE = ".fault-trace.txt"  # the pause points a traced run passed


def run_watched(
    project: Path,
    *args: str,
    stages: tuple[str, ...],
    kill_at: str | None = None,
    trace: bool = False,
    timeout_s: float = COMMAND_HANG_S,
) -> Watched:
    """Run ``args`` in ``project`` in a new process group, polling every 50 ms for the
    processes of ``stages``.

    ``kill_at``: a pause point's label (``<stage>:<event>#<n>``, :mod:`vmapcheck.pause`).
    The stage that reaches it is held there, says so in :data:`PAUSED`, and the whole
    group (DVC and the stage) is SIGKILLed at once, as an OOM killer or a power cut of
    the job would: the kill lands at that event, however fast or slow the stage runs.
    ``trace``: every pause point passed is listed in ``Watched.events`` (to choose from).
    """
    paused, traced = project / PAUSED, project / TRACE
    paused.unlink(missing_ok=True)
    traced.unlink(missing_ok=True)
    env = project_env(project)
    if kill_at is not None:
        env.update({PAUSE_AT: kill_at, PAUSE_FILE: str(paused)})
    if trace:
        env[PAUSE_TRACE] = str(traced)
    with open(project / ".fault-run.log", "w+") as log:
        proc = subprocess.Popen(
            list(args),
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        watched = Watched(returncode=0, output="")
        started = time.monotonic()
        try:
            while proc.poll() is None:
                now = time.monotonic() - started
                if now > timeout_s:
                    raise AssertionError(f"{args} still running after {timeout_s} s")
                running = running_stages(proc.pid, stages)  # one look at the tree a poll
                for stage in stages:
                    if stage in running:
                        first, _ = watched.seen_s.get(stage, (now, now))
                        watched.seen_s[stage] = (first, now)
                if kill_at is not None and paused.exists():
                    held = json.loads(paused.read_text())
                    stage = held["label"].split(":", 1)[0]
                    first, _ = watched.seen_s.get(stage, (now, now))
                    os.killpg(proc.pid, signal.SIGKILL)
                    watched.killed_stage = stage in stages
                    watched.killed_after_s = now - first
                    watched.killed_at = held["label"]
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # Nothing of the group may outlive it (a stage's own children included).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            paused.unlink(missing_ok=True)
        log.seek(0)
        watched.output = log.read()
        watched.returncode = proc.returncode
    if trace and traced.exists():
        watched.events = [line for line in traced.read_text().splitlines() if line]
        traced.unlink()
    return watched


# --- outputs -----------------------------------------------------------------------------


def dvc_outputs(project: Path) -> dict[str, list[Path]]:
    """Each stage's outputs (outs and metrics) as dvc.yaml declares them."""
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    found = {}
    for name, stage in stages.items():
        entries = [*stage.get("outs", []), *stage.get("metrics", [])]
        found[name] = [project / (e if isinstance(e, str) else next(iter(e))) for e in entries]
    return found


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.is_file() else []


def file_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole file of its kind (None: it reads back whole)."""
    data = path.read_bytes()
    suffix = path.suffix
    try:
        if suffix == ".json":
            json.loads(data)
        elif suffix == ".npz":
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                for key in arrays.files:
                    arrays[key]
        elif suffix == ".safetensors":
            from safetensors.numpy import load

            load(data)
        elif suffix == ".csv":
            rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
            if not rows or len({len(r) for r in rows}) != 1:
                return "rows of different lengths (cut short?)"
        elif suffix == ".png":
            if not data.endswith(b"IEND\xaeB`\x82"):
                return "no PNG end chunk (cut short)"
        elif suffix == ".html":
            if not data.rstrip().endswith(b"</html>"):
                return "no closing </html> (cut short)"
        else:
            data.decode("utf-8")
    except Exception as exc:  # any failure to read it back is the finding
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    if not data:
        return "empty"
    return None


def output_problems(project: Path) -> list[str]:
    """Every output file (of any stage) that does not read back whole, and any temp file
    of an interrupted write inside an output folder (DVC would cache it with the folder)."""
    problems = []
    for outs in dvc_outputs(project).values():
        for out in outs:
            for file in _files(out):
                if file.name.startswith(".") and file.suffix == ".tmp":
                    problems.append(f"{file.relative_to(project)}: a temp file in an output")
                    continue
                why = file_problem(file)
                if why:
                    problems.append(f"{file.relative_to(project)}: {why}")
    return problems


def leftovers(project: Path) -> list[str]:
    """Temp files and folders of interrupted atomic writes (vmapcheck.io) beside outputs."""
    found = []
    for folder in ("data", "reports"):
        for path in (project / folder).rglob(".*"):
            if path.suffix == ".tmp" or (path.is_dir() and path.name.count(".") >= 2):
                found.append(str(path.relative_to(project)))
    return sorted(found)


# --- the store -----------------------------------------------------------------------------


def store_problems(uri: str) -> list[str]:
    """What the store must never hold after a recovery: a RUNNING run, two complete runs
    of one pipeline state, or the alias ``verified`` on a version whose run is not
    complete."""
    from mlflow.tracking import MlflowClient

    from vmapcheck.tracking.registry import VERIFIED, untrusted_because
    from vmapcheck.tracking.store import PIPELINE_KEY_TAG, is_complete

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000) if experiments else []
    problems = [
        f"run {r.info.run_id} ({r.info.run_name}) is RUNNING"
        for r in runs
        if r.info.status == "RUNNING"
    ]
    complete: dict[str, list[str]] = {}
    for r in runs:
        if is_complete(r):
            complete.setdefault(r.data.tags.get(PIPELINE_KEY_TAG, "?"), []).append(r.info.run_id)
    problems += [
        f"pipeline state {key[:12]}... has {len(ids)} complete runs: {ids}"
        for key, ids in complete.items()
        if len(ids) > 1
    ]
    for model in client.search_registered_models():
        with contextlib.suppress(Exception):
            version = client.get_model_version_by_alias(model.name, VERIFIED)
            why = untrusted_because(client, version)
            if why is not None:
                problems.append(
                    f"models:/{model.name}@{VERIFIED} -> version {version.version}: {why}"
                )
    return problems


def store_summary(uri: str) -> str:
    """One line for the fault table: runs by status, complete runs, where the alias is."""
    from mlflow.tracking import MlflowClient

    from vmapcheck.tracking.registry import VERIFIED, untrusted_because
    from vmapcheck.tracking.store import is_complete

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000) if experiments else []
    by_status: dict[str, int] = {}
    for r in runs:
        by_status[r.info.status] = by_status.get(r.info.status, 0) + 1
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    alias = "no alias"
    for model in client.search_registered_models():
        with contextlib.suppress(Exception):
            version = client.get_model_version_by_alias(model.name, VERIFIED)
            trust = untrusted_because(client, version) or "its run complete"
            alias = f"@{VERIFIED} -> v{version.version} ({trust})"
    return f"{len(runs)} runs ({statuses}; {sum(map(is_complete, runs))} complete); {alias}"


# The MLflow client calls of track, by what they do (issue 15: health, experiment, create
# run, log batch, artifacts, registry, alias); the health probe is plain HTTP (no client).
CLIENT_METHODS = (
    "search_experiments",
    "search_runs",
    "get_run",
    "get_experiment",
    "get_experiment_by_name",
    "create_experiment",
    "create_run",
    "log_batch",
    "log_inputs",
    "log_artifact",
    "log_artifacts",
    "set_tag",
    "set_terminated",
    "create_registered_model",
    "get_model_version_by_alias",
    "create_model_version",
    "set_registered_model_alias",
    "set_model_version_tag",
    # A pending alias move (registry.settle_pending_alias, move_verified_alias).
    "get_registered_model",
    "search_model_versions",
    "delete_model_version_tag",
)


@dataclass
class ClientFaults:
    """Wraps :data:`CLIENT_METHODS` of the real ``MlflowClient`` (install with
    :meth:`install` under a monkeypatch): each call is recorded, and the ``occurrence``-th
    call of ``method`` kills ``server`` first (``when="before"``) or while the real call
    is on its way (``when="during"``: a thread kills it ``delay_s`` after the call starts).
    The real call is always made: the client and the server stay real."""

    server: MlflowServer | None = None
    method: str | None = None
    occurrence: int = 1
    when: str = "before"
    delay_s: float = 0.0
    calls: list[str] = field(default_factory=list)
    hit: bool = False
    killed_at: float | None = None  # time.monotonic() when the server was killed

    def install(self, patch: Any) -> None:
        from mlflow.tracking import MlflowClient

        for name in CLIENT_METHODS:
            patch.setattr(MlflowClient, name, self._wrap(name, getattr(MlflowClient, name)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(client: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if (
                self.server is not None
                and not self.hit
                and name == self.method
                and self.calls.count(name) == self.occurrence
            ):
                self.hit = True
                if self.when == "before":
                    self._kill()
                else:
                    killer = threading.Timer(self.delay_s, self._kill)
                    killer.start()
                    try:
                        return real(client, *args, **kwargs)
                    finally:
                        killer.join()
            return real(client, *args, **kwargs)

        return call

    def _kill(self) -> None:
        assert self.server is not None
        self.server.kill()
        self.killed_at = time.monotonic()


# --- permissions and space ----------------------------------------------------------------


def unprivileged_prefix() -> tuple[list[str], str | None]:
    """A command prefix under which file permissions hold, and why there is none.

    Not root: none needed. Root ignores permissions through CAP_DAC_OVERRIDE (and
    CAP_DAC_READ_SEARCH); ``setpriv`` drops them from the bounding set, so the command it
    starts is refused like any user."""
    if os.geteuid() != 0:
        return [], None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return [], "running as root, which ignores file permissions, and no setpriv to drop that"
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    if probe.returncode != 0:
        return (
            [],
            f"running as root and setpriv cannot drop CAP_DAC_OVERRIDE here: {probe.stderr!r}",
        )
    return prefix, None


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` (e.g. "256k"), its contents copied in; on exit the
    contents are copied back and the tmpfs unmounted. Skips (pytest.skip) with the reason
    when the mount is refused (it needs root, or CAP_SYS_ADMIN in a container)."""
    import pytest

    saved = folder.with_name(folder.name + ".before-tmpfs")
    shutil.copytree(folder, saved)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        shutil.rmtree(saved)
        pytest.skip(f"cannot mount a small tmpfs on {folder}: {mounted.stderr.strip()}")
    try:
        shutil.copytree(saved, folder, dirs_exist_ok=True)
        yield folder
    finally:
        kept = folder.with_name(folder.name + ".on-tmpfs")
        shutil.copytree(folder, kept)
        subprocess.run(["umount", str(folder)], check=True)
        shutil.rmtree(folder)
        kept.rename(folder)
        shutil.rmtree(saved)


def fill(folder: Path, leave_bytes: int) -> Path:
    """Fill the file system of ``folder`` up to ``leave_bytes`` free; the filler file."""
    filler = folder / ".filler"
    free = shutil.disk_usage(folder).free - leave_bytes
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(free, 0))
    return filler
