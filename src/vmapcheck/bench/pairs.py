"""The paired verdict's statistics: the pairs' schedule, each cell judged on its paired
ratios, and the rule that makes a regression (:mod:`vmapcheck.bench.paired` runs the
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
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from vmapcheck.bench.labels import cell_label, min_detectable_ratio
from vmapcheck.errors import ConfigError

BASELINE, CURRENT = "baseline", "current"


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


def pair_medians(
    order: Sequence[str], rounds: Sequence[dict[str, Sequence[float]]], cell: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair of adjacent rounds (``order[2i]``, ``order[2i+1]``: one of each side),
    the baseline's and the current round's median of ``cell``: two arrays (pairs,)."""
    base, cur = [], []
    for i in range(0, len(order) - 1, 2):
        first, second = order[i], order[i + 1]
        if {first, second} != {BASELINE, CURRENT}:
            raise ValueError(f"rounds {i} and {i + 1} are not one of each side: {first}, {second}")
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
) -> dict[str, Any]:
    """One cell judged from its pairs of round medians (ms; shape (pairs,) each, pair
    ``i`` taken in adjacent rounds by process pair ``processes[i]``, default all 0): ratio,
    bootstrap CI, one-sided Wilcoxon p-values, and the ratio within each process pair."""
    logs = np.log(np.asarray(cur_ms, float) / np.asarray(base_ms, float))
    groups = np.zeros(logs.size, int) if processes is None else np.asarray(processes, int)
    if groups.shape != logs.shape:
        raise ValueError(f"processes: expected one per pair ({logs.size}), found {groups.size}")
    center = float(np.median(logs))
    if np.ptp(logs) > 0:
        low, high = _cluster_bootstrap_median(logs, groups, confidence, seed)
    else:
        low = high = center
    if np.any(logs != 0):
        p_slower = float(stats.wilcoxon(logs, alternative="greater").pvalue)
        p_faster = float(stats.wilcoxon(logs, alternative="less").pvalue)
    else:  # identical in every pair: no evidence either way
        p_slower = p_faster = 1.0
    return {
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
    rounds: Sequence[dict[str, Sequence[float]]],
    factor: float,
    alpha: float,
    confidence: float = 0.95,
    processes: int = 1,
) -> dict[str, Any]:
    """Judge every cell of paired rounds (module docstring).

    ``order``: the side of each round (:func:`schedule`); ``rounds``: per round, the
    samples (ms) of every cell, keyed ``path/b<rows>``; ``processes``: process pairs, pair
    ``i`` timed by :func:`process_of_pair`.

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
    cells = sorted(
        set.intersection(*(set(r) for r in rounds)) if rounds else set(), key=_cell_order
    )
    pairs = len(rounds) // 2
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
    by_pair = [process_of_pair(i, processes) for i in range(pairs)]
    judged = {
        c: paired_cell(*pair_medians(order, rounds, c), confidence, processes=by_pair)
        for c in cells
    }
    for direction in ("p_slower", "p_faster"):
        adjusted = stats.false_discovery_control([judged[c][direction] for c in cells], method="bh")
        for c, q in zip(cells, adjusted, strict=True):
            judged[c][f"{direction}_adjusted"] = float(q)
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
        cell["status"] = cell_label(cell, factor, slower, faster)
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
        "min_pairs": needed,
        "processes": processes,
        "factor": factor,
        "alpha": alpha,
        "confidence_level": confidence,
    }


def _cell_order(cell: str) -> tuple[str, int]:
    path, _, label = cell.rpartition("/")
    return (path, int(label[1:]) if label[1:].isdigit() else 0)
