"""Figures of latency samples: each cell's distribution (:func:`latency_stats`) and the
speed-ups of one path over another, measured in the same run (:func:`speedups`), with
their bootstrap confidence intervals (:func:`ratio_interval`, :func:`speedup_intervals`).

Samples are per-call latencies of one cell, 1-D (n,), seconds for
:func:`latency_stats` and milliseconds elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from vmapcheck.bench.timing.records import LatencyCell
from vmapcheck.core.paths import SPEEDUPS


def latency_stats(samples_s: np.ndarray, rows: int, confidence: float = 0.95) -> LatencyCell:
    """Distribution of per-call latency (samples in seconds) in milliseconds.

    ``samples_s``: one latency a call, 1-d; ``rows``: the batch size of each call (the
    throughput ``rows_per_s`` is at the median). ``median_ci_low``/``median_ci_high``: a
    bootstrap confidence interval of the median (percentile method, fixed seed so the
    report is reproducible).

    >>> figures = latency_stats(np.array([0.004, 0.002, 0.003, 0.002, 0.009]), rows=32)
    >>> figures["p50"], figures["min"], figures["max"], figures["n"]
    (3.0, 2.0, 9.0, 5)
    >>> round(figures["rows_per_s"])  # 32 rows in 3 ms
    10667
    >>> figures["median_ci_low"] <= figures["p50"] <= figures["median_ci_high"]
    True
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
        "min": float(np.min(ms)),
        "max": float(np.max(ms)),
        "n": int(ms.size),
        "median_ci_low": low,
        "median_ci_high": high,
        "rows_per_s": float(rows / (p50 / 1e3)) if p50 > 0 else float("inf"),
    }


def speedups(latency: Mapping[str, Mapping[str, LatencyCell]]) -> dict[str, dict[str, float]]:
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
    slower_ms: np.ndarray | Sequence[float],
    faster_ms: np.ndarray | Sequence[float],
    confidence: float,
    seed: int = 0,
) -> tuple[float, float]:
    """A bootstrap confidence interval (percentile, 999 resamples) of ``median(slower) /
    median(faster)``, the two samples resampled independently."""
    slower, faster = np.asarray(slower_ms, float), np.asarray(faster_ms, float)
    if np.ptp(slower) == 0 and np.ptp(faster) == 0:  # nothing to resample
        ratio = float(np.median(slower) / np.median(faster))
        return ratio, ratio
    result = stats.bootstrap(
        (slower, faster),
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
