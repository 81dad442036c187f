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

    # Each run's context: keys of the CONTEXT registry (vmapcheck.bench.verdict.baseline)
    # beside "source" and "noisy", values as the run recorded them.
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


# The paired verdict (vmapcheck.bench.verdict.paired: ``vmapcheck verdict-paired``,
# reports/perf_verdict_paired.json): both sides timed at once, pair by pair, and judged.


class SpendingRecord(TypedDict):
    """One boundary of the group-sequential test: its alpha-spending function, its
    level and its z bound at each look."""

    spending: str
    level: float
    bounds_z: list[float]


class SequentialRecord(TypedDict):
    """The group-sequential test (:meth:`vmapcheck.bench.verdict.pairs.SequentialPlan.
    describe`): its looks and, with more than one, the pairs at each and its bounds."""

    looks: int
    pairs_at_looks: NotRequired[list[int]]
    slower: NotRequired[SpendingRecord]
    below: NotRequired[SpendingRecord]
    beyond: NotRequired[SpendingRecord]


class PairedCell(TypedDict):
    """One cell judged from its pairs (:func:`vmapcheck.bench.verdict.pairs.paired_cell`):
    the ratio current / baseline of the pairs' medians with its bootstrap interval, the
    one-sided p-values, the pairs (and how many were slower), each side's median, every
    pair's ratio and each process pair's; then, judged with the other cells, the
    adjusted p-values, the process pairs beyond the factor either way and its label."""

    stopped: str | None  # why a group-sequential cell's pairs ended; None: one look
    ratio: float
    ci_low: float
    ci_high: float
    p_slower: float
    p_faster: float
    pairs: int
    pairs_slower: int
    baseline_p50_ms: float
    current_p50_ms: float
    pair_ratios: list[float]
    process_ratios: list[float]
    p_slower_adjusted: NotRequired[float]
    p_faster_adjusted: NotRequired[float]
    processes_slower: NotRequired[int]
    processes_faster: NotRequired[int]
    status: NotRequired[str]
    min_detectable_ratio: NotRequired[float]


class PairedJudgement(TypedDict):
    """Every cell of paired rounds judged (:func:`vmapcheck.bench.verdict.pairs.
    judge_paired`)."""

    verdict: str  # "regression" or "no regression"
    regressions: list[str]
    improvements: list[str]
    cells: dict[str, PairedCell]
    pairs: int  # planned
    pairs_taken: int
    sequential: SequentialRecord
    min_pairs: int
    processes: int
    factor: float
    alpha: float
    confidence_level: float


class SideDescription(TypedDict):
    """How a side ran (:meth:`vmapcheck.bench.verdict.sides.SideSpec.describe`): its
    project folder, interpreter and its ``PYTHONPATH``, whose code (its own ``src/`` or
    the driver's vmapcheck), and the worker module."""

    project: str
    python: str
    pythonpath: str | None
    code: str
    worker: str


class StaticContext(TypedDict):
    """What a side's files say of its context before any worker starts
    (:func:`vmapcheck.bench.verdict.sides.static_context`): three CONTEXT keys."""

    model: str
    model_contract: str  # vmapcheck.params_io.contract_digest
    dtype: str


class SideReady(TypedDict):
    """What a side's worker says once ready (vmapcheck.bench.verdict.worker): the side's
    context, the cells it times and those it skipped (cell -> why), and with the blocks
    order the samples a block of each cell."""

    # The CONTEXT registry's keys (vmapcheck.bench.verdict.baseline), each value as the
    # worker found it (text, numbers, lists): free-form here, compared key by key there.
    context: dict[str, Any]
    cells: list[str]
    skipped: dict[str, str]
    block_samples: NotRequired[dict[str, int]]


class PairedDesign(TypedDict):
    """How the pairs were taken (vmapcheck.bench.verdict.paired): rounds and samples, the
    order within a round, the process pairs, whether one process holds both sides (and
    why not), and on a device one process at a time may use, that and the processes
    asked for (and, one after another, the sides' order); with the blocks order, the
    shortest block and the samples a block of each cell."""

    rounds_per_side: int
    samples_per_round: int
    warmup: int
    within_round: str
    process_pairs: int
    one_process_for_both: bool
    why_apart: str | None
    one_at_a_time: NotRequired[str]
    processes_asked: NotRequired[int]
    sessions: NotRequired[list[str]]
    min_block_ms: NotRequired[float]
    block_samples: NotRequired[dict[str, int] | None]


class PairedDesignReport(PairedDesign):
    """The design as the report states it (:func:`vmapcheck.bench.verdict.paired_report.
    design_head`): named, with the processes, the order, the cells and the rule."""

    name: str
    processes: int
    order: str
    paths: list[str]
    batch_sizes: list[int]
    unit: str
    statistic: str
    test: str
    rule: str


class PairedHead(TypedDict):
    """What the paired report states once both sides are loaded: the design, each side
    (its project, interpreter and code, and its context's keys: free-form values, as
    :class:`SideReady`'s ``context``), the context keys that must be the same, and those
    that differ; the cells a side skipped."""

    design: PairedDesignReport
    baseline: dict[str, Any]
    current: dict[str, Any]
    required_same: list[str]
    differences: NotRequired[dict[str, list[Any]]]
    skipped: NotRequired[dict[str, str]]


class PairedLoad(TypedDict):
    """The 1-minute load average over the rounds, and the cores usable."""

    load_avg_1m_min: float
    load_avg_1m_max: float
    load_avg_1m_mean: float
    usable_cores: int


class PairedReport(TypedDict):
    """``reports/perf_verdict_paired.json``: the paired verdict; timed (the judgement
    (:class:`PairedJudgement`), the head (:class:`PairedHead`), the cells one side
    lacks, the load and the wall seconds), or not comparable (``reasons``, ``why``, the
    sides and their differences; ``timed`` False where known before any worker)."""

    verdict: str
    regressions: list[str]
    improvements: list[str]
    reasons: NotRequired[list[str]]
    why: NotRequired[str]
    timed: NotRequired[bool]
    cells: NotRequired[dict[str, PairedCell]]
    pairs: NotRequired[int]
    pairs_taken: NotRequired[int]
    sequential: NotRequired[SequentialRecord]
    min_pairs: NotRequired[int]
    processes: NotRequired[int]
    factor: NotRequired[float]
    alpha: NotRequired[float]
    confidence_level: NotRequired[float]
    design: NotRequired[PairedDesignReport]
    baseline: NotRequired[dict[str, Any]]
    current: NotRequired[dict[str, Any]]
    required_same: NotRequired[list[str]]
    differences: NotRequired[dict[str, list[Any]]]
    skipped: NotRequired[dict[str, str]]
    only_one_side: NotRequired[list[str]]
    load: NotRequired[PairedLoad]
    wall_s: NotRequired[float]
