"""The control: a square matmul timed in the same run as the cells, and the device's
matmul peak swept in the run's dtype and matmul precision (:func:`peak_sweep`).

The control's samples are compared round by round by the regression verdict (a slower
machine withholds a regression: :func:`vmapcheck.bench.verdict.regression.judge_control`); the peak
is what the roofline share of each jit path is read against
(:func:`vmapcheck.bench.timing.bounds.roofline_share`). The peak is the best of several short
sweeps (:func:`best_peak`), and says whether the machine was busier than its cores while
it was measured: a share of a peak measured under contention reads high
(:func:`vmapcheck.bench.timing.bounds.peak_caveat`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from vmapcheck.bench.timing.bounds import PLATEAU_REACHED
from vmapcheck.bench.timing.records import ControlFigures, Peak, SweepPoint


def matmul_call(dtype: Any, size: int) -> Callable[[], Any]:
    """A compiled (size x size) @ (size x size) matmul, ready to time: the control."""
    a = jax.device_put(jax.numpy.ones((size, size), dtype=dtype))
    compiled = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    return lambda: compiled(a, a)


def control_figures(size: int, samples_s: np.ndarray) -> ControlFigures:
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
# least PEAK_GROWTH, one call stays under PEAK_MAX_CALL_S and the next size's would stay
# under PEAK_NEXT_CALL_S, up to PEAK_MAX_SIZE (three float32 matrices of 16,384^2 take
# 3 GiB).
PEAK_SAMPLES = 7


PEAK_GROWTH = 1.1


PEAK_MAX_CALL_S = 0.25
# ... and the next size's call (8x the work) is projected to take under this: at most
# a second, so a sweep never times 9 calls of several seconds each.
PEAK_NEXT_CALL_S = 1.0


PEAK_MAX_SIZE = 16384
# Sweeps :func:`best_peak` takes the best of, budget allowing (the first always runs):
# on two shared cores at load 6-16 one sweep's peak was 40.5, 131.3, 60.2 and 46.7
# GFLOP/s in four runs (issue 44); a spell of contention rarely covers three sweeps.
PEAK_SWEEPS = 3
# The share of the bench's time budget the peak's sweeps may take. On the CPU a sweep
# levels off at a few hundred rows in well under a second. On a TPU v5e each larger
# product compiles for seconds: with a tenth of the accelerator profile's budget the
# sweep stopped at 2048^3 and read 14.6 TFLOP/s, where 30.5 is reachable in float32
# highest (2026-12-07, benchmarks/tpu_peak_20261207.json), so every share of it read high.
PEAK_BUDGET_SHARE = {"cpu": 0.1, "accelerator": 0.3}


def peak_budget(budget_s: float | None, backend: str) -> float | None:
    """Seconds of a bench's ``budget_s`` (None: no budget) the peak's sweeps may take
    on ``backend`` (JAX's platform name: cpu, tpu, gpu): :data:`PEAK_BUDGET_SHARE`."""
    if budget_s is None:
        return None
    return budget_s * PEAK_BUDGET_SHARE["cpu" if backend == "cpu" else "accelerator"]


def peak_sweep(
    dtype: Any,
    start_size: int,
    budget_s: float | None = None,
    spent: Callable[[], float] | None = None,
    calls: dict[int, Callable[[], Any]] | None = None,
) -> Peak:
    """The device's matmul peak in the run's dtype and matmul precision (JAX's default
    matmul precision, as :func:`vmapcheck.core.runtime.configure_jax` set it): square
    products of ``start_size`` (``bench.peak_matmul_size``), doubled while the throughput
    grows by :data:`PEAK_GROWTH` or more, a call takes under :data:`PEAK_MAX_CALL_S`, the
    next size's call would take under :data:`PEAK_NEXT_CALL_S` (8x this one's) and the
    size is at most :data:`PEAK_MAX_SIZE`; stops early when ``budget_s`` seconds are
    spent. A small product measures launch overhead, not the device: on a TPU v5e a 512^3
    float32 product ran at 0.4 TFLOP/s and an 8,192^3 one at 148 (2026-12-06).

    ``spent``: the budget's clock (seconds; None: wall seconds since this call), as the
    bench counts its budget (:class:`vmapcheck.bench.timing.budget.BudgetClock`); ``calls``:
    compiled products by size, filled and reused across the sweeps of :func:`best_peak`.

    Returns ``{"gflops", "size", "p50_ms", "sweep": [{"size", "p50_ms", "gflops"}],
    "dtype", "matmul_precision", "stopped"}``: the best p50 throughput of the sweep, and
    why the sweep stopped (the throughput levelled off, a call grew or would grow too
    long, the size cap, the device ran out of memory, or the budget).
    """
    if spent is None:
        wall0 = time.perf_counter()

        def spent() -> float:
            return time.perf_counter() - wall0

    calls = {} if calls is None else calls
    began = spent()
    sweep: list[SweepPoint] = []
    size, stopped = start_size, f"size cap {PEAK_MAX_SIZE}"
    while size <= PEAK_MAX_SIZE:
        try:
            if size not in calls:
                calls[size] = matmul_call(dtype, size)
            call = calls[size]
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
            stopped = f"{PLATEAU_REACHED} at {size}^3"
            break
        if p50 > PEAK_MAX_CALL_S:
            stopped = f"a {size}^3 call took {p50:.2g} s"
            break
        # The next size does 8x the work: timing it when its call would take several
        # times the cap costs more than the whole sweep below it. On two loaded cores a
        # 2048^3 call took 0.24 s, and the 4096^3 step (9 calls of about 2 s, on both
        # cores) then took 32 of a 42 s bench's wall seconds to read no higher.
        if 8 * p50 > PEAK_NEXT_CALL_S and size * 2 <= PEAK_MAX_SIZE:
            stopped = f"a {size * 2}^3 call would take about {8 * p50:.2g} s"
            break
        if budget_s is not None and spent() - began > budget_s:
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


def best_size(results: list[Peak]) -> int:
    """The product size of the best of ``results`` (:func:`peak_sweep` records)."""
    return int(max(results, key=lambda sweep: sweep["gflops"])["size"])


def _load_1m() -> float:
    return os.getloadavg()[0]


def best_peak(
    dtype: Any,
    start_size: int,
    budget_s: float | None = None,
    spent: Callable[[], float] | None = None,
    sweeps: int = PEAK_SWEEPS,
    load: Callable[[], float] = _load_1m,
    cores: int | None = None,
) -> Peak:
    """The device's matmul peak as the best of up to ``sweeps`` :func:`peak_sweep` runs
    within ``budget_s`` seconds of ``spent`` (the first sweep always runs; None: every
    sweep), each reusing the products the first compiled; a later sweep starts at half
    the best size so far, so it re-times the plateau rather than climbing to it again.
    A loaded machine slows some sweeps, not all: the best is the device's, the others
    the load's.

    Returns :func:`peak_sweep`'s record of the best sweep, and ``"sweeps_gflops"`` (each
    sweep's best, in order), ``"load_avg_1m"`` (the highest 1-minute load average read
    before, between and after the sweeps: ``load``), ``"usable_cores"`` (``cores``;
    None: this process's CPU affinity) and ``"contended"``: that load above the usable
    cores, when every sweep shared the CPU and the peak reads low (a share of it high).
    """
    if spent is None:
        wall0 = time.perf_counter()

        def spent() -> float:
            return time.perf_counter() - wall0

    began = spent()
    calls: dict[int, Callable[[], Any]] = {}
    loads = [load()]
    results: list[Peak] = []
    while len(results) < sweeps:
        left = None if budget_s is None else budget_s - (spent() - began)
        if results and left is not None and left <= 0:
            break
        # A later sweep starts a size below the best so far: short, and still on the
        # plateau the first one climbed to.
        start = start_size if not results else max(start_size, best_size(results) // 2)
        results.append(peak_sweep(dtype, start, left, spent, calls))
        loads.append(load())
    best = max(results, key=lambda sweep: sweep["gflops"])
    usable = len(os.sched_getaffinity(0)) if cores is None else cores
    return {
        **best,
        "sweeps_gflops": [sweep["gflops"] for sweep in results],
        "load_avg_1m": max(loads),
        "usable_cores": usable,
        "contended": max(loads) > usable,
    }
