"""MLflow: the store, the run's logging, the model registry, serving and the UI.

Its public modules, the ones other floors import (imported from the module: importing
this package loads neither MLflow nor JAX). ``clock``, ``experiment``, ``request_body``
and ``serving`` are parts of the others: no other floor imports them.
"""

__all__ = [
    "attempts",
    "baselines",
    "log",
    "records",
    "registered_params",
    "registry",
    "registry_commands",
    "review",
    "run_inputs",
    "runs",
    "server",
    "sqlite_store",
    "store",
    "ui",
    "uri",
]
