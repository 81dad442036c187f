"""How one latency sample is taken: the calls warmed up, the order of the calls within a
pass, each timed sample after a discarded call of the same function, and no compile
while timing.

- :func:`warm_up`: each call's first run timed apart, ``warmup`` runs discarded, and the
  inner loop sized so that a sample spans at least :data:`MIN_SAMPLE_TICKS` timer ticks
  (:func:`inner_loop_size`);
- :func:`balanced_orders`, :func:`pass_orders`: the Williams design the passes follow
  (every call directly follows every other equally often);
- :func:`sample_passes`: the passes themselves; :func:`sample_cost`: what one costs;
- :class:`CompileCounter`, :func:`no_compiles`: XLA compilations counted through
  ``jax.monitoring`` (a compile while timing is a harness bug);
- :func:`bench_input`: the batch a cell times, on the device.

Used by the bench stage (:mod:`vmapcheck.bench.timing.run`), the paired verdict's workers
(:mod:`vmapcheck.bench.verdict.worker`) and the serving guard (:mod:`vmapcheck.guard.predictor`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import jax
import numpy as np

from vmapcheck.core import contract

# A cell's key, whatever the caller times (a (path, label) pair, a worker's cell name):
# the maps in and out share it.
K = TypeVar("K", bound=Hashable)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# A sample shorter than this many timer ticks is below the timer's resolution.
MIN_SAMPLE_TICKS = 1000


class CompileCounter:
    """Counts XLA compilations in this process (persistent-cache hits count too), and
    the seconds they took in all."""

    count = 0
    seconds = 0.0
    _registered = False

    @classmethod
    def start(cls) -> None:
        if not cls._registered:
            jax.monitoring.register_event_duration_secs_listener(cls._on_event)
            cls._registered = True

    @classmethod
    def _on_event(cls, event: str, duration_secs: float, **_: str | int) -> None:
        if event == COMPILE_EVENT:
            cls.count += 1
            cls.seconds += duration_secs


def inner_loop_size(one_call_s: float) -> int:
    """Calls per sample so that one sample spans at least MIN_SAMPLE_TICKS timer ticks."""
    resolution = time.get_clock_info("perf_counter").resolution
    return max(1, math.ceil(MIN_SAMPLE_TICKS * resolution / max(one_call_s, 1e-12)))


def warm_up(
    calls: dict[K, Callable[[], Any]],
    warmup: int,
    per_call: dict[K, float] | None = None,
) -> tuple[dict[K, float], dict[K, int]]:
    """Each call's first run timed apart, ``warmup`` runs discarded, then one timed run
    to size the inner loop. Returns (first-call seconds, inner-loop size) by name; fills
    ``per_call`` (when given) with each call's median seconds over its discarded runs and
    that timed one: the cost the progress's ETA plans with (vmapcheck.bench.timing.progress)."""
    first: dict[K, float] = {}
    inner: dict[K, int] = {}
    for name, fn in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - start
        seconds = []
        for _ in range(warmup + 1):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            seconds.append(time.perf_counter() - start)
        inner[name] = inner_loop_size(seconds[-1])
        if per_call is not None:
            per_call[name] = float(np.median(seconds))
    return first, inner


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``range(n)`` forming a Williams design: over all of them, every index
    directly follows every other index equally often (once in ``n`` orders for even
    ``n``; twice in ``2n`` for odd ``n``, the orders and their mirror images) and takes
    every position equally often."""
    if n < 1:
        return []
    # First order 0, 1, n-1, 2, n-2, ...: its steps (mod n) are all different, so the
    # shifted orders hold every ordered pair once (when n is even).
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(v + shift) % n for v in first] for shift in range(n)]
    return orders + [order[::-1] for order in orders] if n % 2 else orders


def pass_orders(n: int, passes: int, seed: int = 0) -> list[list[int]]:
    """The order of ``range(n)`` in each of ``passes`` passes: cycles of
    :func:`balanced_orders`, each cycle's orders shuffled (seeded) so that the joins
    between passes (a pass's first after the previous pass's last) are balanced too, on
    average."""
    design = balanced_orders(n)
    rng = np.random.default_rng(seed)
    orders: list[list[int]] = []
    while len(orders) < passes:
        orders += [design[k] for k in rng.permutation(len(design))]
    return orders[:passes]


def sample_passes(
    calls: dict[K, Callable[[], Any]],
    inner: dict[K, int],
    samples: dict[K, np.ndarray],
    indices: range,
    isolate: bool = True,
    on_sample: Callable[[K], None] | None = None,
) -> None:
    """Fill ``samples[name][i]`` (seconds per call) for every ``i`` in ``indices``: one
    pass over all calls per index, pass ``i`` in order ``i`` of :func:`pass_orders`. With
    ``isolate``, each timed sample comes right after one discarded call of the same
    function, which takes what the call before it left behind. ``on_sample(name)`` runs
    after each sample is taken (progress), outside the timed span."""
    names = list(calls)
    orders = pass_orders(len(names), indices.stop)
    for i in indices:
        for k in orders[i]:
            name = names[k]
            fn, n = calls[name], inner[name]
            if isolate:
                jax.block_until_ready(fn())
            start = time.perf_counter()
            for _ in range(n):
                out = fn()
            jax.block_until_ready(out)
            samples[name][i] = (time.perf_counter() - start) / n
            if on_sample is not None:
                on_sample(name)


@contextlib.contextmanager
def no_compiles(what: str) -> Iterator[None]:
    """Raises RuntimeError when anything compiled inside the block (``what``: the calls
    being timed, for the message): a call at an already-seen shape must compile nothing."""
    CompileCounter.start()
    before = CompileCounter.count
    yield
    recompiles = CompileCounter.count - before
    if recompiles:
        raise RuntimeError(
            f"{recompiles} compilation(s) happened while timing {what} after warm-up: "
            "a call at an already-seen shape must compile nothing"
        )


def sample_cost(per_call_s: float, inner: int, isolate: bool = True) -> float:
    """Planned seconds of one sample of :func:`sample_passes`: its inner loop of
    ``inner`` calls, and the discarded call before it when ``isolate``."""
    return per_call_s * (inner + (1 if isolate else 0))


def bench_input(template_rows: Any, rows: int, dtype: Any) -> Any:
    """A batch of ``rows`` rows tiled from real rows (every leaf, batch axis 0; float
    leaves at ``dtype``), on the device before timing."""
    return jax.device_put(contract.cast_floats(contract.tile_rows(template_rows, rows), dtype))
