"""What DVC shows: the metrics files hold the headline only, named as the MLflow run's
``summary/*`` metrics; the plot CSVs hold only what was measured."""

import csv

import numpy as np
import pytest

from vmapcheck.core.paths import SPEEDUPS
from vmapcheck.pipeline.bench import dvc_metrics as bench_metrics
from vmapcheck.pipeline.check import dvc_metrics as check_metrics
from vmapcheck.report.headline import summary_metrics
from vmapcheck.report.plots import write_latency_csvs, write_speedup_csvs


def _check(reference_max_rel=1e-7):
    """A check_details.json cut to what the headline reads: two cases, two refusals."""
    return {
        "passed": True,
        "failures": [],
        "dtype": "float32",
        "cases": {
            "standard": {
                "pairs": {"loop_eager-vs-vmap_jit": {"max_abs": 1e-7, "max_rel": 2e-6}},
                "oracle": {"vmap_jit": {"max_rel": 4e-6}},
            },
            "zeros": {
                "pairs": {
                    "loop_eager-vs-direct_jit": {
                        "max_abs": 3e-7,
                        "max_rel": 5e-6,
                        "bound_ratio": 0.2,
                    }
                },
                "oracle": {},
            },
        },
        "negative": {"invalid_nan": {"passed": True}, "invalid_rank": {"passed": True}},
        "reference": {"status": "ok", "max_rel": reference_max_rel, "passed": True},
    }


# Padded and unpadded labels, as bench_details.json may hold either; the loop is capped
# at 128 rows, so 1,024 rows have no vmap_over_loop.
SPEEDUP = {
    "b16": {"vmap_over_loop": 1.5, "vmap_over_direct": 1.0},
    "b0128": {"vmap_over_loop": 4.0, "vmap_over_direct": 0.98},
    "b1024": {"vmap_over_direct": 1.01},
}


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


F32_EPS = float(np.finfo(np.float32).eps)


def test_check_metrics_are_the_summary_metrics_with_relative_errors_in_epsilons():
    """The summary figures without the prefix; each max_rel in units of the run dtype's
    epsilon, so that DVC's 5 decimals show it (2e-6 read 0.0; it reads 16.8)."""
    check = _check()
    metrics = check_metrics(check)
    summary = {k.removeprefix("summary/"): v for k, v in summary_metrics(check).items()}
    # Besides the summary figures: the findings by kind, every kind (MLflow logs them as
    # check/findings/<kind>).
    assert metrics.pop("findings") == {
        "batching": 0,
        "numerical": 0,
        "model": 0,
        "contract": 0,
    }
    assert {k.replace("_max_rel_eps", "_max_rel") for k in metrics} == set(summary)
    assert metrics == pytest.approx(
        {
            "passed": True,
            "n_failures": 0,
            "worst_max_rel_eps": 5e-6 / F32_EPS,
            "worst_bound_ratio": 0.2,
            "worst_vs_reference_max_rel_eps": 1e-7 / F32_EPS,
            "worst_vs_f64_max_rel_eps": 4e-6 / F32_EPS,
            "invalid_refused": 2,
            "invalid_total": 2,
        }
    )
    assert round(metrics["worst_max_rel_eps"], 5) == pytest.approx(41.94304)
    for dtype, eps in (("float64", np.finfo(np.float64).eps), ("bfloat16", 2.0**-7)):
        scaled = check_metrics({**check, "dtype": dtype})["worst_max_rel_eps"]
        assert scaled == pytest.approx(5e-6 / eps)


def test_a_figure_the_run_does_not_have_is_left_out_not_written_as_zero():
    check = _check(reference_max_rel=None)
    check["reference"]["status"] = "missing"
    check["cases"]["standard"]["oracle"] = {}
    metrics = check_metrics(check)
    assert "worst_vs_reference_max_rel_eps" not in metrics
    assert "worst_vs_f64_max_rel_eps" not in metrics


def test_bench_metrics_are_the_speedups_at_the_headline_batch_named_by_it():
    bench = {"speedup": SPEEDUP, "speedup_ci": {}}
    metrics = bench_metrics(bench)
    # Every headline name is a key; one not measured is null (never another batch's).
    assert metrics == {
        "vmap_over_loop@b0128": 4.0,
        "vmap_over_direct@b0128": 0.98,
        "vmap_over_map@b0128": None,
    }
    # MLflow gets the measured ones only (a null is no metric there).
    summary = summary_metrics(_check(), bench)
    measured = {name for name, value in metrics.items() if value is not None}
    assert {f"summary/{name}" for name in measured} <= set(summary)
    assert "summary/vmap_over_map@b0128" not in summary
    assert bench_metrics({"speedup": {}}) == {}


# The bootstrap intervals bench_details.json holds beside the ratios (speedup_ci); 1,024
# rows have a ratio without one.
SPEEDUP_CI = {
    "b16": {"vmap_over_loop": [1.4, 1.6], "vmap_over_direct": [0.86, 1.16]},
    "b0128": {"vmap_over_loop": [3.5, 4.4], "vmap_over_direct": [0.9, 1.05]},
}


def test_speedup_csvs_hold_only_measured_ratios_with_their_intervals(tmp_path):
    written = write_speedup_csvs(tmp_path / "speedup", SPEEDUP, SPEEDUP_CI)
    assert [p.name for p in written] == [f"{s.name}.csv" for s in SPEEDUPS]
    folder = tmp_path / "speedup"
    assert _rows(folder / "vmap_over_loop.csv") == [
        ["batch_size", "ratio", "ci_low", "ci_high"],
        ["16", "1.5", "1.4", "1.6"],
        ["128", "4.0", "3.5", "4.4"],
    ]
    # The console's "no measurable difference (CI 0.86-1.16)" is in the plot's data; a
    # ratio without an interval has empty interval cells, never a band of zero width.
    assert _rows(folder / "vmap_over_direct.csv") == [
        ["batch_size", "ratio", "ci_low", "ci_high"],
        ["16", "1.0", "0.86", "1.16"],
        ["128", "0.98", "0.9", "1.05"],
        ["1024", "1.01", "", ""],
    ]
    # Measured nowhere: a header alone, no row of zeros or empty cells.
    assert _rows(folder / "vmap_over_map.csv") == [["batch_size", "ratio", "ci_low", "ci_high"]]


def test_latency_csvs_are_in_batch_order_with_only_the_timed_sizes(tmp_path):
    stats = {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    latency = {"loop_jit": {"b0128": stats, "b16": stats}, "vmap_jit": {}}
    write_latency_csvs(tmp_path, latency)
    assert [r[0] for r in _rows(tmp_path / "loop_jit.csv")] == ["batch_size", "16", "128"]
    assert _rows(tmp_path / "vmap_jit.csv") == [["batch_size", "p50_ms", "p90_ms", "p99_ms"]]
