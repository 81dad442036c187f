"""The benchmark reports distributions after warm-up and says what it skipped."""

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.bench import latency_stats, metrics_summary, run_bench, time_interleaved
from vmapcheck.config import BenchConfig, ModelConfig
from vmapcheck.models import build_model
from vmapcheck.names import PATH_NAMES


def test_latency_stats_are_percentiles_not_the_best_run():
    samples = np.array([1.0, 2.0, 3.0, 4.0, 100.0]) * 1e-3
    stats = latency_stats(samples, rows=10)
    assert stats["p50"] == 3.0 and stats["min"] == 1.0 and stats["max"] == 100.0
    assert stats["n"] == 5
    assert np.isclose(stats["p90"], np.percentile(samples * 1e3, 90))
    assert np.isclose(stats["rows_per_s"], 10 / 3e-3)


def test_interleaved_timing_counts_first_call_and_warmup_apart():
    counts = {"a": 0, "b": 0}

    def make(name):
        def call():
            counts[name] += 1
            return jnp.ones(2)

        return call

    first, samples = time_interleaved({"a": make("a"), "b": make("b")}, warmup=3, repeats=7)
    assert counts == {"a": 11, "b": 11}
    assert set(first) == {"a", "b"} and all(v > 0 for v in first.values())
    assert samples["a"].shape == samples["b"].shape == (7,)


def test_run_bench_covers_every_path_and_caps_the_loop():
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    config = BenchConfig(name="t", batch_sizes=[1, 32], warmup=1, repeats=5, loop_max_batch=8)
    result = run_bench(model, params, rows, config, jnp.float32)
    for path in PATH_NAMES:
        assert set(result["latency_ms"][path]) == (
            {"b1"} if path.startswith("loop") else {"b1", "b32"}
        )
        assert result["latency_ms"][path]["b1"]["n"] == 5
    assert "capped at 8 rows" in result["skipped"]["loop_jit"]["b32"]
    assert set(result["speedup"]["b1"]) == {"vmap_over_loop", "vmap_over_direct"}
    assert set(result["speedup"]["b32"]) == {"vmap_over_direct"}
    assert result["machine"]["before"]["logical_cores"] >= 1
    summary = metrics_summary(result)
    assert set(summary["latency_ms"]["vmap_jit"]["b32"]) == {"p50", "p90", "p99"}
