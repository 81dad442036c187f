"""The benchmark reports distributions after warm-up and says what it skipped."""

import io
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.bench.timing.bounds import peak_caveat
from vmapcheck.bench.timing.budget import (
    BUDGET_SETTING,
    STOP_BUDGET,
    STOP_CI,
    compile_over_budget,
    early_stops,
    left_out_by_budget,
    median_interval,
    over_budget,
    round_slices,
    samples_per_round,
    stopped_line,
)
from vmapcheck.bench.timing.control import peak_sweep
from vmapcheck.bench.timing.latency import latency_stats
from vmapcheck.bench.timing.progress import PlainLines, Progress
from vmapcheck.bench.timing.run import ROUNDS, run_bench
from vmapcheck.bench.timing.run import (
    out_of_device_memory as timing_out_of_device_memory,
)
from vmapcheck.bench.timing.sampling import (
    balanced_orders,
    no_compiles,
    pass_orders,
    sample_passes,
    warm_up,
)
from vmapcheck.bench.verdict.regression import BLOCKS, blocks_of
from vmapcheck.config import BenchConfig, EarlyStopConfig, ModelConfig, RegressionConfig
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import get, path_names, speedup_text
from vmapcheck.pipeline.bench import dvc_metrics

# Every round of every cell, one look: the timing as it was before early stopping.
NO_EARLY_STOP = EarlyStopConfig(min_rounds=5, ci_target=0.01, time_budget_s=None, paired_looks=1)


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

    calls = {"a": make("a"), "b": make("b")}
    per_call = {}
    first, inner = warm_up(calls, warmup=3, per_call=per_call)
    samples = {name: np.empty(7) for name in calls}
    taken = []
    sample_passes(calls, inner, samples, range(7), on_sample=taken.append)
    assert sorted(taken) == ["a"] * 7 + ["b"] * 7  # one progress report per sample
    assert set(per_call) == {"a", "b"} and all(v > 0 for v in per_call.values())
    # first call, warm-up, one calibration call, then each sample (inner loop of 1 here)
    # after one discarded call of its own
    assert inner == {"a": 1, "b": 1}
    assert counts == {"a": 1 + 3 + 1 + 2 * 7, "b": 1 + 3 + 1 + 2 * 7}
    assert set(first) == {"a", "b"} and all(v > 0 for v in first.values())
    assert samples["a"].shape == samples["b"].shape == (7,)


def test_run_bench_covers_every_path_and_caps_the_loop():
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    config = BenchConfig(
        name="t",
        batch_sizes=[1, 32],
        warmup=1,
        repeats=5,
        loop_max_batch=8,
        confidence_level=0.95,
        peak_matmul_size=128,
        replay_requests=100,
        regression=RegressionConfig(factor=1.1, alpha=0.01, baseline=None),
        early_stop=NO_EARLY_STOP,
    )
    log = io.StringIO()
    result = run_bench(
        model, params, rows, config, jnp.float32, progress=Progress(PlainLines("bench", log))
    )
    # Progress in a log: every phase starts and ends with a line; the timing's count is
    # every cell's samples and the control's.
    lines = log.getvalue().splitlines()
    cells = sum(len(by_batch) for by_batch in result["latency_ms"].values())
    assert lines[0] == "bench: compiling: 2 batch sizes"
    timing = f"bench: timing {cells} cells and the control in 5 rounds"
    assert any(line.startswith(f"{timing}: {(cells + 1) * 5:,} samples, about ") for line in lines)
    assert f"{timing}: done, {(cells + 1) * 5:,} samples in" in log.getvalue()
    for path in path_names("batch"):
        assert set(result["latency_ms"][path]) == (
            {"b1"} if path.startswith("loop") else {"b1", "b32"}
        )
        assert result["latency_ms"][path]["b1"]["n"] == 5
    assert "capped at 8 rows" in result["skipped"]["loop_jit"]["b32"]
    assert set(result["speedup"]["b1"]) == {"vmap_over_loop", "vmap_over_direct", "vmap_over_map"}
    assert set(result["speedup"]["b32"]) == {"vmap_over_direct", "vmap_over_map"}
    assert {k: set(v) for k, v in result["speedup_ci"].items()} == {
        k: set(v) for k, v in result["speedup"].items()
    }
    assert result["machine"]["before"]["logical_cores"] >= 1
    # The load sampled from this call's start to its end, not only around the timing.
    during = result["machine"]["during"]
    assert during["samples"] >= 2 and during["span_s"] >= sum(result["phases_s"].values()) - 0.01
    # The DVC metrics: the speed-ups at the largest batch the loop ran at, named by it.
    assert dvc_metrics(result) == {
        f"{name}@b0001": ratio for name, ratio in result["speedup"]["b1"].items()
    }
    assert set(result["latency_ms"]["vmap_jit"]["b32"]) >= {
        "p50",
        "p90",
        "p99",
        "median_ci_low",
        "median_ci_high",
    }
    figures = result["figures"]["vmap_jit"]["b32"]
    assert figures["compile_ms"] > 0 and figures["flops"] > 0 and figures["roofline"] > 0
    assert result["figures"]["vmap_eager"]["b32"]["flops"] == figures["flops"]
    # lax.map's scan body is counted once by XLA: the same arithmetic as vmap's stands in.
    assert result["figures"]["map_jit"]["b32"]["flops"] == figures["flops"]
    assert result["figures"]["map_jit"]["b32"]["roofline"] > 0
    # The data-parallel path over this process's devices, its flops the whole mesh's.
    sharded = result["figures"]["sharded_jit"]["b32"]
    devices = len(jax.devices())
    assert sharded["devices"] == devices and sharded["padded_rows"] % devices == 0
    assert sharded["flops"] == devices * sharded["flops_per_device"] > 0
    assert sharded["compile_ms"] > 0
    # The peak: the best of short sweeps in the run's dtype and matmul precision, each
    # from the control's size or larger (a later sweep starts at half the best size),
    # never below a path's; with the load it was measured at.
    peak = result["peak"]
    assert peak["gflops"] > 0 and peak["dtype"] == "float32" and peak["sweep"]
    assert peak["sweep"][0]["size"] >= config.peak_matmul_size and peak["stopped"]
    assert peak["gflops"] == max(entry["gflops"] for entry in peak["sweep"])
    assert peak["gflops"] == max(peak["sweeps_gflops"]) and len(peak["sweeps_gflops"]) == 3
    assert peak["contended"] == (peak["load_avg_1m"] > peak["usable_cores"])
    assert all(
        f["roofline"] is None or 0 < f["roofline"] <= 1
        for by_batch in result["figures"].values()
        for f in by_batch.values()
    )
    assert result["phases_s"]["peak_sweep"] > 0
    # the control matmul is timed in every round, like the cells
    assert len(result["control"]["samples_ms"]) == config.repeats
    assert result["machine"]["before"]["matmul_precision"]
    assert any("GPU" in line for line in result["limits"])


def test_the_median_comes_with_a_confidence_interval():
    samples = np.random.default_rng(0).normal(10.0, 1.0, size=200) * 1e-3
    stats = latency_stats(samples, rows=1)
    assert stats["median_ci_low"] < stats["p50"] < stats["median_ci_high"]
    assert stats["median_ci_high"] - stats["median_ci_low"] < 0.5  # ms, for n=200


def test_a_call_below_the_timer_resolution_gets_an_inner_loop():
    from vmapcheck.bench.timing.sampling import inner_loop_size

    assert inner_loop_size(1.0) == 1
    assert inner_loop_size(1e-12) > 1


def test_a_compile_while_timing_stops_the_benchmark():
    shapes = iter(range(1, 100))

    def new_shape_each_call():
        return jax.jit(lambda x: x + 1)(jnp.ones(next(shapes)))

    calls = {"recompiles": new_shape_each_call}
    _, inner = warm_up(calls, warmup=1)
    samples = {"recompiles": np.empty(5)}
    with pytest.raises(RuntimeError, match="compilation"), no_compiles("recompiles"):
        sample_passes(calls, inner, samples, range(5))


@pytest.mark.parametrize("repeats", [5, 10, 50, 100, 37])
def test_rounds_are_the_verdicts_blocks(repeats):
    # The verdict's unit is a round: the bench's round boundaries and the verdict's
    # block boundaries must be the same cut of the samples.
    samples = np.arange(repeats, dtype=float)
    rounds = round_slices(repeats)
    assert len(rounds) == min(ROUNDS, repeats) and ROUNDS == BLOCKS
    assert [list(r) for r in rounds] == [list(b.astype(int)) for b in blocks_of(samples)]
    assert sum(len(r) for r in rounds) == repeats


def test_a_speedup_comes_with_its_confidence_interval():
    from vmapcheck.bench.timing.latency import ratio_interval

    rng = np.random.default_rng(1)
    slower, faster = rng.normal(2.0, 0.1, 100), rng.normal(1.0, 0.05, 100)
    low, high = ratio_interval(slower, faster, 0.95)
    assert low < np.median(slower) / np.median(faster) < high and 1.9 < low < high < 2.1
    # Identical distributions: the interval holds 1.0 (no measurable difference).
    same_low, same_high = ratio_interval(slower, rng.normal(2.0, 0.1, 100), 0.95)
    assert same_low < 1.0 < same_high
    assert ratio_interval(np.ones(5), np.full(5, 2.0), 0.95) == (0.5, 0.5)


@pytest.mark.parametrize("n", range(1, 9))
def test_balanced_orders_let_every_path_follow_every_other_equally_often(n):
    orders = balanced_orders(n)
    assert len(orders) == (2 * n if n % 2 else n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = [(a, b) for order in orders for a, b in itertools.pairwise(order)]
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    assert sorted(follows) == sorted(pairs * (2 if n % 2 else 1))
    for position in range(n):  # and every path goes first, second, ... equally often
        assert sorted(order[position] for order in orders) == sorted(
            list(range(n)) * (2 if n % 2 else 1)
        )
    # The passes: whole cycles of the design, each shuffled, the same for the same seed.
    passes = pass_orders(n, 3 * len(orders) + 1)
    assert len(passes) == 3 * len(orders) + 1 and passes == pass_orders(n, len(passes))
    for cycle in range(3):
        done = passes[cycle * len(orders) : (cycle + 1) * len(orders)]
        assert sorted(done) == sorted(orders)


BASE_S, PENALTY_S = 1e-3, 3e-3


class _PlayedTime:
    """Stands in for the ``time`` module of vmapcheck.bench.timing.sampling: ``perf_counter`` is
    a clock that moves only when a simulated call says how long it took, so a test of
    the timing's order is exact on a loaded machine (time.sleep overshoots there)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.get_clock_info = time.get_clock_info

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def played(monkeypatch) -> _PlayedTime:
    import vmapcheck.bench.timing.sampling as sampling

    clock = _PlayedTime()
    monkeypatch.setattr(sampling, "time", clock)
    return clock


def _polluting_group(names: tuple[str, ...], clock: _PlayedTime) -> dict[str, object]:
    """Three paths that each take BASE_S; after "loop" runs, whatever call comes next pays
    PENALTY_S more (as the unrolled loop_jit left the next path ~20-45% slower)."""
    owed = [0.0]

    def path(pollutes: bool):
        def call():
            clock.now += BASE_S + owed[0]
            owed[0] = PENALTY_S if pollutes else 0.0

        return call

    return {name: path(name == "loop") for name in names}


def _medians(samples: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: float(np.median(v)) for name, v in samples.items()}


@pytest.mark.parametrize("names", list(itertools.permutations(("loop", "a", "b"))))
def test_a_path_that_slows_the_next_one_leaves_two_identical_paths_equal(names, played):
    calls = _polluting_group(names, played)
    _, inner = warm_up(calls, warmup=1)
    samples = {name: np.empty(24) for name in calls}
    sample_passes(calls, inner, samples, range(24))
    p50 = _medians(samples)
    assert p50["a"] == pytest.approx(p50["b"]), p50
    # No timed call paid the penalty, each discarded call before it did (in a balanced
    # order alone, a third of the samples of "a" and "b" would).
    paid = {name: float(np.mean(samples[name] > BASE_S + 0.8 * PENALTY_S)) for name in "ab"}
    assert max(paid.values()) == 0.0, paid


def test_the_old_fixed_rotation_is_biased_by_the_same_pollution(played):
    """What the test above guards against: passes rotating the first path (loop, a, b;
    a, b, loop; b, loop, a) with no discarded call have "a" always right after "loop"."""
    calls = _polluting_group(("loop", "a", "b"), played)
    warm_up(calls, warmup=1)
    names = list(calls)
    samples = {name: np.empty(24) for name in calls}
    for i in range(24):
        for name in names[i % 3 :] + names[: i % 3]:
            start = played.perf_counter()
            calls[name]()
            samples[name][i] = played.perf_counter() - start
    p50 = _medians(samples)
    assert p50["a"] / p50["b"] > 2.0, p50


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference():
    assert speedup_text(1.03, [0.95, 1.1]) == "no measurable difference (CI 0.95-1.10)"
    assert speedup_text(1.29, [1.2, 1.4]) == "1.29x (CI 1.20-1.40)"
    assert speedup_text(0.8, [0.7, 0.9]) == "0.80x (CI 0.70-0.90)"
    assert speedup_text(30.0) == "30.00x"


# --- early stopping (bench.early_stop) ----------------------------------------------------


def test_the_median_interval_is_the_order_statistics_with_enough_coverage():
    seven = np.array([5.0, 1.0, 3.0, 7.0, 2.0, 6.0, 4.0])
    assert median_interval(seven, 0.95) == (1.0, 7.0)  # coverage 98.4%; the next 87.5%
    ten = np.arange(1.0, 11.0)
    assert median_interval(ten, 0.95) == (2.0, 9.0)  # coverage 97.9%


def _stream(cells: dict[str, float], rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """Round medians of each cell (deterministic): 1.0 times a lognormal of sigma
    ``cells[cell]``, in time order."""
    rng = np.random.default_rng(seed)
    return {c: list(np.exp(rng.normal(0.0, sd, rounds))) for c, sd in cells.items()}


STOP = EarlyStopConfig(min_rounds=7, ci_target=0.02, time_budget_s=None, paired_looks=4)


def test_a_tight_cell_stops_at_a_round_boundary_and_a_noisy_one_goes_on():
    medians = _stream({"tight": 0.002, "noisy": 0.2}, 10)
    cost = {"tight": 1.0, "noisy": 1.0}
    # Never before min_rounds, however tight.
    for done in range(1, STOP.min_rounds):
        part = {c: v[:done] for c, v in medians.items()}
        assert early_stops(part, cost, done, 10, 0.0, STOP, 0.95) == {}
    part = {c: v[:7] for c, v in medians.items()}
    assert early_stops(part, cost, 7, 10, 0.0, STOP, 0.95) == {"tight": STOP_CI}
    # The last round ends every cell anyway: nothing "stops" there.
    assert early_stops(medians, cost, 10, 10, 0.0, STOP, 0.95) == {}


def test_the_budget_stops_the_dearest_cells_first_and_keeps_the_cheap_ones():
    budget = STOP.model_copy(update={"time_budget_s": 10.0})
    medians = _stream({"dear": 0.2, "mid": 0.2, "cheap": 0.2}, 7)
    cost = {"dear": 1.0, "mid": 0.3, "cheap": 0.01}  # seconds a round
    # 7 s gone, 3 rounds left: 7 + 3 * 1.31 > 10; without "dear": 7 + 3 * 0.31 < 10.
    assert early_stops(medians, cost, 7, 10, 7.0, budget, 0.95) == {"dear": STOP_BUDGET}
    # Past the budget already: every cell stops (at min_rounds, not before).
    assert early_stops(medians, cost, 7, 10, 11.0, budget, 0.95) == dict.fromkeys(cost, STOP_BUDGET)
    early = {c: v[:6] for c, v in medians.items()}
    assert early_stops(early, cost, 6, 10, 11.0, budget, 0.95) == {}


def test_the_budget_line_reads_as_a_sentence_naming_the_setting():
    """Issue 43: `bench: stopped early: 11 of 11 cells (11 time budget)` was hard to read."""
    every = dict.fromkeys(range(11), STOP_BUDGET)
    assert stopped_line(every, 11) == (
        f"11 of 11 cells stopped early by the time budget ({BUDGET_SETTING}: raise it to "
        "time every round)"
    )
    both = {0: STOP_BUDGET, 1: STOP_BUDGET, 2: STOP_CI}
    assert stopped_line(both, 12) == (
        f"3 of 12 cells stopped early: 1 with their interval within target "
        f"(bench.early_stop.ci_target), 2 by the time budget ({BUDGET_SETTING}: raise it "
        "to time every round)"
    )
    assert "ci_target" in EarlyStopConfig.model_fields  # the setting the line names


def test_what_the_budget_left_out_is_told_from_its_other_reasons():
    config = _budgeted([4, 64], 5.0)
    over = over_budget(get("loop_eager"), 64, (4, 1.0), config, least=1, spent_s=0.0)
    compile_ = compile_over_budget("vmap_jit", 64, {"direct_jit": 9.0}, None, 5.0, 0.0)
    assert over is not None and compile_ is not None
    skipped = {
        "loop_eager": {"b64": over},
        "vmap_jit": {"b64": compile_, "b1024": compile_},
        "loop_jit": {"b64": "loop_jit capped at 4 rows (bench.loop_max_batch): ..."},
    }
    assert left_out_by_budget(skipped) == {"loop_eager": [64], "vmap_jit": [64, 1024]}


def test_samples_per_round_takes_samples_from_the_dearest_cell_first():
    """The plan fits the budget by taking samples a round from whichever cell is dearest
    then; cheap cells and the kept control keep their rounds' every sample."""
    cost = {"control": 0.001, "cheap": 0.001, "mid": 0.01, "dear": 0.1}
    # Unbudgeted: every cell takes whole rounds.
    assert samples_per_round(cost, 5, 10, None) == dict.fromkeys(cost, 5)
    # Full plan: 10 rounds x 5 x 0.112 = 5.6 s. Within 1.65 s, "dear" gives up four
    # samples a round (1.6 s planned) and "mid" keeps all of its own.
    quota = samples_per_round(cost, 5, 10, 1.65, keep=["control"])
    assert quota == {"control": 5, "cheap": 5, "mid": 5, "dear": 1}
    # Within 1.5 s, "mid" is then the dearest that can give one up.
    assert samples_per_round(cost, 5, 10, 1.55, keep=["control"])["mid"] == 4
    # Beyond reach: every reducible cell down to one sample a round, the control kept.
    quota = samples_per_round(cost, 5, 10, 1e-6, keep=["control"])
    assert quota == {"control": 5, "cheap": 1, "mid": 1, "dear": 1}


def test_run_bench_records_each_cells_rounds_and_why_it_stopped():
    """A budget already spent takes one sample a round of every cell (samples_per_round)
    and stops it at min_rounds (unless its interval did first): its samples are its
    first whole rounds, recorded per round, and why it stopped; the control keeps every
    round and every sample."""
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    config = BenchConfig(
        name="t",
        batch_sizes=[2],
        warmup=1,
        repeats=20,
        loop_max_batch=2,
        confidence_level=0.95,
        peak_matmul_size=64,
        replay_requests=10,
        regression=RegressionConfig(factor=1.1, alpha=0.01, baseline=None),
        early_stop=EarlyStopConfig(
            min_rounds=5, ci_target=0.01, time_budget_s=1e-6, paired_looks=1
        ),
    )
    log = io.StringIO()
    result = run_bench(
        model, params, rows, config, jnp.float32, progress=Progress(PlainLines("bench", log))
    )
    for path, by_batch in result["samples_ms"].items():
        for label, samples in by_batch.items():
            assert result["round_sizes"][path][label] == [1, 1, 1, 1, 1]
            assert len(samples) == 5 == result["latency_ms"][path][label]["n"]
            assert not np.isnan(samples).any()
            record = result["early_stop"]["cells"][path][label]
            assert record["rounds"] == 5 and record["samples"] == 5
            assert record["samples_per_round"] == 1
            assert record["stopped"] in (STOP_CI, STOP_BUDGET)
    assert len(result["control"]["samples_ms"]) == 20
    cells = sum(len(b) for b in result["samples_ms"].values())
    assert f"bench: {cells} of {cells} cells stopped early " in log.getvalue()
    # The progress counts only the samples taken: the stopped cells' rounds left the plan.
    assert f"done, {cells * 5 + 20:,} samples in" in log.getvalue()
    # What the verdict reads back: the recorded rounds.
    from vmapcheck.bench.verdict.baseline import record_from_details

    record = record_from_details(result, "run")
    some = next(iter(record.samples_ms))
    label = next(iter(record.samples_ms[some]))
    assert (
        blocks_of(record.samples_ms[some][label], BLOCKS, record.rounds_of(some, label))[0].size
        == 1
    )


def _budgeted(batch_sizes: list[int], time_budget_s: float | None) -> BenchConfig:
    """A small bench profile with ``time_budget_s`` as its whole budget."""
    return BenchConfig(
        name="t",
        batch_sizes=batch_sizes,
        warmup=1,
        repeats=5,
        loop_max_batch=64,
        confidence_level=0.95,
        peak_matmul_size=64,
        replay_requests=10,
        regression=RegressionConfig(factor=1.1, alpha=0.01, baseline=None),
        early_stop=EarlyStopConfig(
            min_rounds=5, ci_target=0.01, time_budget_s=time_budget_s, paired_looks=1
        ),
    )


def test_compiling_and_warm_up_spend_the_budget_a_loop_path_is_left_out_by():
    """The budget covers the whole bench: what compiling and warm-up spent is not left
    for a loop path's projected compile (as on a TPU, where compiles take seconds)."""
    config = _budgeted([1, 64], 60)
    loop_jit = get("loop_jit")
    # 0.5 s to compile one row: 32 s projected at 64 rows, inside 60 s of budget ...
    assert over_budget(loop_jit, 64, (1, 0.5), config, least=1, spent_s=0.0) is None
    # ... but not once the other paths' compiles and warm-up have spent 40 s of it.
    why = over_budget(loop_jit, 64, (1, 0.5), config, least=1, spent_s=40.0)
    assert why is not None and "loop_jit left out at 64 rows" in why
    assert "20 s left of the bench's budget of 60 s" in why and "compiling and warm-up" in why
    assert over_budget(loop_jit, 64, (1, 0.5), _budgeted([1, 64], None), 1, 1e6) is None


def test_a_jit_path_is_left_out_where_its_projected_compile_would_end_past_the_budget():
    """As on a TPU v5e (benchmarks/tpu_pipeline_flax_cnn.json): the CNN's vmap_jit took
    37 s to compile at 4,096 rows, so direct_jit, whose program is near-identical, is
    projected at 37 s too and left out when less is left; without a compile at this
    size, a path's own compile at a smaller size is the projection."""
    at_4096 = {"map_jit": 0.5, "vmap_jit": 37.1}
    why = compile_over_budget("direct_jit", 4096, at_4096, (256, 0.8), 60.0, 48.0)
    assert why is not None and why.startswith("direct_jit left out at 4096 rows")
    assert "about 37.1 s (as vmap_jit took at this size)" in why
    assert "12 s left of the bench's budget of 60 s" in why
    # Enough left, or no budget: compiled.
    assert compile_over_budget("direct_jit", 4096, at_4096, (256, 0.8), 60.0, 20.0) is None
    assert compile_over_budget("direct_jit", 4096, at_4096, (256, 0.8), None, 1e6) is None
    # The first path at a new size: its own compile at the last size.
    why = compile_over_budget("vmap_jit", 16384, {}, (4096, 37.1), 60.0, 48.0)
    assert why is not None and "as it took at 4096 rows" in why
    assert compile_over_budget("vmap_jit", 16384, {}, None, 60.0, 59.0) is None


def test_a_cheap_compile_at_this_size_does_not_hide_a_paths_own_dearer_one():
    """As on a TPU v5e (benchmarks/tpu_pipeline_flax_cnn.json, 2026-12-06): lax.map's
    program compiled first at 16,384 rows in 0.5 s, and vmap_jit, which had taken 34.9 s
    at 4,096 rows, was projected at 0.5 s and compiled past the budget. The projection is
    the larger of the two floors."""
    why = compile_over_budget("vmap_jit", 16384, {"map_jit": 0.5}, (4096, 34.9), 60.0, 50.0)
    assert why is not None and "about 34.9 s (as it took at 4096 rows)" in why
    why = compile_over_budget("direct_jit", 4096, {"vmap_jit": 37.1}, (256, 0.8), 60.0, 48.0)
    assert why is not None and "(as vmap_jit took at this size)" in why
    # An eager path's first call is named as such.
    why = compile_over_budget(
        "vmap_eager", 16384, {}, (4096, 20.0), 60.0, 50.0, what="its first call"
    )
    assert why is not None and why.startswith(
        "vmap_eager left out at 16384 rows: its first call would take about 20 s"
    )


def _hungry_direct_mlp(from_rows: int):
    """The built-in MLP whose hand-batched forward, from ``from_rows`` rows on, also
    materializes a (rows, 2**40) float32 buffer (4 TiB a row): a real allocation failure
    of the device (the CPU here), as a TPU's compile failed for the transformer at
    16,384 rows (HLO temporaries of 16.52G against 15.75G of HBM)."""
    import dataclasses

    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    batched = model.forward_batch

    def forward_batch(params, x):
        out = batched(params, x)
        if x.shape[0] < from_rows:
            return out
        huge = jax.lax.optimization_barrier(jnp.broadcast_to(x[:, :1], (x.shape[0], 2**40)))
        return out + 0.0 * huge[:, :2]

    return dataclasses.replace(model, forward_batch=forward_batch)


def test_out_of_device_memory_is_xlas_resource_exhausted_and_nothing_else():
    model = _hungry_direct_mlp(2)
    params = model.init(jax.random.key(0))
    with pytest.raises(jax.errors.JaxRuntimeError) as caught:
        jax.block_until_ready(jax.jit(model.forward_batch)(params, jnp.ones((4, 4))))
    words = timing_out_of_device_memory(caught.value)
    assert words is not None and words.startswith("RESOURCE_EXHAUSTED")
    assert timing_out_of_device_memory(ValueError("RESOURCE_EXHAUSTED")) is None
    assert timing_out_of_device_memory(jax.errors.JaxRuntimeError("INTERNAL: boom")) is None


def test_a_size_the_device_has_no_memory_for_is_left_out_with_xlas_words_and_so_are_larger():
    """The transformer's bench on a TPU v5e died with a traceback at 16,384 rows
    (RESOURCE_EXHAUSTED at compile, 2026-12-06): now that cell, and the path's larger
    sizes, are left out naming the device's words, and the other paths are timed."""
    model = _hungry_direct_mlp(16)
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    log = io.StringIO()
    result = run_bench(
        model,
        params,
        rows,
        _budgeted([1, 16, 32], None),
        jnp.float32,
        progress=Progress(PlainLines("bench", log)),
    )
    for name in ("direct_jit", "direct_eager"):
        assert set(result["latency_ms"][name]) == {"b1"}
        why = result["skipped"][name]["b16"]
        assert why.startswith(f"{name} left out at 16 rows: the device ran out of memory (")
        assert "RESOURCE_EXHAUSTED" in why and why in log.getvalue()
        assert result["skipped"][name]["b32"].startswith(
            f"{name} left out at 32 rows: the device ran out of memory for it at 16 rows"
        )
    assert set(result["latency_ms"]["vmap_jit"]) == {"b1", "b16", "b32"}
    assert set(result["latency_ms"]["map_jit"]) == {"b1", "b16", "b32"}


def test_the_bench_asks_the_projection_before_each_compile_past_the_first_size(monkeypatch):
    """run_bench with a real model asks compile_over_budget before each jit compile past
    the first size, with what that size's compiles so far took; a path it leaves out
    is not compiled there, and its reason is the bench's."""
    import vmapcheck.bench.timing.run as timing

    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    asked: list[tuple[str, int, dict[str, float]]] = []

    def projection(name, rows, at_this_size, own_last, budget_s, spent_s, what="compiling it"):
        assert own_last is not None and own_last[0] == 1 and budget_s == 600
        if what != "compiling it":  # an eager path's first call
            assert not get(name).jit and set(at_this_size) <= {
                p for p in path_names("batch") if not get(p).jit
            }
            return None
        asked.append((name, rows, dict(at_this_size)))
        return "direct_jit left out: projected" if name == "direct_jit" else None

    monkeypatch.setattr(timing, "compile_over_budget", projection)
    result = run_bench(model, params, rows, _budgeted([1, 16], 600), jnp.float32)
    assert {rows for _, rows, _ in asked} == {16}
    assert result["skipped"]["direct_jit"]["b16"] == "direct_jit left out: projected"
    assert "b16" not in result["latency_ms"]["direct_jit"]
    assert "b16" in result["latency_ms"]["vmap_jit"]
    # Each path is asked with the compiles its size had taken before it.
    order = [name for name, _, _ in asked]
    for name, _, seen in asked:
        assert set(seen) == {n for n in order[: order.index(name)] if n != "direct_jit"}


def test_the_peak_sweep_grows_the_product_until_the_throughput_levels_off():
    peak = peak_sweep(jnp.float32, 64, budget_s=5.0)
    sizes = [entry["size"] for entry in peak["sweep"]]
    assert sizes[0] == 64 and all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert peak["gflops"] == max(entry["gflops"] for entry in peak["sweep"]) > 0
    assert peak["dtype"] == "float32" and peak["matmul_precision"] and peak["stopped"]


def test_the_peak_sweep_does_not_time_a_size_whose_call_would_take_seconds():
    """The next size is 8x the work: after a 0.15 s call (under PEAK_MAX_CALL_S) the
    sweep stops instead of timing 9 calls of about 1.2 s (on two loaded cores the
    4096^3 step took 32 of a bench's 42 s), and says why."""

    def slow_call():
        time.sleep(0.15)

    def never():
        raise AssertionError("the sweep timed the 128^3 product")

    peak = peak_sweep(jnp.float32, 64, calls={64: slow_call, 128: never})
    assert [entry["size"] for entry in peak["sweep"]] == [64]
    # Under heavy load the sleep may overrun the cap itself: either way it stopped at 64.
    assert peak["stopped"].startswith(("a 128^3 call would take about", "a 64^3 call took"))
    assert peak_caveat(peak) is not None  # short of a plateau: a share of it reads high


def test_once_compiling_has_spent_the_budget_larger_sizes_are_left_out():
    """Compiling falls under the budget: once it has spent it, the batch sizes still to
    compile are left out, each saying why; the first size is always timed."""
    model = build_model(ModelConfig(name="mlp", in_features=4, hidden=[8], out_features=2))
    params = model.init(jax.random.key(0))
    rows = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    # So small a budget that compiling the first size spends it all.
    config = _budgeted([1, 64], 0.001)
    result = run_bench(model, params, rows, config, jnp.float32)
    assert result["latency_ms"]["vmap_jit"].keys() == {"b1"}
    why = result["skipped"]["vmap_jit"]["b64"]
    assert why.startswith("vmap_jit left out at 64 rows: compiling had spent")
    assert "bench.early_stop.time_budget_s" in why
