"""The examples in the public API's docstrings run, and say what they print (issue 47).

Each docstring with examples is one test, so a failure names the function. The modules
are listed here, not collected by ``--doctest-modules`` over the package: that would
import every module, the example models' frameworks and the stage entry points
included. The API's entry points (the functions :mod:`vmapcheck.testing` defines and
names in ``__all__``) must each have an example: a new one without fails.
"""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

import vmapcheck.testing

# The public modules whose docstrings hold examples: the Python API, the precision names
# it takes (vmapcheck.config.run), the one tolerance rule and the benchmark's latency
# figures.
MODULES = (
    "vmapcheck.testing",
    "vmapcheck.config.run",
    "vmapcheck.core.compare",
    "vmapcheck.bench.timing.latency",
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _examples() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder()
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [t for t in finder.find(module, name) if t.examples]
    return sorted(found, key=lambda t: t.name)


EXAMPLES = _examples()


@pytest.mark.parametrize("test", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_the_example_runs_as_written(test):
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    output: list[str] = []
    runner.run(test, out=output.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(output)
    assert result.attempted == len(test.examples)


def test_every_entry_point_of_the_api_has_an_example():
    """``check_batching``, ``assert_batching_consistent``, ``precision_config``, ...:
    derived from ``vmapcheck.testing.__all__``, so a new entry point needs an example."""
    entry_points = sorted(
        name
        for name in vmapcheck.testing.__all__
        if inspect.isfunction(obj := getattr(vmapcheck.testing, name))
        and obj.__module__ == "vmapcheck.testing"
    )
    documented = {t.name.removeprefix("vmapcheck.testing.") for t in EXAMPLES}
    assert "check_batching" in entry_points
    assert [n for n in entry_points if n not in documented] == []
