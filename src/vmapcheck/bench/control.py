"""The control: a square matmul timed in the same run as the cells, and the device's
matmul peak swept in the run's dtype and matmul precision (:func:`peak_sweep`).

The control's samples are compared round by round by the regression verdict (a slower
machine withholds a regression: :func:`vmapcheck.bench.verdict.judge_control`); the peak
is what the roofline share of each jit path is read against
(:func:`vmapcheck.bench.bounds.roofline_share`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


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
