"""The Python API reuses its compiled programs across calls in one process (issue 44):
a repeat ``check_batching`` of the same model compiles nothing, and another model or
another precision is never served a program built for the first
(:mod:`vmapcheck.core.jit_cache`).

Compiles are counted with JAX's own monitoring event for an XLA backend compile, not
timed: the figure does not depend on the machine's load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_api import EXAMPLES, MODEL, PARAMS, planted
from vmapcheck.core import jit_cache
from vmapcheck.testing import check_batching

# Recorded by JAX each time XLA compiles a program (jax/_src/compiler.py); a program
# served from a jitted function's cache records nothing.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts backend compiles while registered (:func:`compiles`)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, _duration: float, **_kwargs: object) -> None:
        if event == COMPILE_EVENT:
            self.count += 1


@pytest.fixture
def compiles() -> Iterator[CompileCounter]:
    counter = CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(counter)


def _compiled(counter: CompileCounter, **kwargs: object) -> tuple[int, object]:
    """(compiles, report) of one check of ``kwargs``' model (MODEL by default)."""
    before = counter.count
    model = kwargs.pop("model", MODEL)
    report = check_batching(model, PARAMS, EXAMPLES, **kwargs)  # type: ignore[arg-type]
    return counter.count - before, report


def test_a_repeat_check_of_the_same_model_compiles_nothing(compiles):
    jit_cache.clear()
    first, report = _compiled(compiles)
    assert report.passed
    assert first > 0  # the counter sees compiles: the first call has them all
    again, report_again = _compiled(compiles)
    assert again == 0, f"the repeat call compiled {again} program(s)"
    assert report_again.passed
    # The same figures: the programs reused compute what they computed.
    assert report_again.pairs == report.pairs
    assert report_again.oracle == report.oracle
    assert jit_cache.stats()["hits"] > 0


def test_another_model_of_the_same_shapes_is_not_served_the_first_ones_paths(compiles):
    """A planted batch-axis softmax (same names, shapes and dtypes as MODEL) after MODEL:
    its paths are built and compiled anew, and it fails; MODEL still passes after it."""
    jit_cache.clear()
    assert _compiled(compiles)[1].passed
    n, report = _compiled(compiles, model=planted(softmax_axis=0))
    assert n > 0
    assert not report.passed
    assert any("direct" in line for line in report.failures)
    # A new object with the same functions is another entry, built again, and passes.
    twin = dataclasses.replace(MODEL)
    assert _compiled(compiles, model=twin)[1].passed
    assert _compiled(compiles)[1].passed


def test_another_precision_is_not_served_the_first_ones_programs(compiles):
    """f32, then bf16 on the same model: the bf16 call builds its own programs (a
    float32 path would refuse a bfloat16 batch), and both are kept: f32 again
    compiles nothing."""
    jit_cache.clear()
    f32 = _compiled(compiles, precision="f32")[1]
    n, bf16 = _compiled(compiles, precision="bf16")
    assert n > 0
    assert bf16.dtype == "bfloat16"
    assert f32.dtype == "float32"
    assert bf16.refused == f32.refused  # every invalid input refused, none wrongly
    assert _compiled(compiles, precision="f32")[0] == 0


def test_the_cache_keys_on_the_model_object_and_the_jax_settings():
    jit_cache.clear()
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    a = jit_cache.cached(MODEL, "thing", ("float32",), make)
    assert jit_cache.cached(MODEL, "thing", ("float32",), make) == a
    # Another model object, key, x64 or matmul precision: built again.
    assert jit_cache.cached(dataclasses.replace(MODEL), "thing", ("float32",), make) != a
    assert jit_cache.cached(MODEL, "thing", ("bfloat16",), make) != a
    with jax.enable_x64(True):
        assert jit_cache.cached(MODEL, "thing", ("float32",), make) != a
    with jax.default_matmul_precision("bfloat16"):
        assert jit_cache.cached(MODEL, "thing", ("float32",), make) != a
    assert jit_cache.cached(MODEL, "thing", ("float32",), make) == a
    assert len(made) == 5


def test_the_cache_is_bounded_least_recently_used_out():
    jit_cache.clear()
    first = jit_cache.cached(MODEL, "n", 0, lambda: object())
    for i in range(1, jit_cache.MAX_ENTRIES + 1):
        jit_cache.cached(MODEL, "n", i, lambda: object())
    assert jit_cache.stats()["entries"] == jit_cache.MAX_ENTRIES
    assert jit_cache.cached(MODEL, "n", 0, lambda: object()) is not first


def test_a_stochastic_model_is_not_served_another_seeds_keys(compiles):
    """The paths of a sampling model carry its base key (from ``seed``): another seed
    builds them again, and each seed's outputs are its own (the oracle, computed with
    that seed's keys, agrees with them)."""
    jit_cache.clear()

    def noisy_one(params, x, key):
        out = MODEL.forward_one(params, x)
        # float32 draws in float32 and float64 runs alike: the oracle repeats them.
        return out + 0.01 * jax.random.normal(key, out.shape, jnp.float32).astype(out.dtype)

    noisy = dataclasses.replace(MODEL, forward_one=noisy_one, forward_batch=None, stochastic=True)
    one = check_batching(noisy, PARAMS, EXAMPLES, seed=1, gradients=False)
    n, two = _compiled(compiles, model=noisy, seed=2, gradients=False)
    assert one.passed and two.passed
    assert n > 0
    again = _compiled(compiles, model=noisy, seed=1, gradients=False)[0]
    assert again == 0
    # The float64 oracle draws seed 2's keys itself: paths built with seed 1's keys
    # would disagree with it, so its being judged is what makes ``passed`` say it.
    assert two.oracle and all(np.isfinite(v) for v in two.oracle.values())
