"""One pipeline run at a time in a workspace: a second ``dvc exp run`` is refused before
it rewrites ``params.yaml`` under the first.

DVC composes ``params.yaml`` from ``conf/`` (its Hydra integration) before it finds a
pipeline already running in the workspace, so a second ``dvc exp run`` started meanwhile
rewrote the first one's settings, and only then was refused. vmapcheck closes that gap:

- the ``code`` stage, the first of every run, records the ``dvc`` process running it
  (:func:`mark_running`: pid, start time, command line) in ``.dvc/tmp/vmapcheck-run.json``;
  ``track``, the last, removes the record (:func:`clear_running`), whatever its outcome;
- ``conf/config.yaml`` reads ``seed`` through the resolver ``vmapcheck_idle``
  (:func:`idle`), which the composition of every ``dvc exp run -S``/``--queue`` and
  ``vmapcheck params`` evaluates. It refuses, naming the run, while the recorded ``dvc``
  process is alive and is not the caller's own: nothing has been written yet then.
  DVC's process finds the resolver through the Hydra plugin that this package installs
  (``hydra_plugins.vmapcheck_run_guard``); vmapcheck registers it too (:func:`register`).

A run that died leaves a record whose process is gone (or whose pid now belongs to
another process, told apart by its start time): it refuses nothing. Nothing here imports
JAX. track's check of the settings each stage ran with
(:func:`vmapcheck.pipeline.stage.settings_changed`) stays as the last line of defence.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

import psutil

from vmapcheck.errors import ArtifactError, first_line, redact
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.layout import Layout

RESOLVER = "vmapcheck_idle"
# The names of DVC's command, as its process shows in a command line.
_DVC_NAMES = ("dvc", "dvc.exe")


class PipelineRunningError(RuntimeError):
    """A vmapcheck pipeline is running in this workspace (raised inside the composition:
    OmegaConf and DVC show its message)."""


def _is_dvc(process: psutil.Process) -> bool:
    try:
        cmdline = process.cmdline()
    except (psutil.Error, OSError):
        return False
    words = [Path(word).name for word in cmdline[:3]]
    return any(word in _DVC_NAMES for word in words) or (
        len(cmdline) >= 3 and cmdline[1] == "-m" and cmdline[2] == "dvc"
    )


def dvc_ancestor() -> psutil.Process | None:
    """The nearest ``dvc`` process above this one (the one running this stage); None
    when a stage runs by hand."""
    try:
        process = psutil.Process(os.getpid()).parent()
        while process is not None:
            if _is_dvc(process):
                return process
            process = process.parent()
    except (psutil.Error, OSError):
        return None
    return None


def dvc_run_began() -> float | None:
    """When the ``dvc`` process running this stage started (seconds since the epoch): the
    stages that started after it are this pipeline run's. None outside DVC."""
    process = dvc_ancestor()
    try:
        return None if process is None else float(process.create_time())
    except (psutil.Error, OSError):
        return None


class RunningRecord(TypedDict):
    """``.dvc/tmp/vmapcheck-run.json`` (``Layout.running_record``): the ``dvc`` process
    running the pipeline (:func:`mark_running`), read by any other process in the
    workspace: its pid, its start time (seconds since the epoch: a reused pid has
    another) and its command line."""

    pid: int
    create_time: float
    cmdline: str


def mark_running(layout: Layout) -> None:
    """Record the ``dvc`` process running this pipeline (nothing when none: a stage run
    by hand, or a repository without ``.dvc/``)."""
    process = dvc_ancestor()
    if process is None or not layout.running_record.parent.parent.is_dir():
        return
    layout.running_record.parent.mkdir(parents=True, exist_ok=True)
    record: RunningRecord = {
        "pid": process.pid,
        "create_time": process.create_time(),
        "cmdline": " ".join(process.cmdline()),
    }
    atomic_write_json(layout.running_record, record)


def clear_running(layout: Layout) -> None:
    """Remove this run's record (only this run's: a record of another live process
    stays)."""
    record = _read(layout.running_record)
    process = dvc_ancestor()
    if record is None or (process is not None and record.get("pid") != process.pid):
        return
    layout.running_record.unlink(missing_ok=True)


def _read(path: Path) -> RunningRecord | None:
    """The running record at ``path``, or None where there is none that names a
    process: absent, not JSON, or without an integer pid (a record cut short or written
    by something else names no run). A missing start time or command line reads as 0
    (no process started then: the pid counts as reused) and ""."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("pid"), int):
        return None
    try:
        began = float(found.get("create_time", 0))
    except (TypeError, ValueError):
        began = 0.0
    return {"pid": found["pid"], "create_time": began, "cmdline": str(found.get("cmdline", ""))}


def running_elsewhere(layout: Layout) -> RunningRecord | None:
    """The record of a pipeline running in this workspace in another process tree than
    the caller's, or None (no record, its process gone or replaced, or an ancestor)."""
    record = _read(layout.running_record)
    if record is None:
        return None
    try:
        process = psutil.Process(record["pid"])
        if abs(process.create_time() - record["create_time"]) > 1.0:
            return None  # the pid was reused
        ours = {p.pid for p in psutil.Process(os.getpid()).parents()} | {os.getpid()}
    except (psutil.Error, OSError, ValueError, TypeError):
        return None
    return None if process.pid in ours else record


def _project_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return None


def idle(value: Any = 0) -> Any:
    """The resolver ``${vmapcheck_idle:<value>}``: ``value`` unchanged, unless a pipeline
    runs in this workspace in another process (the project: the nearest folder above the
    working directory holding ``.dvc/``).

    Raises:
        PipelineRunningError: naming the running ``dvc`` process and what to do.
    """
    root = _project_root(Path.cwd())
    record = running_elsewhere(Layout(root)) if root is not None else None
    if record is not None:
        began = datetime.datetime.fromtimestamp(record["create_time"]).strftime("%H:%M:%S")
        raise PipelineRunningError(
            f"vmapcheck: a pipeline is running in this workspace (`{record['cmdline']}`, "
            f"pid {record['pid']}, since {began}); composing params.yaml now would change its "
            "settings under it, so nothing was written. Wait until it ends (or stop it), "
            "then run this again; to run several experiments, queue them all first "
            "(`dvc exp run --queue -S ...`) and start them with `dvc queue start`"
        )
    return value


class CredentialInSettingError(ValueError):
    """A setting holds a credential (a URL's user or password, a token in a query): refused
    while Hydra composes params.yaml, before anything is written."""


def credential_settings(root: Any) -> list[str]:
    """The keys of the composed config ``root`` whose value holds a credential: a URL's
    user or password, or a query parameter named as one (what :func:`vmapcheck.errors.redact`
    hides), as ``key=<value redacted>``. Values are read unresolved: an interpolation is
    not a credential given in a setting."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    found = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                walk(child, f"{key}.{name}" if key else str(name))
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{key}[{i}]")
        elif isinstance(node, str) and redact(node) != node:
            found.append(f"{key}={redact(node)}")

    if isinstance(root, DictConfig | ListConfig):
        walk(OmegaConf.to_container(root, resolve=False), "")
    return found


def compose_guard(value: Any = 0, *, _root_: Any = None) -> Any:
    """The resolver ``${vmapcheck_idle:<value>}`` (conf/config.yaml's ``seed``), which runs
    in every process that composes params.yaml (``dvc exp run -S``, ``vmapcheck params``),
    before it is written: refuses a credential given in a setting (DVC would write it in
    plain text to params.yaml, then dvc.lock), then :func:`idle`.

    Raises:
        CredentialInSettingError: naming each key, its value redacted, and where
            credentials go instead.
        PipelineRunningError: see :func:`idle`.
    """
    found = credential_settings(_root_)
    if found:
        raise CredentialInSettingError(
            f"vmapcheck: a credential given in a setting ({'; '.join(found)}) would be "
            "written in plain text to params.yaml and dvc.lock, so nothing was written: give "
            "the URL without it, and the credentials in MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), which MLflow reads"
        )
    return idle(value)


def scrub_credentials(path: Path, stage: str) -> bool:
    """Rewrite ``path`` (params.yaml) with every credential in it redacted (``***``), when
    it holds one, saying so on stderr as ``stage``; whether it did. The stages call it
    before validating params.yaml: an override of ``seed`` (``-S seed=5``) replaces the
    interpolation that runs :func:`compose_guard`, so DVC may have written a credential
    there; validation then refuses the setting, and the secret does not stay in the file
    for ``git commit -a``."""
    try:
        # Only a regular file of a params.yaml's size: a FIFO or device would block or
        # never end here (read_params refuses them, naming the file).
        if not path.is_file() or path.stat().st_size > 2**20:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False  # unreadable: read_params says why
    scrubbed = redact(text)
    if scrubbed == text:
        return False
    from vmapcheck.io import atomic_write_text

    atomic_write_text(path, scrubbed)
    print(
        f"{stage}: {path}: a credential given in a setting was replaced by *** in the file "
        "(never kept there); the setting is refused below",
        file=sys.stderr,
    )
    return True


def register() -> None:
    """Register :func:`compose_guard` with OmegaConf (once; a second call changes nothing)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, compose_guard, use_cache=False)


# --- a stage the system killed ------------------------------------------------------


# Where the kernel counts the processes its out-of-memory killer ended, with the key:
# this cgroup's (v2, then v1), else the whole machine's.
OOM_COUNTERS = (
    (Path("/sys/fs/cgroup/memory.events"), "oom_kill"),
    (Path("/sys/fs/cgroup/memory/memory.oom_control"), "oom_kill"),
    (Path("/proc/vmstat"), "oom_kill"),
)


class OomCount(TypedDict):
    """How many processes the out-of-memory killer has ended so far, and the file read."""

    source: str
    count: int


class StageParams(TypedDict):
    """What a stage recorded of the params.yaml it ran with
    (:func:`vmapcheck.pipeline.stage.params_record`): its own dvc.yaml params keys, the
    sha256 of every key any stage declares, its own keys' leaves' sha256 (absent in
    records older than them) and the whole file's."""

    keys: list[str]
    sha256: dict[str, str]
    leaves: NotRequired[dict[str, str]]
    file_sha256: str


class StageTime(TypedDict):
    """``reports/stages/<stage>.json`` (:func:`vmapcheck.pipeline.stage.write_stage_time`):
    written by each stage, read by track, the summary and the run guard. Times in seconds
    since the epoch; ``end``, ``wall_s`` and ``exit_code`` None while the stage runs (and
    for ever when it was killed). Records older than ``params``, ``pid`` and ``oom_kills``
    lack them; ``error`` only where the stage stopped on one. (NotRequired is read by
    mypy here; at run time, under ``from __future__ import annotations``, no reader
    checks these keys: a record is refused only without its ``start``.)"""

    stage: str
    start: float
    end: float | None
    wall_s: float | None
    exit_code: int | None
    params: NotRequired[StageParams | None]
    pid: NotRequired[int]
    oom_kills: NotRequired[OomCount | None]
    error: NotRequired[str]


def oom_kills() -> OomCount | None:
    """``{"source": file, "count": n}``: how many processes the out-of-memory killer has
    ended so far, from the first of :data:`OOM_COUNTERS` that is readable; None on a
    system that counts none (macOS, Windows)."""
    for path, key in OOM_COUNTERS:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                return {"source": str(path), "count": int(parts[1])}
    return None


def _still_running(record: StageTime) -> bool:
    """Whether the process that wrote ``record`` still runs (the pid alone could be
    another process's since: its start time tells them apart)."""
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        process = psutil.Process(pid)
        # A killed process that nobody has reaped yet (its parent, DVC, killed with it)
        # is a zombie: it ended.
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= float(record["start"]) + 1.0
    except (psutil.Error, OSError, ValueError):
        return False


def killed_stage(record: StageTime) -> str | None:
    """Why the stage of time record ``record`` ended without an exit of its own (one
    line naming it), or None: it ended (well or with its error), or is still running.

    A stage writes its record's end whatever happens in Python, an error or Ctrl-C
    included; only a kill that no program can catch (SIGKILL: the system's
    out-of-memory killer, or a job's limit) or a native crash leaves it without one. The
    out-of-memory killer's count (:func:`oom_kills`) then says whether it was memory."""
    if record.get("end") is not None or _still_running(record):
        return None
    name = record.get("stage", "?")
    started = float(record["start"])
    when = datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    before, now = record.get("oom_kills"), oom_kills()
    head = f"stage {name} (started {when}) was killed before it finished, without an error"
    if before and now and now["source"] == before["source"] and now["count"] > before["count"]:
        return (
            f"{head}: the system's out-of-memory killer ended {now['count'] - before['count']}"
            f" process(es) since it started ({now['source']}: oom_kill {before['count']} -> "
            f"{now['count']}); it needs more memory than this machine gives it: a smaller "
            "model, data or batch setting, or a machine with more memory"
        )
    return (
        f"{head} of its own (SIGKILL, exit -9 or 137: most likely the system, for lack of "
        "memory, or a job's time limit; no out-of-memory kill counted here"
        + (f", {now['source']}" if now else "")
        + "); `dvc repro` runs it again"
    )


def read_stage_time(path: Path) -> StageTime:
    """A stage time record (``reports/stages/<stage>.json``), the one reader of them.
    Only ``start`` is checked: records older than a key lack it, and every reader takes
    the other keys with ``.get`` or as the writer wrote them.

    Raises:
        ArtifactError: not JSON, or not a record with a numeric ``start``.
    """
    record = read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("start"), int | float):
        raise ArtifactError(
            f"{path}: expected a stage time record with a numeric 'start' "
            "(written by vmapcheck.pipeline.stage.run_stage)"
        )
    return cast(StageTime, record)


def _stage_records(layout: Layout) -> list[StageTime]:
    """Every readable stage time record (``reports/stages/<stage>.json``), oldest start
    first; one that is not JSON or lacks its ``start`` is left out."""
    records: list[StageTime] = []
    folder = layout.stage_times
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(ArtifactError):
            records.append(read_stage_time(path))
    records.sort(key=lambda r: r["start"])
    return records


def failed_stages(layout: Layout) -> list[str]:
    """One line per stage whose last run stopped on an error (its record's ``error``,
    written by :func:`vmapcheck.pipeline.stage.run_stage`), oldest first: the stage, when
    it started, and the error's first line (the whole message is in
    ``reports/stages/<stage>.json``)."""
    lines = []
    for record in _stage_records(layout):
        if not isinstance(record.get("error"), str):
            continue
        stage = str(record.get("stage", "?"))
        when = datetime.datetime.fromtimestamp(float(record["start"]), datetime.UTC)
        lines.append(
            f"stage {stage} (started {when:%Y-%m-%d %H:%M:%S} UTC) failed: "
            f"{first_line(record['error'], limit=2000)} (whole message: "
            f"{layout.stage_time(stage)})"
        )
    return lines


def killed_stages(layout: Layout) -> list[str]:
    """:func:`killed_stage` for every stage record there is, oldest first: the stages
    of the last pipeline run that the system killed."""
    return [line for r in _stage_records(layout) if (line := killed_stage(r)) is not None]
