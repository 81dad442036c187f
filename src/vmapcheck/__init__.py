"""vmapcheck: prove batched JAX inference agrees with the per-example loop, and time it.

The public API, re-exported here (imported on first use, so ``vmapcheck --help`` and
the stages that need none of it do not load JAX for it):

- :class:`Model` and :func:`build_model`: the contract a user's model fulfils;
- :data:`PATHS` / :class:`ForwardPath` and :data:`CASE_KINDS` / :class:`CaseKind`:
  the registries of forward paths and regression case kinds;
- :func:`compare`: the one tolerance rule;
- :class:`Layout`: every file the stages exchange;
- :class:`Config` and :func:`load_config`: the validated configuration;
- :func:`assert_batching_consistent` and :func:`check_batching`: the checks from a test
  suite (:mod:`vmapcheck.testing`, docs/python-api.md).

Every subpackage's ``__init__`` names its public modules or names in ``__all__``; a
module whose name starts with ``_`` is its package's own (only that package imports it).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Model": "vmapcheck.core.models",
    "build_model": "vmapcheck.core.models",
    "PATHS": "vmapcheck.core.paths",
    "ForwardPath": "vmapcheck.core.paths",
    "CASE_KINDS": "vmapcheck.core.cases",
    "CaseKind": "vmapcheck.core.cases",
    "compare": "vmapcheck.core.compare",
    "Layout": "vmapcheck.layout",
    "Config": "vmapcheck.config",
    "load_config": "vmapcheck.config",
    "assert_batching_consistent": "vmapcheck.testing",
    "check_batching": "vmapcheck.testing",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vmapcheck' has no attribute {name!r}")
