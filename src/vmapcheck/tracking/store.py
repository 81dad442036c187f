"""The MLflow store a run reaches: where it is, how long to wait for it, and logging once.

**Where.** ``tracking.tracking_uri``, or ``MLFLOW_TRACKING_URI`` when set (MLflow's own
convention). A relative ``sqlite:///mlflow.db`` and a relative ``tracking.artifact_root``
are resolved against the *store root* (:func:`store_root`): the project root, except in an
experiment queued with ``dvc exp run --queue`` and run by ``dvc queue start``. Those run in
a temporary copy of the repository under ``<repo>/.dvc/tmp/exps/``, deleted afterwards,
and DVC passes the original repository's root to every stage in ``DVC_ROOT``
(``dvc/repo/experiments/queue/base.py``). When the project root lies inside
``<DVC_ROOT>/.dvc/tmp/``, ``DVC_ROOT`` is the store root: every experiment of a sweep
reaches the one store of the repository it was queued from.

**Creating it once.** MLflow creates the sqlite schema the first time a process opens the
file; two processes doing that at once can fail half-way and leave a broken store.
:func:`open_store` creates it under an exclusive ``fcntl`` lock on ``<db>.lock``, and
``track`` keeps that lock while it reads and writes the store (:func:`writer_lock`), so
parallel experiments log one after the other (a few seconds each) rather than meeting
sqlite's "database is locked". ``vmapcheck store init`` creates the store and the
configured model's experiment before a sweep starts (and migrates a store made by an
older MLflow, after a backup: ``track`` never migrates on its own).

**How long.** By default MLflow retries a failed request 7 times with exponential backoff
and waits up to 120 s per attempt: about four minutes on a dead server. The
``tracking.http_*`` settings go into MLflow's own variables (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
``..._MAX_RETRIES``, ``..._BACKOFF_FACTOR``, ``..._BACKOFF_JITTER``, which
``mlflow.utils.rest_utils.http_request`` reads on every request, artifact uploads
included) before the first request. They replace values already in the environment: the
config is what the run records. A server is probed first (``GET <uri>/health``, one
attempt of at most ``http_timeout_s``), so a stopped server fails ``track`` within
seconds with a :class:`~vmapcheck.errors.TrackingStoreError` naming the URI; a server
that stops answering later is recognized by :func:`reaching`, which probes again.

**Logging once.** ``track`` fails when the store does, so DVC records nothing and the next
``dvc repro`` runs it again on the reports left on disk (they are outputs of the earlier
stages, untouched). The failed attempt may have got as far as creating a run. So every
run carries the tag ``pipeline_key``: a sha256 over the contents of everything ``track``
depends on in ``dvc.yaml`` (its code, ``params.yaml``, the reports, the params
artifact). A run stays RUNNING while ``track`` logs into it; its last writes are the tag
``pipeline_complete=true`` and then status FINISHED (:func:`mark_complete`).

**Complete runs.** A run is *complete* when its status is FINISHED, it has
``pipeline_complete=true`` and a ``verdict`` tag (:data:`COMPLETE_FILTER` for MLflow
searches, :func:`is_complete` on a run). Only complete runs are trusted: the benchmark
baseline ``last-verified``, a baseline named by run id, registry rollback and loading.
``vmapcheck compare`` lists every run but shows an incomplete one by its status.

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
  run (this happens when ``track`` reran on the same inputs, e.g. after a failed check made
  it exit 1, or ``dvc repro -f``), so the store never holds two complete runs of one state.

Two ``track`` processes on the same inputs at the same moment would meet each other's
unfinished run; on a sqlite store the lock orders them, and DVC never runs one pipeline
state twice at once (a sweep's experiments differ in their params, and two identical ones
still differ in their benchmark timings, hence in their key).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml

from vmapcheck.config import Config, TrackingConfig, load_config, tracking_uri_problem
from vmapcheck.errors import ArtifactError, ConfigError, TrackingStoreError, VmapcheckError
from vmapcheck.io import sha256_file
from vmapcheck.layout import Layout

PIPELINE_KEY_TAG = "pipeline_key"
COMPLETE_TAG = "pipeline_complete"
VERDICT_TAG = "verdict"
# A run's model contract digest (vmapcheck.params_io.contract_digest): last-verified
# takes only a run with the judged run's (tracking.log sets it).
MODEL_CONTRACT_TAG = "model_contract_sha256"
# The saved runs-table view vmapcheck writes (tracking.log), loaded when a URL holds
# ``viewStateShareKey=<key>`` (tracking.ui builds such URLs).
VIEW_KEY = "vmapcheck-summary"
# Which track process a run belongs to (set when it is created): a run left unfinished by a
# process that is gone is abandoned, one of a live process (a parallel experiment) is not.
PID_TAG = "vmapcheck.track_pid"
PID_START_TAG = "vmapcheck.track_pid_start"
HOST_TAG = "vmapcheck.track_host"
# Why a run was marked FAILED by a later track (its process was gone, or it was replaced).
ABANDONED_TAG = "vmapcheck.abandoned"
# A run still RUNNING after this long, whose process cannot be checked (another host, or
# no PID tag), is abandoned: no track of this project runs for hours.
ABANDONED_AFTER_S = 6 * 3600.0
# The one definition of a complete run, as an MLflow search filter (is_complete: the same
# on a Run): status FINISHED, pipeline_complete=true, and a verdict.
COMPLETE_FILTER = (
    f"attributes.status = 'FINISHED' and tags.{COMPLETE_TAG} = 'true' "
    f"and tags.{VERDICT_TAG} LIKE '%'"
)
SQLITE = "sqlite:///"
# How long track waits for another process (a parallel experiment) to finish logging to
# the same sqlite file before giving up.
LOCK_WAIT_S = 900.0
# MLflow's variables for the tracking.http_* settings (mlflow/environment_variables.py).
HTTP_ENV = {
    "http_timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "http_max_retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "http_backoff_factor": "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "http_backoff_jitter": "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
}


# --- where ------------------------------------------------------------------------------


def store_root(project_root: Path) -> Path:
    """The folder a relative store path is resolved against (see the module docstring)."""
    root = project_root.resolve()
    original = os.environ.get("DVC_ROOT", "").strip()
    if original:
        original_root = Path(original).resolve()
        # Only a temp copy inside that repository's own .dvc/tmp: a DVC_ROOT left over from
        # another project must not redirect this one's runs.
        if root.is_relative_to(original_root / ".dvc" / "tmp"):
            return original_root
    return root


def tracking_uri(tracking: TrackingConfig, project_root: Path) -> str:
    """``MLFLOW_TRACKING_URI`` when set and non-empty, else ``tracking.tracking_uri``; a
    relative ``sqlite:///file.db`` is made absolute against :func:`store_root`.

    Raises:
        ConfigError: ``MLFLOW_TRACKING_URI`` names no store MLflow supports here (the
            configured URI was validated with the config).
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        problem = tracking_uri_problem(uri)
        if problem:
            raise ConfigError(f"MLFLOW_TRACKING_URI: {problem}, found {shown(uri)!r}")
    else:
        uri = tracking.tracking_uri
    if uri.startswith(SQLITE) and not uri[len(SQLITE) :].startswith("/"):
        return SQLITE + str((store_root(project_root) / uri[len(SQLITE) :]).resolve())
    return uri


def artifact_location(tracking: TrackingConfig, project_root: Path) -> str | None:
    """Where a new experiment keeps its artifacts; None: the server's own store.

    A local folder means nothing to a server (it would be a path on this machine that the
    server and other clients never see), so with an HTTP store only a URI is passed on.
    """
    root = tracking.artifact_root
    if root is None:
        return None
    if "://" in root:
        return root
    if is_http(tracking_uri(tracking, project_root)):
        return None
    return (store_root(project_root) / root).resolve().as_uri()


def resolve_tracking_uri(tracking: TrackingConfig, root: Path) -> str:
    """The store to log to: ``MLFLOW_TRACKING_URI`` when set and non-empty (MLflow's own
    convention; the scheduled CI job names its server this way), else the configured URI,
    with a relative ``sqlite:///file.db`` made absolute against the store root (the
    project root; in a queued experiment's temp copy, the original repository's root:
    vmapcheck.tracking.store).

    Every use of the store starts here, so this also puts the ``tracking.http_*``
    timeouts and retries into MLflow's environment variables (bounded waiting on a server).
    """
    apply_http_settings(tracking)
    return tracking_uri(tracking, root)


def resolve_artifact_root(tracking: TrackingConfig, root: Path) -> str | None:
    """Artifact location of a new experiment; None: the tracking server's own store."""
    return artifact_location(tracking, root)


def experiment_name(config: Config) -> str:
    """The run's experiment: ``tracking.experiment`` (one per project, every model's
    runs, told apart by their tag ``model``: the default), or
    ``<tracking.experiment>-<model.name>`` with ``tracking.experiment_per_model``."""
    base = config.tracking.experiment
    return f"{base}-{config.model.name}" if config.tracking.experiment_per_model else base


def model_experiments(config: Config) -> list[str]:
    """Every experiment that may hold runs of this config's model, the one it logs to
    first: ``tracking.experiment`` and ``<tracking.experiment>-<model.name>``.

    Runs logged before the project's experiment became the default (one experiment per
    model) stay where they are; lookups of this model's runs (the benchmark's
    ``last-verified`` baseline) search both layouts, by tag ``model``."""
    base = config.tracking.experiment
    names = [experiment_name(config), base, f"{base}-{config.model.name}"]
    return list(dict.fromkeys(names))


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def shown(uri: str) -> str:
    """``uri`` without a user name or password, for messages."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:////abs/path.db`` URI, else None."""
    if not uri.startswith(SQLITE):
        return None
    return Path(uri[len(SQLITE) :].split("?", 1)[0])


# Tables every MLflow sqlite store has (a database with tables but none of these is not
# an MLflow store).
MLFLOW_TABLES = {"experiments", "runs", "alembic_version"}

# Below this much free space on a sqlite store's disk, logging a run (a few MB of
# artifacts and rows) is refused before it starts.
MIN_FREE_MB = 64


def sqlite_problem(path: Path, write: bool = True) -> str | None:
    """Why the sqlite store ``path`` cannot be used now, with the way out; None when it
    can (or does not exist yet: it is created). Checks, without changing the file: that
    it is an SQLite database passing ``PRAGMA quick_check``, and with ``write`` that it
    and its folder are writable (SQLite writes a journal beside it) and that the disk
    has :data:`MIN_FREE_MB` free."""
    import sqlite3

    if not path.exists():
        return None
    if not path.is_file():
        return (
            "is a folder (or another kind of file), not an SQLite database file: move it "
            "aside, or set tracking.tracking_uri to a file"
        )
    # A write cut short (a full disk, a killed process) leaves a hot journal beside the
    # file, which a read-only connection cannot roll back: SQLite does it on the next
    # read-write open, as MLflow's would. Opened so here, the store is judged as MLflow
    # will find it, not called corrupt.
    journal = path.with_name(path.name + "-journal")
    recover = journal.is_file() and journal.stat().st_size > 0 and os.access(path, os.W_OK)
    opened = str(path) if recover else f"file:{path}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(opened, uri=not recover)) as db:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):  # another writer holds it: not a fault of the file
            return (
                f"is locked by another process writing it ({first_line(exc)}): a `track` "
                "or `vmapcheck store init` running? Try again once it ends"
            )
        return (
            f"is not a readable SQLite database ({first_line(exc)}): restore it from a "
            f"backup ({path.name}.bak-* beside it, if any), or move it aside and make a new "
            "store with `vmapcheck store init`"
        )
    if verdict != "ok":
        return (
            f"fails SQLite's integrity check ({first_line(verdict)}): restore it from a "
            f"backup ({path.name}.bak-* beside it, if any) before logging to it"
        )
    if tables and not tables & MLFLOW_TABLES:
        # Another program's database: MLflow would add its own tables into it.
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (
            f"is another program's SQLite database (tables {listed}; none of MLflow's "
            "experiments, runs): set tracking.tracking_uri to a file of its own"
        )
    if not write:
        return None
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        which = path if not os.access(path, os.W_OK) else path.parent
        return (
            f"is read-only here ({which} is not writable by this user): make it writable "
            "(chmod u+w), or set tracking.tracking_uri to a store you can write"
        )
    free_mb = shutil.disk_usage(path.parent).free / 2**20
    if free_mb < MIN_FREE_MB:
        return (
            f"has {free_mb:.0f} MB free on its disk, under the {MIN_FREE_MB} MB a run needs: "
            "free space there, or set tracking.tracking_uri to a store on another disk"
        )
    return None


def require_usable_store(uri: str, write: bool = True) -> None:
    """Refuse a local store that is corrupt, read-only or on a full disk, in one line
    naming it, the fault and the way out (:func:`sqlite_problem`); a server is probed
    elsewhere (:func:`probe`).

    Raises:
        TrackingStoreError: the store's problem.
    """
    path = sqlite_file(uri)
    problem = sqlite_problem(path, write) if path is not None else None
    if problem:
        raise TrackingStoreError(f"the MLflow store {path} {problem}")


@contextlib.contextmanager
def store_faults(uri: str) -> Iterator[None]:
    """A local store failing while it is written (disk full, I/O error, read-only, a
    corrupt page) becomes one :class:`TrackingStoreError` naming the store and the fault;
    the run it was logging is left unfinished, and the next ``track`` marks it FAILED
    (:func:`settle_earlier_attempts`). Any other error passes unchanged."""
    path = sqlite_file(uri)
    # MLflow logs each database error with its traceback before it raises it again: the
    # error itself is reported below (one line), or passes on unchanged.
    db_log = logging.getLogger("mlflow.store.db.utils")
    level = db_log.level
    db_log.setLevel(logging.CRITICAL)
    try:
        yield
    except TrackingStoreError:
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        faults = {
            "database or disk is full": "the disk is full",
            "disk I/O error": "a disk I/O error (a full disk, or a file size limit)",
            "readonly database": "it is read-only",
            "file is not a database": "it is not an SQLite database (corrupt?)",
            "database disk image is malformed": "it is corrupt",
            "No space left on device": "the disk is full",
            "File too large": "a file size limit was reached",
        }
        found = next((why for key, why in faults.items() if key in text), None)
        if path is None or found is None:
            raise
        raise TrackingStoreError(
            f"the MLflow store {path} failed while this run was logged: {found} "
            f"({first_line(exc)}); the run is left unfinished and the next `track` marks "
            "it FAILED. Free space or fix the file, then `dvc repro` again "
            "(`vmapcheck store probe` checks the store)"
        ) from None
    finally:
        db_log.setLevel(level)


def require_existing_store(uri: str, action: str) -> None:
    """Refuse a sqlite store whose file does not exist, for ``action`` (what needed it),
    rather than letting MLflow create an empty store where a user mistyped its path.

    Raises:
        TrackingStoreError: naming the file, what it was needed for and how it is made.
    """
    path = sqlite_file(uri)
    if path is not None and not path.exists():
        raise TrackingStoreError(
            f"no MLflow store at {path} (tracking.tracking_uri, or MLFLOW_TRACKING_URI when "
            f"set): {action} needs an existing one, and none is created here; check the "
            "path, or make the store with `vmapcheck store init` or a first `dvc repro`"
        )
    # Read: a corrupt file is named here rather than by a traceback from MLflow.
    require_usable_store(uri, write=False)


# --- how long ---------------------------------------------------------------------------


def http_settings(tracking: TrackingConfig) -> dict[str, str]:
    """MLflow's environment variables for the ``tracking.http_*`` settings."""
    return {
        HTTP_ENV["http_timeout_s"]: str(tracking.http_timeout_s),
        HTTP_ENV["http_max_retries"]: str(tracking.http_max_retries),
        HTTP_ENV["http_backoff_factor"]: str(tracking.http_backoff_factor),
        HTTP_ENV["http_backoff_jitter"]: repr(float(tracking.http_backoff_jitter)),
    }


def apply_http_settings(tracking: TrackingConfig) -> dict[str, str]:
    """Put the settings into this process's environment (before any MLflow request)."""
    values = http_settings(tracking)
    os.environ.update(values)
    return values


def worst_request_s(tracking: TrackingConfig) -> float:
    """The longest one request can take against a server that accepts connections but
    never answers: every attempt times out, with urllib3's backoff in between (no sleep
    before the first retry, then factor x 2, 4, ... s, plus up to the jitter each)."""
    retries = tracking.http_max_retries
    sleeps = [tracking.http_backoff_factor * 2 ** (k - 1) for k in range(2, retries + 1)]
    return (
        (retries + 1) * tracking.http_timeout_s
        + sum(min(s, 120) for s in sleeps)
        + len(sleeps) * tracking.http_backoff_jitter
    )


def health(uri: str, timeout_s: float) -> str | None:
    """Why ``GET <uri>/health`` failed (one attempt), or None when the server answers OK."""
    # A user and password in the URL (MLFLOW_TRACKING_URI may hold them) go as HTTP basic
    # auth, as MLflow sends them; urllib would take them for part of the host name.
    parts = urlsplit(uri)
    request = urllib.request.Request(shown(uri).rstrip("/") + "/health")
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status == 200:
                return None
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout_s:g} s"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror.lower()
        return str(reason)[:200]
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (exc.strerror or type(exc).__name__).lower()


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """The first line of ``error``'s message, at most about ``limit`` characters.

    A longer line keeps its start and its end (where an HTTP client puts the cause, e.g.
    "Connection refused"), joined by " ... " and cut at spaces, never mid-word.
    """
    line = (str(error).splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    half = (limit - 5) // 2
    head = line[:half]
    head = head[: head.rfind(" ")] if " " in head else head
    tail = line[-half:]
    tail = tail[tail.find(" ") + 1 :] if " " in tail else tail
    return f"{head.rstrip()} ... {tail.lstrip()}"


def _unreachable(uri: str, why: str, seconds: float, when: str = "") -> str:
    return (
        f"the MLflow tracking server {shown(uri)} does not answer{when} (GET /health: {why}; "
        f"gave up after {seconds:.1f} s). Nothing was lost: the reports are on disk (reports/); "
        "once the server answers, `dvc repro` reruns track and logs them as one run. Check "
        "tracking.tracking_uri (or MLFLOW_TRACKING_URI) if the server moved."
    )


def probe(uri: str, tracking: TrackingConfig) -> None:
    """Raise :class:`TrackingStoreError` naming ``uri`` unless the server answers."""
    started = time.monotonic()
    why = health(uri, tracking.http_timeout_s)
    if why is not None:
        raise TrackingStoreError(_unreachable(uri, why, time.monotonic() - started))


@contextlib.contextmanager
def reaching(uri: str, tracking: TrackingConfig) -> Iterator[None]:
    """Report a failure of the store's requests as the server going away, when it has.

    MLflow raises its own errors (after the bounded retries) for a server that stopped
    answering; this probes the server again and, if it is down, replaces them by one
    :class:`TrackingStoreError` naming the URI. Any other error passes unchanged.
    """
    started = time.monotonic()
    try:
        yield
    except TrackingStoreError:
        raise
    except Exception as exc:
        if not is_http(uri):
            raise
        why = health(uri, tracking.http_timeout_s)
        if why is None:
            raise
        first = first_line(exc)
        raise TrackingStoreError(
            _unreachable(uri, why, time.monotonic() - started, " any more")
            + f" (the request that failed: {type(exc).__name__}: {first})"
        ) from None


# --- creating it once -------------------------------------------------------------------

_held: set[Path] = set()


@contextlib.contextmanager
def writer_lock(uri: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Exclusive use of a sqlite store among processes (``<db>.lock``); no-op otherwise.

    Re-entrant within a process. Waits at most ``wait_s`` for another holder.
    """
    path = sqlite_file(uri)
    if path is None:
        yield
        return
    lock = path.with_name(path.name + ".lock")
    if lock in _held:
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingStoreError(
                        f"the MLflow store {path} stayed locked by another process for "
                        f"{wait_s:.0f} s ({lock}); is a stuck `track` still running?"
                    ) from None
                if not told:
                    print(f"waiting for another process logging to {path} ...", file=sys.stderr)
                    told = True
                time.sleep(0.2)
        _held.add(lock)
        try:
            yield
        finally:
            _held.discard(lock)
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_sqlite_store(uri: str, migrate: bool = False, artifact_root: str | None = None) -> None:
    """Create the sqlite store's schema if missing (call under :func:`writer_lock`).

    A new store's ``Default`` experiment keeps its artifacts under ``artifact_root`` (a
    ``file://`` URI, :func:`artifact_location`) rather than MLflow's ``./mlruns`` of the
    working directory, which in a queued experiment is a temporary copy deleted when the
    experiment ends. A store made by an older MLflow is migrated only when ``migrate``
    (after copying the file to ``<db>.bak-<UTC time>``); otherwise it is an error saying
    how to migrate.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    path = sqlite_file(uri)
    assert path is not None, uri
    path.parent.mkdir(parents=True, exist_ok=True)
    if artifact_root is not None and not path.exists():
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        # Making the store object creates the schema and the Default experiment.
        SqlAlchemyStore(uri, artifact_root)
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        return
    except MlflowException as exc:
        if "out-of-date database schema" not in str(exc):
            raise TrackingStoreError(
                f"the MLflow store {path} cannot be opened: {first_line(exc)}"
            ) from None
    if not migrate:
        raise TrackingStoreError(
            f"the MLflow store {path} was made by an older MLflow; migrate it once with "
            "`vmapcheck store init` (it keeps a backup of the file)"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    backup = path.with_name(f"{path.name}.bak-{stamp}")
    shutil.copy2(path, backup)
    print(f"migrating {path} to this MLflow's schema (backup: {backup})")
    done = subprocess.run(
        [sys.executable, "-m", "mlflow", "db", "upgrade", uri], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise TrackingStoreError(
            f"migrating the MLflow store {path} failed (`mlflow db upgrade`, exit "
            f"{done.returncode}); the file before migration is {backup}"
        )


def open_store(tracking: TrackingConfig, project_root: Path) -> str:
    """Make the configured store ready to log to, and return its URI.

    Applies the HTTP settings, then: a server must answer its health probe; a sqlite
    file is created once, under the lock, if missing.
    """
    apply_http_settings(tracking)
    uri = tracking_uri(tracking, project_root)
    if is_http(uri):
        probe(uri, tracking)
    elif sqlite_file(uri) is not None:
        require_usable_store(uri)
        with writer_lock(uri), store_faults(uri):
            create_sqlite_store(uri, artifact_root=artifact_location(tracking, project_root))
    return uri


def ensure_experiment(uri: str, name: str, artifact_location: str | None) -> str:
    """Id of experiment ``name``, created if missing (another process may create it at the
    same moment: then its id)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


# --- logging once -----------------------------------------------------------------------


def pipeline_key(project_root: Path, stage: str = "track") -> str:
    """sha256 over the path and contents of every file ``stage`` depends on in dvc.yaml
    (folders: every file in them), i.e. over the inputs DVC reruns the stage for.

    Raises:
        ArtifactError: dvc.yaml is missing or has no such stage with a list of deps.
    """
    dvc_yaml = Layout(project_root).dvc_yaml
    try:
        deps = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"][stage]["deps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ArtifactError(
            f"{dvc_yaml}: cannot read the deps of stage {stage!r} ({type(exc).__name__})"
        ) from None
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ArtifactError(f"{dvc_yaml}: stages.{stage}.deps: expected a list of paths")
    digest = hashlib.sha256(f"vmapcheck pipeline key 1\0{stage}\0".encode())
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


# --- complete runs ----------------------------------------------------------------------


def complete_filter(*conditions: str) -> str:
    """:data:`COMPLETE_FILTER` and ``conditions`` (MLflow filter strings) joined by ``and``:
    what every search for runs to trust (baselines, last-verified) passes to MLflow."""
    return " and ".join([COMPLETE_FILTER, *(c for c in conditions if c)])


def is_complete(run: Any) -> bool:
    """:data:`COMPLETE_FILTER` on one MLflow ``Run`` (and the run is not deleted)."""
    return incomplete_because(run) is None


def incomplete_because(run: Any) -> str | None:
    """Why ``run`` is not a complete run, e.g. "its status is FAILED (...)" (None: it is);
    callers name the run."""
    info, tags = run.info, run.data.tags
    if info.lifecycle_stage != "active":
        return "it was deleted"
    if info.status != "FINISHED":
        why = f"its status is {info.status}"
        return why + (f" ({tags[ABANDONED_TAG]})" if tags.get(ABANDONED_TAG) else "")
    if tags.get(COMPLETE_TAG) != "true":
        return f"it has no tag {COMPLETE_TAG}=true (the track that logged it did not finish)"
    if not tags.get(VERDICT_TAG):
        return f"it has no {VERDICT_TAG} tag"
    return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3 on of ``/proc/<pid>/stat`` (state first; starttime at index 19), None where
    there is no such file (the process is gone, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def owner_tags() -> dict[str, str]:
    """The tags naming this process, set on a run when it is created: its PID, the PID's
    start time where /proc has it (a PID is reused; the pair names one process), the host."""
    pid = os.getpid()
    tags = {PID_TAG: str(pid), HOST_TAG: socket.gethostname()}
    stat = _proc_stat(pid)
    if stat is not None and len(stat) > 19:
        tags[PID_START_TAG] = stat[19]
    return tags


def _alive_here(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host runs, and is the one started at ``start``."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process: it exists
    except (OSError, OverflowError):  # no such process (ProcessLookupError), or no valid PID
        return False
    stat = _proc_stat(pid)
    if not stat:
        return sys.platform != "linux"  # no /proc to ask: the PID is all there is
    if stat[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return False
    return start is None or len(stat) <= 19 or stat[19] == start


def gone_because(run: Any, now_s: float | None = None) -> str | None:
    """Why the track that created ``run`` is gone (None: it may still be running).

    From the run's :func:`owner_tags`: on this host, the process must be alive; from
    another host (or without a PID), the run must be younger than ``ABANDONED_AFTER_S``.
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


# --- before logging: earlier attempts and abandoned runs --------------------------------


def settle_earlier_attempts(uri: str, key: str) -> dict[str, Any] | None:
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


def mark_complete(uri: str, run_id: str) -> None:
    """The last writes of a run: tag ``pipeline_complete=true``, then status FINISHED.
    From then on it is a complete run (see the module docstring)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    client.set_tag(run_id, COMPLETE_TAG, "true")
    client.set_terminated(run_id, status="FINISHED")


# --- command line -----------------------------------------------------------------------


def run_store(layout: Layout, verb: str) -> int:
    """``vmapcheck store init|where|probe`` for the project ``layout``.

    init: create (or migrate) the store and the experiment, e.g. before a sweep; where:
    print the store and artifact location; probe: check a server answers. Exit 2 with
    ``store: error: ...`` on stderr when the store cannot be reached or made.
    """
    try:
        config = load_config(layout.params_yaml)
        tracking = config.tracking
        apply_http_settings(tracking)
        uri = tracking_uri(tracking, layout.root)
        location = artifact_location(tracking, layout.root)
        if verb == "where":
            print(f"store: {shown(uri)}")
            print(f"artifacts of new experiments: {location or 'the server decides'}")
            return 0
        if is_http(uri):
            probe(uri, tracking)
            print(f"{shown(uri)} answers")
        elif verb == "probe":
            path = sqlite_file(uri)
            if path is None or not path.exists():
                print(f"{shown(uri)}: no store there yet (the first `dvc repro` makes it)")
                return 0
            require_usable_store(uri)
            if path.stat().st_size == 0:
                print(
                    f"{shown(uri)}: an empty file, writable (the first `dvc repro` makes "
                    "the store in it)"
                )
            else:
                print(f"{shown(uri)}: an SQLite store, integrity ok, writable")
            return 0
        if verb == "init":
            require_usable_store(uri)
            with writer_lock(uri), store_faults(uri):
                if sqlite_file(uri) is not None:
                    create_sqlite_store(uri, migrate=True, artifact_root=location)
                # One experiment for every model (with experiment_per_model, the other
                # models' are made by track: under the lock on sqlite, race-safe on a server).
                experiment = experiment_name(config)
                experiment_id = ensure_experiment(uri, experiment, location)
            print(f"store ready: {shown(uri)}, experiment {experiment!r} (id {experiment_id})")
        return 0
    except VmapcheckError as exc:
        print(f"store: error: {exc}", file=sys.stderr)
        return 2
