"""The MLflow store a run reaches: where it is, opening it, and which runs are complete.

**Where.** ``tracking.tracking_uri``, or ``MLFLOW_TRACKING_URI`` when set (MLflow's own
convention). A relative ``sqlite:///mlflow.db`` and a relative ``tracking.artifact_root``
are resolved against the *store root* (:func:`store_root`): the project root, except in an
experiment queued with ``dvc exp run --queue`` and run by ``dvc queue start``. Those run in
a temporary copy of the repository under ``<repo>/.dvc/tmp/exps/``, deleted afterwards,
and DVC passes the original repository's root to every stage in ``DVC_ROOT``
(``dvc/repo/experiments/queue/base.py``). When the project root lies inside
``<DVC_ROOT>/.dvc/tmp/``, ``DVC_ROOT`` is the store root: every experiment of a sweep
reaches the one store of the repository it was queued from.

**Complete runs.** A run is *complete* when ``track`` ended it (status FINISHED, or
FAILED for a check that failed: :data:`VERDICT_STATUS`), it has ``pipeline_complete=true``
and a ``verdict`` tag, and no later ``track`` marked it abandoned (tag
``vmapcheck.abandoned``) (:data:`COMPLETE_FILTER` for MLflow searches, :func:`is_complete`
on a run). Only complete runs are trusted: the benchmark baseline ``last-verified`` (which
also wants ``verdict=passed``), a baseline named by run id, registry rollback and loading.
``vmapcheck compare`` lists every run but shows an incomplete one by its status.

Beside it: how long a run waits for a tracking server (:mod:`vmapcheck.tracking.server`),
a local sqlite store's health and lock (:mod:`vmapcheck.tracking.sqlite_store`), and
logging one pipeline state once (:mod:`vmapcheck.tracking.attempts`).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from vmapcheck.config import Config, TrackingConfig, load_config, tracking_uri_problem
from vmapcheck.config.tracking import SQLITE_URI
from vmapcheck.errors import ConfigError, TrackingStoreError, VmapcheckError
from vmapcheck.layout import Layout
from vmapcheck.tracking.server import apply_http_settings, probe
from vmapcheck.tracking.sqlite_store import (
    create_sqlite_store,
    relink_artifacts,
    require_existing_store,
    require_store_path,
    require_usable_store,
    store_faults,
    writer_lock,
)
from vmapcheck.tracking.uri import is_http, shown, sqlite_file

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
# Why logging a run stopped part-way (an artifact that could not be written, the store
# failing): set with status FAILED, which a failed check also has; the run is incomplete.
LOG_FAILED_TAG = "vmapcheck.log_failed"
# Why a run was marked FAILED by a later track (its process was gone, or it was replaced).
ABANDONED_TAG = "vmapcheck.abandoned"
# The status ``track`` ends a run with, by its verdict: MLflow's runs list shows FINISHED
# as a green tick and FAILED as a red cross, so a failed check is seen at a glance there.
# A run a later track marked abandoned is FAILED too, but carries ABANDONED_TAG.
VERDICT_STATUS = {"passed": "FINISHED", "failed": "FAILED"}
# The one definition of a complete run, as an MLflow search filter (is_complete: the same
# on a Run): ended by track (a status of VERDICT_STATUS), pipeline_complete=true, a
# verdict, and not marked abandoned.
# MLflow's search refuses ``status IN (...)`` (only run_id takes a list), so the filter
# leaves out MLflow's other statuses (mlflow.entities.RunStatus) one by one.
NOT_ENDED_BY_TRACK = ("RUNNING", "SCHEDULED", "KILLED")
COMPLETE_FILTER = " and ".join(
    [
        *(f"attributes.status != '{status}'" for status in NOT_ENDED_BY_TRACK),
        f"tags.{COMPLETE_TAG} = 'true'",
        f"tags.{VERDICT_TAG} LIKE '%'",
        f"tags.`{ABANDONED_TAG}` IS NULL",
    ]
)


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
    if uri.startswith(SQLITE_URI) and not uri[len(SQLITE_URI) :].startswith("/"):
        return SQLITE_URI + str(
            absolute_store_file(store_root(project_root) / uri[len(SQLITE_URI) :])
        )
    return uri


def absolute_store_file(path: Path) -> Path:
    """``path`` made absolute with its folders resolved but not the file itself: a store
    file that is a symlink stays one, so that a symlink loop or a dangling link is judged
    as such (vmapcheck.tracking.sqlite_store.store_path_problem) rather than followed to
    a store that does not exist (or raising on the loop)."""
    path = Path(os.path.normpath(path.absolute()))
    try:
        return path.parent.resolve() / path.name
    except (OSError, RuntimeError):  # a loop among its folders: named when it is opened
        return path


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
    folder = store_root(project_root) / root
    try:
        return folder.resolve().as_uri()
    except (OSError, RuntimeError):  # a symlink loop: named before a run is logged there
        return absolute_store_file(folder).as_uri()


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


# --- opening it -------------------------------------------------------------------------


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
        require_store_path(uri)
        require_usable_store(uri)
        with writer_lock(uri), store_faults(uri):
            create_sqlite_store(uri, artifact_root=artifact_location(tracking, project_root))
    return uri


def ensure_experiment(uri: str, name: str, artifact_location: str | None) -> str:
    """Id of experiment ``name``, created if missing (another process may create it at the
    same moment: then its id), once it is fit to log into (:func:`experiment_problem`).

    Raises:
        TrackingStoreError: the experiment is deleted, or its artifacts would go elsewhere
            than ``artifact_location`` or to a folder that cannot be written.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(name)
    if found is None:
        require_artifacts_writable(artifact_location)
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    problem = experiment_problem(found, uri, artifact_location)
    if problem:
        raise TrackingStoreError(problem)
    require_artifacts_writable(found.artifact_location)
    return found.experiment_id


def experiment_problem(experiment: Any, uri: str, artifact_location: str | None) -> str | None:
    """Why runs must not be logged into ``experiment`` (an MLflow ``Experiment``) of the
    store ``uri`` (None: they may), with the way out.

    - It is deleted (in MLflow's trash): MLflow refuses a run there with a traceback, and
      restoring what a user deleted is theirs to decide, so the refusal names it and the
      command that restores it.
    - Its artifact location (fixed when it was made) is not ``artifact_location`` (what
      ``tracking.artifact_root`` names now), both local folders: MLflow would write this
      run's artifacts to the old one, silently. A copied or moved project's store names
      the original's folder (an absolute path): ``vmapcheck store relink`` points the
      store at this project's folder.
    """
    where = f"experiment {experiment.name!r} (id {experiment.experiment_id}) in {shown(uri)}"
    if experiment.lifecycle_stage != "active":
        return (
            f"{where} is deleted (in MLflow's trash; tracking.experiment names it): restore "
            f"it with `MLFLOW_TRACKING_URI={shown(uri)} mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}`, or set tracking.experiment to "
            "another name"
        )
    have, want = local_folder(experiment.artifact_location), local_folder(artifact_location)
    if have is None or want is None or have == want:
        return None
    return (
        f"{where} keeps its artifacts in {have}, but tracking.artifact_root names {want}: "
        f"MLflow would write this run's artifacts to {have}. If this project was copied or "
        f"moved, `vmapcheck store relink` points the store at {want} (after a backup); "
        f"to keep {have}, set tracking.artifact_root to it; or log to a new experiment "
        "(tracking.experiment)"
    )


def local_folder(location: str | None) -> Path | None:
    """The local folder of a ``file://`` artifact location (resolved), else None."""
    if location is None or not location.startswith("file:"):
        return None
    from urllib.parse import unquote, urlsplit

    path = Path(unquote(urlsplit(location).path))
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: require_artifacts_writable names it
        return Path(os.path.normpath(path.absolute()))


def require_artifacts_writable(location: str | None) -> None:
    """Refuse a local artifact folder this process cannot write, before a run is created
    (MLflow would fail with a traceback after the run exists, and leave it FAILED as if
    its check had failed). The folder is made when it is missing and its parent exists
    (MLflow makes it at the first artifact; ``mlartifacts/`` of a fresh project), not a
    tree of missing folders (a mistyped path). Another location (a server's, s3://)
    passes.

    Raises:
        TrackingStoreError: naming the folder, what is wrong and tracking.artifact_root.
    """
    folder = local_folder(location)
    if folder is None or location is None:
        return
    from urllib.parse import unquote, urlsplit

    # Named as the store has it, and where a symlink leads.
    given = Path(unquote(urlsplit(location).path))
    named = f"{given}" if given == folder else f"{given} (-> {folder})"
    setting = "the artifact folder (tracking.artifact_root when its experiment was made)"
    if given.is_symlink() and not given.exists():  # dangling or a loop: nothing made
        raise TrackingStoreError(
            f"{setting} {given} is a symlink to {os.readlink(given)}, which does not exist "
            "or loops: point it at a folder, or remove it (MLflow makes the folder)"
        )
    if folder.exists() and not folder.is_dir():
        raise TrackingStoreError(
            f"{setting} {named} is a file, not a folder: move it aside (MLflow makes the "
            "folder), or set tracking.artifact_root to a folder"
        )
    if not folder.exists() and not folder.parent.is_dir():
        raise TrackingStoreError(
            f"{setting} {named} does not exist, nor its parent {folder.parent} (a mistyped "
            "path?): create it (mkdir -p), or set tracking.artifact_root to a folder"
        )
    try:
        folder.mkdir(exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TrackingStoreError(
            f"{setting} {named} cannot be written ({exc.strerror or exc}): make it "
            "writable, or set tracking.artifact_root to a folder this user can write"
        ) from None


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
    if tags.get(LOG_FAILED_TAG):
        return f"its status is {info.status} ({tags[LOG_FAILED_TAG]})"
    if info.status not in VERDICT_STATUS.values() or tags.get(ABANDONED_TAG):
        why = f"its status is {info.status}"
        return why + (f" ({tags[ABANDONED_TAG]})" if tags.get(ABANDONED_TAG) else "")
    if tags.get(COMPLETE_TAG) != "true":
        return f"it has no tag {COMPLETE_TAG}=true (the track that logged it did not finish)"
    if not tags.get(VERDICT_TAG):
        return f"it has no {VERDICT_TAG} tag"
    return None


def mark_complete(uri: str, run_id: str, verdict: str) -> None:
    """The last writes of a run: tag ``pipeline_complete=true``, then its end status by
    ``verdict`` (its ``verdict`` tag: FINISHED when passed, FAILED when failed,
    :data:`VERDICT_STATUS`). From then on it is a complete run (see the module docstring).

    Raises:
        ValueError: ``verdict`` is neither ``passed`` nor ``failed``.
    """
    from mlflow.tracking import MlflowClient

    if verdict not in VERDICT_STATUS:
        raise ValueError(
            f"mark_complete: verdict must be one of {sorted(VERDICT_STATUS)}, got {verdict!r}"
        )
    client = MlflowClient(tracking_uri=uri)
    client.set_tag(run_id, COMPLETE_TAG, "true")
    client.set_terminated(run_id, status=VERDICT_STATUS[verdict])


# --- the process a run belongs to ------------------------------------------------------


def proc_stat(pid: int) -> list[str] | None:
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
    stat = proc_stat(pid)
    if stat is not None and len(stat) > 19:
        tags[PID_START_TAG] = stat[19]
    return tags


# --- command line -----------------------------------------------------------------------


def relink_store(config: Config, uri: str, location: str | None) -> str:
    """``vmapcheck store relink``: point the local store's artifact locations at
    ``location`` (this project's ``tracking.artifact_root``) where they name another
    folder (the project was copied or moved); one line saying what changed, and which
    artifact folders the store names that this project lacks.

    Raises:
        TrackingStoreError: not a local store, no such store or experiment, or a location
            that is not a local folder.
    """
    from mlflow.tracking import MlflowClient

    path = sqlite_file(uri)
    if path is None or location is None:
        raise TrackingStoreError(
            f"relink: {shown(uri)} is a tracking server; its artifact store is its own"
        )
    require_existing_store(uri, "relink")
    name = experiment_name(config)
    with writer_lock(uri), store_faults(uri):
        found = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
        if found is None:
            raise TrackingStoreError(
                f"relink: no experiment {name!r} (tracking.experiment) in {path}: nothing to relink"
            )
        have, want = local_folder(found.artifact_location), local_folder(location)
        if have is None or want is None:
            raise TrackingStoreError(
                f"relink: experiment {name!r} keeps its artifacts at {found.artifact_location}, "
                f"not a local folder; tracking.artifact_root: {location}"
            )
        if have == want:
            return f"relink: experiment {name!r} keeps its artifacts in {want}; nothing to change"
        changed = relink_artifacts(path, have.as_uri(), want.as_uri())
    missing = [p for p in (want / n for n in _run_folders(path, want)) if not p.exists()]
    note = (
        f"; {len(missing)} run artifact folder(s) it names are not in {want} (e.g. "
        f"{missing[0]}): copy them from {have}"
        if missing
        else ""
    )
    counts = ", ".join(f"{k} {v}" for k, v in changed.items() if v)
    return f"relink: {path}: artifact locations under {have} now under {want} ({counts}){note}"


def _run_folders(path: Path, root: Path) -> list[str]:
    """The first folder names, under ``root``, of the run artifact locations the store at
    ``path`` holds (a run's id, ``models``)."""
    import contextlib
    import sqlite3

    prefix = root.as_uri() + "/"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT artifact_uri FROM runs").fetchall()
    return sorted(
        {u[len(prefix) :].split("/", 1)[0] for (u,) in rows if u and u.startswith(prefix)}
    )


def run_store(layout: Layout, verb: str) -> int:
    """``vmapcheck store init|where|probe|relink`` for the project ``layout``.

    init: create (or migrate) the store and the experiment, e.g. before a sweep (its
    folder too: asked for); where: print the store and artifact location; probe: check a
    server answers, or a local store is sound; relink: point a copied or moved project's
    store at its own artifact folder (:func:`relink_store`). Exit 2 with
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
            require_store_path(uri)
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
        if verb == "relink":
            print(relink_store(config, uri, location))
            return 0
        if verb == "init":
            # Asked for: the store's folder is made (not a dangling symlink's target).
            require_store_path(uri, create_folder=True)
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
