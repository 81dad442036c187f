"""What the benchmark writes (``reports/bench_details.json``), typed: one latency cell
per path and batch size, the matmul peak, and the record around them. The bench stage
writes the file from :class:`BenchDetails`; the summary, the HTML report and track read
it back with :func:`read_bench_details`, which names any key its type requires that the
file lacks. The regression verdict's record is :mod:`vmapcheck.bench.verdict.records`.

Latencies are in milliseconds, one sample per call on a batch of ``rows`` (batch axis
0); rates in rows per second.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations.
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from vmapcheck.core.record import MeshRecord, RuntimeRecord
from vmapcheck.io import read_json_typed


class LatencyCell(TypedDict):
    """One path at one batch size: the distribution of its calls' latency (ms) after
    warm-up, and the median's confidence interval."""

    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float
    max: float
    n: int
    median_ci_low: NotRequired[float]
    median_ci_high: NotRequired[float]
    rows_per_s: NotRequired[float]


class SweepPoint(TypedDict):
    """One product size of a peak sweep: its p50 (ms) and GFLOP/s at p50."""

    size: int
    p50_ms: float
    gflops: float


class Peak(TypedDict):
    """The matmul peak measured in the same run (the roofline's ceiling)."""

    size: int
    p50_ms: float
    gflops: float
    sweep: NotRequired[list[SweepPoint]]
    dtype: NotRequired[str]
    matmul_precision: NotRequired[str]
    stopped: NotRequired[str]
    # The best of several sweeps (vmapcheck.bench.timing.control.best_peak): each sweep's best,
    # and the machine's load while they ran; contended: that load above the usable
    # cores (a share of this peak then reads high: vmapcheck.bench.timing.bounds.peak_caveat).
    sweeps_gflops: NotRequired[list[float]]
    load_avg_1m: NotRequired[float]
    usable_cores: NotRequired[int]
    contended: NotRequired[bool]


class CompileFigures(TypedDict, total=False):
    """What compiling one cell told (:mod:`vmapcheck.bench.timing.run`): its compile
    time and XLA's cost analysis, on a jitted path only (an eager path has none); a
    distributed path's flops and bytes scaled to the whole mesh, with the per-device
    flops, the device count and the rows run (padding included)."""

    compile_ms: float
    flops: float
    bytes_accessed: float
    temp_bytes: float
    flops_per_device: float
    devices: float
    padded_rows: float


class CellFigures(CompileFigures):
    """One cell's figures beside its latency: :class:`CompileFigures`, the first call
    (ms, compile included where jitted), the calls one sample times (the inner loop),
    the flops (an eager path's: its jit twin's) and GFLOP/s at p50 with its share of the
    matmul peak (None: no peak to share)."""

    first_call_ms: float
    inner_loop: int
    gflops: float
    roofline: NotRequired[float | None]  # absent in records older than the share


class ControlFigures(TypedDict):
    """The control matmul timed in every round (:func:`vmapcheck.bench.timing.control.
    control_figures`): its size, p50 (ms), GFLOP/s at p50 and every sample (ms), which
    the verdict compares round by round."""

    size: int
    p50_ms: float
    gflops: float
    samples_ms: list[float]


class LaunchFit(TypedDict):
    """A path's time fitted over its batch sizes (:func:`vmapcheck.bench.timing.bounds.
    fit_launch`): ``p50 = fixed_ms + per_row_ms * rows``, the rows where it leaves flat
    (None: no growth over the sizes timed), and that boundary's bootstrap interval
    ``[low, high]`` (high None: some replicates saw no growth; None: no samples)."""

    fixed_ms: float
    per_row_ms: float
    up_to_rows_fit: float | None
    interval: list[float | None] | None


class LaunchBound(TypedDict):
    """A path whose time is flat in batch size (:func:`vmapcheck.bench.timing.bounds.
    launch_bound`): from its smallest batch up to the largest timed one within the
    fitted boundary, their p50s (ms), the throughput there, and the fit (absent in
    records from before the fit)."""

    from_rows: int
    up_to_rows: int
    p50_ms_from: float
    p50_ms_up_to: float
    rows_per_s: float
    fit: NotRequired[LaunchFit]


class JaxSettings(TypedDict):
    """The JAX settings that change numbers or speed, and the device with its memory and
    runtime (as text: ``accelerator_runtime`` "libtpu 0.0.42.1", "" on CPU; these three
    absent in records older than them, as in :class:`vmapcheck.core.record.RuntimeRecord`)."""

    backend: str
    device_kind: str
    device_count: int
    device_memory_gib: NotRequired[float | None]
    platform_version: NotRequired[str]
    accelerator_runtime: NotRequired[str]
    jax_version: str
    jaxlib_version: str
    matmul_precision: str
    enable_x64: bool


class Conditions(JaxSettings):
    """The machine at one moment (:func:`vmapcheck.bench.timing.machine.conditions`): CPU,
    cores, load averages, memory, threading settings, and :class:`JaxSettings`."""

    cpu_model: str
    logical_cores: int | None
    usable_cores: int
    load_avg_1m: float
    load_avg_5m: float
    load_avg_15m: float
    memory_total_gib: float
    memory_available_gib: float
    omp_num_threads: str
    xla_flags: str


class Spread(TypedDict):
    """The least, largest and mean of some readings."""

    min: float
    max: float
    mean: float


class Sampled(TypedDict):
    """The load and CPU frequency read through a run (:meth:`vmapcheck.bench.timing.
    machine.ConditionsSampler.summary`): what they span, over how long, how many readings
    how far apart, and each reading's spread (None: none read)."""

    covers: list[str]
    span_s: float
    samples: int
    interval_s: float
    load_avg_1m: Spread | None
    cpu_mhz: Spread | None


class MachineRecord(TypedDict):
    """bench_details.json's ``machine`` (:func:`vmapcheck.bench.timing.machine.
    machine_record`): the conditions before and after, the readings during (None: not
    sampled), and ``noisy``: the highest 1-minute load above the usable cores."""

    before: Conditions
    after: Conditions
    during: NotRequired[Sampled | None]  # absent in records from before the sampling
    noisy: bool


class CellStop(TypedDict):
    """How one cell's timing ended (bench_details.json ``early_stop.cells``): the whole
    rounds it kept and their samples, why it stopped (every round, its interval within
    target, the time budget), the samples a round took (fewer than a round's size where
    the budget made it give some up) and its median's interval half-width, relative."""

    rounds: int
    samples: int
    stopped: str
    samples_per_round: NotRequired[int]  # absent in records older than the budget's quotas
    interval_half_width: float


class BudgetClockRecord(TypedDict):
    """What the time budget was counted in and what the bench spent of it, beside the
    wall and CPU seconds it was read from (:meth:`vmapcheck.bench.timing.budget.
    BudgetClock.record`)."""

    counts: str
    spent_s: float
    wall_s: float
    cpu_s: float


class EarlyStopRecord(TypedDict):
    """bench_details.json's ``early_stop``: the settings (bench.early_stop, as
    configured), each cell's stop (path -> ``b<rows>`` label -> :class:`CellStop`) and
    the budget's clock (absent in records older than it)."""

    settings: dict[str, Any]  # vmapcheck.config.EarlyStopConfig, dumped
    cells: dict[str, dict[str, CellStop]]
    budget_clock: NotRequired[BudgetClockRecord]


class GuardHistogram(TypedDict):
    """The guard's latency histogram: each bin's upper edge (ms) and count."""

    upper_edges_ms: list[float]
    counts: list[int]


class GuardLatency(TypedDict):
    """The guard's latency over its requests: the histogram, and exact percentiles (ms)
    over its last ``window`` requests (absent when it served none)."""

    histogram: GuardHistogram
    window: int
    p50: NotRequired[float]
    p90: NotRequired[float]
    p99: NotRequired[float]
    max: NotRequired[float]


class GuardMetrics(TypedDict):
    """The serving guard's aggregates (:meth:`vmapcheck.guard.predictor.Guard.metrics`);
    no request value is among them. The bucket figures are None for an un-bucketed
    guard."""

    requests: int
    served: int
    refused: dict[str, int]  # reason -> requests
    invalid_share: dict[str, float]  # reason -> share of the requests
    invalid_share_total: float
    numeric_errors: int
    compiles: int
    compile_s: float
    buckets: list[int] | None
    compiles_within_bound: bool | None
    requests_per_bucket: dict[str, int] | None
    distinct_batch_sizes: int
    rows_real: int
    rows_padding: int
    padding_overhead: float
    latency_ms: GuardLatency


class ReplayLatency(TypedDict):
    """Served requests' latency (:class:`LatencyCell`; None: none served): the bucketed
    guard over the whole stream, and, with the un-bucketed comparison, both over its
    prefix and the un-bucketed one without the requests that compiled."""

    bucketed: LatencyCell | None
    bucketed_prefix: NotRequired[LatencyCell | None]
    unbucketed_prefix: NotRequired[LatencyCell | None]
    unbucketed_prefix_no_compile: NotRequired[LatencyCell | None]


class UnbucketedReplay(TypedDict):
    """The un-bucketed guard's replay of the stream's prefix: requests sent of those
    planned, whether the budget cut it short, its compiles and their seconds, and the
    batch sizes it saw."""

    requests: int
    requests_planned: int
    stopped_by_budget: bool
    compiles: int
    compile_s: float
    distinct_batch_sizes: int


class ReplayReport(TypedDict):
    """The guard replay (:func:`vmapcheck.guard.replay.run_replay`): a stream of requests
    through a bucketed guard, then its prefix through an un-bucketed one. Keys added
    after the replay (``requests_planned``, ``time_budget_s``, ``stopped_by_budget``,
    ``wall_s``) are absent in records older than them."""

    requests: int
    requests_planned: NotRequired[int]
    time_budget_s: NotRequired[float | None]
    stopped_by_budget: NotRequired[bool]
    buckets: list[int]
    compiles: int
    compiles_within_bound: bool
    compiles_during_replay: int
    padding_overhead: float
    invalid_share: dict[str, float]
    invalid_share_total: float
    numeric_errors: int
    outcomes: dict[str, int]  # outcome -> requests
    mismatched: dict[str, int]  # "expected->got" -> requests (should be empty)
    latency_ms: ReplayLatency
    bucketed_metrics: GuardMetrics
    wall_s: NotRequired[dict[str, float]]  # replay ("bucketed", "unbucketed") -> seconds
    unbucketed: NotRequired[UnbucketedReplay]
    notes: NotRequired[list[str]]


class ReplayRecord(ReplayReport):
    """bench_details.json's ``replay``: the report and its headline figures, flat
    (:func:`vmapcheck.guard.replay.replay_figures`)."""

    figures: dict[str, float]


class CellResults(TypedDict):
    """The timing's figures by kind (:func:`vmapcheck.bench.timing.run.run_bench`, before
    they go into :class:`BenchResult`), each path -> ``b<rows>`` label -> value."""

    figures: dict[str, dict[str, CellFigures]]
    latency: dict[str, dict[str, LatencyCell]]
    samples: dict[str, dict[str, list[float]]]
    round_sizes: dict[str, dict[str, list[int]]]
    stopping: dict[str, dict[str, CellStop]]


class BenchResult(TypedDict):
    """What :func:`vmapcheck.bench.timing.run.run_bench` measured; cells keyed path ->
    ``b<rows>`` label."""

    batch_sizes: list[int]
    latency_ms: dict[str, dict[str, LatencyCell]]
    figures: dict[str, dict[str, CellFigures]]  # path -> label -> figures
    speedup: dict[str, dict[str, float]]  # label -> speed-up name -> p50 ratio
    speedup_ci: dict[str, dict[str, list[float]]]  # label -> name -> [low, high]
    peak: NotRequired[Peak]
    control: NotRequired[ControlFigures]
    launch_bound: dict[str, LaunchBound]  # path -> its flat range
    skipped: dict[str, dict[str, str]]  # path -> label -> why it was left out
    samples_ms: dict[str, dict[str, list[float]]]
    round_sizes: dict[str, dict[str, list[int]]]
    early_stop: EarlyStopRecord
    machine: MachineRecord  # conditions before and after, and the load over the run
    limits: NotRequired[list[str]]  # what the benchmark cannot tell, one line each
    phases_s: dict[str, float]


class BenchDetails(BenchResult):
    """``reports/bench_details.json``: the result, what was timed and where."""

    model: str
    model_contract: str
    precision: str
    dtype: str
    runtime: RuntimeRecord  # vmapcheck.core.runtime.RuntimeInfo
    bench: dict[str, Any]  # the bench settings (vmapcheck.config.BenchConfig)
    sharded: MeshRecord | None
    # Every distributed path's mesh (vmapcheck.core.paths.describe_meshes); absent in
    # records older than the mesh paths.
    meshes: NotRequired[dict[str, MeshRecord]]
    replay: NotRequired[ReplayRecord]


def read_bench_details(path: Path) -> BenchDetails:
    """``reports/bench_details.json``, every key its type requires present."""
    return read_json_typed(path, BenchDetails)
