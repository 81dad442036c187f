"""What the benchmark writes (``reports/bench_details.json``), typed: one latency cell
per path and batch size, the matmul peak, and the record around them. The bench stage
writes the file from :class:`BenchDetails`; the summary, the HTML report and track read
it back with :func:`read_bench_details`, which names any key its type requires that the
file lacks.

Latencies are in milliseconds, one sample per call on a batch of ``rows`` (batch axis
0); rates in rows per second.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations.
from pathlib import Path
from typing import Any, NotRequired, TypedDict

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


class Peak(TypedDict):
    """The matmul peak measured in the same run (the roofline's ceiling)."""

    size: int
    p50_ms: float
    gflops: float
    sweep: NotRequired[list[dict[str, Any]]]
    dtype: NotRequired[str]
    matmul_precision: NotRequired[str]
    stopped: NotRequired[str]
    # The best of several sweeps (vmapcheck.bench.control.best_peak): each sweep's best,
    # and the machine's load while they ran; contended: that load above the usable
    # cores (a share of this peak then reads high: vmapcheck.bench.bounds.peak_caveat).
    sweeps_gflops: NotRequired[list[float]]
    load_avg_1m: NotRequired[float]
    usable_cores: NotRequired[int]
    contended: NotRequired[bool]


class BenchResult(TypedDict):
    """What :func:`vmapcheck.bench.timing.run_bench` measured; cells keyed path ->
    ``b<rows>`` label."""

    batch_sizes: list[int]
    latency_ms: dict[str, dict[str, LatencyCell]]
    figures: dict[str, Any]
    speedup: dict[str, dict[str, float]]  # label -> speed-up name -> p50 ratio
    speedup_ci: dict[str, dict[str, list[float]]]  # label -> name -> [low, high]
    peak: NotRequired[Peak]
    control: NotRequired[dict[str, Any]]
    launch_bound: dict[str, dict[str, Any]]
    skipped: dict[str, Any]  # path -> label or size -> why it was left out
    samples_ms: dict[str, dict[str, list[float]]]
    round_sizes: dict[str, dict[str, list[int]]]
    early_stop: dict[str, Any]
    machine: dict[str, Any]  # conditions before and after, and the load over the run
    limits: NotRequired[dict[str, Any]]
    phases_s: dict[str, float]


class BenchDetails(BenchResult):
    """``reports/bench_details.json``: the result, what was timed and where."""

    model: str
    model_contract: str
    precision: str
    dtype: str
    runtime: dict[str, Any]  # vmapcheck.core.runtime.RuntimeInfo
    bench: dict[str, Any]  # the bench settings (vmapcheck.config.BenchConfig)
    sharded: dict[str, Any] | None
    # Every distributed path's mesh (vmapcheck.core.paths.describe_meshes); absent in
    # records older than the mesh paths.
    meshes: NotRequired[dict[str, dict[str, Any]]]
    replay: NotRequired[dict[str, Any]]


class CellComparison(TypedDict):
    """One cell (path, batch size) of two runs compared
    (:func:`vmapcheck.bench.verdict.compare_cell`): the ratio of medians, current /
    baseline, with its cluster-bootstrap interval and one-sided p-values on block
    medians; then its label."""

    ratio: float
    raw_ratio: float
    ci_low: float
    ci_high: float
    p_slower: float
    p_faster: float
    n_baseline: int
    n_current: int
    blocks_baseline: int
    blocks_current: int
    baseline_p50_ms: float
    current_p50_ms: float
    # Set when the cells are judged together: the adjusted p-values, the label
    # ("regression", "slower", "faster", "no measurable difference", ...).
    p_slower_adjusted: NotRequired[float]
    p_faster_adjusted: NotRequired[float]
    status: NotRequired[str]


class PerfVerdict(TypedDict):
    """Two runs' timings judged (:func:`vmapcheck.bench.verdict.compare`): the verdict,
    whether they could be compared and why not, the settings and both runs' context,
    the cells that regressed or improved; the cells themselves when comparable."""

    verdict: str  # "regression", "no regression", "inconclusive", "not comparable"
    comparable: bool
    reasons: list[str]
    baseline: dict[str, Any]
    current: dict[str, Any]
    factor: float
    alpha: float
    confidence_level: float
    differences: dict[str, list[Any]]
    required_same: list[str]
    regressions: list[Any]
    improvements: list[Any]
    machine_slowdown: float | None
    why: NotRequired[str]
    cells: NotRequired[dict[str, dict[str, CellComparison]]]
    only_in_baseline: NotRequired[list[str]]
    only_in_current: NotRequired[list[str]]
    rounds: NotRequired[dict[str, Any]]
    noisy: NotRequired[bool]
    control: NotRequired[dict[str, Any]]
    machine_slower: NotRequired[bool]
    round_index: NotRequired[dict[str, Any]]


def read_bench_details(path: Path) -> BenchDetails:
    """``reports/bench_details.json``, every key its type requires present."""
    return read_json_typed(path, BenchDetails)
