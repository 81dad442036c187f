"""An empty MLflow sqlite store, made once per test process and copied for each test.

Creating a sqlite store runs MLflow's database migrations: a second or two on an idle
machine, several on a loaded one. Tests that need a fresh store of their own, but do not
test how a store is created (tests/test_store.py does), copy this one instead.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path


def make_empty_store(db: Path) -> str:
    """Create the MLflow sqlite store ``db`` (tracking and registry tables, the Default
    experiment, as MLflow makes them); return its URI."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{db}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.search_experiments()  # creates the tracking tables
    client.search_registered_models()  # and checks the registry's
    return uri


def copy_empty_store(template: Path, db: Path) -> str:
    """``template`` (see :func:`make_empty_store`) copied to ``db``; returns its URI."""
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


@functools.cache
def empty_store_template() -> Path:
    """The empty store (:func:`make_empty_store`) this test process copies: made on first
    use, removed when the process ends."""
    folder = Path(tempfile.mkdtemp(prefix="vmapcheck-test-store-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    make_empty_store(folder / "mlflow.db")
    return folder / "mlflow.db"
