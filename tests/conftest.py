"""Shared test set-up: JAX on CPU with strict settings, project paths.

The end-to-end tests run the pipeline in subprocesses, which do not read this file: the
strict settings below hold for the code the unit tests run in this process.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.helpers.config import ROOT
from tests.helpers.store import copy_empty_store, empty_store_template
from vmapcheck.core.runtime import SHARED_COMPILE_CACHE_ENV

# One JAX compile cache for every pipeline this session runs, in-process and in the e2e
# projects' subprocesses (they inherit it; so do the xdist workers, started after this):
# the projects compile the same programs, and each pipeline run compiled them afresh
# (the forward stage: 12.6 CPU s cold, 3.0 s from the cache). A stage that reads an
# entry the other worker is still writing compiles it instead, after JAX's warning
# (vmapcheck.core.runtime.enable_compile_cache).
if not os.environ.get(SHARED_COMPILE_CACHE_ENV):
    _compile_cache = tempfile.mkdtemp(prefix="vmapcheck-test-jax-cache-")
    os.environ[SHARED_COMPILE_CACHE_ENV] = _compile_cache
    atexit.register(shutil.rmtree, _compile_cache, ignore_errors=True)

# Before JAX starts: the tests run on CPU whatever the machine has.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # after JAX_PLATFORMS, which JAX reads on import

# Strict JAX: no implicit dtype promotion (an int or float64 operand silently widening a
# float32 computation) and no implicit rank promotion (a (n,) bias broadcast against an
# (m, n) batch): library code must cast and broadcast explicitly.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
# Two emulated CPU devices (only takes effect before the backend starts), so the sharded
# path splits a real batch over a mesh in this process too.
jax.config.update("jax_num_cpu_devices", 2)
# A compile cache of this process's own (each xdist worker has one), for the stages the
# tests run in-process. Each run builds its model afresh, so JAX's in-memory caches miss
# and the same programs were compiled again: the transformer's four planted mistakes took
# 72 s, 48 s with this cache. Only compiles over 20 ms are kept: the many tiny eager
# ones are as quick to redo. A hit still fires JAX's compile event, which the bench's
# and the guard's compile counts read.
_inprocess_compile_cache = tempfile.mkdtemp(prefix="vmapcheck-test-inprocess-jax-cache-")
atexit.register(shutil.rmtree, _inprocess_compile_cache, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _inprocess_compile_cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.02)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def empty_mlflow_store() -> Callable[[Path], str]:
    """``empty_mlflow_store(path)``: a fresh, empty MLflow sqlite store at ``path``, copied
    from one made once per test process (MLflow's migrations take seconds); its URI."""
    return partial(copy_empty_store, empty_store_template())


def _file_cost_rank(item: pytest.Item) -> int:
    """0 for a file of end-to-end tests (whole pipelines in subprocesses: a minute or more
    each), 1 for one with in-process stage runs (tens of seconds), 2 for unit tests."""
    if item.get_closest_marker("e2e"):
        return 0
    return 1 if item.get_closest_marker("stages") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The dearest files first: by rank, then by how many tests of that rank the file
    holds, then in collection order. The Makefile's xdist workers take whole files in
    this order (--dist loadfile --no-loadscope-reorder), so the run ends on short unit
    files and neither worker waits long for the other; in file name order, the
    transformer's planted mistakes (over a minute) ran among the last files."""
    cost: dict[str, tuple[int, int]] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        rank, count = cost.get(path, (2, 0))
        item_rank = _file_cost_rank(item)
        if item_rank < rank:
            rank, count = item_rank, 0
        cost[path] = (rank, count - (item_rank == rank))
    items.sort(key=lambda item: cost[item.nodeid.split("::", 1)[0]])  # stable
