"""pytest plugin: the ``batching_check`` fixture and the ``--vmapcheck-precision`` option.

Registered as the ``pytest11`` entry point ``vmapcheck``, so installing vmapcheck makes
both available to every test suite; without the entry point, load it with ``-p
vmapcheck.pytest_plugin`` or ``pytest_plugins = ["vmapcheck.pytest_plugin"]`` in a
root conftest.py (docs/python-api.md)::

    def test_my_model_batches(batching_check):
        report = batching_check(make_model(), params, examples)  # raises AssertionError
        assert report.worst_bound_ratio < 0.1

``batching_check(model, params, examples, **options)`` is
:func:`vmapcheck.testing.assert_batching_consistent` with ``precision`` defaulting to
``--vmapcheck-precision`` (f32 unless given), so one suite runs at f64 or bf16 with
``pytest --vmapcheck-precision=bf16``; a test passing ``precision=`` keeps its own.

``--vmapcheck-compile-cache`` (or ``vmapcheck_compile_cache = true`` in the pytest
ini): JAX's persistent compilation cache in pytest's cache folder, so a later session
loads the programs an earlier one compiled instead of compiling them again (a check's
first call is mostly compiling: docs/python-api.md, "Speed").

This module imports no JAX: pytest loads it in every session, JAX loads with the
first check (or at the start of a session with the compile cache on). It needs pytest,
which vmapcheck does not require: ``pip install 'vmapcheck[pytest]'`` brings the range
the project's tests pass with; imported without it, the error says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import pytest
except ModuleNotFoundError as exc:
    # pytest itself never lands here: its pytest11 entry point loads this module only in
    # a running pytest. A direct import does (a conftest's pytest_plugins read by another
    # runner, an IDE's test discovery, `python -c "import vmapcheck.pytest_plugin"`).
    if exc.name != "pytest":
        raise
    raise ModuleNotFoundError(
        "vmapcheck.pytest_plugin (the batching_check fixture) needs pytest, which is not "
        "installed: pip install 'vmapcheck[pytest]' (docs/python-api.md, the pytest fixture)",
        name="pytest",
    ) from None

from vmapcheck.errors import ConfigError
from vmapcheck.testing import (
    DEFAULT_PRECISION,
    BatchingReport,
    assert_batching_consistent,
    precision_config,
    precision_names,
)

OPTION = "--vmapcheck-precision"
CACHE_OPTION = "--vmapcheck-compile-cache"
CACHE_INI = "vmapcheck_compile_cache"
# The folder under pytest's cache directory (.pytest_cache/d/<this>): `--cache-clear`
# empties it with the rest of pytest's cache.
CACHE_FOLDER = "vmapcheck-jax"
# The folder the session's JAX programs are kept in, once the compile cache is on.
_compile_cache_key = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vmapcheck", "vmapcheck batching checks")
    group.addoption(
        OPTION,
        action="store",
        dest="vmapcheck_precision",
        default=DEFAULT_PRECISION,
        metavar="NAME",
        help=(
            "default precision of the batching_check fixture: a shipped precision option "
            f"({', '.join(precision_names())}; vmapcheck/conf/precision/<NAME>.yaml). "
            f"Default: {DEFAULT_PRECISION}."
        ),
    )
    group.addoption(
        CACHE_OPTION,
        action="store_true",
        dest="vmapcheck_compile_cache",
        default=False,
        help=(
            "keep the XLA programs this session compiles in pytest's cache folder "
            f"(.pytest_cache/d/{CACHE_FOLDER}/) and load them in later sessions instead of "
            "compiling them again: JAX's persistent compilation cache, for every JAX "
            "program of the session. --cache-clear empties it. Also the ini key "
            f"{CACHE_INI}."
        ),
    )
    parser.addini(
        CACHE_INI,
        type="bool",
        default=False,
        help=f"as {CACHE_OPTION}: JAX's persistent compilation cache in pytest's cache folder",
    )


def pytest_configure(config: pytest.Config) -> None:
    # An unknown name stops the session before any test runs, in the config's words,
    # rather than failing every test that uses the fixture.
    name = config.getoption("vmapcheck_precision")
    try:
        precision_config(name)
    except ConfigError as exc:
        raise pytest.UsageError(f"{OPTION}={name}: {exc}") from None
    if config.getoption("vmapcheck_compile_cache") or config.getini(CACHE_INI):
        config.stash[_compile_cache_key] = _enable_compile_cache(config)


def _enable_compile_cache(config: pytest.Config) -> str:
    """Turn on JAX's persistent compilation cache for this process, in
    ``.pytest_cache/d/vmapcheck-jax/<worker>``, every compile kept; returns the folder in
    use. A folder the user set (``JAX_COMPILATION_CACHE_DIR``, or ``VMAPCHECK_COMPILE_CACHE``
    as for the pipeline's stages) is kept
    (:func:`vmapcheck.core.runtime.enable_compile_cache`, which also bounds it).

    One folder per pytest-xdist worker: JAX writes an entry in place, unlocked, and a
    process reading an entry another is still writing gets a warning from JAX, which a
    suite with ``filterwarnings = error`` turns into a failed test.
    """
    cache = getattr(config, "cache", None)
    if cache is None:
        raise pytest.UsageError(
            f"{CACHE_OPTION} ({CACHE_INI}): expected pytest's cache folder to keep the "
            "programs in, found pytest's cache provider turned off (-p no:cacheprovider): "
            "drop that, or set JAX_COMPILATION_CACHE_DIR and "
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 instead (docs/python-api.md)"
        )
    import jax

    from vmapcheck.core.runtime import enable_compile_cache

    # xdist's own mark of a worker session, not its PYTEST_XDIST_WORKER variable, which a
    # pytest started from inside a worker (a test running pytest) inherits.
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    enable_compile_cache(Path(cache.mkdir(CACHE_FOLDER)) / worker)
    return str(jax.config.jax_compilation_cache_dir)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"vmapcheck: batching_check precision {config.getoption('vmapcheck_precision')}"]
    if _compile_cache_key in config.stash:
        lines.append(f"vmapcheck: JAX compile cache {config.stash[_compile_cache_key]}")
    return lines


@pytest.fixture
def vmapcheck_precision(request: pytest.FixtureRequest) -> str:
    """The precision option given by ``--vmapcheck-precision`` (default f32)."""
    return request.config.getoption("vmapcheck_precision")


@pytest.fixture
def batching_check(vmapcheck_precision: str) -> Callable[..., BatchingReport]:
    """``check(model, params, examples, **options) -> BatchingReport``:
    :func:`vmapcheck.testing.assert_batching_consistent`, its ``precision`` defaulting to
    ``--vmapcheck-precision``. ``examples``: a batch with the batch on axis 0 (an array
    ``(n, in_features)``, or a dict of the model's input leaves, each ``(n, ...)``)."""

    def check(model: Any, params: Any, examples: Any, **options: Any) -> BatchingReport:
        __tracebackhide__ = True  # the failure points at the test's own line
        options.setdefault("precision", vmapcheck_precision)
        return assert_batching_consistent(model, params, examples, **options)

    return check
