"""What a benchmark's figures may claim (vmapcheck.bench.timing.bounds): no share of the matmul
peak above 1, and the launch-bound label where a path's time is flat in batch size, from
a line fitted to its p50s with a bootstrap interval."""

import math

import numpy as np

from vmapcheck.bench.timing.bounds import (
    fit_launch,
    launch_bound,
    launch_bound_at,
    launch_bound_text,
    ratio_launch_bound,
    roofline_share,
)


def _latency(p50_by_rows: dict[int, float]) -> dict[str, dict[str, float]]:
    return {f"b{rows}": {"p50": p50} for rows, p50 in p50_by_rows.items()}


def test_a_share_of_the_peak_is_never_above_one():
    assert roofline_share(50.0, 100.0) == 0.5
    assert roofline_share(100.0, 100.0) == 1.0
    # A path faster than the peak: its flop count or the peak is wrong; no figure.
    assert roofline_share(109.1, 100.0) is None
    assert roofline_share(math.nan, 100.0) is None
    assert roofline_share(10.0, 0.0) is None


def test_flat_time_in_batch_size_is_labelled_launch_bound():
    # As on the TPU v5e: 0.5-0.7 ms from 1 to 4,096 rows, then the work shows.
    tpu_like = _latency({1: 0.50, 256: 0.52, 4096: 0.70, 16384: 2.1, 65536: 8.0})
    # As a small model on a CPU: the time grows with the rows from the start.
    cpu_like = _latency({1: 0.01, 16: 0.05, 128: 0.4})
    found = launch_bound({"vmap_jit": tpu_like, "loop_jit": cpu_like})
    assert set(found) == {"vmap_jit"}
    entry = found["vmap_jit"]
    assert entry["from_rows"] == 1 and entry["up_to_rows"] == 4096
    assert entry["p50_ms_up_to"] == 0.70
    assert math.isclose(entry["rows_per_s"], 4096 / 0.7e-3)
    assert launch_bound_at(found, "vmap_jit", 4096) and not launch_bound_at(
        found, "vmap_jit", 16384
    )
    assert not launch_bound_at(found, "loop_jit", 16)
    text = launch_bound_text(entry)
    assert "up to 4096 rows" in text and "rows/s" in text


def test_a_batch_that_grew_too_little_says_nothing_and_one_size_is_never_labelled():
    # 4x more rows for the same time: too small a step to call it flat.
    assert launch_bound({"vmap_jit": _latency({1: 0.5, 4: 0.5})}) == {}
    assert launch_bound({"vmap_jit": _latency({4096: 0.5})}) == {}


def test_a_ratio_of_two_launch_bound_paths_is_marked():
    flat = _latency({1: 0.5, 256: 0.55})
    found = launch_bound({"loop_jit": flat, "vmap_jit": flat, "direct_jit": _latency({1: 0.5})})
    assert ratio_launch_bound(found, "vmap_over_loop", 256)
    # direct_jit is not launch-bound (one size), so vmap_over_direct compares work.
    assert not ratio_launch_bound(found, "vmap_over_direct", 256)
    assert not ratio_launch_bound(found, "no_such_ratio", 256)


def _cells(p50_by_rows: dict[int, float], spread: float, n: int = 40, seed: int = 1):
    """Each cell's samples (ms): its p50 times a lognormal jitter of ``spread``."""
    rng = np.random.default_rng(seed)
    return {rows: p50 * rng.lognormal(0.0, spread, n) for rows, p50 in p50_by_rows.items()}


def test_the_launch_bound_boundary_is_a_fit_with_its_interval():
    """A fixed cost of 0.5 ms and 0.001 ms a row: the time reaches 1.5x the fixed cost at
    250 rows. The fit finds it from 1, 16, 128 and 1,024 rows, and its bootstrap
    interval from each cell's samples holds it; noisier samples widen the interval."""
    true = {rows: 0.5 + 0.001 * rows for rows in (1, 16, 128, 1024)}
    fit = fit_launch(true)
    assert fit is not None and fit["interval"] is None
    assert math.isclose(fit["up_to_rows_fit"], 250.0, rel_tol=1e-6)
    assert math.isclose(fit["fixed_ms"], 0.5, rel_tol=1e-6)
    tight = fit_launch(true, _cells(true, 0.02))
    wide = fit_launch(true, _cells(true, 0.2))
    assert tight is not None and wide is not None
    low, high = tight["interval"]
    assert low < 250.0 < high
    assert wide["interval"][1] - wide["interval"][0] > high - low
    # Seeded: the same samples, the same interval.
    assert fit_launch(true, _cells(true, 0.02)) == tight


def test_a_launch_bound_label_comes_with_its_fitted_boundary_and_interval():
    """The label is the largest timed size within the fitted boundary (128 rows, where
    the fit says 250); the text gives the fit and its interval."""
    true = {rows: 0.5 + 0.001 * rows for rows in (1, 16, 128, 1024)}
    latency = {"vmap_jit": {f"b{r}": {"p50": p} for r, p in true.items()}}
    samples = {"vmap_jit": {f"b{r}": list(v) for r, v in _cells(true, 0.02).items()}}
    entry = launch_bound(latency, samples)["vmap_jit"]
    assert entry["up_to_rows"] == 128 and entry["from_rows"] == 1
    text = launch_bound_text(entry)
    assert text.startswith("up to 128 rows (fit: flat to about 250 rows, 95% interval ")
    # Flat over every size: no boundary within them, the largest size labelled.
    flat = {"vmap_jit": _latency({1: 0.5, 256: 0.5, 4096: 0.49})}
    entry = launch_bound(flat)["vmap_jit"]
    assert entry["up_to_rows"] == 4096 and entry["fit"]["up_to_rows_fit"] is None
    assert launch_bound_text(entry).startswith(
        "up to 4096 rows (fit: no growth over the sizes timed; p50 0.5 ms at 1 row(s)"
    )
