"""``make ui``: the MLflow UI over the configured store, on 127.0.0.1 only."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vmapcheck.config import load_config
from vmapcheck.store import is_http, shown
from vmapcheck.tracking import experiment_name, resolve_artifact_root, resolve_tracking_uri


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    root = Path.cwd()
    config = load_config(root / "params.yaml")
    uri = resolve_tracking_uri(config.tracking, root)
    location = resolve_artifact_root(config.tracking, root)
    if is_http(uri) or location is None:
        # A tracking server has its own UI.
        print(f"the store is a tracking server: open {shown(uri)} in a browser")
        return
    print(f"MLflow UI for {uri} on http://127.0.0.1:{args.port} (Ctrl-C stops it)")
    scope = "this model's runs" if config.tracking.experiment_per_model else "the runs"
    print(
        f"{scope}: experiment '{experiment_name(config)}'; "
        "every model side by side: make compare (README: Comparing runs)"
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
            str(args.port),
        ],
    )


if __name__ == "__main__":
    main()
