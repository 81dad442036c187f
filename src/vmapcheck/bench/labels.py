"""What a compared cell is called, in both verdicts (:mod:`vmapcheck.bench.verdict`,
:mod:`vmapcheck.bench.pairs`), and the smallest slowdown its own spread could show.

The regression rule (ratio beyond the factor, significant after the adjustment over
cells) decides what fails a build. The other labels say what the interval of the ratio
measured, so that an effect below the factor is not called "no change":

- ``regression``: the rule;
- ``faster``: the mirror rule (an improvement), or an interval wholly below 1 whose
  direction is significant after the same adjustment (``p_faster_adjusted < alpha``);
- ``slower (below the factor)``: an interval wholly above 1 and wholly under the factor,
  its direction significant after the adjustment (``p_slower_adjusted < alpha``): a real
  slowdown, smaller than what fails a build;
- ``underpowered``: none of the above, and the interval reaches the factor: this run
  cannot rule out a slowdown the size of the factor (a noisy cell, or a ratio beyond the
  factor that the test does not find significant);
- ``no measurable difference``: none of the above, the interval under the factor.

A direction label without the adjusted significance was a false alarm in A/A runs (6 of
36 cells labelled ``faster`` or ``slower`` at adjusted p 0.027-0.19, 2026-12-06).
"""

from __future__ import annotations

import math
from typing import Any

from scipy import stats

REGRESSION = "regression"
FASTER = "faster"
SLOWER = "slower (below the factor)"
UNDERPOWERED = "underpowered"
NO_DIFFERENCE = "no measurable difference"
LABELS = (REGRESSION, SLOWER, UNDERPOWERED, NO_DIFFERENCE, FASTER)
# How each label is shown in a terminal table (rich styles).
STYLES = {REGRESSION: "bold red", SLOWER: "yellow", UNDERPOWERED: "dim", FASTER: "green"}
# The power the minimum detectable ratio is stated for.
POWER = 0.8


def cell_label(
    cell: dict[str, Any], factor: float, regression: bool, improvement: bool, alpha: float
) -> str:
    """The label of a compared cell (module docstring): ``cell`` holds its ``ratio``,
    ``ci_low``, ``ci_high``, ``p_slower_adjusted`` and ``p_faster_adjusted``;
    ``regression`` / ``improvement``: whether the verdict's rule found one; ``alpha``:
    the level both directions are judged at."""
    if regression:
        return REGRESSION
    if improvement or (cell["ci_high"] < 1.0 and cell["p_faster_adjusted"] < alpha):
        return FASTER
    if cell["ci_low"] > 1.0 and cell["ci_high"] < factor and cell["p_slower_adjusted"] < alpha:
        return SLOWER
    if cell["ci_high"] >= factor:
        return UNDERPOWERED
    return NO_DIFFERENCE


def min_detectable_ratio(ci_low: float, ci_high: float, confidence: float, alpha: float) -> float:
    """The smallest slowdown (a ratio) that this cell's own spread would show as
    significant at ``alpha`` (one-sided, before the adjustment over cells) with
    probability :data:`POWER`: the interval's width on the log scale gives the ratio's
    standard error, ``se = (ln high - ln low) / (2 z)``, and the ratio is
    ``exp((z_(1-alpha) + z_power) * se)``. A normal approximation, for reading a table:
    the verdict itself never uses it."""
    z = stats.norm.ppf(0.5 + confidence / 2)
    se = (math.log(ci_high) - math.log(ci_low)) / (2 * z)
    return math.exp((stats.norm.ppf(1 - alpha) + stats.norm.ppf(POWER)) * se)
