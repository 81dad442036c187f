"""What a compared cell is called, in both verdicts (:mod:`vmapcheck.bench.verdict.regression`,
:mod:`vmapcheck.bench.verdict.pairs`), and the smallest slowdown its own spread could show.

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

:func:`verdict_headline` is the one sentence a verdict is said in (the console table's
title, the HTML report's benchmark card, the MLflow run's description): the verdict word,
then every size where a direction was found, so that a change slower at small batches and
faster at a large one is never headlined by one word alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

REGRESSION = "regression"
FASTER = "faster"
SLOWER = "slower (below the factor)"
UNDERPOWERED = "underpowered"
NO_DIFFERENCE = "no measurable difference"
# The verdict (not a cell label) of a run whose regressions the noise or the control withheld.
INCONCLUSIVE = "inconclusive"
LABELS = (REGRESSION, SLOWER, UNDERPOWERED, NO_DIFFERENCE, FASTER)
# How each label is shown in a terminal table (rich styles).
STYLES = {REGRESSION: "bold red", SLOWER: "yellow", UNDERPOWERED: "dim", FASTER: "green"}
# The power the minimum detectable ratio is stated for.
POWER = 0.8


def cell_label(
    cell: Mapping[str, Any], factor: float, regression: bool, improvement: bool, alpha: float
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
    # Imported here: scipy.stats takes over a second to import, and the track stage and
    # the HTML report import this module for the headline alone.
    from scipy import stats

    z = stats.norm.ppf(0.5 + confidence / 2)
    se = (math.log(ci_high) - math.log(ci_low)) / (2 * z)
    return math.exp((stats.norm.ppf(1 - alpha) + stats.norm.ppf(POWER)) * se)


# Where the headline names the sizes of each label after the verdict word, in this order
# (regression leads, as the verdict's own word). Underpowered and no measurable difference
# are not directions: the table names them.
HEADLINE_LABELS = (REGRESSION, FASTER, SLOWER)


def cell_columns(cell: Mapping[str, Any]) -> list[str]:
    """A compared cell's figures as the verdict tables print them: baseline and current
    p50 (ms), the ratio and its interval, the adjusted p (slower) and the smallest ratio
    the cell could have detected."""
    return [
        f"{cell['baseline_p50_ms']:.4g}",
        f"{cell['current_p50_ms']:.4g}",
        f"{cell['ratio']:.3f}",
        f"[{cell['ci_low']:.3f}, {cell['ci_high']:.3f}]",
        f"{cell['p_slower_adjusted']:.2g}",
        f"{cell['min_detectable_ratio']:.2f}x",
    ]


def _cells(result: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(path, batch label, cell)`` of a verdict's cells, in its order: nested
    ``{path: {label: cell}}`` (:func:`vmapcheck.bench.verdict.regression.compare`) or flat
    ``{"path/label": cell}`` (the paired verdict, :mod:`vmapcheck.bench.verdict.pairs`)."""
    for name, value in (result.get("cells") or {}).items():
        if "status" in value:
            path, _, label = name.rpartition("/")
            yield path, label, value
        else:
            for label, cell in value.items():
                yield name, label, cell


def _rows(label: str) -> int | None:
    digits = label.lstrip("b")
    return int(digits) if digits.isdigit() else None


# The most paths a headline names at one size; beyond it, their count (the table names
# every cell).
NAMED_PATHS = 3


def _sizes_text(places: dict[int, list[str]], paths_at: dict[int, set[str]]) -> str:
    """``256 and 1,024 rows``; where only some of a size's paths got the label, each size
    is said with its rows and those paths: ``256 rows and 1,024 rows in direct_jit``
    (``in 5 of 11 paths`` beyond :data:`NAMED_PATHS`)."""
    sizes = sorted(places)
    partial = {rows for rows in sizes if set(places[rows]) != paths_at[rows]}
    if not partial:
        return f"{_joined([f'{rows:,}' for rows in sizes])} {_rows_word(sizes[-1])}"
    items = []
    for rows in sizes:
        text = f"{rows:,} {_rows_word(rows)}"
        named = places[rows]
        if rows in partial:
            which = (
                ", ".join(named)
                if len(named) <= NAMED_PATHS
                else f"{len(named)} of {len(paths_at[rows])} paths"
            )
            text += f" in {which}"
        items.append(text)
    return _joined(items)


def _rows_word(rows: int) -> str:
    return "row" if rows == 1 else "rows"


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def verdict_headline(result: Mapping[str, Any]) -> str:
    """The verdict in one sentence: its word (``REGRESSION``, ``NO REGRESSION``,
    ``INCONCLUSIVE``, ...), then where each direction was found, by batch size:
    ``REGRESSION at 256 and 1,024 rows; faster at 4,096 rows``. An inconclusive verdict
    says why (its ``reasons``) and where its regressions were found and withheld.
    ``result``: a verdict of :func:`vmapcheck.bench.verdict.regression.compare` or the
    paired verdict (cells labelled by :func:`cell_label`), or one without cells (``not
    compared``, ``bench not rerun``, ...): its word alone (its ``why`` is said beside it)."""
    verdict = str(result["verdict"])
    places: dict[str, dict[int, list[str]]] = {label: {} for label in HEADLINE_LABELS}
    paths_at: dict[int, set[str]] = {}
    for path, label, cell in _cells(result):
        rows = _rows(label)
        if rows is None:
            continue
        paths_at.setdefault(rows, set()).add(path)
        if cell.get("status") in places:
            places[cell["status"]].setdefault(rows, []).append(path)
    word = verdict.upper()
    if verdict == INCONCLUSIVE and result.get("reasons"):
        word += f" ({'; '.join(result['reasons'])})"
    parts = []
    for label in HEADLINE_LABELS:
        found = places[label]
        if not found:
            continue
        sizes = _sizes_text(found, paths_at)
        if label != REGRESSION:
            parts.append(f"{label} at {sizes}")
        elif verdict == REGRESSION:
            parts.append(f"{word} at {sizes}")
        else:  # inconclusive: the regressions found, withheld for its reasons
            parts.append(f"{word}: slower beyond the factor at {sizes}, withheld")
    if not parts or not parts[0].startswith(word):
        parts.insert(0, word)
    return "; ".join(parts)
