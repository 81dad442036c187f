"""``vmapcheck ui`` (``make ui``): the MLflow UI over the configured store, on 127.0.0.1 only."""

from __future__ import annotations

import os

from vmapcheck.config import load_config
from vmapcheck.layout import Layout
from vmapcheck.tracking.store import (
    experiment_name,
    is_http,
    resolve_artifact_root,
    resolve_tracking_uri,
    shown,
)


def run_ui(layout: Layout, port: int = 5000) -> int:
    """Replace this process by ``mlflow ui`` on ``127.0.0.1:<port>`` over the project's
    local store; with a tracking server, say where its own UI is and return 0."""
    config = load_config(layout.params_yaml)
    uri = resolve_tracking_uri(config.tracking, layout.root)
    location = resolve_artifact_root(config.tracking, layout.root)
    if is_http(uri) or location is None:
        # A tracking server has its own UI.
        print(f"the store is a tracking server: open {shown(uri)} in a browser")
        return 0
    print(f"MLflow UI for {uri} on http://127.0.0.1:{port} (Ctrl-C stops it)")
    scope = "this model's runs" if config.tracking.experiment_per_model else "the runs"
    print(
        f"{scope}: experiment '{experiment_name(config)}'; "
        "every model side by side: make compare (docs/tracking.md)"
    )
    os.execvp(
        "mlflow",
        [
            "mlflow",
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
