"""A local sqlite store: whether its file can be used, its faults while it is written,
and creating its schema once under an exclusive lock.

**Creating it once.** MLflow creates the sqlite schema the first time a process opens the
file; two processes doing that at once can fail half-way and leave a broken store.
:func:`~vmapcheck.tracking.store.open_store` creates it under an exclusive ``fcntl`` lock
on ``<db>.lock``, and ``track`` keeps that lock while it reads and writes the store
(:func:`writer_lock`), so parallel experiments log one after the other (a few seconds
each) rather than meeting sqlite's "database is locked". ``vmapcheck store init``
creates the store and the configured model's experiment before a sweep starts (and
migrates a store made by an older MLflow, after a backup: ``track`` never migrates on its
own).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from vmapcheck.errors import TrackingStoreError, first_line
from vmapcheck.io import NO_ROOM, space_note
from vmapcheck.tracking.uri import sqlite_file

# How long track waits for another process (a parallel experiment) to finish logging to
# the same sqlite file before giving up.
LOCK_WAIT_S = 900.0


# --- whether the file can be used -------------------------------------------------------


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
    elsewhere (:func:`~vmapcheck.tracking.server.probe`).

    Raises:
        TrackingStoreError: the store's problem.
    """
    path = sqlite_file(uri)
    problem = sqlite_problem(path, write) if path is not None else None
    if problem:
        raise TrackingStoreError(f"the MLflow store {path} {problem}")


@contextlib.contextmanager
def store_faults(uri: str, artifacts: Path | None = None) -> Iterator[None]:
    """A local store failing while it is written (disk full, I/O error, read-only, a
    corrupt page) becomes one :class:`TrackingStoreError` naming the store and the fault;
    the run it was logging is left unfinished, and the next ``track`` marks it FAILED
    (:func:`~vmapcheck.tracking.attempts.settle_earlier_attempts`). Any other error passes
    unchanged."""
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
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        # A file write (an artifact copied into the artifact root), not the database: the
        # folder that was full is named, with its free space, not mlflow.db.
        folder = Path(exc.filename).parent if exc.filename else artifacts
        where = f"{folder}" if folder is not None else "the artifact store"
        raise TrackingStoreError(
            f"the run's artifacts could not be written in {where}: "
            f"{exc.strerror or 'no room'}{space_note(exc, folder or Path.cwd())}; the run is "
            "left unfinished and the next `track` marks it FAILED. Free space there, then "
            "`dvc repro` again"
        ) from None
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
    ``file://`` URI, :func:`~vmapcheck.tracking.store.artifact_location`) rather than
    MLflow's ``./mlruns`` of the working directory, which in a queued experiment is a
    temporary copy deleted when the experiment ends. A store made by an older MLflow is
    migrated only when ``migrate`` (after copying the file to ``<db>.bak-<UTC time>``);
    otherwise it is an error saying how to migrate.
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
