"""What the regression verdict writes (``reports/perf_verdict.json``), typed: two runs'
timings judged (:class:`PerfVerdict`, made by
:func:`vmapcheck.bench.verdict.regression.compare`) and each cell compared
(:class:`CellComparison`). Track writes the file; the HTML report and the MLflow run
read it. The timings it compares are :mod:`vmapcheck.bench.timing.records`.

Latencies are in milliseconds; a ratio is current / baseline, above 1 slower.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations.
from typing import Any, NotRequired, TypedDict


class CellComparison(TypedDict):
    """One cell (path, batch size) of two runs compared
    (:func:`vmapcheck.bench.verdict.regression.compare_cell`): the ratio of medians, current /
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
    """Two runs' timings judged (:func:`vmapcheck.bench.verdict.regression.compare`): the verdict,
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
