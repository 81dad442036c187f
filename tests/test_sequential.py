"""Group-sequential tests (vmapcheck.bench.verdict.sequential) and the paired verdict's stopping
rules (vmapcheck.bench.verdict.pairs.SequentialPlan), on deterministic synthetic streams."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vmapcheck.bench.verdict.pairs import (
    ALL_PAIRS,
    BELOW_FACTOR,
    BEYOND_FACTOR,
    SequentialPlan,
    judge_paired,
    paired_cell,
    process_of_pair,
    schedule,
)
from vmapcheck.bench.verdict.sequential import (
    OBRIEN_FLEMING,
    POCOCK,
    Design,
    look_sizes,
    spend,
    wilcoxon_z,
)

FOUR = [0.25, 0.5, 0.75, 1.0]


def test_obrien_fleming_bounds_are_the_published_ones():
    # Lan-DeMets O'Brien-Fleming type, 4 equally spaced looks, one-sided 0.025
    # (Jennison & Turnbull; gsDesign's sfLDOF): 4.333, 2.963, 2.359, 2.014.
    bounds = Design(FOUR, 0.025, OBRIEN_FLEMING).bounds
    assert np.allclose(bounds, [4.333, 2.963, 2.359, 2.014], atol=2e-3)


@pytest.mark.parametrize("kind", [OBRIEN_FLEMING, POCOCK])
def test_one_look_is_the_fixed_sample_test(kind):
    design = Design([1.0], 0.01, kind)
    assert design.bounds[0] == pytest.approx(stats.norm.ppf(0.99), abs=1e-6)
    assert design.stagewise_p(0, 1.7) == pytest.approx(stats.norm.sf(1.7), abs=1e-9)


def test_the_spending_functions_spend_alpha_by_the_last_look():
    for kind in (OBRIEN_FLEMING, POCOCK):
        assert spend(kind, 0.01, 1.0) == pytest.approx(0.01)
        assert spend(kind, 0.01, 0.25) < spend(kind, 0.01, 0.5) < 0.01
    # O'Brien-Fleming spends almost nothing early, Pocock evenly.
    assert spend(OBRIEN_FLEMING, 0.01, 0.25) < 1e-6 < 2e-3 < spend(POCOCK, 0.01, 0.25)


@pytest.mark.parametrize("kind", [OBRIEN_FLEMING, POCOCK])
def test_looking_four_times_keeps_the_false_positive_rate(kind):
    """Brownian paths under the null (seeded): the chance of crossing at any look is
    alpha, where testing each look at the fixed level would be about 2.5 times more."""
    alpha, paths = 0.05, 40_000
    rng = np.random.default_rng(7)
    t = np.array(FOUR)
    steps = rng.normal(0.0, np.sqrt(np.diff([0.0, *t])), size=(paths, t.size))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    design = Design(FOUR, alpha, kind)
    crossed = (z >= design.bounds).any(axis=1).mean()
    naive = (z >= stats.norm.ppf(1 - alpha)).any(axis=1).mean()
    se = math.sqrt(alpha * (1 - alpha) / paths)
    assert abs(crossed - alpha) < 3 * se
    assert naive > 2 * alpha
    # The stagewise p is uniform: P(p <= u) = u, at the first crossing or the last look.
    p = np.empty(paths)
    for i in range(paths):
        hits = np.flatnonzero(z[i] >= design.bounds)
        k = int(hits[0]) if hits.size else t.size - 1
        if hits.size == 0 and z[i, k] < -1.0:  # far from any p of interest
            p[i] = 1.0
            continue
        p[i] = design.stagewise_p(k, float(z[i, k]))
    for u in (0.01, 0.02, alpha):
        assert abs((p <= u).mean() - u) < 3 * math.sqrt(u * (1 - u) / paths)


def test_the_wilcoxon_statistic_is_scipys_normal_approximation():
    values = np.random.default_rng(3).normal(0.2, 1.0, 25)
    ours = wilcoxon_z(values)
    theirs = stats.wilcoxon(values, alternative="greater", method="approx", correction=False)
    assert stats.norm.sf(ours) == pytest.approx(theirs.pvalue, rel=1e-9)
    assert wilcoxon_z(np.zeros(4)) == 0.0


def test_looks_are_equally_spaced_and_end_at_the_maximum():
    assert look_sizes(40, 4) == [10, 20, 30, 40]
    assert look_sizes(40, 1) == [40]
    assert look_sizes(14, 3) == [5, 10, 14]
    with pytest.raises(ValueError, match="looks"):
        look_sizes(3, 4)


# --- the paired verdict's plan -----------------------------------------------------------

FACTOR, ALPHA, CONFIDENCE = 1.1, 0.01, 0.95


def _logs(n: int, shift: float, sd: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(math.log(shift), sd, n)


def _groups(n: int) -> np.ndarray:
    return np.array([process_of_pair(i, 3) for i in range(n)])


def _first_decision(plan: SequentialPlan, logs: np.ndarray) -> tuple[int, str]:
    """Pairs taken and why, as the driver stops: the first look that decides, or all."""
    for n in plan.sizes[:-1]:
        why = plan.decision(logs[:n], FACTOR, _groups(n), CONFIDENCE)
        if why is not None:
            return n, why
    return plan.sizes[-1], ALL_PAIRS


def test_an_unchanged_cell_stops_below_the_factor_before_the_maximum():
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    stops = [_first_decision(plan, _logs(40, 1.0, 0.03, seed)) for seed in range(20)]
    assert all(why == BELOW_FACTOR for _, why in stops)
    assert max(n for n, _ in stops) <= 20


def test_a_large_slowdown_stops_beyond_the_factor_and_is_a_regression():
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    n, why = _first_decision(plan, _logs(40, 1.4, 0.03, seed=1))
    assert why == BEYOND_FACTOR and n < 40
    p_slower, p_faster = plan.p_values(_logs(40, 1.4, 0.03, seed=1)[:n])
    assert p_slower < ALPHA < p_faster


def test_a_slowdown_at_the_factor_is_never_decided_early():
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    stops = [_first_decision(plan, _logs(40, FACTOR, 0.05, seed)) for seed in range(20)]
    assert sum(why != ALL_PAIRS for _, why in stops) <= 2


def test_the_sequential_test_keeps_its_false_alarms_and_its_power():
    """Synthetic pair streams (seeded, 40 pairs, 4 looks), each judged as the driver
    stops it: without a slowdown, significant in about alpha of them (no more); with a
    slowdown of 1.2x, a regression (significant and beyond the factor) about as often as
    by the fixed-sample test of all 40 pairs."""
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    runs = 1000

    def regression(shift: float, seed: int, sequential: bool, sd: float = 0.08) -> bool:
        logs = _logs(40, shift, sd, seed)
        if sequential:
            logs = logs[: _first_decision(plan, logs)[0]]
            p = plan.p_values(logs)[0]
        else:
            p = stats.wilcoxon(logs, alternative="greater").pvalue
        return p < ALPHA and math.exp(np.median(logs)) > (1.0 if shift == 1.0 else FACTOR)

    null = sum(regression(1.0, s, True) for s in range(runs)) / runs
    assert null < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs)
    found = sum(regression(1.2, s, True, sd=0.3) for s in range(300))
    fixed = sum(regression(1.2, s, False, sd=0.3) for s in range(300))
    assert found >= fixed - 0.05 * 300


def test_a_slowdown_below_the_factor_does_not_stop_as_no_difference():
    """A 7% slowdown stops only once its interval is wholly above 1, so that it reads
    `slower (below the factor)`, or runs every pair."""
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    for seed in range(20):
        logs = _logs(40, 1.07, 0.03, seed)
        n, why = _first_decision(plan, logs)
        if why == BELOW_FACTOR:
            base = np.ones(n)
            cell = paired_cell(base, np.exp(logs[:n]), CONFIDENCE, processes=_groups(n))
            assert cell["ci_low"] > 1.0 and cell["ci_high"] < FACTOR


def test_judge_paired_with_looks_records_each_cells_pairs_and_why():
    """Rounds as the driver leaves them: a cell decided at a look is absent from the
    rounds after it. Each cell is judged on its own pairs, with the stagewise p."""
    rng = np.random.default_rng(11)
    rounds, plan = 40, SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    order = schedule(rounds)
    slow = {"direct_jit/b256": 1.4, "vmap_jit/b256": 1.0}
    ends = {"direct_jit/b256": 20, "vmap_jit/b256": 10}
    taken = []
    for i, side in enumerate(order):
        pair = i // 2
        if pair >= max(ends.values()):
            break
        if i % 2 == 0:
            load = float(np.exp(rng.uniform(0, np.log(1.5))))
        taken.append(
            {
                cell: list(
                    0.1
                    * load
                    * (factor if side == "current" else 1.0)
                    * np.exp(rng.normal(0, 0.01, 5))
                )
                for cell, factor in slow.items()
                if pair < ends[cell]
            }
        )
    result = judge_paired(
        order[: len(taken)],
        taken,
        FACTOR,
        ALPHA,
        CONFIDENCE,
        processes=3,
        looks=4,
        planned_pairs=rounds,
    )
    cells = result["cells"]
    assert cells["direct_jit/b256"]["pairs"] == 20 and cells["vmap_jit/b256"]["pairs"] == 10
    assert cells["direct_jit/b256"]["stopped"] == BEYOND_FACTOR
    assert cells["direct_jit/b256"]["status"] == "regression"
    assert cells["vmap_jit/b256"]["stopped"] == BELOW_FACTOR
    assert cells["vmap_jit/b256"]["status"] == "no measurable difference"
    assert result["pairs"] == 40 and result["pairs_taken"] == 20
    assert result["sequential"]["pairs_at_looks"] == plan.sizes


def test_a_cell_that_took_every_pair_reads_all_pairs_not_a_stop():
    """The last look ends every cell: a cell judged on all its pairs says so, even where
    its pairs would have stopped it at an earlier look (it was not stopped early)."""
    plan = SequentialPlan(40, 4, ALPHA, CONFIDENCE)
    logs = _logs(40, 1.0, 0.03, seed=0)
    assert _first_decision(plan, logs)[1] == BELOW_FACTOR
    assert plan.decision(logs, FACTOR, _groups(40), CONFIDENCE) is None
    cell = paired_cell(
        np.ones(40), np.exp(logs), CONFIDENCE, processes=_groups(40), plan=plan, factor=FACTOR
    )
    assert cell["stopped"] == ALL_PAIRS and cell["pairs"] == 40
