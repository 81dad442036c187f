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
import errno
import fcntl
import logging
import os
import re
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

# Where a store's URI comes from, as messages name it.
URI_SETTING = "tracking.tracking_uri, or MLFLOW_TRACKING_URI when set"

# How long track waits for another process (a parallel experiment) to finish logging to
# the same sqlite file before giving up.
LOCK_WAIT_S = 900.0


# --- whether the path can hold a store -------------------------------------------------


def store_path_problem(path: Path, create_folder: bool = False) -> str | None:
    """Why a store must not be opened or created at ``path`` (None: it may): MLflow
    creates an empty store wherever its URI points, so a mistake in the path would
    otherwise start a new, empty store and register ``@verified`` there, silently.

    Refused: a symlink loop; a symlink whose target does not exist (the store it pointed
    at is gone or unmounted: a new one is not made at its target); a store file whose
    folder does not exist (a mistyped folder), unless ``create_folder`` (``vmapcheck
    store init``, which is asked to make it); a folder path that is not a folder. A
    missing file in an existing folder is fine: the project's first run makes its store
    there (``sqlite:///mlflow.db`` in the project root).
    """
    if path.is_symlink():
        try:
            os.stat(path)
        except OSError as exc:
            target = os.readlink(path)
            if exc.errno == errno.ELOOP:
                return (
                    f"is a symlink loop ({path} -> {target} -> ...): remove the link, or "
                    "point it at the store's file"
                )
            return (
                f"is a symlink to {target}, which does not exist ({exc.strerror}); no new "
                "store is made there: restore the file (or mount its disk), or remove the "
                "link to start a new store"
            )
        return None
    if path.exists():
        return None
    folder = path.parent
    if folder.is_dir():
        return None
    if folder.exists() or folder.is_symlink():
        return f"cannot be made: {folder} is not a folder"
    if create_folder:
        return None
    return (
        f"does not exist, nor its folder {folder} (a mistyped path?); no store is made "
        "there unless asked: check the path, or create the store with `vmapcheck store "
        "init` (which makes the folder)"
    )


def require_store_path(uri: str, create_folder: bool = False) -> None:
    """Refuse a local store path that would open or create the wrong store
    (:func:`store_path_problem`), naming the setting it came from; a server passes.

    Raises:
        TrackingStoreError: the path's problem and the way out.
    """
    path = sqlite_file(uri)
    if path is None:
        return
    problem = store_path_problem(path, create_folder)
    if problem:
        raise TrackingStoreError(f"the MLflow store {path} ({URI_SETTING}) {problem}")


# --- which MLflow made it ----------------------------------------------------------------


def known_schema_revisions() -> set[str]:
    """The alembic revisions of the installed MLflow's store schema (its migration
    scripts, ``mlflow/store/db_migrations/versions/*.py``, each naming its ``revision``)."""
    import mlflow.store.db_migrations as migrations

    folder = Path(migrations.__file__).parent / "versions"
    found = set()
    for script in folder.glob("*.py"):
        match = re.search(r"^revision\s*=\s*[\"']([0-9a-f]+)[\"']", script.read_text(), re.M)
        if match:
            found.add(match.group(1))
    return found


def newer_schema_problem(revision: str | None) -> str | None:
    """Why a store stamped with alembic ``revision`` is left alone: a revision the installed
    MLflow does not know was made by a newer MLflow (its migrations are not here); MLflow
    would offer `mlflow db upgrade`, which cannot go to an unknown revision, and nothing
    here migrates or downgrades it. None: a revision this MLflow knows (older stores are
    migrated by `vmapcheck store init`, after a backup)."""
    if revision is None or revision in known_schema_revisions():
        return None
    from importlib.metadata import version

    return (
        f"was made by a newer MLflow than the {version('mlflow')} installed here (its schema "
        f"revision {revision} is not one this MLflow knows; the store does not record the "
        "version that made it): it is left as it is, not migrated or downgraded. Use the "
        "MLflow that made it (pip install -U mlflow, then requirements.lock), or set "
        "tracking.tracking_uri to another store"
    )


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
            stamped = (
                db.execute("SELECT version_num FROM alembic_version").fetchone()
                if "alembic_version" in tables
                else None
            )
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
    newer = newer_schema_problem(stamped[0] if stamped else None)
    if newer:
        return newer
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
    # A symlink loop or a dangling symlink: said as such (not "no store").
    require_store_path(uri, create_folder=True)
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


# --- a copied or moved project ----------------------------------------------------------

# The columns of an MLflow 3.17 sqlite store that hold an artifact location (a file://
# URI under the artifact root): what a copy of the store must have rewritten to use its
# own project's artifacts (tables absent from older schemas are passed over).
LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def relink_artifacts(path: Path, old: str, new: str) -> dict[str, int]:
    """Rewrite every artifact location under ``old`` (a ``file://`` URI of a folder) to
    the same place under ``new`` in the sqlite store ``path``, in one transaction, after
    copying the file to ``<db>.bak-<UTC time>`` (call under :func:`writer_lock`). Returns
    the rows changed per ``table.column``.

    For a project copied or moved with its store: the store still names the original's
    folder (MLflow keeps absolute locations), so runs would be logged, and versions
    loaded, from there.
    """
    import sqlite3

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    shutil.copy2(path, path.with_name(f"{path.name}.bak-{stamp}"))
    old, new = old.rstrip("/"), new.rstrip("/")
    changed: dict[str, int] = {}
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table, column in LOCATION_COLUMNS:
            if table not in tables:
                continue
            # substr, not LIKE: a path may hold LIKE's wildcards (_ and %).
            done = db.execute(
                f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                (new, len(old) + 1, old, len(old) + 1, old + "/"),
            )
            changed[f"{table}.{column}"] = done.rowcount
    return changed
