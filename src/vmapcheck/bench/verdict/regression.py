"""Regression verdict: is a benchmark slower than its baseline, beyond this machine's noise?

For every path and batch size present in both runs (``samples_ms`` of
``bench_details.json``: per-call latencies in milliseconds, in the order they were
taken):

- ``ratio``: median(current) / median(baseline); above 1 is slower;
- the unit of the statistics is a **block** of consecutive samples (each run's samples
  cut into ``BLOCKS`` contiguous blocks: the bench stage's rounds, spread over the run),
  not a single sample. Samples taken a few
  milliseconds apart are not independent on a shared machine: a spell of interference
  slows a whole stretch of them, and a per-sample test reads that as a highly
  significant shift (measured here: two back-to-back runs of the same code had cells
  16-35% apart with p < 0.005). A slowdown of the code shifts every block;
- ``ci_low``/``ci_high``: a bootstrap confidence interval of that ratio, resampling
  whole blocks of each run (cluster bootstrap, percentile method, fixed seed);
- ``p_slower``/``p_faster``: one-sided Mann-Whitney U tests on the block medians (is the
  current run's latency stochastically larger / smaller?), then adjusted over all cells
  of the comparison with Benjamini-Hochberg, since one comparison tests a dozen cells
  or more. With 10 blocks a side the smallest p is 5.4e-6.
- optionally (``compare(normalize_rounds=True)``, off: docs/benchmark.md
  has its measured effect) each block is first divided by its round's slowdown common
  to all cells (:func:`round_index`).

A cell is a **regression** only when the slowdown is both significant (adjusted
``p_slower < alpha``) and larger than ``factor`` (``ratio > factor``), asv's rule: a
shared machine makes tiny shifts between two processes significant, and the factor is
what keeps those from being reported. An **improvement** is the mirror image
(``ratio < 1 / factor``). docs/benchmark.md gives this detector's measured false-alarm and
detection rates on this machine (``benchmarks/validate_verdict.py``).

Before any cell is compared, the two runs' context is (:data:`CONTEXT`). Runs that differ
in a key that changes what a latency means (bench profile and its timing settings, CPU
model and cores, backend, device, dtype, matmul precision; JAX and jaxlib versions or the
model too when the caller asks with ``require_same``) are **not comparable**: nothing is
compared and every such key is named ("not comparable: bench profiles differ (quick vs
full)"). A model or JAX change is otherwise what the verdict is for: it is compared and
noted.

The control (:func:`judge_control`) is the same matmul, of the same size and dtype, timed
in every round of both runs; a control of another size or dtype is not compared (the
verdict says why). Only a significant slowdown of the machine beyond the factor withholds
a regression (``inconclusive``); a faster machine never does.

The baseline is a ``bench_details.json`` file, an MLflow run id, or ``last-verified``:
the newest complete run in the store that passed its checks with the same model, backend
and precision (and, from ``vmapcheck verdict``, bench profile), other than the run being
judged. A run is read only when complete (vmapcheck.tracking.store.COMPLETE_FILTER: a
``track`` that was killed leaves an incomplete one); the store is read by
:mod:`vmapcheck.tracking.baselines`, which hands the records down here.
``vmapcheck verdict --baseline ...`` (``make verdict``) prints the table
(:func:`report_verdict`) and exits 1 on a regression (0 for "no regression",
"inconclusive" and "not comparable"). Judging the reports on disk, the run that logged
them (:func:`vmapcheck.tracking.baselines.run_of_reports`) is never their baseline; when
``last-verified`` finds no other run it says so and exits 0.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy import stats

from vmapcheck.bench.verdict.baseline import CONTEXT, CONTEXT_KEYS, BenchRecord
from vmapcheck.bench.verdict.labels import (
    STYLES,
    cell_columns,
    cell_label,
    min_detectable_ratio,
    verdict_headline,
)
from vmapcheck.bench.verdict.records import (
    CellComparison,
    ControlVerdict,
    PerfVerdict,
    RoundsCompared,
    VerdictHead,
)
from vmapcheck.errors import ConfigError
from vmapcheck.io import atomic_write_json

NOT_COMPARABLE = "not comparable"
# Blocks of consecutive samples per run and cell: the statistics' unit (module docstring).
BLOCKS = 10


def blocks_of(
    samples: np.ndarray, blocks: int = BLOCKS, sizes: list[int] | None = None
) -> list[np.ndarray]:
    """``samples`` (1-D, in time order) cut into its rounds: ``sizes`` (samples per
    round, as the bench stage records them: a cell stopped early has fewer rounds) when
    given and ``blocks`` is the rounds' :data:`BLOCKS`; else ``min(blocks, len)``
    contiguous near-equal blocks (an older record: 10 rounds of repeats/10 samples; or
    another unit asked for, e.g. single samples)."""
    if sizes is not None and blocks == BLOCKS:
        return np.split(samples, np.cumsum(sizes)[:-1])
    return np.array_split(samples, min(blocks, samples.size))


def smallest_p(blocks_baseline: int, blocks_current: int) -> float:
    """The smallest one-sided exact Mann-Whitney p of ``blocks_baseline`` against
    ``blocks_current`` round medians (every current round beyond every baseline one):
    ``1 / C(n1 + n2, n1)``; 5.4e-6 at 10 a side, 2.9e-4 at 7."""
    return 1.0 / math.comb(blocks_baseline + blocks_current, blocks_baseline)


def _cluster_bootstrap_medians(
    groups: list[np.ndarray], n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Median of the pooled samples of ``len(groups)`` blocks drawn with replacement, for
    each of ``n_resamples`` resamples: shape (n_resamples,)."""
    picks = rng.integers(0, len(groups), size=(n_resamples, len(groups)))
    # Blocks as rows of one matrix, short ones padded with NaN: one vectorized median.
    width = max(g.size for g in groups)
    matrix = np.full((len(groups), width), np.nan)
    for row, group in enumerate(groups):
        matrix[row, : group.size] = group
    pooled = matrix[picks].reshape(n_resamples, -1)
    if all(g.size == width for g in groups):
        return np.median(pooled, axis=1)
    return np.nanmedian(pooled, axis=1)


def round_index(record: BenchRecord, blocks: int = BLOCKS) -> np.ndarray | None:
    """How slow each round of a run was, across all its cells: shape (blocks,).

    For every cell, each block's median over the cell's median; then, per block, the
    median of that over all cells. The bench times every cell in every round, so a spell
    of interference from another tenant slows every cell of the rounds it falls in (seen
    here: single rounds 1.2-2x slower in every cell), while a change of the code moves a
    cell in all rounds alike and leaves its own ratios near 1. Dividing each block by its
    round's factor takes the spell out before the test. None when the run has fewer than
    3 cells or a cell has fewer than ``blocks`` samples (nothing to take the median of).
    """
    rows = [
        [np.median(b) / np.median(v) for b in blocks_of(v, blocks, record.rounds_of(path, label))]
        for path, by_batch in record.samples_ms.items()
        for label, v in by_batch.items()
    ]
    # A cell stopped early (fewer rounds) says nothing of the rounds it missed.
    rows = [r for r in rows if len(r) == blocks]
    if len(rows) < 3:
        return None
    return np.median(np.array(rows), axis=0)


def compare_cell(
    baseline: np.ndarray,
    current: np.ndarray,
    confidence: float = 0.95,
    seed: int = 0,
    blocks: int = BLOCKS,
    base_rounds: np.ndarray | None = None,
    cur_rounds: np.ndarray | None = None,
    base_sizes: list[int] | None = None,
    cur_sizes: list[int] | None = None,
) -> CellComparison:
    """Ratio of medians (current / baseline) with its cluster-bootstrap CI and one-sided
    Mann-Whitney p-values on block medians (module docstring).

    ``baseline``, ``current``: per-call latencies (ms) of one cell, in time order.
    ``base_rounds``, ``cur_rounds``: each run's :func:`round_index` (one factor per
    block), or None; when given, every block's samples are divided by its round's factor
    before the statistics (``raw_ratio`` keeps the undivided ratio of medians).
    ``base_sizes``, ``cur_sizes``: samples per round as recorded (:func:`blocks_of`); the
    two runs may have different numbers of rounds (early stopping), the test takes that.
    """
    base_blocks = blocks_of(baseline, blocks, base_sizes)
    cur_blocks = blocks_of(current, blocks, cur_sizes)
    if base_rounds is not None and len(base_rounds) == len(base_blocks):
        base_blocks = [b / f for b, f in zip(base_blocks, base_rounds, strict=True)]
    if cur_rounds is not None and len(cur_rounds) == len(cur_blocks):
        cur_blocks = [b / f for b, f in zip(cur_blocks, cur_rounds, strict=True)]
    base_medians = np.array([np.median(b) for b in base_blocks])
    cur_medians = np.array([np.median(b) for b in cur_blocks])
    rng = np.random.default_rng(seed)
    n_resamples = 2000
    ratios = _cluster_bootstrap_medians(cur_blocks, n_resamples, rng) / (
        _cluster_bootstrap_medians(base_blocks, n_resamples, rng)
    )
    tail = (1.0 - confidence) / 2.0
    ci_low, ci_high = np.quantile(ratios, [tail, 1.0 - tail])
    # Exact null distribution at these sizes (the normal approximation overstates the
    # smallest p 17-fold at 10 a side); it assumes no ties, so ties use the approximation.
    tied = np.unique(np.concatenate([base_medians, cur_medians])).size < (
        base_medians.size + cur_medians.size
    )
    small = max(base_medians.size, cur_medians.size) <= 20
    method = "exact" if small and not tied else "asymptotic"
    return {
        "ratio": float(
            np.median(np.concatenate(cur_blocks)) / np.median(np.concatenate(base_blocks))
        ),
        "raw_ratio": float(np.median(current) / np.median(baseline)),
        "ci_low": float(ci_low),
        "ci_high": float(ci_high),
        "p_slower": float(
            stats.mannwhitneyu(
                cur_medians, base_medians, alternative="greater", method=method
            ).pvalue
        ),
        "p_faster": float(
            stats.mannwhitneyu(cur_medians, base_medians, alternative="less", method=method).pvalue
        ),
        "n_baseline": int(baseline.size),
        "n_current": int(current.size),
        "blocks_baseline": len(base_blocks),
        "blocks_current": len(cur_blocks),
        "baseline_p50_ms": float(np.median(baseline)),
        "current_p50_ms": float(np.median(current)),
    }


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def comparability(
    baseline: BenchRecord, current: BenchRecord, require_same: Iterable[str] = ()
) -> tuple[list[str], dict[str, list[Any]]]:
    """Why the two runs cannot be compared (empty: they can), and every context key in
    which they differ (``{key: [baseline, current]}``, :data:`CONTEXT`'s order).

    A required key (or one in ``require_same``) that differs makes them not comparable:
    "bench profiles differ (quick vs full)". A required key not recorded on one side (a
    bench_details.json older than the key) is only noted; one the caller asked for with
    ``require_same`` must be recorded on both sides.

    Raises:
        ConfigError: ``require_same`` names a key that is not in :data:`CONTEXT`.
    """
    asked = set(require_same)
    unknown = sorted(asked - set(CONTEXT_KEYS))
    if unknown:
        raise ConfigError(
            f"require_same: unknown context key(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(CONTEXT_KEYS)}"
        )
    reasons: list[str] = []
    differences: dict[str, list[Any]] = {}
    for key in CONTEXT:
        base, cur = baseline.context.get(key.name), current.context.get(key.name)
        if base == cur:
            continue
        differences[key.name] = [base, cur]
        if base is None or cur is None:
            if key.name in asked:
                side = "baseline" if base is None else "current run"
                reasons.append(f"{key.plural} not recorded in the {side}")
        elif key.required or key.name in asked:
            reasons.append(f"{key.plural} differ ({_shown(base)} vs {_shown(cur)})")
    return reasons, differences


def judge_control(
    baseline: BenchRecord,
    current: BenchRecord,
    factor: float,
    alpha: float,
    confidence: float = 0.95,
    blocks: int = BLOCKS,
) -> ControlVerdict:
    """Did the machine itself get slower between the runs? From the control: the same
    matmul timed in every round of both runs, compared only like with like.

    Returns ``{"compared", "why", "size", "dtype", "ratio", "ci_low", "ci_high",
    "p_slower", "slower"}``. ``compared`` is False, and ``why`` says why, when the two
    controls differ in size or dtype (a 512^3 and a 1024^3 matmul do not time the same
    machine alike) or one run has none. ``ratio``: median(current) / median(baseline),
    above 1 when the current machine was slower, with its block-bootstrap CI and one-sided
    p (:func:`compare_cell`); runs from before the control was timed in rounds have one
    throughput figure each, their ratio only. ``slower``: the ratio is beyond ``factor``
    AND significant (``p_slower < alpha``), asv's rule applied to the machine; a faster
    machine is never ``slower``.
    """
    sizes = [baseline.control_size, current.control_size]
    dtypes = [baseline.control_dtype, current.control_dtype]
    out: ControlVerdict = {
        "compared": False,
        "why": None,
        "size": sizes,
        "dtype": dtypes,
        "ratio": None,
        "ci_low": None,
        "ci_high": None,
        "p_slower": None,
        "slower": False,
    }
    timed = [r.control_ms is not None or r.peak_gflops is not None for r in (baseline, current)]
    if not all(timed):
        side = "baseline" if not timed[0] else "current run"
        out["why"] = f"no control matmul in the {side}"
    elif None in sizes:
        side = "baseline" if sizes[0] is None else "current run"
        out["why"] = f"the control's matmul size is not recorded in the {side}"
    elif sizes[0] != sizes[1]:
        out["why"] = f"matmul sizes differ ({sizes[0]}^3 vs {sizes[1]}^3)"
    elif dtypes[0] != dtypes[1]:
        out["why"] = f"matmul dtypes differ ({dtypes[0]} vs {dtypes[1]})"
    if out["why"] is not None:
        return out
    out["compared"] = True
    base_ms, cur_ms = baseline.control_ms, current.control_ms
    if base_ms is not None and cur_ms is not None and min(base_ms.size, cur_ms.size) >= 2:
        cell = compare_cell(base_ms, cur_ms, confidence, blocks=blocks)
        out["ratio"], out["ci_low"] = cell["ratio"], cell["ci_low"]
        out["ci_high"], out["p_slower"] = cell["ci_high"], cell["p_slower"]
        out["slower"] = cell["ratio"] > factor and cell["p_slower"] < alpha
    elif baseline.peak_gflops and current.peak_gflops:
        # One throughput figure a run (runs from before the rounds): no test is possible.
        ratio = baseline.peak_gflops / current.peak_gflops
        out["ratio"] = ratio
        out["slower"] = ratio > factor
    else:
        out["compared"], out["why"] = False, "a run has control samples, the other one figure"
    return out


def compare(
    baseline: BenchRecord,
    current: BenchRecord,
    factor: float,
    alpha: float,
    confidence: float = 0.95,
    blocks: int = BLOCKS,
    normalize_rounds: bool = False,
    require_same: Iterable[str] = (),
) -> PerfVerdict:
    """Judge every path and batch size the two runs share; see the module docstring.

    ``blocks``: blocks per cell (a number above the sample count tests single samples,
    the per-sample test this tool used before; benchmarks/validate_verdict.py compares).
    ``require_same``: optional context keys (:data:`OPTIONAL_KEYS`, e.g. the JAX and
    jaxlib versions) the caller wants equal too.

    Runs that differ in a required context key (:func:`comparability`) are ``not
    comparable``: no cell is compared, ``reasons`` names every such key. A run with
    regressions is judged ``inconclusive`` instead when either run was noisy (load above
    the core count) or the machine itself got slower beyond the factor
    (:func:`judge_control`; ``machine_slowdown``: the control's ratio, > 1 when the
    current run's machine was slower); ``reasons`` says which.

    Returns {"verdict": "regression" | "no regression" | "inconclusive" | "not
    comparable", "reasons": [...], "comparable", "regressions": ["path/b<batch>"],
    "improvements": [...], "cells": {path: {label: {...}}} (absent when not comparable),
    "only_in_baseline", "only_in_current", "differences": {key: [baseline, current]},
    "noisy", "control", "machine_slowdown", "machine_slower", ...}.
    """
    if not factor > 1.0:
        raise ConfigError(f"bench.regression.factor: expected > 1, found {factor}")
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"bench.regression.alpha: expected 0 < alpha < 1, found {alpha}")
    not_comparable, differences = comparability(baseline, current, require_same)
    head: VerdictHead = {
        "baseline": {"source": baseline.source, **baseline.context, "noisy": baseline.noisy},
        "current": {"source": current.source, **current.context, "noisy": current.noisy},
        "factor": factor,
        "alpha": alpha,
        "confidence_level": confidence,
        "differences": differences,
        "required_same": [k.name for k in CONTEXT if k.required or k.name in set(require_same)],
    }
    if not_comparable:
        return {
            "verdict": NOT_COMPARABLE,
            "comparable": False,
            "reasons": not_comparable,
            "why": f"{NOT_COMPARABLE}: {'; '.join(not_comparable)}",
            **head,
            "regressions": [],
            "improvements": [],
            "machine_slowdown": None,
        }
    base_rounds = round_index(baseline, blocks) if normalize_rounds else None
    cur_rounds = round_index(current, blocks) if normalize_rounds else None
    cells, keys, only_base, only_cur = _compare_cells(
        baseline, current, confidence, blocks, base_rounds, cur_rounds
    )
    _adjust_over_cells(cells, keys)
    regressions, improvements = _label_cells(cells, keys, factor, alpha, confidence)
    rounds = _rounds_compared(cells, keys)
    # The control. Only a machine that got slower can explain a slowdown of the cells;
    # a faster one cannot hide one (a regression found on a faster machine is, if
    # anything, understated), so it withholds nothing.
    control = judge_control(baseline, current, factor, alpha, confidence, blocks)
    noisy = baseline.noisy or current.noisy
    reasons = _withholding_reasons(baseline, current, control)
    if not regressions:
        verdict = "no regression"
    elif reasons:
        verdict = "inconclusive"
    else:
        verdict = "regression"
    return {
        "verdict": verdict,
        "comparable": True,
        "reasons": reasons if verdict == "inconclusive" else [],
        **head,
        "regressions": regressions,
        "improvements": improvements,
        "cells": cells,
        "only_in_baseline": only_base,
        "only_in_current": only_cur,
        "rounds": rounds,
        "noisy": noisy,
        "control": control,
        "machine_slowdown": control["ratio"] if control["compared"] else None,
        "machine_slower": control["slower"],
        "round_index": {
            "baseline": None if base_rounds is None else base_rounds.tolist(),
            "current": None if cur_rounds is None else cur_rounds.tolist(),
        },
    }


def _compare_cells(
    baseline: BenchRecord,
    current: BenchRecord,
    confidence: float,
    blocks: int,
    base_rounds: np.ndarray | None,
    cur_rounds: np.ndarray | None,
) -> tuple[dict[str, dict[str, CellComparison]], list[tuple[str, str]], list[str], list[str]]:
    """Every cell (path, ``b<batch>`` label) both runs have, compared
    (:func:`compare_cell`; ``base_rounds``/``cur_rounds``: :func:`round_index`, or None).
    Returns ``cells[path][label]``, the cells' keys in order (paths sorted, batch sizes
    ascending), and the ``path/label`` of the cells only the baseline or only the current
    run has."""
    cells: dict[str, dict[str, CellComparison]] = {}
    keys: list[tuple[str, str]] = []
    only_base, only_cur = [], []
    for path in sorted(set(baseline.samples_ms) | set(current.samples_ms)):
        base_batches = baseline.samples_ms.get(path, {})
        cur_batches = current.samples_ms.get(path, {})
        for label in sorted(set(base_batches) | set(cur_batches), key=_batch_order):
            if label not in cur_batches:
                only_base.append(f"{path}/{label}")
            elif label not in base_batches:
                only_cur.append(f"{path}/{label}")
            else:
                cell = compare_cell(
                    base_batches[label],
                    cur_batches[label],
                    confidence,
                    blocks=blocks,
                    base_rounds=base_rounds,
                    cur_rounds=cur_rounds,
                    base_sizes=baseline.rounds_of(path, label),
                    cur_sizes=current.rounds_of(path, label),
                )
                cells.setdefault(path, {})[label] = cell
                keys.append((path, label))
    return cells, keys, only_base, only_cur


def _adjust_over_cells(
    cells: dict[str, dict[str, CellComparison]], keys: list[tuple[str, str]]
) -> None:
    """Add ``p_slower_adjusted`` and ``p_faster_adjusted`` to every cell: Benjamini-Hochberg
    over the cells of this comparison, one direction at a time."""
    if not keys:
        return
    for direction in ("p_slower", "p_faster"):
        raw = np.array([cells[p][b][direction] for p, b in keys])
        adjusted = stats.false_discovery_control(raw, method="bh")
        for (p, b), q in zip(keys, adjusted, strict=True):
            if direction == "p_slower":
                cells[p][b]["p_slower_adjusted"] = float(q)
            else:
                cells[p][b]["p_faster_adjusted"] = float(q)


def _label_cells(
    cells: dict[str, dict[str, CellComparison]],
    keys: list[tuple[str, str]],
    factor: float,
    alpha: float,
    confidence: float,
) -> tuple[list[str], list[str]]:
    """Give every cell its ``status``, ``min_detectable_ratio``, ``smallest_p`` and
    ``can_reach_alpha_alone``; return the ``path/label`` of the regressions and of the
    improvements (significant after the adjustment and beyond ``factor``)."""
    regressions, improvements = [], []
    for path, label in keys:
        cell = cells[path][label]
        slower = cell["ratio"] > factor and cell["p_slower_adjusted"] < alpha
        faster = cell["ratio"] < 1.0 / factor and cell["p_faster_adjusted"] < alpha
        cell["status"] = cell_label(cell, factor, slower, faster, alpha)
        cell["min_detectable_ratio"] = min_detectable_ratio(
            cell["ci_low"], cell["ci_high"], confidence, alpha
        )
        # Whether this cell alone could be a regression with the rounds the two runs
        # have: its smallest p, adjusted over the cells, must be able to pass alpha.
        cell["smallest_p"] = smallest_p(cell["blocks_baseline"], cell["blocks_current"])
        cell["can_reach_alpha_alone"] = cell["smallest_p"] * len(keys) < alpha
        if slower:
            regressions.append(f"{path}/{label}")
        elif faster:
            improvements.append(f"{path}/{label}")
    return regressions, improvements


def _withholding_reasons(
    baseline: BenchRecord, current: BenchRecord, control: ControlVerdict
) -> list[str]:
    """Why regressions found would be ``inconclusive``: a noisy run (load above the core
    count), or the machine itself slower beyond the factor (``control``:
    :func:`judge_control`)."""
    reasons = []
    if baseline.noisy or current.noisy:
        sides = [name for name, r in (("baseline", baseline), ("current run", current)) if r.noisy]
        were = "the baseline and the current run were" if len(sides) == 2 else f"the {sides[0]} was"
        reasons.append(f"{were} noisy (load above the core count)")
    if control["slower"]:
        reasons.append(
            f"the machine itself was slower: the control matmul took {control['ratio']:.2f}x "
            "the baseline's time, beyond the factor"
        )
    return reasons


def _rounds_compared(
    cells: dict[str, dict[str, CellComparison]], keys: list[tuple[str, str]]
) -> RoundsCompared:
    """How many rounds each side's cells have (early stopping leaves some with fewer):
    ``{"baseline_fewer": [cells], "current_fewer": [cells], "cannot_reach_alpha_alone":
    [cells], "baseline": [min, max], "current": [min, max]}``."""

    def spread(counts: list[int]) -> list[int] | None:
        return [min(counts), max(counts)] if counts else None

    out: RoundsCompared = {
        "baseline_fewer": [],
        "current_fewer": [],
        "cannot_reach_alpha_alone": [],
        "baseline": spread([cells[p][b]["blocks_baseline"] for p, b in keys]),
        "current": spread([cells[p][b]["blocks_current"] for p, b in keys]),
    }
    for p, b in keys:
        cell, name = cells[p][b], f"{p}/{b}"
        if cell["blocks_baseline"] < cell["blocks_current"]:
            out["baseline_fewer"].append(name)
        elif cell["blocks_current"] < cell["blocks_baseline"]:
            out["current_fewer"].append(name)
        if not cell["can_reach_alpha_alone"]:
            out["cannot_reach_alpha_alone"].append(name)
    return out


def rounds_lines(result: PerfVerdict) -> list[str]:
    """Notes on the rounds compared: when a side's cells have fewer rounds (stopped
    early), and which cells could not be a regression alone with the rounds at hand."""
    rounds = result.get("rounds")
    lines = []
    for side, other in (("baseline", "current run"), ("current", "baseline")):
        key: Literal["baseline_fewer", "current_fewer"] = (
            "baseline_fewer" if side == "baseline" else "current_fewer"
        )
        fewer = (rounds.get(key) if rounds else None) or []
        if fewer:
            cell = result["cells"]
            counts = sorted(
                {
                    f"{cell[p][b]['blocks_baseline']} vs {cell[p][b]['blocks_current']}"
                    for p, _, b in (n.rpartition("/") for n in fewer)
                }
            )
            who = "the baseline" if side == "baseline" else "the current run"
            lines.append(
                f"note: {who} has fewer rounds than the {other} in {len(fewer)} cell(s) "
                f"(stopped early; baseline vs current rounds: {', '.join(counts)}): "
                "compared round medians with round medians"
            )
    short = (rounds.get("cannot_reach_alpha_alone") if rounds else None) or []
    if short:
        lines.append(
            f"note: {len(short)} cell(s) have too few rounds to be a regression alone "
            f"(smallest p x cells >= alpha): {', '.join(short[:6])}"
            + (" ..." if len(short) > 6 else "")
        )
    return lines


def _batch_order(label: str) -> tuple[float, str]:
    """A batch label's sort key: its rows, a label without them last."""
    digits = label.lstrip("b")
    return (int(digits), label) if digits.isdigit() else (math.inf, label)


def format_table(result: PerfVerdict) -> str:
    """The comparison as text: the verdict and why, one line per path and batch size
    (regressions marked), then the notes (context differences, the control)."""
    from rich.console import Console
    from rich.table import Table

    title = f"benchmark verdict: {verdict_headline(result)}"
    if "cells" not in result:  # not comparable: nothing was compared
        lines = [f"{title}: {'; '.join(result['reasons'])}"]
        lines.append(
            f"nothing compared; baseline: {result['baseline']['source']}, current: "
            f"{result['current']['source']}. Runs compare only when these are equal: "
            f"{', '.join(result['required_same'])} (docs/benchmark.md)"
        )
        return "\n".join(lines)
    # The headline on a line of its own, above the table: a table's title is wrapped to
    # the table's width, and the headline is read first.
    table = Table()
    columns = ("path", "batch", "base p50 ms", "cur p50 ms", "ratio", "ratio CI", "p slower")
    for column in (*columns, "min det."):
        table.add_column(column, justify="left" if column in ("path", "batch") else "right")
    table.add_column("status")
    for path, by_batch in result["cells"].items():
        for label, cell in by_batch.items():
            table.add_row(
                path,
                label,
                *cell_columns(cell),
                cell["status"],
                style=STYLES.get(cell["status"], ""),
            )
    buffer = io.StringIO()
    Console(file=buffer, width=120, force_terminal=False).print(table)
    lines = [title, buffer.getvalue().rstrip()]
    lines.append(
        f"regression = ratio of medians > {result['factor']} and Mann-Whitney p on block medians "
        f"(BH-adjusted) < {result['alpha']}; baseline: {result['baseline']['source']}"
    )
    for key, (base, cur) in result["differences"].items():
        if base is None or cur is None:
            side = "baseline" if base is None else "current run"
            lines.append(f"note: {key} not recorded in the {side} (an older bench_details.json)")
        else:
            lines.append(f"note: {key} differs (compared): baseline {base!r}, current {cur!r}")
    lines += rounds_lines(result)
    if result["noisy"] and result["verdict"] != "inconclusive":  # else the title says it
        lines.append("note: a run was marked noisy (load above the core count): read with care")
    lines.append(control_line(result["control"]))
    if result["verdict"] == "inconclusive":
        lines.append(
            "hint: `vmapcheck verdict-paired --baseline-project <dir>` times the baseline and this "
            "project in alternating rounds, under the same load (docs/benchmark.md)"
        )
    for name in ("only_in_baseline", "only_in_current"):
        if result[name]:
            lines.append(f"note: {name.replace('_', ' ')}: {', '.join(result[name])}")
    return "\n".join(lines)


def control_line(control: ControlVerdict) -> str:
    """One line on the control (:func:`judge_control`): its ratio and what it decided."""
    ratio = control["ratio"]
    if not control["compared"] or ratio is None:  # compared: a ratio measured
        return f"control: not compared: {control['why']}"
    size = control["size"][0]
    text = f"control: the same {size}^3 {control['dtype'][0]} matmul took {control['ratio']:.2f}x"
    if control["ci_low"] is not None:
        text += f" [{control['ci_low']:.2f}, {control['ci_high']:.2f}]"
    text += " the baseline's time"
    if control["slower"]:
        return text + " (the machine was slower beyond the factor: regressions withheld)"
    if ratio < 1.0:
        return text + " (a faster machine withholds nothing)"
    return text + " (not a slowdown of the machine beyond the factor)"


def report_verdict(result: PerfVerdict, out: Path | None = None) -> int:
    """Print ``result`` (:func:`compare`) as its table, write it to ``out`` when given,
    and return ``vmapcheck verdict``'s exit code: 1 on a regression, else 0."""
    print(format_table(result))
    if out:
        atomic_write_json(out, result)
    return 1 if result["verdict"] == "regression" else 0
