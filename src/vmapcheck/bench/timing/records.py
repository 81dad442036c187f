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
    # The best of several sweeps (vmapcheck.bench.timing.control.best_peak): each sweep's best,
    # and the machine's load while they ran; contended: that load above the usable
    # cores (a share of this peak then reads high: vmapcheck.bench.timing.bounds.peak_caveat).
    sweeps_gflops: NotRequired[list[float]]
    load_avg_1m: NotRequired[float]
    usable_cores: NotRequired[int]
    contended: NotRequired[bool]


class BenchResult(TypedDict):
    """What :func:`vmapcheck.bench.timing.run.run_bench` measured; cells keyed path ->
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


def read_bench_details(path: Path) -> BenchDetails:
    """``reports/bench_details.json``, every key its type requires present."""
    return read_json_typed(path, BenchDetails)
