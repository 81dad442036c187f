"""The paired verdict's report (:mod:`vmapcheck.bench.verdict.paired`): its design
(:func:`concurrent_design`) and what it says of it and the sides (:func:`design_head`),
its whole result once judged (:func:`finished`), and the
result as text (:func:`format_paired`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

import numpy as np

from vmapcheck.bench.verdict.baseline import CONTEXT
from vmapcheck.bench.verdict.labels import STYLES, cell_columns, verdict_headline
from vmapcheck.bench.verdict.pairs import ALL_PAIRS, BASELINE, CURRENT
from vmapcheck.bench.verdict.records import (
    PairedDesign,
    PairedHead,
    PairedJudgement,
    PairedReport,
    SideReady,
)
from vmapcheck.bench.verdict.sides import SideSpec
from vmapcheck.bench.verdict.worker import BLOCKS


def finished(
    result: PairedJudgement,
    head: PairedHead,
    ready: dict[str, SideReady],
    loads: list[float],
    cores: int,
    started: float,
) -> PairedReport:
    """The paired verdict's whole result: the judgement, the head, the cells only one
    side has, the load over the rounds (1-minute averages, ``cores`` usable) and the
    wall seconds since ``started`` (``time.time()``)."""
    only = sorted(set(ready[BASELINE]["cells"]) ^ set(ready[CURRENT]["cells"]))
    return {
        **result,
        **head,
        "only_one_side": only,
        "load": {
            "load_avg_1m_min": min(loads),
            "load_avg_1m_max": max(loads),
            "load_avg_1m_mean": float(np.mean(loads)),
            "usable_cores": cores,
        },
        "wall_s": time.time() - started,
    }


def concurrent_design(
    rounds: int,
    samples: int,
    warmup: int,
    order: str,
    processes: int,
    apart: str | None,
    alone: str | None,
    asked: int,
) -> PairedDesign:
    """The report's ``design`` of :func:`~vmapcheck.bench.verdict.paired.run_paired`'s
    workers running at once: its settings, whether one process holds both sides
    (``apart``: why not), and where the device takes one process at a time (``alone``),
    the processes ``asked`` for."""
    design: PairedDesign = {
        "rounds_per_side": rounds,
        "samples_per_round": samples,
        "warmup": warmup,
        "within_round": order,
        "process_pairs": processes,
        "one_process_for_both": apart is None,
        "why_apart": apart,
    }
    if alone is not None:
        design["one_at_a_time"] = alone
        design["processes_asked"] = asked
    return design


def design_head(
    baseline: SideSpec,
    current: SideSpec,
    paths: Sequence[str],
    batch_sizes: Sequence[int],
    design: PairedDesign,
) -> PairedHead:
    """What the report says of the design (``design``: rounds_per_side,
    samples_per_round, warmup, within_round, process_pairs, one_process_for_both,
    why_apart) and the two sides."""
    pairs = design["process_pairs"]
    shape = (
        f"{pairs} processes, each holding both sides"
        if design["one_process_for_both"]
        else f"{pairs} processes a side ({design['why_apart']})"
    )
    turns = "the process pairs taking turns"
    order = (
        "A B B A A B B A ... (A: baseline, B: current), pair i timed by process pair i mod "
        "process_pairs, after a discarded round per side and process"
    )
    processes = pairs if design["one_process_for_both"] else 2 * pairs
    unit = (
        "a pair of adjacent blocks of a cell's samples, one of each side"
        if design["within_round"] == BLOCKS
        else "a pair of adjacent rounds, one of each side"
    )
    if design.get("one_at_a_time") and design["one_process_for_both"]:
        shape = f"{pairs} process holding both sides; {design['one_at_a_time']}"
    if "sessions" in design:  # one after another (vmapcheck.bench.verdict.pairs.sessions)
        letters = " ".join("A" if s == BASELINE else "B" for s in design["sessions"])
        processes = len(design["sessions"])
        shape = (
            f"{processes} processes one after another ({letters}; {design['why_apart']}); "
            f"{design['one_at_a_time']}"
        )
        turns = "each pair's halves in consecutive processes"
        unit = unit.replace("adjacent ", "") + ", in consecutive processes"
        order = (
            f"A B B A A B B A ... (A: baseline, B: current), processes {letters} one after "
            "another, each after a discarded round of its own: pair i timed by the process "
            "pair i mod process_pairs (processes k and k + 1), its first half in process k, "
            "its second in process k + 1"
        )
    return {
        "design": {
            "name": f"paired, {shape}, ABBA, {turns}",
            "processes": processes,
            **design,
            "order": order,
            "paths": list(paths),
            "batch_sizes": list(batch_sizes),
            "unit": unit,
            "statistic": "exp(median of log(current round median / baseline round median))",
            "test": "one-sided Wilcoxon signed-rank on the pairs' log ratios, "
            "Benjamini-Hochberg over the cells",
            "rule": "regression: adjusted p_slower < alpha AND ratio > factor AND the ratio "
            "beyond factor in a majority of the process pairs",
        },
        "baseline": {**baseline.describe(), **baseline.context},
        "current": {**current.describe(), **current.context},
        "required_same": [k.name for k in CONTEXT if k.required],
    }


def format_paired(result: PairedReport) -> str:
    """The paired verdict as text: the verdict, one line per cell, the design and load."""
    from rich.console import Console
    from rich.table import Table

    title = f"paired benchmark verdict: {verdict_headline(result)}"
    if "cells" not in result:
        return f"{title}: {'; '.join(result['reasons'])}; nothing timed"
    table = Table()  # the headline above it, unwrapped (as vmapcheck.bench.verdict.regression's)
    for column in ("path", "batch", "base p50 ms", "cur p50 ms", "ratio", "ratio CI", "p slower"):
        table.add_column(column, justify="left" if column in ("path", "batch") else "right")
    table.add_column("min det.", justify="right")
    table.add_column("slower pairs", justify="right")
    table.add_column("per process", justify="right")
    table.add_column("status")
    for name, cell in result["cells"].items():
        path, _, label = name.rpartition("/")
        table.add_row(
            path,
            label,
            *cell_columns(cell),
            f"{cell['pairs_slower']}/{cell['pairs']}",
            " ".join(f"{r:.2f}" for r in cell.get("process_ratios", [])),
            cell["status"],
            style=STYLES.get(cell["status"], ""),
        )
    buffer = io.StringIO()
    Console(file=buffer, width=150, force_terminal=False).print(table)
    design, load = result["design"], result["load"]
    lines = [
        title,
        buffer.getvalue().rstrip(),
        f"design: {design['name']}; {_pairs_text(result)}",
        *_sequential_lines(result),
        f"regression = ratio > {result['factor']} and one-sided Wilcoxon p on the pairs "
        f"(BH-adjusted) < {result['alpha']} and the ratio beyond {result['factor']} in a "
        f"majority of the {result.get('processes', 1)} process pairs ('per process')",
        f"load during the rounds: {load['load_avg_1m_min']:.1f}-{load['load_avg_1m_max']:.1f} "
        f"(1-min average) on {load['usable_cores']} cores; "
        + (
            "each pair's halves saw it in consecutive processes"
            if "sessions" in design
            else "both sides saw it alike"
        ),
        f"baseline: {result['baseline']['project']} ({result['baseline']['code']}); "
        f"current: {result['current']['project']} ({result['current']['code']})",
    ]
    for key, (base, cur) in result["differences"].items():
        lines.append(f"note: {key} differs (compared): baseline {base!r}, current {cur!r}")
    for skipped, why in result.get("skipped", {}).items():
        lines.append(f"note: {skipped} not timed: {why}")
    return "\n".join(lines)


def _sequential_lines(result: PairedReport) -> list[str]:
    """The group-sequential test in words, and every cell that stopped at a look."""
    plan = result.get("sequential") or {"looks": 1}
    if plan["looks"] == 1:
        return ["sequential: one look (every planned pair of every cell)"]
    early = {
        c: cell
        for c, cell in result["cells"].items()
        if cell.get("stopped") not in (None, ALL_PAIRS)
    }
    lines = [
        f"sequential: {plan['looks']} looks at {plan['pairs_at_looks']} pairs; p slower: "
        f"O'Brien-Fleming-type spending of alpha; a cell stops when its slowdown is ruled "
        f"below the factor (Pocock-type spending of {plan['below']['level']:.3g}) or shown "
        f"beyond it (O'Brien-Fleming-type, {plan['beyond']['level']:.3g}); "
        f"{result.get('pairs_taken', result['pairs'])} of {result['pairs']} pairs taken"
    ]
    for name, cell in early.items():
        lines.append(f"stopped early: {name} after {cell['pairs']} pairs: {cell['stopped']}")
    return lines


def _pairs_text(result: PairedReport) -> str:
    """How the pairs were taken, in words."""
    design = result["design"]
    if design.get("within_round") == BLOCKS:
        counts = sorted(set((design.get("block_samples") or {}).values())) or [
            design["samples_per_round"]
        ]
        samples = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        return (
            f"{result['pairs']} pairs of blocks per cell, {samples} samples a block "
            f"(at least {design['samples_per_round']}, lasting {design.get('min_block_ms')} ms)"
        )
    return (
        f"{design['rounds_per_side']} rounds a side of {design['samples_per_round']} samples "
        f"per cell (interleaved within a round), {result['pairs']} pairs"
    )
