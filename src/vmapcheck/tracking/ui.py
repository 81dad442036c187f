"""``vmapcheck ui`` (``make ui``): the MLflow UI over the configured store, on 127.0.0.1 only.

The URLs it and the summary print open MLflow's classic ML view (runs, metrics, models),
not the GenAI one (traces, evaluations) that MLflow 3 opens by default: the UI reads
``workflowType=machine_learning`` from the URL (mlflow/server/js, WorkflowType). The
experiment's page also loads the runs-table view ``viewStateShareKey=vmapcheck-summary``
(columns: the verdict tags and the ``summary/*`` metrics), which ``track`` stores on the
experiment (vmapcheck.tracking.experiment.describe_experiment).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from pathlib import Path
from urllib.parse import quote, urlencode

from vmapcheck.config import load_config
from vmapcheck.errors import ResourceError
from vmapcheck.layout import Layout
from vmapcheck.tracking.sqlite_store import require_store_path
from vmapcheck.tracking.store import (
    VIEW_KEY,
    experiment_name,
    resolve_artifact_root,
    resolve_tracking_uri,
)
from vmapcheck.tracking.uri import is_http, shown, sqlite_file

ML_VIEW = {"workflowType": "machine_learning"}


def experiment_url(base: str, experiment_id: str) -> str:
    """The experiment's runs table in the ML view, with the summary columns."""
    query = urlencode({**ML_VIEW, "viewStateShareKey": VIEW_KEY})
    # The runs tab's own route: the experiment's bare route redirects and drops the query.
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """One run's page in the ML view."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{urlencode(ML_VIEW)}"


def model_version_url(base: str, name: str, version: str | int) -> str:
    """A registered model version's page (the registry: vmapcheck.tracking.registry), in
    the ML view (without ``workflowType`` MLflow 3.17 opens it in its GenAI one)."""
    page = f"{base.rstrip('/')}/#/models/{quote(name, safe='')}/versions/{version}"
    return f"{page}?{urlencode(ML_VIEW)}"


def compare_url(base: str, runs: list[tuple[str, str]]) -> str:
    """The compare view of ``runs`` ((experiment id, run id) pairs) in the ML view: their
    params, metrics (the ``_summary/*`` ones first) and tags side by side.

    The runs table's own **Compare** button opens ``#/compare-runs`` without
    ``workflowType`` (MLflow 3.17), and the page then takes the browser's stored choice,
    GenAI unless one switched to **Model training** there once; this address carries it."""
    if not runs:
        raise ValueError("compare_url: no run to compare")
    run_ids = json.dumps([run for _, run in runs], separators=(",", ":"))
    experiment_ids = json.dumps(
        list(dict.fromkeys(experiment for experiment, _ in runs)), separators=(",", ":")
    )
    query = urlencode({"runs": run_ids, "experiments": experiment_ids, **ML_VIEW})
    return f"{base.rstrip('/')}/#/compare-runs?{query}"


def ui_base(tracking_uri: str, port: int = 5000) -> tuple[str, str]:
    """Where the store's UI is: (its base URL, what to run first: "" for a server, else
    ``vmapcheck ui``, which serves the local store on 127.0.0.1:<port>)."""
    if is_http(tracking_uri):
        return shown(tracking_uri), ""
    return f"http://127.0.0.1:{port}", "vmapcheck ui"


# MLflow's switch for its server's job runner (mlflow/environment_variables.py).
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def require_free_port(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a port another process already listens on, before ``mlflow ui`` starts:
    its server prints "Address already in use" and MLflow's launcher still exits 0, after
    this command printed the URL (of the other process's page).

    A bind test on ``host``: ``SO_REUSEADDR`` so that a port left in TIME_WAIT by a UI
    that just stopped is not taken for a live one (Linux still refuses a port that a
    socket listens on).

    Raises:
        ResourceError: naming the port, what holds it (as far as the error says) and the
            flag that picks another.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe_socket.bind((host, port))
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            why = "another process listens on it" if taken else exc.strerror or str(exc)
            other = port + 1 if port < 65535 else 5001
            raise ResourceError(
                f"--port {port}: {host}:{port} cannot be used ({why}): stop that process, "
                f"or pick another port, e.g. `vmapcheck ui --port {other}`"
            ) from None


def run_ui(layout: Layout, port: int = 5000) -> int:
    """Replace this process by ``mlflow ui`` on ``127.0.0.1:<port>`` over the project's
    local store; with a tracking server, say where its own UI is and return 0.

    Raises:
        ResourceError: the port is taken (:func:`require_free_port`).
        TrackingStoreError: the local store cannot be used (its path, :func:`~vmapcheck.
            tracking.sqlite_store.store_path_problem`, or its file).
    """
    config = load_config(layout.params_yaml)
    uri = resolve_tracking_uri(config.tracking, layout.root)
    location = resolve_artifact_root(config.tracking, layout.root)
    if is_http(uri) or location is None:
        # A tracking server has its own UI.
        print(f"the store is a tracking server: open {shown(uri)} in a browser")
        return 0
    # `mlflow ui` would create a store wherever the URI points (a dangling symlink's
    # target, a mistyped folder): the same refusal as track's.
    require_store_path(uri)
    require_free_port(port)
    base = f"http://127.0.0.1:{port}"
    print(f"MLflow UI for {uri} on {base} (Ctrl-C stops it)")
    scope = (
        "this model's runs"
        if config.tracking.experiment_per_model
        else "every model's runs (tag `model`)"
    )
    experiment_id = _experiment_id(uri, experiment_name(config))
    where = (
        experiment_url(base, experiment_id)
        if experiment_id is not None
        else f"{base}/#/experiments?{urlencode(ML_VIEW)} (nothing logged there yet)"
    )
    print(f"{scope}, experiment '{experiment_name(config)}': {where}")
    print(
        "runs side by side: `vmapcheck compare` prints the table and the address of their "
        "compare view (docs/tracking.md)"
    )
    # MLflow 3's server starts a GenAI job runner (about ten huey consumer processes) that
    # vmapcheck's runs never use: on a two-core machine it only takes CPU. Unless asked for.
    os.environ.setdefault(JOB_EXECUTION_ENV, "false")
    # exec replaces this process with its unwritten buffer: piped (`make ui | tee`, a
    # log file) the lines above would be lost.
    sys.stdout.flush()
    # MLflow's command of this interpreter's environment: `.venv/bin/vmapcheck ui` runs
    # without the venv on PATH (make ui has it there), and finds no other `mlflow`.
    beside = Path(sys.executable).with_name("mlflow")
    mlflow = str(beside) if beside.is_file() else "mlflow"
    os.execvp(
        mlflow,
        [
            mlflow,
            "ui",
            "--backend-store-uri",
            uri,
            "--default-artifact-root",
            location,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
    )


def _experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment ``name`` in the local store, None when it has none (yet)."""
    from mlflow.tracking import MlflowClient

    database = sqlite_file(uri)
    if database is None or not database.exists():
        return None  # asking would create an empty store
    found = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    return None if found is None else found.experiment_id
