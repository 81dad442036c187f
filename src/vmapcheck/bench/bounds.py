"""What a benchmark's figures may claim: a path's share of the matmul peak, and where a
path is launch-bound. Pure functions of the figures (no JAX): the bench stage, the
printed verdict, the HTML report and MLflow all label from here.

On an accelerator a small call is dominated by its fixed cost: a TPU v5e took 0.46-0.75
ms for every jit path at every batch size from 1 to 4,096 rows (2026-12-06), so a ratio
of two such paths compares two launches, and a product of 512^3 measured 0.3% of the
chip's matmul peak. These labels keep such figures from saying more than was measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# What a launch-bound label means, wherever it is printed.
LAUNCH_BOUND_MEANING = (
    "its time is dispatch and transfer, not compute: its ratios there say nothing about "
    "the work; compare rows/s"
)


def peak_contention(peak: Mapping[str, Any] | None) -> str | None:
    """What a share of ``peak`` (a :class:`~vmapcheck.bench.records.Peak`) must say when
    the peak was measured on a machine busier than its cores (``contended``, from
    :func:`vmapcheck.bench.control.best_peak`), else None: such a peak reads low (on two
    shared cores one sweep gave 40.5 to 131.3 GFLOP/s, issue 44), so every share of it
    reads high. ``peak measured under contention (load 12.3 on 2 usable cores): shares
    of it read high``."""
    if not peak or not peak.get("contended"):
        return None
    return (
        f"peak measured under contention (load {peak['load_avg_1m']:.1f} on "
        f"{peak['usable_cores']} usable cores): shares of it read high"
    )


def roofline_share(gflops: float, peak_gflops: float) -> float | None:
    """A path's achieved share of the matmul peak, or None where it would exceed 1: a
    path cannot outrun the device's peak, so a share over 1 means its flop count (XLA's
    cost analysis) or the peak is wrong, and no figure is shown for it."""
    if not (math.isfinite(gflops) and peak_gflops > 0):
        return None
    share = gflops / peak_gflops
    return share if share <= 1.0 else None


# A path is launch-bound up to a batch size where its p50 is within this factor of its
# p50 at its smallest batch size (:func:`launch_bound`), the batch having grown at least
# LAUNCH_MIN_GROWTH times: the work grew with the rows, the time did not.
LAUNCH_FLAT_FACTOR = 1.5
LAUNCH_MIN_GROWTH = 8


def launch_bound(latency_ms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The paths whose time is flat in batch size: ``{path: {"from_rows", "up_to_rows",
    "p50_ms_from", "p50_ms_up_to", "rows_per_s"}}``, for each path whose p50 at some
    batch of at least :data:`LAUNCH_MIN_GROWTH` times its smallest timed batch stays
    within :data:`LAUNCH_FLAT_FACTOR` of the p50 there. ``up_to_rows`` is the largest
    such batch, and ``rows_per_s`` its throughput at p50: there the time is the call's
    fixed cost (dispatch, transfer, a launch), not its work, so the path would take more
    rows for the same time; compare paths by rows per second at batch sizes past it.

    ``latency_ms``: per path, per ``b<rows>`` label, :func:`latency_stats`."""
    out: dict[str, dict[str, Any]] = {}
    for path, by_batch in latency_ms.items():
        timed = sorted((int(label[1:]), stats_["p50"]) for label, stats_ in by_batch.items())
        if len(timed) < 2:
            continue
        (rows0, p50_0), flat = timed[0], None
        for rows, p50 in timed[1:]:
            if rows >= LAUNCH_MIN_GROWTH * rows0 and p50 <= LAUNCH_FLAT_FACTOR * p50_0:
                flat = (rows, p50)
        if flat is not None:
            out[path] = {
                "from_rows": rows0,
                "up_to_rows": flat[0],
                "p50_ms_from": p50_0,
                "p50_ms_up_to": flat[1],
                "rows_per_s": flat[0] / (flat[1] / 1e3),
            }
    return out


def launch_bound_text(entry: dict[str, Any]) -> str:
    """``up to 4096 rows (p50 0.51 ms at 1 row, 0.55 ms at 4096; 7.4e+06 rows/s)``."""
    return (
        f"up to {entry['up_to_rows']} rows (p50 {entry['p50_ms_from']:.3g} ms at "
        f"{entry['from_rows']} row(s), {entry['p50_ms_up_to']:.3g} ms at "
        f"{entry['up_to_rows']}; {entry['rows_per_s']:.3g} rows/s)"
    )


def launch_bound_at(launch: dict[str, dict[str, Any]], path: str, rows: int) -> bool:
    """Whether ``path`` is launch-bound at ``rows`` (:func:`launch_bound`'s result)."""
    entry = launch.get(path)
    return entry is not None and entry["from_rows"] <= rows <= entry["up_to_rows"]


def ratio_launch_bound(launch: dict[str, dict[str, Any]], speedup: str, rows: int) -> bool:
    """Whether both paths of the same-run ratio ``speedup`` (a
    :data:`vmapcheck.core.paths.SPEEDUPS` name) are launch-bound at ``rows``: the ratio
    then compares two fixed costs, not two computations."""
    from vmapcheck.core.paths import SPEEDUPS

    entry = next((s for s in SPEEDUPS if s.name == speedup), None)
    return entry is not None and all(
        launch_bound_at(launch, path, rows) for path in (entry.slower, entry.faster)
    )
