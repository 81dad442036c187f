"""Latency of each forward path after warm-up, as distributions, never a best run.

For every path and batch size: the first call is timed apart (trace + compile for jit),
then ``warmup`` calls are discarded, then ``repeats`` calls are each timed to
``block_until_ready`` (JAX dispatches asynchronously: without it we would time the
dispatch, not the work), interleaved across paths. Inputs are validated once before
timing, so the figures are the forward alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from vmapcheck.config import BenchConfig
from vmapcheck.machine import conditions
from vmapcheck.models import Model, Params
from vmapcheck.names import PATH_NAMES
from vmapcheck.paths import build_paths, cast_tree, validate_batch


def latency_stats(samples_s: np.ndarray, rows: int) -> dict[str, float]:
    """Distribution of per-call latency (samples in seconds) in milliseconds."""
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(ms.mean()),
        "std": float(ms.std(ddof=1)) if ms.size > 1 else 0.0,
        "min": float(ms.min()),
        "max": float(ms.max()),
        "n": int(ms.size),
        "rows_per_s": float(rows / (p50 / 1e3)) if p50 > 0 else float("inf"),
    }


def time_interleaved(
    calls: dict[str, Callable[[], Any]], warmup: int, repeats: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Time several calls round-robin; returns (first-call seconds, per-call samples).

    Each call's first run (trace and compile for jit) is timed apart, then ``warmup``
    runs are discarded. Samples are then taken in rounds, one of each call per round,
    starting each round at a different call: drift in the machine's state (frequency,
    other tenants) then lands on every path alike, so their ratios stay fair.
    """
    first: dict[str, float] = {}
    for name, fn in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - start
        for _ in range(warmup):
            jax.block_until_ready(fn())
    names = list(calls)
    samples = {name: np.empty(repeats) for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            fn = calls[name]
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name][i] = time.perf_counter() - start
    return first, samples


def bench_input(template_rows: np.ndarray, rows: int, dtype: Any) -> jax.Array:
    """A (rows, n_features) batch tiled from real rows, on the device before timing."""
    batch = np.resize(template_rows, (rows, template_rows.shape[1]))
    return jax.device_put(jax.numpy.asarray(batch, dtype=dtype))


def run_bench(
    model: Model,
    params: Params,
    template_rows: np.ndarray,
    config: BenchConfig,
    dtype: Any,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Time every path at every batch size; returns latency, skips and conditions."""
    paths = build_paths(model, dtype, validate=False)
    run_params = jax.device_put(cast_tree(params, dtype))
    before = conditions()
    latency: dict[str, dict[str, Any]] = {p: {} for p in PATH_NAMES}
    first_call: dict[str, dict[str, float]] = {p: {} for p in PATH_NAMES}
    samples: dict[str, dict[str, list[float]]] = {p: {} for p in PATH_NAMES}
    skipped: dict[str, dict[str, str]] = {p: {} for p in PATH_NAMES}
    for rows in config.batch_sizes:
        x = bench_input(template_rows, rows, dtype)
        validate_batch(x, model.in_features, dtype)
        label = f"b{rows}"
        calls = {}
        for name in PATH_NAMES:
            if name not in paths:
                skipped[name][label] = "not provided: the model has no hand-batched forward"
                continue
            if name.startswith("loop") and rows > config.loop_max_batch:
                skipped[name][label] = (
                    f"loop path capped at {config.loop_max_batch} rows (bench.loop_max_batch): "
                    "one Python-level forward per row, unrolled by jit"
                )
                continue
            calls[name] = lambda fn=paths[name], x=x: fn(run_params, x)
        progress(f"batch {rows}: {', '.join(calls)}")
        first, secs = time_interleaved(calls, config.warmup, config.repeats)
        for name in calls:
            latency[name][label] = latency_stats(secs[name], rows)
            first_call[name][label] = first[name] * 1e3
            samples[name][label] = [float(s * 1e3) for s in secs[name]]
    after = conditions()
    busy = max(before["load_avg_1m"], after["load_avg_1m"]) > (before["usable_cores"] or 1)
    return {
        "batch_sizes": list(config.batch_sizes),
        "latency_ms": latency,
        "first_call_ms": first_call,
        "speedup": speedups(latency),
        "skipped": skipped,
        "samples_ms": samples,
        "machine": {"before": before, "after": after, "noisy": busy},
    }


def speedups(latency: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Ratios of p50 latencies measured in the same run (robust to a slow machine).

    ``vmap_over_loop``: how many times faster vmap is than the loop (jit vs jit);
    ``vmap_over_direct``: vmap's cost relative to the hand-batched form (1.0 = free).
    """
    out: dict[str, dict[str, float]] = {}
    for label, vmap in latency["vmap_jit"].items():
        entry = {}
        if label in latency["loop_jit"]:
            entry["vmap_over_loop"] = latency["loop_jit"][label]["p50"] / vmap["p50"]
        if label in latency["direct_jit"]:
            entry["vmap_over_direct"] = vmap["p50"] / latency["direct_jit"][label]["p50"]
        out[label] = entry
    return out


def metrics_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures DVC shows as metrics (reports/bench.json): percentiles and ratios.

    The full distribution (mean, std, min, max, samples) stays in bench_details.json.
    """
    return {
        "latency_ms": {
            path: {
                label: {stat: stats[stat] for stat in ("p50", "p90", "p99")}
                for label, stats in by_batch.items()
            }
            for path, by_batch in result["latency_ms"].items()
        },
        "speedup": result["speedup"],
    }
