"""Logging one pipeline state once: its key, and settling earlier attempts and runs left
unfinished before ``track`` logs.

**Logging once.** ``track`` fails when the store does, so DVC records nothing and the next
``dvc repro`` runs it again on the reports left on disk (they are outputs of the earlier
stages, untouched). The failed attempt may have got as far as creating a run. So every
run carries the tag ``pipeline_key``: a sha256 over the contents of everything ``track``
depends on in ``dvc.yaml`` (its code, the reports, the params artifact) and the values of
its params keys (vmapcheck's config, not the project's own keys). A run stays RUNNING
while ``track`` logs into it; its last writes are the tag ``pipeline_complete=true`` and
then status FINISHED (FAILED for a failed check)
(:func:`~vmapcheck.tracking.store.mark_complete`).

**Before logging**, :func:`settle_earlier_attempts` marks runs FAILED (status FAILED,
tag ``vmapcheck.abandoned`` saying why, by which process and when); it never deletes a
run, since a run may be another run's ``perf_baseline``:

- an incomplete run with this key (an attempt that died half-way) is marked, and one
  fresh run is logged. Replacing rather than resuming it: logging into it again would
  add a second point to every metric's history and could mix two attempts' artifacts.
- a RUNNING run of any pipeline state whose ``track`` is gone (killed, e.g. SIGKILL) is
  marked (:func:`abandon_unfinished_runs`). Each run records the process that created it
  (tags ``vmapcheck.track_pid``, ``vmapcheck.track_pid_start``, ``vmapcheck.track_host``):
  on this host the process must be alive, a run from another host (or without those tags)
  counts as abandoned after ``ABANDONED_AFTER_S`` (6 h). So the RUNNING run of a parallel
  experiment (``dvc queue start -j 2`` against a server) is left alone.
- a complete one with this key is kept and nothing is logged again: ``track`` reports that
  run (this happens when ``track`` reran on the same inputs, e.g. after it failed to
  reach the store, or ``dvc repro -f``), so the store never holds two complete runs of one state.

Two ``track`` processes on the same inputs at the same moment would meet each other's
unfinished run; on a sqlite store the lock orders them, and DVC never runs one pipeline
state twice at once (a sweep's experiments differ in their params, and two identical ones
still differ in their benchmark timings, hence in their key).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from vmapcheck.errors import ArtifactError
from vmapcheck.io import sha256_file
from vmapcheck.layout import Layout
from vmapcheck.tracking.records import LoggedRun
from vmapcheck.tracking.store import (
    ABANDONED_TAG,
    HOST_TAG,
    PID_START_TAG,
    PID_TAG,
    PIPELINE_KEY_TAG,
    is_complete,
    proc_stat,
)

# A run still RUNNING after this long, whose process cannot be checked (another host, or
# no PID tag), is abandoned: no track of this project runs for hours.
ABANDONED_AFTER_S = 6 * 3600.0


# --- logging once -----------------------------------------------------------------------


def _param_values(project_root: Path, keys: list[str]) -> list[str]:
    """``key=<JSON of its value>`` in params.yaml for each dotted ``key`` (``null`` when
    absent), sorted; none when there is no params.yaml to read."""
    try:
        raw = yaml.safe_load(Layout(project_root).params_yaml.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    values = []
    for key in sorted(set(keys)):
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        values.append(f"{key}={json.dumps(node, sort_keys=True, default=str)}")
    return values


def pipeline_key(project_root: Path, stage: str = "track") -> str:
    """sha256 over the path and contents of every file ``stage`` depends on in dvc.yaml
    (folders: every file in them) and the params.yaml values of its params keys, i.e.
    over the inputs DVC reruns the stage for.

    Raises:
        ArtifactError: dvc.yaml is missing or has no such stage with a list of deps.
    """
    dvc_yaml = Layout(project_root).dvc_yaml
    try:
        declared = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"][stage]
        deps = declared["deps"]
        # Keys of params.yaml by name (dvc.yaml's short form, as init writes them).
        params = [k for k in declared.get("params") or [] if isinstance(k, str)]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(
            f"{dvc_yaml}: cannot read the deps of stage {stage!r} ({type(exc).__name__})"
        ) from None
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ArtifactError(f"{dvc_yaml}: stages.{stage}.deps: expected a list of paths")
    # Version 2: params by key (version 1 hashed params.yaml whole, a key of the
    # project's own included).
    digest = hashlib.sha256(f"vmapcheck pipeline key 2\0{stage}\0".encode())
    for dep in sorted(set(deps)):
        path = project_root / dep
        # Bytecode caches are not the state (.dvcignore leaves them out of DVC's hashes too).
        files = (
            sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if path.is_dir()
            else [path]
        )
        for file in files:
            digest.update(file.relative_to(project_root).as_posix().encode() + b"\0")
            digest.update((sha256_file(file) if file.is_file() else "missing").encode() + b"\0")
    for value in _param_values(project_root, params):
        digest.update(f"param\0{value}\0".encode())
    return digest.hexdigest()


def _experiment_ids(client: Any) -> list[str]:
    ids: list[str] = []
    token = None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        ids += [e.experiment_id for e in page]
        token = page.token
        if not token:
            return ids


def tracked_runs(uri: str, filter_string: str) -> list[Any]:
    """Active runs matching ``filter_string`` in any experiment, newest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    ids = _experiment_ids(client)
    runs: list[Any] = []
    for i in range(0, len(ids), 50):
        token = None
        while True:
            page = client.search_runs(
                ids[i : i + 50],
                filter_string=filter_string,
                max_results=1000,
                order_by=["attributes.start_time DESC"],
                page_token=token,
            )
            runs += page
            token = page.token
            if not token:
                break
    return sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True)


def runs_with_key(uri: str, key: str) -> list[Any]:
    """Active runs tagged ``pipeline_key=key`` in any experiment, newest first."""
    return tracked_runs(uri, f"tags.{PIPELINE_KEY_TAG} = '{key}'")


# --- before logging: earlier attempts and abandoned runs --------------------------------


def _alive_here(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host runs, and is the one started at ``start``."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process: it exists
    except (OSError, OverflowError):  # no such process (ProcessLookupError), or no valid PID
        return False
    stat = proc_stat(pid)
    if not stat:
        return sys.platform != "linux"  # no /proc to ask: the PID is all there is
    if stat[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return False
    return start is None or len(stat) <= 19 or stat[19] == start


def gone_because(run: Any, now_s: float | None = None) -> str | None:
    """Why the track that created ``run`` is gone (None: it may still be running).

    From the run's :func:`~vmapcheck.tracking.store.owner_tags`: on this host, the process
    must be alive; from another host (or without a PID), the run must be younger than
    ``ABANDONED_AFTER_S``.
    """
    tags = run.data.tags
    host, pid_tag = tags.get(HOST_TAG), tags.get(PID_TAG, "")
    pid = int(pid_tag) if pid_tag.isdigit() and int(pid_tag) > 0 else None
    if host == socket.gethostname() and pid is not None:
        if _alive_here(pid, tags.get(PID_START_TAG)):
            return None
        return f"its process {pid} on {host} is gone"
    age_s = (now_s if now_s is not None else time.time()) - (run.info.start_time or 0) / 1000
    if age_s < ABANDONED_AFTER_S:
        return None
    where = f"on another host ({host})" if host else "by a track that recorded no process"
    return f"it started {age_s / 3600:.1f} h ago {where}; no track runs that long"


def mark_failed(uri: str, run_id: str, why: str) -> None:
    """Set run ``run_id``'s status to FAILED, with tag ``vmapcheck.abandoned`` saying why
    and by which process, when."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    by = f"marked FAILED by the track of process {os.getpid()} on {socket.gethostname()} at {stamp}"
    client.set_tag(run_id, ABANDONED_TAG, f"{why}; {by}"[:5000])
    client.set_terminated(run_id, status="FAILED")


def abandon_unfinished_runs(uri: str) -> list[str]:
    """Mark FAILED every RUNNING run of a ``track`` (any pipeline state, any experiment)
    whose process is gone (:func:`gone_because`); return their ids. A run of a live
    ``track`` (a parallel experiment, this process) is left alone."""
    marked = []
    running = f"attributes.status = 'RUNNING' and tags.{PIPELINE_KEY_TAG} LIKE '%'"
    for run in tracked_runs(uri, running):
        gone = gone_because(run)
        if gone is None:
            continue
        why = f"left RUNNING by a track that did not finish ({gone})"
        mark_failed(uri, run.info.run_id, why)
        print(f"track: marked run {run.info.run_id} ({run.info.run_name}) FAILED: {why}")
        marked.append(run.info.run_id)
    return marked


def settle_earlier_attempts(uri: str, key: str) -> LoggedRun | None:
    """Before ``track`` reads the store: mark FAILED the incomplete runs of pipeline state
    ``key`` and the abandoned runs of any state (:func:`abandon_unfinished_runs`); return
    the complete run of ``key``, if any, as ``track`` reports a run (ids, names, verdicts,
    git state), else None. Nothing is deleted: a run may be another's ``perf_baseline``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = runs_with_key(uri, key)
    complete = [r for r in runs if is_complete(r)]
    for run in runs:
        tags = run.data.tags
        if is_complete(run) or (run.info.status == "FAILED" and tags.get(ABANDONED_TAG)):
            continue
        why = (
            f"an earlier attempt on the same inputs (pipeline_key {key[:12]}...) that did not "
            f"finish (status {run.info.status})"
        )
        mark_failed(uri, run.info.run_id, why)
        print(f"track: marked run {run.info.run_id} ({run.info.run_name}) FAILED: {why}")
    abandon_unfinished_runs(uri)
    if not complete:
        return None
    run = complete[0]
    tags = run.data.tags
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "experiment_id": run.info.experiment_id,
        "tracking_uri": uri,
        "verdict": tags.get("verdict", "unknown"),
        "perf_verdict": tags.get("perf_verdict", "unknown"),
        "git_commit": tags.get("git_commit", "unknown"),
        "git_dirty": tags.get("git_dirty", "unknown"),
        "logged_before": True,
    }
