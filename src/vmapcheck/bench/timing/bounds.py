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

import numpy as np

from vmapcheck.bench.timing.records import LaunchBound, LaunchFit

# What a launch-bound label means, wherever it is printed.
LAUNCH_BOUND_MEANING = (
    "its time is dispatch and transfer, not compute: its ratios there say nothing about "
    "the work; compare rows/s"
)


# How a sweep that saw the throughput level off says so (vmapcheck.bench.timing.control.peak_sweep's
# ``stopped``); any other stop (its budget, a long call, the device's memory, the size cap)
# left the sweep short of the plateau, and the peak may read low.
PLATEAU_REACHED = "throughput levelled off"


def peak_caveat(peak: Mapping[str, Any] | None) -> str | None:
    """What a share of ``peak`` (a :class:`~vmapcheck.bench.timing.records.Peak`) must say, else
    None, for either of two reasons it may read low, and every share of it high:

    - it was measured on a machine busier than its cores (``contended``, from
      :func:`vmapcheck.bench.timing.control.best_peak`): on two shared cores one sweep gave 40.5
      to 131.3 GFLOP/s (issue 44);
    - its sweep stopped before the throughput levelled off (``stopped``): on a TPU v5e the
      quick profile's sweep stopped at 2048^3 after its budget, at 14.3 TFLOP/s where 30.5
      is reachable (issue 44).

    ``peak measured under contention (load 12.3 on 2 usable cores); the sweep stopped short
    of a plateau (its budget of 0.6 s): shares of it read high``."""
    if not peak:
        return None
    reasons = []
    if peak.get("contended"):
        reasons.append(
            f"peak measured under contention (load {peak['load_avg_1m']:.1f} on "
            f"{peak['usable_cores']} usable cores)"
        )
    stopped = peak.get("stopped")
    if stopped is not None and not stopped.startswith(PLATEAU_REACHED):
        reasons.append(f"the sweep stopped short of a plateau ({stopped})")
    return "; ".join(reasons) + ": shares of it read high" if reasons else None


def roofline_share(gflops: float, peak_gflops: float) -> float | None:
    """A path's achieved share of the matmul peak, or None where it would exceed 1: a
    path cannot outrun the device's peak, so a share over 1 means its flop count (XLA's
    cost analysis) or the peak is wrong, and no figure is shown for it."""
    if not (math.isfinite(gflops) and peak_gflops > 0):
        return None
    share = gflops / peak_gflops
    return share if share <= 1.0 else None


# A path is launch-bound up to the batch size where its time, on the line fitted to its
# p50s (:func:`fit_launch`: fixed cost + per-row cost x rows), reaches this factor of the
# fixed cost: there the rows' work is still at most half the call's fixed cost. It is
# labelled only where that covers a batch at least LAUNCH_MIN_GROWTH times its smallest
# timed one: the work grew with the rows, the time did not.
LAUNCH_FLAT_FACTOR = 1.5
LAUNCH_MIN_GROWTH = 8
# Bootstrap replicates of the boundary's interval (each cell's samples resampled), and
# the interval's coverage: a 95% percentile interval.
LAUNCH_REPLICATES = 400
LAUNCH_COVERAGE = 0.95


def _line(rows: np.ndarray, p50: np.ndarray) -> tuple[float, float]:
    """``(fixed_ms, per_row_ms)`` of ``p50 = fixed + per_row * rows`` (both (n,)), by
    least squares on relative residuals (weights 1/p50^2): a 1-row call of 0.05 ms
    counts as much as a 128-row one of 5 ms, so the fixed cost is read where it shows."""
    weight = 1.0 / p50
    design = np.stack([np.ones_like(rows), rows], axis=1) * weight[:, None]
    (fixed, per_row), *_ = np.linalg.lstsq(design, p50 * weight, rcond=None)
    return float(fixed), float(per_row)


def _boundary(fixed: float, per_row: float) -> float:
    """Rows where the fitted time reaches :data:`LAUNCH_FLAT_FACTOR` x ``fixed``; inf
    where the time does not grow with the rows (or the fit finds no fixed cost: 0)."""
    if fixed <= 0:
        return 0.0
    if per_row <= 0:
        return math.inf
    return (LAUNCH_FLAT_FACTOR - 1.0) * fixed / per_row


def _fit(rows: np.ndarray, p50: np.ndarray) -> tuple[float, float, float]:
    """``(fixed_ms, per_row_ms, boundary_rows)``: the line through every size
    (:func:`_line`), then once more through the sizes up to the first one past its
    boundary (at least two). A device's cost a row grows at large batches (a TPU v5e's
    past 4,096 rows), and those sizes would pull a line through all of them below a
    boundary the small ones show."""
    fixed, per_row = _line(rows, p50)
    boundary = _boundary(fixed, per_row)
    past = np.nonzero(rows > boundary)[0]
    keep = max(int(past[0]) + 1, 2) if past.size else rows.size
    if keep < rows.size:
        fixed, per_row = _line(rows[:keep], p50[:keep])
        boundary = _boundary(fixed, per_row)
    return fixed, per_row, boundary


def fit_launch(
    p50_by_rows: Mapping[int, float],
    samples_by_rows: Mapping[int, Any] | None = None,
    seed: int = 0,
) -> LaunchFit | None:
    """The launch-bound boundary of one path from a fit over its batch sizes, with its
    uncertainty (None with fewer than two sizes).

    ``p50_by_rows``: rows -> p50 (ms); ``samples_by_rows``: rows -> that cell's samples
    (ms, any order; None: no interval). The line ``p50 = fixed_ms + per_row_ms * rows``
    (:func:`_fit`) gives the boundary ``up_to_rows_fit``, where the time reaches
    :data:`LAUNCH_FLAT_FACTOR` x the fixed cost (``None``: the time did not grow over the
    sizes measured, so no boundary within them). Its interval ``[low, high]`` is the
    percentile interval of :data:`LAUNCH_REPLICATES` bootstrap fits, each on the medians
    of every cell's samples resampled with replacement (``high`` None: some replicates
    saw no growth). Seeded (``seed``): the same samples give the same interval."""
    if len(p50_by_rows) < 2:
        return None
    rows = np.array(sorted(p50_by_rows), dtype=float)
    p50 = np.array([p50_by_rows[int(r)] for r in rows], dtype=float)
    fixed, per_row, boundary = _fit(rows, p50)
    out: LaunchFit = {
        "fixed_ms": fixed,
        "per_row_ms": per_row,
        "up_to_rows_fit": None if math.isinf(boundary) else boundary,
        "interval": None,
    }
    if samples_by_rows is None or any(int(r) not in samples_by_rows for r in rows):
        return out
    cells = [np.asarray(samples_by_rows[int(r)], dtype=float) for r in rows]
    cells = [c[np.isfinite(c)] for c in cells]
    if any(c.size == 0 for c in cells):
        return out
    rng = np.random.default_rng(seed)
    found = np.empty(LAUNCH_REPLICATES)
    for i in range(LAUNCH_REPLICATES):
        medians = np.array([np.median(rng.choice(c, size=c.size)) for c in cells])
        found[i] = _fit(rows, medians)[2]
    tail = (1.0 - LAUNCH_COVERAGE) / 2 * 100
    # Order statistics, not interpolated: a replicate without growth is inf, and an
    # interpolation next to it would give inf * 0.
    low = np.percentile(found, tail, method="lower")
    high = np.percentile(found, 100 - tail, method="higher")
    out["interval"] = [float(low), None if math.isinf(high) else float(high)]
    return out


def launch_bound(
    latency_ms: dict[str, dict[str, Any]],
    samples_ms: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, LaunchBound]:
    """The paths whose time is flat in batch size: ``{path: {"from_rows", "up_to_rows",
    "p50_ms_from", "p50_ms_up_to", "rows_per_s", "fit"}}``, for each path whose fitted
    boundary (:func:`fit_launch`: the line through its p50s, not one pair of them, which
    moved the label from 128 rows to 16 between two runs under load, issue 44) covers a
    timed batch of at least :data:`LAUNCH_MIN_GROWTH` times its smallest one.
    ``up_to_rows`` is the largest timed batch within the boundary, and ``rows_per_s`` its
    throughput at p50: there the time is the call's fixed cost (dispatch, transfer, a
    launch), not its work, so the path would take more rows for the same time; compare
    paths by rows per second at batch sizes past it. ``fit``: :func:`fit_launch`'s
    record (the boundary in rows and its interval).

    ``latency_ms``: per path, per ``b<rows>`` label, :func:`latency_stats`;
    ``samples_ms``: the same cells' samples (None: the boundary without an interval)."""
    out: dict[str, LaunchBound] = {}
    for path, by_batch in latency_ms.items():
        p50s = {int(label[1:]): float(stats_["p50"]) for label, stats_ in by_batch.items()}
        cell_samples = (samples_ms or {}).get(path)
        by_rows = (
            {int(label[1:]): values for label, values in cell_samples.items()}
            if cell_samples
            else None
        )
        fit = fit_launch(p50s, by_rows)
        if fit is None:
            continue
        boundary = fit["up_to_rows_fit"]
        rows0 = min(p50s)
        within = [
            rows
            for rows in p50s
            if rows >= LAUNCH_MIN_GROWTH * rows0 and (boundary is None or rows <= boundary)
        ]
        if not within:
            continue
        flat = max(within)
        out[path] = {
            "from_rows": rows0,
            "up_to_rows": flat,
            "p50_ms_from": p50s[rows0],
            "p50_ms_up_to": p50s[flat],
            "rows_per_s": flat / (p50s[flat] / 1e3),
            "fit": fit,
        }
    return out


def _fit_text(fit: LaunchFit) -> str:
    """``fit: flat to about 5,237 rows, 95% interval 3,900-7,000``; ``fit: no growth
    over the sizes timed``; the interval's top ``beyond the sizes timed`` where some
    bootstrap fits saw no growth."""
    boundary = fit["up_to_rows_fit"]
    if boundary is None:
        return "fit: no growth over the sizes timed"
    text = f"fit: flat to about {boundary:,.0f} rows"
    interval = fit.get("interval")
    if interval:
        low, high = interval
        top = "beyond the sizes timed" if high is None else f"{high:,.0f}"
        text += f", {LAUNCH_COVERAGE:.0%} interval {low:,.0f}-{top}"
    return text


def launch_bound_text(entry: LaunchBound) -> str:
    """``up to 4096 rows (fit: flat to about 5,237 rows, 95% interval 3,900-7,000; p50
    0.51 ms at 1 row, 0.55 ms at 4096; 7.4e+06 rows/s)``: the largest timed batch within
    the fitted boundary (:func:`fit_launch`), the boundary with its interval (a record
    from before the fit: without them)."""
    fit = entry.get("fit")
    fitted = f"{_fit_text(fit)}; " if fit else ""
    return (
        f"up to {entry['up_to_rows']} rows ({fitted}p50 {entry['p50_ms_from']:.3g} ms at "
        f"{entry['from_rows']} row(s), {entry['p50_ms_up_to']:.3g} ms at "
        f"{entry['up_to_rows']}; {entry['rows_per_s']:.3g} rows/s)"
    )


def launch_bound_at(launch: Mapping[str, LaunchBound], path: str, rows: int) -> bool:
    """Whether ``path`` is launch-bound at ``rows`` (:func:`launch_bound`'s result)."""
    entry = launch.get(path)
    return entry is not None and entry["from_rows"] <= rows <= entry["up_to_rows"]


def ratio_launch_bound(launch: Mapping[str, LaunchBound], speedup: str, rows: int) -> bool:
    """Whether both paths of the same-run ratio ``speedup`` (a
    :data:`vmapcheck.core.paths.SPEEDUPS` name) are launch-bound at ``rows``: the ratio
    then compares two fixed costs, not two computations."""
    from vmapcheck.core.paths import SPEEDUPS

    entry = next((s for s in SPEEDUPS if s.name == speedup), None)
    return entry is not None and all(
        launch_bound_at(launch, path, rows) for path in (entry.slower, entry.faster)
    )
