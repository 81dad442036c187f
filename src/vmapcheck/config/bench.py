"""Config groups ``bench`` and ``budget``: the benchmark's batches, repeats, early stop and
regression verdict, and how many rows the check's costliest parts compute."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from vmapcheck.config.fields import Fraction, PositiveInt, Strict


class RegressionConfig(Strict):
    """When a benchmark counts as slower than its baseline (vmapcheck.bench.verdict.regression)."""

    # A cell regresses only when median(current) / median(baseline) exceeds this ...
    factor: Annotated[float, Field(gt=1.0, le=10.0)]
    # ... and the BH-adjusted one-sided Mann-Whitney p-value on block medians is below this.
    alpha: Fraction
    # Compared after every run in `track`: "last-verified" (the newest passed run with
    # the same model, backend and precision in the store), a bench_details.json, a run
    # id, or null for no comparison.
    baseline: str | None

    @field_validator("baseline", mode="after")
    @classmethod
    def _a_baseline_track_can_find(cls, spec: str | None) -> str | None:
        # Judged in track, after the whole pipeline: a value that can name nothing is
        # refused here, before any work (a file's existence is track's to check).
        if spec is None or spec == "last-verified" or spec.endswith(".json"):
            return spec
        if re.fullmatch(r"[0-9a-f]{32}", spec):
            return spec
        raise ValueError(
            "expected last-verified, an MLflow run id (32 hex digits), a path to a "
            "bench_details.json, or null (no comparison)"
        )


# Rounds the bench stage times every cell in (vmapcheck.bench.timing.run.ROUNDS): a cell
# stopped early has fewer (EarlyStopConfig), never more.
BENCH_ROUNDS = 10
# The fewest latencies a cell keeps (vmapcheck.bench.timing.budget.samples_per_round) and a stored
# baseline's cell must hold to be compared (vmapcheck.bench.verdict.baseline): one number for both.
MIN_SAMPLES = 5


class EarlyStopConfig(Strict):
    """When timing stops before its maximum (docs/benchmark.md, "Early stopping").

    The bench stage (vmapcheck.bench.timing.run.run_bench) stops a cell at a round boundary,
    never within a round, once it has ``min_rounds`` rounds and either its median's
    confidence interval over those rounds is within ``ci_target`` or the timing has run
    ``time_budget_s``. The paired verdict (vmapcheck.bench.verdict.paired) looks at its pairs
    ``paired_looks`` times, a group-sequential test (vmapcheck.bench.verdict.sequential).
    """

    # The stored-run verdict tests round medians (Mann-Whitney): 7 rounds a side still
    # reach p = 2.9e-4, under alpha / 30 cells (0.01 / 30) after Benjamini-Hochberg.
    # A run with fewer rounds than this (bench.repeats under min_rounds, as the tests'
    # short runs have) takes every round: nothing stops early.
    min_rounds: Annotated[int, Field(ge=2, le=BENCH_ROUNDS)]
    # Relative half-width of a cell's median interval over its round medians (the
    # order-statistic interval at bench.confidence_level) at which the cell stops.
    ci_target: Fraction
    # Wall seconds the timing phase plans to fit (vmapcheck.bench.timing.run): the dearest
    # cells take fewer samples a round from the first round on (samples_per_round), a
    # loop path whose projected cost alone exceeds it is left out at that batch size
    # (over_budget), and from min_rounds on the cells stop at a round boundary once the
    # rest would overrun it; null: no budget.
    time_budget_s: Annotated[float, Field(gt=0.0)] | None
    # Looks of the paired verdict's group-sequential test, equally spaced up to its
    # pairs; 1: the fixed-sample test.
    paired_looks: Annotated[int, Field(ge=1, le=10)]


MAX_REPEATS = 100_000
# Warm-up calls run before the timing and outside its budget (bench.early_stop.time_budget_s):
# the first call compiles and caches settle within a handful (the profiles use 1-5), so a
# count past this warms nothing more and only delays the bench; refused up front rather
# than taken into the budget, where it would silently cut the timing itself short.
MAX_WARMUP = 100


class BenchConfig(Strict):
    name: str
    batch_sizes: Annotated[list[PositiveInt], Field(min_length=1)]
    warmup: Annotated[int, Field(gt=0, le=MAX_WARMUP)]
    # At most MAX_REPEATS: the timing keeps a float per sample and cell, and the rounds
    # stop early long before (bench.early_stop); 1e9 was killed for memory after 132 s.
    repeats: Annotated[int, Field(ge=5, le=MAX_REPEATS)]
    loop_max_batch: PositiveInt
    # Of the bootstrap confidence interval reported for each median.
    confidence_level: Annotated[float, Field(gt=0.5, lt=1.0)]
    # Side of the control matmul timed in every round (the verdict's yardstick), and the
    # first size of the peak sweep, which doubles it until the device is busy
    # (vmapcheck.bench.timing.control.peak_sweep).
    peak_matmul_size: Annotated[int, Field(ge=64, le=8192)]
    # Requests the serving guard's replay sends (guard.replay.n_requests interpolates it):
    # the replay is part of the bench, so its profile bounds it too.
    replay_requests: PositiveInt
    # Wall seconds the guard's bucketed replay may run (guard.replay.time_budget_s
    # interpolates it): past it the stream stops before its next request, and the report
    # says how many of replay_requests were sent. A bigger model serves fewer requests in
    # the same time, so the profile bounds the replay for every model; null: no budget.
    replay_time_budget_s: Annotated[float, Field(gt=0.0)] | None = None
    regression: RegressionConfig
    early_stop: EarlyStopConfig


class BudgetConfig(Strict):
    """How much of each case the costliest parts of the check compute, in rows of a batch
    case (batch axis 0): each runs on the case's first ``*_max_rows`` rows at most, and
    the check report says how many rows each covered and that the budget capped it
    (docs/checks.md, "Budgets"). A row count, not a time: the outputs, and so what DVC
    caches, must not depend on the machine's speed or load.
    """

    # The float64 oracle (vmapcheck.core.oracle): forward_one row by row in float64.
    oracle_max_rows: PositiveInt
    # The terms' magnitude (vmapcheck.core.magnitude): forward_one's jaxpr interpreted on
    # magnitudes in float64, row by row. Rows beyond it are judged by the output rule.
    magnitude_max_rows: PositiveInt
    # The loop paths in `forward` (every PATHS entry with forward_cap): one Python-level
    # forward per row, which jit unrolls into one program (compile time grows with rows).
    loop_max_rows: PositiveInt
    # The gradient probe in `forward` on the standard case: vmap(grad) holds one gradient
    # per row, rows x parameters numbers.
    gradient_max_rows: PositiveInt
