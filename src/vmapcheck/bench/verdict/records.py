"""What the regression verdict writes (``reports/perf_verdict.json``), typed: two runs'
timings judged (:class:`PerfVerdict`, made by
:func:`vmapcheck.bench.verdict.regression.compare`) and each cell compared
(:class:`CellComparison`). Track writes the file; the HTML report and the MLflow run
read it. The timings it compares are :mod:`vmapcheck.bench.timing.records`.

Latencies are in milliseconds; a ratio is current / baseline, above 1 slower.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations.
from typing import Any, NotRequired, TypedDict, final


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
    # Set with the label: the smallest ratio the cell could have detected, its smallest
    # possible p-value with the rounds both runs have, and whether that p adjusted over
    # the cells can pass alpha.
    min_detectable_ratio: NotRequired[float]
    smallest_p: NotRequired[float]
    can_reach_alpha_alone: NotRequired[bool]


class ControlVerdict(TypedDict):
    """The control matmul of two runs compared
    (:func:`vmapcheck.bench.verdict.regression.judge_control`): whether it could be and
    why not, each side's size and dtype (baseline, current), the ratio current /
    baseline with its interval and one-sided p (None where not measured), and whether
    the machine itself was slower beyond the factor."""

    compared: bool
    why: str | None
    size: list[int | None]
    dtype: list[str | None]
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_slower: float | None
    slower: bool


class RoundsCompared(TypedDict):
    """How many rounds each side's cells have (early stopping leaves some with fewer):
    the cells where one side has fewer, those that cannot reach alpha alone, and each
    side's ``[min, max]`` (None: no cell compared)."""

    baseline_fewer: list[str]
    current_fewer: list[str]
    cannot_reach_alpha_alone: list[str]
    baseline: list[int] | None
    current: list[int] | None


class RoundIndex(TypedDict):
    """How slow each round of each run was across its cells (None: not normalized)."""

    baseline: list[float] | None
    current: list[float] | None


class VerdictHead(TypedDict):
    """What every verdict states, compared or not: both runs' context (``source``, the
    context keys, ``noisy``), the settings, and the context keys that differ."""

    baseline: dict[str, Any]
    current: dict[str, Any]
    factor: float
    alpha: float
    confidence_level: float
    differences: dict[str, list[Any]]
    required_same: list[str]


# Final, as NoVerdict: `"baseline" in outcome` tells a PerfOutcome's two apart.
@final
class PerfVerdict(VerdictHead):
    """Two runs' timings judged (:func:`vmapcheck.bench.verdict.regression.compare`): the verdict,
    whether they could be compared and why not, the settings and both runs' context
    (:class:`VerdictHead`), the cells that regressed or improved; the cells themselves
    when comparable."""

    verdict: str  # "regression", "no regression", "inconclusive", "not comparable"
    comparable: bool
    reasons: list[str]
    regressions: list[str]  # path/b<rows>
    improvements: list[str]
    machine_slowdown: float | None
    why: NotRequired[str]
    cells: NotRequired[dict[str, dict[str, CellComparison]]]
    only_in_baseline: NotRequired[list[str]]
    only_in_current: NotRequired[list[str]]
    rounds: NotRequired[RoundsCompared]
    noisy: NotRequired[bool]
    control: NotRequired[ControlVerdict]
    machine_slower: NotRequired[bool]
    round_index: NotRequired[RoundIndex]


@final
class NoVerdict(TypedDict):
    """A verdict without a comparison (:func:`vmapcheck.pipeline.track.judge_performance`):
    its word (``"not compared"``, ``"no baseline"``, ``"bench not rerun"``) and why."""

    verdict: str
    why: str


# What reports/perf_verdict.json holds: two runs judged, or why they were not.
PerfOutcome = PerfVerdict | NoVerdict
