"""What a benchmark's figures may claim (vmapcheck.bench.bounds): no share of the matmul
peak above 1, and the launch-bound label where a path's time is flat in batch size."""

import math

from vmapcheck.bench.bounds import (
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
