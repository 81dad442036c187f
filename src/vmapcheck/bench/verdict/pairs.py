"""The paired verdict's statistics: the pairs' schedule, each cell judged on its paired
ratios, and the rule that makes a regression (:mod:`vmapcheck.bench.verdict.paired` runs the
worker processes that time the pairs, and reports; its module docstring says why the
design is what it is).

Each cell holds, per pair of adjacent rounds, the baseline's and the current side's
round medians (:func:`pair_medians`). Its ratio is the exponential of the median log
ratio over the pairs, its interval a bootstrap that resamples the pairs within each
process pair, and its p-values one-sided Wilcoxon signed-rank tests on the log ratios
(:func:`paired_cell`), adjusted over the cells with Benjamini-Hochberg
(:func:`judge_paired`). A cell regresses when the ratio exceeds the factor, the
adjusted p is under alpha, and the ratio exceeds the factor within a majority of the
process pairs too (:func:`is_regression`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from vmapcheck.bench.verdict.labels import cell_label, min_detectable_ratio
from vmapcheck.bench.verdict.records import PairedCell, PairedJudgement, SequentialRecord
from vmapcheck.bench.verdict.sequential import (
    OBRIEN_FLEMING,
    POCOCK,
    Design,
    look_sizes,
    wilcoxon_z,
)
from vmapcheck.errors import ConfigError

BASELINE, CURRENT = "baseline", "current"
# Why a cell's pairs ended (the report's ``stopped``): decided at a look, one way or the
# other (:func:`decision`), or every planned pair taken.
BELOW_FACTOR = "below the factor"
BEYOND_FACTOR = "slower beyond the factor"
ALL_PAIRS = "all pairs"


class SequentialPlan:
    """The paired verdict's group-sequential test (vmapcheck.bench.verdict.sequential): ``looks``
    equally spaced looks up to ``pairs`` pairs; per cell three one-sided tests on the
    pairs' log ratios, each with its own Lan-DeMets spending:

    - **slower** (H0: no slowdown), level ``alpha``, O'Brien-Fleming type: its stagewise
      p is the cell's ``p_slower`` (then Benjamini-Hochberg over the cells, as without
      looks). The last boundary is close to the fixed test's, so detection is kept;
    - **below** (H0: a slowdown of ``factor`` or more), level ``(1 - confidence) / 2``,
      Pocock type (spent evenly: most cells are unchanged, and stopping them early is
      where the time is saved): crossing it rules out a regression of the factor's size;
    - **beyond** (H0: a slowdown of ``factor`` or less), the same level, O'Brien-Fleming
      type: with **slower** crossed too, the cell is slower beyond the factor.

    A cell is decided (stops being timed) at the first look where **below** crosses, or
    **slower** and **beyond** both have. ``looks=1`` is the fixed-sample test.
    """

    def __init__(self, pairs: int, looks: int, alpha: float, confidence: float) -> None:
        self.pairs, self.looks, self.confidence = pairs, looks, confidence
        self.sizes = look_sizes(pairs, looks)
        t = [n / pairs for n in self.sizes]
        side = (1.0 - confidence) / 2.0
        self.slower = Design(t, alpha, OBRIEN_FLEMING)
        self.below = Design(t, side, POCOCK)
        self.beyond = Design(t, side, OBRIEN_FLEMING)

    def look_at(self, pairs: int) -> int | None:
        """The look (0-based) taken after ``pairs`` pairs, or None between looks."""
        return self.sizes.index(pairs) if pairs in self.sizes else None

    def statistics(self, logs: np.ndarray, factor: float) -> dict[str, float]:
        """The three tests' standardized Wilcoxon statistics of the log ratios ``logs``
        (pairs,): each large when its null is contradicted."""
        shift = math.log(factor)
        return {
            "slower": wilcoxon_z(logs),
            "below": wilcoxon_z(shift - logs),
            "beyond": wilcoxon_z(logs - shift),
        }

    def decision(
        self, logs: np.ndarray, factor: float, groups: np.ndarray, confidence: float
    ) -> str | None:
        """Whether a cell whose first ``len(logs)`` pairs have these log ratios (pair
        ``i`` timed by process pair ``groups[i]``) is decided at this look
        (:data:`BELOW_FACTOR`, :data:`BEYOND_FACTOR`), or None: go on (also between looks,
        and at the last look, where every cell ends anyway).

        A cell stopped below the factor must also have its label settled by the interval
        the label reads (the cluster bootstrap of :func:`paired_cell`): under the factor
        (else it would stop ``underpowered``, a label that asks for more pairs), and
        either wholly above 1 (``slower (below the factor)``) or under half the factor
        (``sqrt(factor)``): a cell slower by 5-10% does not stop as ``no measurable
        difference`` while its interval still reaches that far. These conditions only
        make stops rarer, so the error rates hold."""
        k = self.look_at(len(logs))
        if k is None or k == self.looks - 1:  # between looks, or the last (one look too)
            return None
        z = self.statistics(logs, factor)
        if self.below.crossed(k, z["below"]):
            low, high = np.exp(_cluster_bootstrap_median(logs, groups, confidence, seed=0))
            if high < factor and (low > 1.0 or high < math.sqrt(factor)):
                return BELOW_FACTOR
        if self.slower.crossed(k, z["slower"]) and self.beyond.crossed(k, z["beyond"]):
            return BEYOND_FACTOR
        return None

    def p_values(self, logs: np.ndarray) -> tuple[float, float]:
        """``(p_slower, p_faster)`` of a cell's pairs under this design: the stagewise p
        (vmapcheck.bench.verdict.sequential.Design.stagewise_p) at the first look whose boundary
        the statistic crossed, else at the cell's last look. The same design serves the
        mirror test (faster)."""
        out = []
        for sign in (1.0, -1.0):
            chosen = None
            for k, n in enumerate(self.sizes):
                if n > len(logs):
                    break
                z = sign * wilcoxon_z(logs[:n])
                chosen = (k, z)
                if self.slower.crossed(k, z):
                    break
            if chosen is None:  # fewer pairs than the first look: nothing to test
                out.append(1.0)
            else:
                out.append(self.slower.stagewise_p(*chosen))
        return out[0], out[1]

    def describe(self) -> SequentialRecord:
        return {
            "looks": self.looks,
            "pairs_at_looks": self.sizes,
            "slower": {
                "spending": OBRIEN_FLEMING,
                "level": self.slower.alpha,
                "bounds_z": [float(b) for b in self.slower.bounds],
            },
            "below": {
                "spending": POCOCK,
                "level": self.below.alpha,
                "bounds_z": [float(b) for b in self.below.bounds],
            },
            "beyond": {
                "spending": OBRIEN_FLEMING,
                "level": self.beyond.alpha,
                "bounds_z": [float(b) for b in self.beyond.bounds],
            },
        }


class InsufficientRoundsError(ConfigError):
    """Too few pairs of rounds for the test to reach ``alpha`` (see :func:`min_pairs`)."""


def min_pairs(cells: int, alpha: float) -> int:
    """Pairs of rounds needed so that one significant cell among ``cells`` can reach
    ``alpha`` after Benjamini-Hochberg (``cells * 2**-n < alpha``), plus two."""
    return math.ceil(math.log2(max(cells, 1) / alpha)) + 2


def schedule(rounds: int) -> list[str]:
    """The sides' order for ``rounds`` rounds each: A B B A A B B A ... (A: baseline)."""
    return [
        s
        for i in range(rounds)
        for s in ((BASELINE, CURRENT) if i % 2 == 0 else (CURRENT, BASELINE))
    ]


def process_of_pair(pair: int, processes: int) -> int:
    """The process pair that times pair ``pair``: they take turns."""
    return pair % processes


def session_pairs(processes: int, rounds: int) -> int:
    """Pairs of consecutive worker processes in the one-at-a-time design (:func:`sessions`):
    ``processes`` rounded up to even, so that as many of them time the baseline first as
    the current side (an order effect cancels, as over ABBA's pairs), at least 2 (A B A:
    the fewest processes that make ABBA), at most the even part of ``rounds`` (each
    holds a pair at least)."""
    return min(max(2, processes + processes % 2), rounds - rounds % 2)


def sessions(rounds: int, groups: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """The worker processes of the one-at-a-time design (vmapcheck.bench.verdict.paired, a backend
    whose device one process at a time may hold), in the order they run: per process its
    side and what it times, ``(pair, half)`` in order (half 0: the pair's first round in
    :func:`schedule`, 1: its second).

    ``groups + 1`` processes, A B A B ... A (``groups``: :func:`session_pairs`, even).
    Pair ``i`` belongs to the pair of processes ``g = i mod groups``
    (:func:`process_of_pair`): process ``g`` times its first half, process ``g + 1`` its
    second. So process ``j`` times the second halves of group ``j - 1``'s pairs, then the
    first halves of group ``j``'s: A | B B | A A | B ... is ABBA with each side's two
    adjacent turns in one process, and the sides of :func:`schedule` hold (group ``g``'s
    first process is A when ``g`` is even, as pair ``i``'s first round is when ``i`` is).
    """
    if groups < 2 or groups % 2 or groups > rounds:
        raise ValueError(f"groups: expected an even number from 2 to {rounds}, found {groups}")
    plan = []
    for j in range(groups + 1):
        work = [(i, 1) for i in range(j - 1, rounds, groups)] if j > 0 else []
        work += [(i, 0) for i in range(j, rounds, groups)] if j < groups else []
        plan.append((BASELINE if j % 2 == 0 else CURRENT, work))
    return plan


def pair_medians(
    order: Sequence[str], rounds: Sequence[Mapping[str, Sequence[float]]], cell: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair of adjacent rounds (``order[2i]``, ``order[2i+1]``: one of each side),
    the baseline's and the current round's median of ``cell``: two arrays (pairs,). A
    cell decided early is absent from the rounds after its last pair: its pairs end
    there."""
    base, cur = [], []
    for i in range(0, len(order) - 1, 2):
        first, second = order[i], order[i + 1]
        if {first, second} != {BASELINE, CURRENT}:
            raise ValueError(f"rounds {i} and {i + 1} are not one of each side: {first}, {second}")
        if cell not in rounds[i] or cell not in rounds[i + 1]:
            break
        by_side = {first: rounds[i][cell], second: rounds[i + 1][cell]}
        base.append(float(np.median(by_side[BASELINE])))
        cur.append(float(np.median(by_side[CURRENT])))
    return np.array(base), np.array(cur)


def _cluster_bootstrap_median(
    logs: np.ndarray, groups: np.ndarray, confidence: float, seed: int, resamples: int = 2000
) -> tuple[float, float]:
    """Percentile interval of the median of ``logs`` (pairs,), resampling the groups
    (process pairs) with replacement, then the pairs within each chosen group."""
    rng = np.random.default_rng(seed)
    members = [logs[groups == g] for g in np.unique(groups)]
    widest = max(m.size for m in members)
    chosen = rng.integers(len(members), size=(resamples, len(members)))
    # Slot j of every resample: the pairs drawn from its chosen group, NaN-padded to the
    # widest group, so that all resamples' medians come from one nanmedian.
    slots = []
    for j in range(len(members)):
        slot = np.full((resamples, widest), np.nan)
        for g, member in enumerate(members):
            rows = chosen[:, j] == g
            drawn = rng.integers(member.size, size=(int(rows.sum()), member.size))
            slot[rows, : member.size] = member[drawn]
        slots.append(slot)
    medians = np.nanmedian(np.concatenate(slots, axis=1), axis=1)
    tail = (1.0 - confidence) / 2.0
    return float(np.quantile(medians, tail)), float(np.quantile(medians, 1.0 - tail))


def paired_cell(
    base_ms: np.ndarray,
    cur_ms: np.ndarray,
    confidence: float = 0.95,
    seed: int = 0,
    processes: Sequence[int] | None = None,
    plan: SequentialPlan | None = None,
    factor: float | None = None,
) -> PairedCell:
    """One cell judged from its pairs of round medians (ms; shape (pairs,) each, pair
    ``i`` taken in adjacent rounds by process pair ``processes[i]``, default all 0): ratio,
    bootstrap CI, one-sided Wilcoxon p-values, and the ratio within each process pair.
    With a ``plan`` of several looks, the p-values are its stagewise ones
    (:meth:`SequentialPlan.p_values`) and ``stopped`` says why the pairs ended (its
    :meth:`SequentialPlan.decision` at the last look, with ``factor``)."""
    logs = np.log(np.asarray(cur_ms, float) / np.asarray(base_ms, float))
    groups = np.zeros(logs.size, int) if processes is None else np.asarray(processes, int)
    if groups.shape != logs.shape:
        raise ValueError(f"processes: expected one per pair ({logs.size}), found {groups.size}")
    center = float(np.median(logs))
    if np.ptp(logs) > 0:
        low, high = _cluster_bootstrap_median(logs, groups, confidence, seed)
    else:
        low = high = center
    stopped = None
    if not np.any(logs != 0):  # identical in every pair: no evidence either way
        p_slower = p_faster = 1.0
    elif plan is not None and plan.looks > 1:
        p_slower, p_faster = plan.p_values(logs)
    else:
        p_slower = float(stats.wilcoxon(logs, alternative="greater").pvalue)
        p_faster = float(stats.wilcoxon(logs, alternative="less").pvalue)
    if plan is not None and plan.looks > 1 and factor is not None:
        stopped = plan.decision(logs, factor, groups, confidence) or ALL_PAIRS
    return {
        "stopped": stopped,
        "ratio": math.exp(center),
        "ci_low": math.exp(low),
        "ci_high": math.exp(high),
        "p_slower": p_slower,
        "p_faster": p_faster,
        "pairs": int(logs.size),
        "pairs_slower": int((logs > 0).sum()),
        "baseline_p50_ms": float(np.median(base_ms)),
        "current_p50_ms": float(np.median(cur_ms)),
        "pair_ratios": [float(v) for v in np.exp(logs)],
        "process_ratios": [
            math.exp(float(np.median(logs[groups == g]))) for g in np.unique(groups)
        ],
    }


def majority_of(processes: int) -> int:
    """How many process pairs must agree: more than half."""
    return processes // 2 + 1


def is_regression(
    ratio: float, p_adjusted: float, process_ratios: Sequence[float], factor: float, alpha: float
) -> bool:
    """The rule (module docstring): beyond ``factor``, significant after the adjustment,
    and beyond ``factor`` within a majority of the process pairs too."""
    agree = sum(r > factor for r in process_ratios)
    return ratio > factor and p_adjusted < alpha and agree >= majority_of(len(process_ratios))


def judge_paired(
    order: Sequence[str],
    rounds: Sequence[Mapping[str, Sequence[float]]],
    factor: float,
    alpha: float,
    confidence: float = 0.95,
    processes: int = 1,
    looks: int = 1,
    planned_pairs: int | None = None,
) -> PairedJudgement:
    """Judge every cell of paired rounds (module docstring).

    ``order``: the side of each round (:func:`schedule`); ``rounds``: per round, the
    samples (ms) of every cell, keyed ``path/b<rows>`` (a cell decided at a look is
    absent from the rounds after it); ``processes``: process pairs, pair ``i`` timed by
    :func:`process_of_pair`. ``looks``: of the group-sequential test
    (:class:`SequentialPlan`) over ``planned_pairs`` (default: the pairs given); 1: the
    fixed-sample test.

    Returns {"verdict": "regression" | "no regression", "regressions", "improvements",
    "cells": {cell: {...}}, "pairs", "factor", "alpha", ...}.

    Raises:
        ConfigError: ``factor`` or ``alpha`` out of range, or rounds that do not match.
        InsufficientRoundsError: fewer pairs than :func:`min_pairs`.
    """
    if not factor > 1.0:
        raise ConfigError(f"bench.regression.factor: expected > 1, found {factor}")
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"bench.regression.alpha: expected 0 < alpha < 1, found {alpha}")
    if len(order) != len(rounds):
        raise ConfigError(f"paired rounds: {len(order)} sides named for {len(rounds)} rounds")
    # A cell decided early is absent from the later rounds: the cells are those of the
    # first pair.
    cells = sorted(set(rounds[0]) & set(rounds[1]) if len(rounds) > 1 else set(), key=_cell_order)
    pairs = planned_pairs if planned_pairs is not None else len(rounds) // 2
    needed = min_pairs(len(cells), alpha)
    if pairs < needed:
        raise InsufficientRoundsError(
            f"paired verdict: {pairs} pair(s) of rounds for {len(cells)} cell(s); at least "
            f"{needed} are needed (with n pairs the smallest one-sided Wilcoxon p is 2^-n, "
            f"and after Benjamini-Hochberg over {len(cells)} cell(s) it must stay below "
            f"alpha={alpha}, with a margin of two pairs): ask for --rounds {needed} or more"
        )
    if not 1 <= processes <= max(pairs, 1):
        raise ConfigError(
            f"processes: expected 1 to {pairs} (one per pair at most), found {processes}"
        )
    plan = SequentialPlan(pairs, looks, alpha, confidence) if looks > 1 else None
    judged: dict[str, PairedCell] = {}
    for c in cells:
        base, cur = pair_medians(order, rounds, c)
        by_pair = [process_of_pair(i, processes) for i in range(base.size)]
        judged[c] = paired_cell(base, cur, confidence, processes=by_pair, plan=plan, factor=factor)
    slower_q = stats.false_discovery_control([judged[c]["p_slower"] for c in cells], method="bh")
    faster_q = stats.false_discovery_control([judged[c]["p_faster"] for c in cells], method="bh")
    for c, q_slower, q_faster in zip(cells, slower_q, faster_q, strict=True):
        judged[c]["p_slower_adjusted"] = float(q_slower)
        judged[c]["p_faster_adjusted"] = float(q_faster)
    regressions, improvements = [], []
    majority = majority_of(processes)
    for c in cells:
        cell = judged[c]
        cell["processes_slower"] = sum(r > factor for r in cell["process_ratios"])
        cell["processes_faster"] = sum(r < 1.0 / factor for r in cell["process_ratios"])
        slower = is_regression(
            cell["ratio"], cell["p_slower_adjusted"], cell["process_ratios"], factor, alpha
        )
        faster = (
            cell["ratio"] < 1.0 / factor
            and cell["p_faster_adjusted"] < alpha
            and cell["processes_faster"] >= majority
        )
        cell["status"] = cell_label(cell, factor, slower, faster, alpha)
        cell["min_detectable_ratio"] = min_detectable_ratio(
            cell["ci_low"], cell["ci_high"], confidence, alpha
        )
        if slower:
            regressions.append(c)
        elif faster:
            improvements.append(c)
    return {
        "verdict": "regression" if regressions else "no regression",
        "regressions": regressions,
        "improvements": improvements,
        "cells": judged,
        "pairs": pairs,
        "pairs_taken": max((judged[c]["pairs"] for c in cells), default=0),
        "sequential": plan.describe() if plan is not None else {"looks": 1},
        "min_pairs": needed,
        "processes": processes,
        "factor": factor,
        "alpha": alpha,
        "confidence_level": confidence,
    }


def _cell_order(cell: str) -> tuple[str, int]:
    path, _, label = cell.rpartition("/")
    return (path, int(label[1:]) if label[1:].isdigit() else 0)
