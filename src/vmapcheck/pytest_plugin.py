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

This module imports no JAX: pytest loads it in every session, JAX loads with the
first check. It needs pytest, which vmapcheck does not require: ``pip install
'vmapcheck[pytest]'`` brings the range the project's tests pass with; imported without
it, the error says so.
"""

from __future__ import annotations

from collections.abc import Callable
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


def pytest_configure(config: pytest.Config) -> None:
    # An unknown name stops the session before any test runs, in the config's words,
    # rather than failing every test that uses the fixture.
    name = config.getoption("vmapcheck_precision")
    try:
        precision_config(name)
    except ConfigError as exc:
        raise pytest.UsageError(f"{OPTION}={name}: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str:
    return f"vmapcheck: batching_check precision {config.getoption('vmapcheck_precision')}"


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
