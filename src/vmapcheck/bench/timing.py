"""Latency of each forward path after warm-up, as distributions, never a best run.

Method, for every path and batch size:

- jit paths are compiled ahead of time (``jax.jit(f).lower(...).compile()``): that
  compile is timed apart and gives XLA's cost analysis; every path's first call is
  timed apart too (for jit it builds the dispatch cache; eager fills per-op caches);
- ``warmup`` calls are discarded, then ``repeats`` samples are taken, each timed to
  ``block_until_ready`` (JAX dispatches asynchronously: without it we would time the
  dispatch, not the work). The samples are taken in ``ROUNDS`` rounds over every batch
  size; within a round and batch size, in passes over the jit paths (then the eager
  paths). A spell of interference from another tenant of a shared machine thus lands on
  a round or two of every cell instead of on every sample of one batch size, and the
  regression verdict tests the rounds' medians (``vmapcheck.bench.verdict``); each
  cell's samples are stored in time order;
- the order of the paths within a pass follows a balanced Latin square (Williams
  design, :func:`balanced_orders`): over its passes every path directly follows every
  other equally often and takes every position equally often (:func:`pass_orders`
  shuffles the design's passes, seeded, so the joins between passes are balanced on
  average). And every timed call comes right after one discarded call of the *same*
  path, which takes whatever the previous path left (caches, allocator, thread pool):
  timed right after the unrolled ``loop_jit``, ``vmap_jit`` came out measurably slower
  than alone (docs/benchmark.md);
- when one call is too short for the timer (under ``MIN_SAMPLE_TICKS`` of its
  resolution) a sample times a calibrated inner loop of calls and divides;
- a cell may stop early, at a round boundary and never before
  ``bench.early_stop.min_rounds`` rounds (:func:`early_stops`: its median's interval is
  tight enough, or the time budget asks for it); it keeps whole rounds, and
  ``round_sizes`` records them for the verdict;
- no compilation may happen while samples are taken (counted through
  ``jax.monitoring``): a recompile is a harness bug, and the run stops;
- XLA's ``cost_analysis`` gives each jit path's flops and bytes; against the device's
  matmul peak measured in the same run (:func:`peak_sweep`: square products in the run's
  dtype and matmul precision, doubled in size until the device is busy) that gives the
  achieved share of the peak. A path cannot exceed the peak: where its figure would,
  the share is left out and the report says why (:func:`vmapcheck.bench.bounds.roofline_share`);
- the time budget (``bench.early_stop.time_budget_s``) covers the whole bench: compiling,
  warm-up, the peak sweep and the timing. A path whose cost grows with its rows (the
  loop) is left out at a batch size where its projected compile or calls exceed what is
  left of it (:func:`over_budget`);
- a path whose p50 stays flat as the batch grows is launch-bound there
  (:func:`vmapcheck.bench.bounds.launch_bound`): its time is dispatch and transfer, not
  compute, so its ratios say nothing about the work and its rows/s are what matters.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from scipy import stats

from vmapcheck.bench.bounds import launch_bound, roofline_share
from vmapcheck.bench.machine import ConditionsSampler, conditions, machine_record
from vmapcheck.bench.progress import Eta, Progress, silent
from vmapcheck.config import BENCH_ROUNDS, MIN_SAMPLES, BenchConfig, EarlyStopConfig
from vmapcheck.core import contract
from vmapcheck.core.forms import cast_tree, validate_batch
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import (
    PATHS,
    SPEEDUPS,
    Compiled,
    ForwardPath,
    batch_paths,
    not_provided,
    twin,
)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# A sample shorter than this many timer ticks is below the timer's resolution.
MIN_SAMPLE_TICKS = 1000
# Samples are taken in this many rounds spread over the run (module docstring); the
# regression verdict tests the rounds' medians (vmapcheck.bench.verdict.BLOCKS, equal).
# A cell stopped early (bench.early_stop) has fewer, whole rounds.
ROUNDS = BENCH_ROUNDS
# Why a cell's timing ended (bench_details.json's ``early_stop``): it reached its interval
# target, the time budget stopped it, or it took every round.
STOP_CI, STOP_BUDGET, STOP_ALL = "interval within target", "time budget", "all rounds"
# Key of the control matmul among the timed calls (cells are keyed (path, "b<rows>")).
CONTROL = ("control", "matmul")
# A single compile longer than this many seconds is named in the bench's log as it ends.
SLOW_COMPILE_S = 5.0
LIMITS = (
    "A CPU result says nothing about GPU or TPU.",
    "A small model's latency does not predict a large model's.",
    "jit speeds up repeated calls, but compile time (compile_ms), transfers and new "
    "shapes (one compile each) can dominate end-to-end time.",
)


class _CompileCounter:
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
    def _on_event(cls, event: str, duration: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            cls.count += 1
            cls.seconds += duration


def latency_stats(samples_s: np.ndarray, rows: int, confidence: float = 0.95) -> dict[str, float]:
    """Distribution of per-call latency (samples in seconds) in milliseconds.

    ``median_ci_low``/``median_ci_high``: a bootstrap confidence interval of the median
    (percentile method, fixed seed so the report is reproducible).
    """
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    if ms.size > 1 and np.ptp(ms) > 0:
        ci = stats.bootstrap(
            (ms,),
            np.median,
            confidence_level=confidence,
            n_resamples=1000,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    else:
        low = high = float(p50)
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(ms.mean()),
        "std": float(ms.std(ddof=1)) if ms.size > 1 else 0.0,
        "min": float(ms.min()),
        "max": float(ms.max()),
        "n": int(ms.size),
        "median_ci_low": low,
        "median_ci_high": high,
        "rows_per_s": float(rows / (p50 / 1e3)) if p50 > 0 else float("inf"),
    }


def inner_loop_size(one_call_s: float) -> int:
    """Calls per sample so that one sample spans at least MIN_SAMPLE_TICKS timer ticks."""
    resolution = time.get_clock_info("perf_counter").resolution
    return max(1, math.ceil(MIN_SAMPLE_TICKS * resolution / max(one_call_s, 1e-12)))


def warm_up(
    calls: dict[Hashable, Callable[[], Any]],
    warmup: int,
    per_call: dict[Hashable, float] | None = None,
) -> tuple[dict[Hashable, float], dict[Hashable, int]]:
    """Each call's first run timed apart, ``warmup`` runs discarded, then one timed run
    to size the inner loop. Returns (first-call seconds, inner-loop size) by name; fills
    ``per_call`` (when given) with each call's median seconds over its discarded runs and
    that timed one: the cost the progress's ETA plans with (vmapcheck.bench.progress)."""
    first: dict[Hashable, float] = {}
    inner: dict[Hashable, int] = {}
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
    calls: dict[Hashable, Callable[[], Any]],
    inner: dict[Hashable, int],
    samples: dict[Hashable, np.ndarray],
    indices: range,
    isolate: bool = True,
    on_sample: Callable[[Hashable], None] | None = None,
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
    _CompileCounter.start()
    before = _CompileCounter.count
    yield
    recompiles = _CompileCounter.count - before
    if recompiles:
        raise RuntimeError(
            f"{recompiles} compilation(s) happened while timing {what} after warm-up: "
            "a call at an already-seen shape must compile nothing"
        )


def sample_cost(per_call_s: float, inner: int, isolate: bool = True) -> float:
    """Planned seconds of one sample of :func:`sample_passes`: its inner loop of
    ``inner`` calls, and the discarded call before it when ``isolate``."""
    return per_call_s * (inner + (1 if isolate else 0))


def round_slices(repeats: int, rounds: int = ROUNDS) -> list[range]:
    """Sample indices of each round: ``repeats`` cut into ``min(rounds, repeats)``
    contiguous, near-equal ranges (``np.array_split``'s cut, which the verdict's blocks
    use too, so a block is exactly one round)."""
    return [
        range(int(c[0]), int(c[-1]) + 1)
        for c in np.array_split(np.arange(repeats), min(rounds, repeats))
    ]


def median_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """A distribution-free interval of the median of ``values`` (n,): the order
    statistics ``x_(j)``, ``x_(n+1-j)`` with the largest ``j`` whose binomial coverage is
    at least ``confidence`` ([min, max] for 7 values at 95%: coverage 98.4%). No
    resampling: it runs at every round boundary of every cell."""
    x = np.sort(np.asarray(values, float))
    n = x.size
    j = 1
    while j < (n + 1) // 2 and 2 * stats.binom.cdf(j, n, 0.5) <= 1.0 - confidence:
        j += 1
    return float(x[j - 1]), float(x[n - j])


def early_stops(
    round_medians: dict[Hashable, list[float]],
    round_cost_s: dict[Hashable, float],
    rounds_done: int,
    rounds_total: int,
    elapsed_s: float,
    config: EarlyStopConfig,
    confidence: float,
) -> dict[Hashable, str]:
    """Which of the cells still being timed stop now, at the boundary after round
    ``rounds_done`` (1-based) of ``rounds_total``, and why (:data:`STOP_CI`,
    :data:`STOP_BUDGET`).

    ``round_medians``: per cell, the median of each of its rounds so far (all
    ``rounds_done`` of them); ``round_cost_s``: per cell, the seconds one round of it
    costs (its samples' planned cost); ``elapsed_s``: the bench so far (compiling and
    warm-up included: the budget covers them).

    No cell stops before ``config.min_rounds`` rounds. A cell stops when its median's
    interval over its round medians (:func:`median_interval`) has a relative half-width
    within ``config.ci_target``. Then, when finishing every remaining round of the cells
    left would end beyond ``config.time_budget_s``, the dearest cells stop (dearest
    first: the cheap ones cost the budget nothing and keep the verdict's rounds) until
    the rest fits or none may stop.
    """
    if rounds_done < config.min_rounds or rounds_done >= rounds_total:
        return {}
    stops: dict[Hashable, str] = {}
    for cell, medians in round_medians.items():
        low, high = median_interval(np.asarray(medians), confidence)
        center = float(np.median(medians))
        if center > 0 and (high - low) / (2.0 * center) <= config.ci_target:
            stops[cell] = STOP_CI
    if config.time_budget_s is not None:
        left = rounds_total - rounds_done
        going = sorted((c for c in round_medians if c not in stops), key=lambda c: -round_cost_s[c])
        projected = elapsed_s + left * sum(round_cost_s[c] for c in going)
        for cell in going:
            if projected <= config.time_budget_s:
                break
            stops[cell] = STOP_BUDGET
            projected -= left * round_cost_s[cell]
    return stops


def bench_input(template_rows: Any, rows: int, dtype: Any) -> Any:
    """A batch of ``rows`` rows tiled from real rows (every leaf, batch axis 0; float
    leaves at ``dtype``), on the device before timing."""
    return jax.device_put(contract.cast_floats(contract.tile_rows(template_rows, rows), dtype))


def _cost(compiled: Any) -> dict[str, float]:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jaxlibs return one dict per program
        analysis = analysis[0] if analysis else {}
    memory = compiled.memory_analysis()
    return {
        "flops": float((analysis or {}).get("flops", float("nan"))),
        "bytes_accessed": float((analysis or {}).get("bytes accessed", float("nan"))),
        "temp_bytes": float(getattr(memory, "temp_size_in_bytes", float("nan"))),
    }


def _spread_cost(cost: dict[str, float], compiled: Compiled, rows: int) -> dict[str, float]:
    """XLA analyses the per-device SPMD program: scale flops and bytes to the whole mesh
    (padded rows included) so gflops compares with the single-device paths."""
    return {
        **cost,
        "flops": cost["flops"] * compiled.devices,
        "bytes_accessed": cost["bytes_accessed"] * compiled.devices,
        "flops_per_device": cost["flops"],
        "devices": float(compiled.devices),
        "padded_rows": float(compiled.rows_run(rows)),
    }


def matmul_call(dtype: Any, size: int) -> Callable[[], Any]:
    """A compiled (size x size) @ (size x size) matmul, ready to time: the control."""
    a = jax.device_put(jax.numpy.ones((size, size), dtype=dtype))
    compiled = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    return lambda: compiled(a, a)


def control_figures(size: int, samples_s: np.ndarray) -> dict[str, Any]:
    """The control matmul's figures from its samples (seconds): its size, p50 (ms),
    GFLOP/s at p50 and every sample (ms), which the verdict compares round by round."""
    p50 = float(np.median(samples_s))
    return {
        "size": size,
        "p50_ms": p50 * 1e3,
        "gflops": 2 * size**3 / p50 / 1e9,
        "samples_ms": [float(v * 1e3) for v in samples_s],
    }


# The peak sweep (:func:`peak_sweep`): a size is timed this many times (after two
# discarded calls), the sweep doubles the size while the throughput still grows by at
# least PEAK_GROWTH and one call stays under PEAK_MAX_CALL_S, up to PEAK_MAX_SIZE (three
# float32 matrices of 16,384^2 take 3 GiB).
PEAK_SAMPLES = 7
PEAK_GROWTH = 1.1
PEAK_MAX_CALL_S = 0.25
PEAK_MAX_SIZE = 16384


def peak_sweep(dtype: Any, start_size: int, budget_s: float | None = None) -> dict[str, Any]:
    """The device's matmul peak in the run's dtype and matmul precision (JAX's default
    matmul precision, as :func:`vmapcheck.core.runtime.configure_jax` set it): square
    products of ``start_size`` (``bench.peak_matmul_size``), doubled while the throughput
    grows by :data:`PEAK_GROWTH` or more, a call takes under :data:`PEAK_MAX_CALL_S` and
    the size is at most :data:`PEAK_MAX_SIZE`; stops early when ``budget_s`` seconds are
    spent. A small product measures launch overhead, not the device: on a TPU v5e a 512^3
    float32 product ran at 0.4 TFLOP/s and an 8,192^3 one at 148 (2026-12-06).

    Returns ``{"gflops", "size", "p50_ms", "sweep": [{"size", "p50_ms", "gflops"}],
    "dtype", "matmul_precision", "stopped"}``: the best p50 throughput of the sweep, and
    why the sweep stopped (the throughput levelled off, a call grew too long, the size
    cap, the device ran out of memory, or the budget).
    """
    began = time.perf_counter()
    sweep: list[dict[str, float]] = []
    size, stopped = start_size, f"size cap {PEAK_MAX_SIZE}"
    while size <= PEAK_MAX_SIZE:
        try:
            call = matmul_call(dtype, size)
            for _ in range(2):
                jax.block_until_ready(call())
            samples = []
            for _ in range(PEAK_SAMPLES):
                start = time.perf_counter()
                jax.block_until_ready(call())
                samples.append(time.perf_counter() - start)
        except Exception as exc:  # XlaRuntimeError RESOURCE_EXHAUSTED: the device is full
            if "RESOURCE_EXHAUSTED" not in str(exc) and "out of memory" not in str(exc).lower():
                raise
            stopped = f"out of device memory at {size}^3"
            break
        del call
        p50 = float(np.median(samples))
        sweep.append({"size": size, "p50_ms": p50 * 1e3, "gflops": 2 * size**3 / p50 / 1e9})
        if len(sweep) > 1 and sweep[-1]["gflops"] < PEAK_GROWTH * sweep[-2]["gflops"]:
            stopped = f"throughput levelled off at {size}^3"
            break
        if p50 > PEAK_MAX_CALL_S:
            stopped = f"a {size}^3 call took {p50:.2g} s"
            break
        if budget_s is not None and time.perf_counter() - began > budget_s:
            stopped = f"its budget of {budget_s:.3g} s"
            break
        size *= 2
    best = max(sweep, key=lambda entry: entry["gflops"])
    return {
        **best,
        "sweep": sweep,
        "dtype": np.dtype(dtype).name,
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "stopped": stopped,
    }


def samples_per_round(
    sample_s: dict[Hashable, float],
    round_size: int,
    rounds: int,
    budget_s: float | None,
    keep: Iterable[Hashable] = (),
    least: int = 1,
) -> dict[Hashable, int]:
    """How many samples of each cell every round takes (``least`` to ``round_size``) so that
    the planned timing, ``rounds`` rounds of each cell's quota at its ``sample_s``
    seconds a sample, fits ``budget_s`` (None: every cell takes whole rounds).

    The dearest cell gives up a sample a round first, then whichever is dearest again,
    until the plan fits or every cell is down to ``least``: cheap cells cost the budget
    nothing and keep their samples, and a cell of a second a call no longer holds the
    others' rounds hostage. ``keep``: cells never reduced (the control, which the
    verdict compares round by round)."""
    quota = dict.fromkeys(sample_s, round_size)
    if budget_s is None:
        return quota
    kept = set(keep)

    def planned() -> float:
        return rounds * sum(quota[c] * sample_s[c] for c in quota)

    while planned() > budget_s:
        reducible = [c for c in quota if quota[c] > least and c not in kept]
        if not reducible:
            break
        dearest = max(reducible, key=lambda c: quota[c] * sample_s[c])
        quota[dearest] -= 1
    return quota


def over_budget(
    path: ForwardPath,
    rows: int,
    last: tuple[int, float],
    config: BenchConfig,
    least: int,
    spent_s: float = 0.0,
) -> str | None:
    """Why ``path`` is left out at ``rows`` (None: it is timed): a path whose cost grows
    with its rows (one forward per row), projected linearly from ``last`` (rows,
    seconds) at a smaller batch size, would alone take more than what is left of the
    bench's budget (``bench.early_stop.time_budget_s`` less ``spent_s``, the seconds the
    bench has run so far: compiling and warm-up count; None: never left out). A jit
    path's projection is its compile; an eager path's, its warm-up calls and the fewest
    samples its rounds keep (``least`` a round over ``min_rounds``, each after a
    discarded call)."""
    budget = config.early_stop.time_budget_s
    if budget is None:
        return None
    left = budget - spent_s
    last_rows, last_s = last
    scaled = last_s * rows / last_rows
    if path.jit:
        projected, what = scaled, f"its compile (from {last_s:.2g} s at {last_rows} rows)"
    else:
        calls = config.warmup + 2 + 2 * least * config.early_stop.min_rounds
        projected = scaled * calls
        what = f"{calls} calls of {scaled:.2g} s (from {last_s:.2g} s at {last_rows} rows)"
    if projected <= left:
        return None
    return (
        f"{path.name} left out at {rows} rows: {what}, about {projected:.3g} s, exceeds the "
        f"{max(left, 0.0):.3g} s left of the bench's budget of {budget:g} s "
        "(bench.early_stop.time_budget_s; compiling and warm-up count)"
    )


def compile_over_budget(
    name: str,
    rows: int,
    at_this_size: dict[str, float],
    own_last: tuple[int, float] | None,
    budget_s: float | None,
    spent_s: float,
    what: str = "compiling it",
) -> str | None:
    """Why path ``name`` is left out at ``rows`` (None: it is compiled): its compile,
    projected, would end past the bench's budget (``budget_s``, less ``spent_s``, the
    seconds the bench has run so far; None: never left out).

    The projection is the larger of two floors: the dearest compile another path of its
    kind has taken at this batch size (``at_this_size``: path -> seconds; the vmap,
    direct and sharded programs of one model are near-identical, and on a TPU v5e each
    took 35-37 s at 4,096 rows of the CNN at matmul precision highest where 256 rows
    took 1.4 s), and this path's own last compile (``own_last``: rows, seconds) at a
    smaller size, a compile's cost only growing with its rows. Either alone misleads: a
    ``lax.map`` compiled first at a size (0.5 s whatever its rows) said nothing of
    vmap_jit's 35 s there. ``what``: the compile's name in the reason (an eager path's
    first call, which compiles each operation it meets). One compile can still overrun:
    its cost is known only once it is done."""
    if budget_s is None:
        return None
    floors: list[tuple[float, str]] = []
    if at_this_size:
        like, seconds = max(at_this_size.items(), key=lambda item: item[1])
        floors.append((seconds, f"as {like} took at this size"))
    if own_last is not None:
        floors.append((own_last[1], f"as it took at {own_last[0]} rows"))
    if not floors:
        return None
    projected, basis = max(floors, key=lambda floor: floor[0])
    left = budget_s - spent_s
    if projected <= left:
        return None
    return (
        f"{name} left out at {rows} rows: {what} would take about {projected:.3g} s "
        f"({basis}), more than the {max(left, 0.0):.3g} s left of the bench's budget of "
        f"{budget_s:g} s (bench.early_stop.time_budget_s; compiling and warm-up count)"
    )


def out_of_device_memory(error: Exception) -> str | None:
    """XLA's own words when ``error`` is the device running out of memory (a TPU refuses
    the compile: "the total memory required for HLO temporaries (16.52G) exceeds
    available HBM (15.75G)"; a CPU or GPU fails the allocation at the first call), else
    None: any other error is the bench's to raise."""
    if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error):
        return str(error).strip().splitlines()[0]
    return None


Cell = tuple[str, str]  # (path, "b<rows>")


class _DeviceFull(Exception):
    """A cell the device has no memory for; its message is the reason it is left out."""


@dataclass
class _Compiler:
    """The compile phase of :func:`run_bench`: which cells are left out and why, and each
    kept cell compiled (a jit path) and called once, its first call, which for an eager
    path compiles each operation it meets at the new shape. What each cost is what the
    budget's projections (:func:`over_budget`, :func:`compile_over_budget`) read.

    ``built``: path -> its :class:`Compiled` (absent ones in ``absent``: path -> why);
    ``began``: when the bench began (perf_counter), from which the budget counts;
    ``least``: the fewest samples a round a cell keeps (:func:`over_budget`)."""

    built: dict[str, Compiled | None]
    absent: dict[str, str]
    run_params: Params
    config: BenchConfig
    began: float
    least: int
    progress: Progress
    # Cell -> its compile_ms and XLA's cost analysis ({} for an eager cell).
    figures: dict[Cell, dict[str, float]] = field(default_factory=dict)
    # Cell -> seconds of its first call, made here so that the budget governs it.
    first_calls: dict[Cell, float] = field(default_factory=dict)
    # What each path whose cost grows with its rows (a bench_cap path) cost at the last
    # batch size: (rows, seconds), its compile (jit) or one warm call (eager).
    grown: dict[str, tuple[int, float]] = field(default_factory=dict)
    # Every jit path's last compile (rows, seconds), and each size's compiles so far
    # (rows -> path -> seconds); the same for the eager paths' first calls (the CNN's
    # vmap_eager on a TPU: tens of seconds at 16,384 rows).
    compile_last: dict[str, tuple[int, float]] = field(default_factory=dict)
    compiled_at: defaultdict[int, dict[str, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    first_last: dict[str, tuple[int, float]] = field(default_factory=dict)
    first_at: defaultdict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    # Path -> (rows, XLA's words) where the device ran out of memory: no larger size.
    out_of_memory: dict[str, tuple[int, str]] = field(default_factory=dict)

    def left_out(self, path: ForwardPath, rows: int) -> str | None:
        """Why ``path`` is not timed at ``rows`` (None: it is compiled)."""
        name, config = path.name, self.config
        budget = config.early_stop.time_budget_s
        first_size = rows == config.batch_sizes[0]
        if name in self.absent:
            return f"not provided: {self.absent[name]}"
        if name in self.out_of_memory:
            at, words = self.out_of_memory[name]
            return (
                f"{name} left out at {rows} rows: the device ran out of memory for it at "
                f"{at} rows ({words})"
            )
        cap = getattr(config, path.bench_cap) if path.bench_cap else None
        if cap is not None and rows > cap:
            return (
                f"{name} capped at {cap} rows (bench.{path.bench_cap}): one Python-level "
                "forward per row, unrolled by jit"
            )
        spent = time.perf_counter() - self.began
        if path.bench_cap and name in self.grown:
            over = over_budget(path, rows, self.grown[name], config, self.least, spent)
            if over:
                return over
        # Every path is timed at the first batch size; past it, once compiling has
        # spent the whole budget, the sizes still to compile are left out.
        if budget is not None and not first_size and spent > budget:
            return (
                f"{name} left out at {rows} rows: compiling had spent {spent:.3g} s, the "
                f"bench's whole budget of {budget:g} s (bench.early_stop.time_budget_s)"
            )
        # And so is a path whose compile (a jit program, or an eager path's first
        # call), projected, would end past it.
        if path.bench_cap or first_size:
            return None
        if path.jit:
            return compile_over_budget(
                name, rows, self.compiled_at[rows], self.compile_last.get(name), budget, spent
            )
        return compile_over_budget(
            name,
            rows,
            self.first_at[rows],
            self.first_last.get(name),
            budget,
            spent,
            what="its first call (compiling each operation it meets)",
        )

    def compile(self, path: ForwardPath, rows: int, x: Any) -> Callable[[], Any]:
        """``path`` compiled at ``rows`` (``x``: the batch) and called once; returns the
        call to time.

        Raises:
            _DeviceFull: the device has no memory for it (XLA's RESOURCE_EXHAUSTED); the
                path's larger sizes are left out too.
        """
        name, cell = path.name, (path.name, f"b{rows}")
        compiled = self.built[name]
        assert compiled is not None  # absent paths are left out before
        # On its device(s) already (a distributed path: split over the mesh), as every
        # path's batch is before it is timed.
        args = compiled.place(self.run_params, x)
        try:
            if path.jit:
                start = time.perf_counter()
                cost = _cost(compiled.fn.lower(*args).compile())
                self.figures[cell] = {
                    "compile_ms": (time.perf_counter() - start) * 1e3,
                    **(_spread_cost(cost, compiled, rows) if path.distributed else cost),
                }
            start = time.perf_counter()
            jax.block_until_ready(compiled.fn(*args))
            self.first_calls[cell] = time.perf_counter() - start
            if path.bench_cap and not path.jit and self.config.early_stop.time_budget_s is not None:
                # One warm call (the first compiled each primitive it met): what a
                # per-row loop's cost at a larger size is projected from.
                start = time.perf_counter()
                jax.block_until_ready(compiled.fn(*args))
                self.grown[name] = (rows, time.perf_counter() - start)
        except jax.errors.JaxRuntimeError as error:
            words = out_of_device_memory(error)
            if words is None:
                raise
            self.figures.pop(cell, None)
            self.out_of_memory[name] = (rows, words)
            raise _DeviceFull(
                f"{name} left out at {rows} rows: the device ran out of memory ({words})"
            ) from error
        if path.jit:
            seconds, what = self.figures[cell]["compile_ms"] / 1e3, "compiling"
            self.grown[name] = self.compile_last[name] = (rows, seconds)
            # A per-row loop's compile grows with its rows: no yardstick for the
            # batched programs.
            if not path.bench_cap:
                self.compiled_at[rows][name] = seconds
        else:
            self.figures[cell] = {}
            seconds, what = self.first_calls[cell], "the first call of"
            if not path.bench_cap:
                self.first_last[name] = (rows, seconds)
                self.first_at[rows][name] = seconds
        # A compile this slow is where an accelerator's budget goes (a TPU compiled the
        # unrolled loop_jit of a CNN in 24 s at 256 rows): named as it happens, not only
        # in bench_details once the bench is done.
        if seconds > SLOW_COMPILE_S:
            self.progress.note(f"{what} {name} at {rows} rows took {seconds:.1f} s")
        # Timed through the (jitted) function, as users call it: its C++ dispatch path
        # is faster than calling the AOT-compiled object from Python.
        return lambda f=compiled.fn, a=args: f(*a)


@dataclass
class _Rounds:
    """What :func:`_time_rounds` measured: ``secs`` (cell -> seconds per sample, NaN
    where the cell took none), ``rounds`` (each round's sample indices), ``quota`` (cell
    -> samples a round), ``timed_rounds`` (cell -> rounds it took), ``stopped`` (cell ->
    why it stopped early) and the phase's wall ``seconds``."""

    secs: dict[Cell, np.ndarray]
    rounds: list[range]
    quota: dict[Cell, int]
    timed_rounds: dict[Cell, int]
    stopped: dict[Cell, str]
    seconds: float


def _time_rounds(
    groups: list[dict[Cell, Callable[[], Any]]],
    cells: int,
    per_call: dict[Cell, float],
    inner: dict[Cell, int],
    config: BenchConfig,
    timing_budget: float | None,
    least: int,
    bench_began: float,
    progress: Progress,
) -> _Rounds:
    """Time ``groups`` (the control's first, then one per batch size and mode; ``cells``
    of them besides the control) in rounds (a spell of interference from another tenant
    of a shared machine then lands on a round or two of every cell, not on every sample
    of one batch size; within a group the paths take turns in a balanced order, each
    timed call right after a discarded call of its own: :func:`sample_passes`), within
    ``timing_budget`` seconds (None: no bound), each cell leaving at a round boundary
    once :func:`early_stops` says so.
    ``per_call`` and ``inner``: each cell's cost and inner loop from warm-up;
    ``bench_began``: when the bench began (the budget covers compiling and warm-up)."""
    # NaN where a cell took no sample: a cell of a reduced quota fills a prefix of
    # each round's indices.
    secs = {cell: np.full(config.repeats, np.nan) for group in groups for cell in group}
    rounds = round_slices(config.repeats)
    # The ETA's units: planned seconds (each sample's calls at the cell's measured cost).
    sample_s = {cell: sample_cost(per_call[cell], inner[cell]) for cell in secs}
    # The time budget binds from the first round: the dearest cells take fewer samples
    # a round (samples_per_round), not only fewer rounds once min_rounds are done.
    quota = samples_per_round(
        sample_s,
        max(len(r) for r in rounds),
        len(rounds),
        timing_budget,
        keep=[CONTROL],
        # A cell stopped at min_rounds still holds the samples a run's reader requires.
        least=least,
    )
    planned = sum(sample_s[c] * sum(min(quota[c], len(r)) for r in rounds) for c in secs)
    planned_samples = sum(min(quota[c], len(r)) for c in secs for r in rounds)
    # Early stopping (bench.early_stop, :func:`early_stops`): a cell leaves the rounds at
    # a round boundary, so it keeps whole rounds for the verdict. The control never stops:
    # the verdict compares it round by round.
    timed_rounds: dict[tuple[str, str], int] = {cell: len(rounds) for cell in secs}
    stopped: dict[tuple[str, str], str] = {}
    with (
        no_compiles(f"{cells} cells"),
        progress.phase(
            f"timing {cells} cells and the control in {len(rounds)} rounds",
            planned,
            planned_samples,
            unit="samples",
            eta=Eta(planned, prior_rate=1.0),
        ) as timing,
    ):
        began = time.perf_counter()
        for done, indices in enumerate(rounds, start=1):
            for group in groups:
                for i in indices:
                    # A cell of quota q takes the first q indices of every round.
                    active = {
                        c: f
                        for c, f in group.items()
                        if c not in stopped and i - indices.start < quota[c]
                    }
                    if not active:  # every cell of this batch size and mode is done
                        continue
                    sample_passes(
                        active,
                        inner,
                        secs,
                        range(i, i + 1),
                        on_sample=lambda c: timing.advance(sample_s[c]),
                    )
            going = [c for c in secs if c != CONTROL and c not in stopped]
            # Since the bench began: the budget covers compiling and warm-up too.
            elapsed = time.perf_counter() - bench_began
            # A round's cost as planned in warm-up, scaled by how much slower (or faster)
            # than planned the machine has been so far: under load the plan is low.
            pace = (time.perf_counter() - began) / timing.done if timing.done > 0 else 1.0
            now = early_stops(
                {
                    c: [float(np.nanmedian(secs[c][r.start : r.stop])) for r in rounds[:done]]
                    for c in going
                },
                {c: pace * sample_s[c] * min(quota[c], len(indices)) for c in going},
                done,
                len(rounds),
                elapsed,
                config.early_stop,
                config.confidence_level,
            )
            for cell, why in now.items():
                stopped[cell] = why
                timed_rounds[cell] = done
                # The work it leaves is no longer planned: the ETA counts what is left.
                left = sum(min(quota[cell], len(r)) for r in rounds[done:])
                timing.drop(left * sample_s[cell], left)
        if stopped:
            reasons = sorted(set(stopped.values()))
            progress.note(
                f"stopped early: {len(stopped)} of {cells} cells "
                f"({', '.join(f'{sum(w == r for w in stopped.values())} {r}' for r in reasons)})"
            )
    return _Rounds(secs, rounds, quota, timed_rounds, stopped, time.perf_counter() - began)


def _cell_results(
    names: list[str],
    figures: dict[Cell, dict[str, float]],
    first: dict[Cell, float],
    inner: dict[Cell, int],
    timed: _Rounds,
    peak_gflops: float,
    config: BenchConfig,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each timed cell's figures, by kind ("figures", "latency", "samples",
    "round_sizes", "stopping"), each path -> "b<rows>" -> value, for the paths
    ``names``: its latency distribution over the whole rounds it kept, its samples (ms),
    how its timing ended, and its compile, first call, flops and share of the
    ``peak_gflops``."""
    per_path: dict[str, dict[str, Any]] = {name: {} for name in names}
    latency: dict[str, dict[str, Any]] = {name: {} for name in names}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    round_sizes: dict[str, dict[str, list[int]]] = {name: {} for name in names}
    stopping: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    secs, rounds, quota = timed.secs, timed.rounds, timed.quota
    for cell in figures:
        name, label = cell
        rows = int(label[1:])
        kept = rounds[: timed.timed_rounds[cell]]
        # Whole rounds, each the prefix of its indices the cell's quota took.
        by_round = [secs[cell][r.start : r.stop][: quota[cell]] for r in kept]
        taken = np.concatenate(by_round)
        stats_ = latency_stats(taken, rows, config.confidence_level)
        latency[name][label] = stats_
        samples[name][label] = [float(v * 1e3) for v in taken]
        round_sizes[name][label] = [len(r) for r in by_round]
        medians = [float(np.median(r)) for r in by_round]
        low, high = median_interval(np.asarray(medians), config.confidence_level)
        stopping[name][label] = {
            "rounds": len(kept),
            "samples": int(taken.size),
            "stopped": timed.stopped.get(cell, STOP_ALL),
            # Samples a round it took: fewer than the round's size when the time budget
            # made it give some up (samples_per_round).
            "samples_per_round": min(quota[cell], max(len(r) for r in kept)),
            "interval_half_width": (high - low) / (2.0 * float(np.median(medians))),
        }
        # Eager paths do the same arithmetic as their jit twin: use its flop count; a
        # path whose loop XLA counts once uses the count of its flops_as path.
        jit_twin = twin(PATHS[name])
        twin_figures = figures.get((jit_twin.name, label), {}) if jit_twin else {}
        flops = figures[cell].get("flops", twin_figures.get("flops", float("nan")))
        if PATHS[name].flops_as is not None:
            flops = figures.get((PATHS[name].flops_as, label), {}).get("flops", float("nan"))
        gflops = flops / (stats_["p50"] / 1e3) / 1e9
        per_path[name][label] = {
            **figures[cell],
            "first_call_ms": first[cell] * 1e3,
            "inner_loop": inner[cell],
            "flops": flops,
            "gflops": gflops,
            "roofline": roofline_share(gflops, peak_gflops),
        }
    return {
        "figures": per_path,
        "latency": latency,
        "samples": samples,
        "round_sizes": round_sizes,
        "stopping": stopping,
    }


def _warm_groups(
    groups: list[dict[Cell, Callable[[], Any]]],
    warmup: int,
    first_calls: dict[Cell, float],
    progress: Progress,
) -> tuple[dict[Cell, float], dict[Cell, int], dict[Cell, float]]:
    """Every cell of ``groups`` warmed up (:func:`warm_up`): (first-call seconds, inner
    loop, per-call seconds) by cell, the first call being the one made right after its
    compile (``first_calls``) where there was one."""
    first: dict[Cell, float] = {}
    inner: dict[Cell, int] = {}
    per_call: dict[Cell, float] = {}
    with progress.phase("warming up", sum(len(g) for g in groups), unit="cells") as warming:
        for group in groups:
            f, i = warm_up(group, warmup, per_call)
            first |= f | {cell: first_calls[cell] for cell in group if cell in first_calls}
            inner |= i
            warming.advance(len(group), len(group))
    return first, inner, per_call


def _measure_peak(
    dtype: Any, start_size: int, budget: float | None, progress: Progress
) -> dict[str, Any]:
    """The device's peak (:func:`peak_sweep`), in the run's dtype and matmul precision, at
    sizes that fill it; a tenth of the bench's ``budget`` at most (its first size always
    runs)."""
    with progress.phase("measuring the matmul peak", 1, unit="sweep") as sweeping:
        peak = peak_sweep(dtype, start_size, None if budget is None else budget / 10)
        sweeping.advance()
    progress.note(
        f"matmul peak {peak['gflops']:.1f} GFLOP/s ({peak['size']}^3 {peak['dtype']}, "
        f"matmul precision {peak['matmul_precision']}; sweep stopped: {peak['stopped']})"
    )
    return peak


def run_bench(
    model: Model,
    params: Params,
    template_rows: np.ndarray,
    config: BenchConfig,
    dtype: Any,
    progress: Progress | None = None,
    mesh: Mesh | None = None,
    sampler: ConditionsSampler | None = None,
) -> dict[str, Any]:
    """Time every path at every batch size; returns figures, skips and conditions.

    ``progress``: where the phases are shown (compiling, warming up, timing; None: not
    shown). The timing's ETA plans with each cell's per-call cost measured in warm-up
    (:func:`sample_cost`), so it does not jump from a cheap cell to a dear one.
    ``mesh``: the devices of the data-parallel ``sharded_jit`` path (None: all present).
    It is timed on its padded batch already split over the mesh, as every other path's
    batch is already on its device; its flops count every device's share.
    ``sampler``: a running :class:`~vmapcheck.bench.machine.ConditionsSampler` whose span
    covers more than this call (None: one from the start of this call to its end).
    """
    progress = progress or silent()
    # The load and frequency from here to the end (a caller timing more, the bench stage
    # with its replays, passes its own sampler, started before and stopped after).
    own_sampler = sampler is None
    sampler = (sampler or ConditionsSampler()).start()
    # Where the bench's own time goes (the profile's bound is read off these); the time
    # budget counts from here: compiling, warm-up and the peak sweep spend it too.
    bench_began = phase_began = time.perf_counter()
    budget = config.early_stop.time_budget_s
    paths = batch_paths()
    absent = not_provided(model)
    built = {p.name: p.compile(model, mesh) for p in paths if p.name not in absent}
    run_params = jax.device_put(cast_tree(params, dtype))
    before = conditions()
    # The control: a matmul timed in every round like the cells (so it sees the same
    # machine), the verdict's yardstick for "the machine itself changed speed". Timed
    # once, before the rounds, it swung 0.56x to 2.2x between quiet runs here. It is
    # small (bench.peak_matmul_size): not the peak, which peak_sweep measures.
    control = {CONTROL: matmul_call(dtype, config.peak_matmul_size)}
    skipped: dict[str, dict[str, str]] = {p.name: {} for p in paths}
    # Every cell is compiled (and its cost analysed) before any is timed. A cell is one
    # path at one batch size, keyed (path, "b<rows>"). Jit cells are timed interleaved
    # with each other and eager cells with each other (an eager call's many small
    # dispatches would otherwise leave a tiny jit call behind them measurably slower),
    # one batch size at a time (a batch-1 call right after a batch-4096 one would be
    # timed with the caches the big one left): one group per batch size and mode.
    groups: list[dict[Cell, Callable[[], Any]]] = [control]
    # Samples a round a cell keeps at least (samples_per_round).
    least = min(
        max(len(r) for r in round_slices(config.repeats)),
        math.ceil(MIN_SAMPLES / min(config.early_stop.min_rounds, ROUNDS)),
    )
    compiler = _Compiler(built, absent, run_params, config, bench_began, least, progress)
    figures = compiler.figures
    # Compile times are not known before (an unrolled loop's grows with its rows): a
    # count, no ETA.
    with progress.phase("compiling", len(config.batch_sizes), unit="batch sizes") as step:
        for rows in config.batch_sizes:
            x = bench_input(template_rows, rows, dtype)
            validate_batch(x, model, dtype)
            label = f"b{rows}"
            by_mode: dict[str, dict[Cell, Callable[[], Any]]] = {"jit": {}, "eager": {}}
            for path in paths:
                why = compiler.left_out(path, rows)
                if why is None:
                    try:
                        by_mode[path.mode][(path.name, label)] = compiler.compile(path, rows, x)
                    except _DeviceFull as full:
                        why = str(full)
                        progress.note(why)
                if why is not None:
                    skipped[path.name][label] = why
            groups += [group for group in by_mode.values() if group]
            step.advance()
    compile_s = time.perf_counter() - phase_began
    phase_began = time.perf_counter()
    first, inner, per_call = _warm_groups(groups, config.warmup, compiler.first_calls, progress)
    warm_up_s = time.perf_counter() - phase_began
    phase_began = time.perf_counter()
    peak = _measure_peak(dtype, config.peak_matmul_size, budget, progress)
    peak_s = time.perf_counter() - phase_began
    # What the timing may still spend: compiling, warm-up and the sweep came first.
    before_timing_s = time.perf_counter() - bench_began
    timing_budget = None if budget is None else max(budget - before_timing_s, 0.0)
    timed = _time_rounds(
        groups, len(figures), per_call, inner, config, timing_budget, least, bench_began, progress
    )
    control_ = control_figures(config.peak_matmul_size, timed.secs[CONTROL])
    cells_by_path = _cell_results(
        [p.name for p in paths], figures, first, inner, timed, peak["gflops"], config
    )
    latency, samples = cells_by_path["latency"], cells_by_path["samples"]
    after = conditions()
    if own_sampler:
        sampler.stop()
    return {
        "batch_sizes": list(config.batch_sizes),
        "latency_ms": latency,
        "figures": cells_by_path["figures"],
        "speedup": speedups(latency),
        "speedup_ci": speedup_intervals(samples, config.confidence_level),
        "peak": peak,
        "control": control_,
        "launch_bound": launch_bound(latency),
        "skipped": skipped,
        "samples_ms": samples,
        # Samples in each of a cell's rounds, in order (the verdict's blocks; a cell
        # stopped early has fewer rounds), and why each cell's timing ended.
        "round_sizes": cells_by_path["round_sizes"],
        "early_stop": {
            "settings": config.early_stop.model_dump(),
            "cells": cells_by_path["stopping"],
        },
        # Noisy: the highest load over the whole bench (so far, for a caller's sampler
        # still running: vmapcheck.pipeline.bench records it again at its end).
        "machine": machine_record(before, after, sampler.summary()),
        "limits": list(LIMITS),
        "phases_s": {
            "compile": round(compile_s, 3),
            "warm_up": round(warm_up_s, 3),
            "peak_sweep": round(peak_s, 3),
            "timing": round(timed.seconds, 3),
        },
    }


def speedups(latency: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Ratios of p50 latencies measured in the same run (robust to a slow machine), one
    per :data:`vmapcheck.core.paths.SPEEDUPS` entry and batch size both paths ran at:
    ``vmap_over_loop`` (how many times faster vmap is than the loop, jit vs jit) and
    ``vmap_over_direct`` (vmap's cost relative to the hand-batched form; 1.0 = free).
    """
    labels = dict.fromkeys(label for by_batch in latency.values() for label in by_batch)
    out: dict[str, dict[str, float]] = {}
    for label in labels:
        entry = {
            s.name: latency[s.slower][label]["p50"] / latency[s.faster][label]["p50"]
            for s in SPEEDUPS
            if label in latency.get(s.slower, {}) and label in latency.get(s.faster, {})
        }
        out[label] = entry
    return out


def ratio_interval(
    slower_ms: np.ndarray, faster_ms: np.ndarray, confidence: float, seed: int = 0
) -> tuple[float, float]:
    """A bootstrap confidence interval (percentile, 999 resamples) of ``median(slower) /
    median(faster)``, the two samples resampled independently."""
    slower_ms, faster_ms = np.asarray(slower_ms, float), np.asarray(faster_ms, float)
    if np.ptp(slower_ms) == 0 and np.ptp(faster_ms) == 0:  # nothing to resample
        ratio = float(np.median(slower_ms) / np.median(faster_ms))
        return ratio, ratio
    result = stats.bootstrap(
        (np.asarray(slower_ms), np.asarray(faster_ms)),
        lambda a, b, axis=-1: np.median(a, axis=axis) / np.median(b, axis=axis),
        paired=False,
        vectorized=True,
        n_resamples=999,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    ).confidence_interval
    return float(result.low), float(result.high)


def speedup_intervals(
    samples_ms: dict[str, dict[str, list[float]]], confidence: float
) -> dict[str, dict[str, list[float]]]:
    """``{label: {speedup: [low, high]}}``: the confidence interval of each
    :data:`~vmapcheck.core.paths.SPEEDUPS` ratio at each batch size both paths ran at.
    An interval that contains 1.0 is no measurable difference."""
    out: dict[str, dict[str, list[float]]] = {}
    labels = dict.fromkeys(label for by_batch in samples_ms.values() for label in by_batch)
    for label in labels:
        out[label] = {
            s.name: list(
                ratio_interval(samples_ms[s.slower][label], samples_ms[s.faster][label], confidence)
            )
            for s in SPEEDUPS
            if label in samples_ms.get(s.slower, {}) and label in samples_ms.get(s.faster, {})
        }
    return out
