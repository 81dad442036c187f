"""Paired regression verdict: baseline and current timed in alternating pairs, ABBA.

The stored-run verdict (vmapcheck.bench.verdict.regression) compares two runs taken at different
times: on a shared machine the load changes between them, and that difference swamps a
real slowdown (at load 6-11 a +41% model change came out INCONCLUSIVE). Here the two sides
are timed in the same stretch of time, pair by pair, so the two halves of each pair share
the machine's conditions.

Design (:func:`run_paired`): ``processes`` worker processes (``python -m
vmapcheck.bench.verdict.worker``), each loading a project folder as the bench stage does: its
params.yaml, data/params, data/cases, and, where the folder has one, its own ``src`` and
``.venv`` (other model code or another JAX version).

- Where the two sides can share a process (:func:`why_not_one_process`: the same
  interpreter, code, backend and precision), each process holds both projects, and
  whatever makes one process slower than another slows both sides alike. Otherwise
  ``processes`` a side.
- ``order="blocks"`` (the default): pair ``r`` times each cell (a path at a batch size),
  in a balanced order that changes with ``r``, on one side and right away on the other:
  two blocks of its samples, A first or B first alternately. A block lasts at least
  :data:`MIN_BLOCK_MS` (more samples for a short call), every timed call right after a
  discarded call of the same cell. ``"interleaved"``: whole rounds of every cell, A B B A,
  in the bench stage's passes (vmapcheck.bench.timing.sampling.sample_passes).
- Pair ``r`` is timed by process (pair) ``r mod processes``: they take turns, so each one
  spans the whole comparison.
- On a backend whose device one process at a time may hold (``backend.exclusive_device``,
  vmapcheck.config.BackendConfig: a TPU, whose second process dies on libtpu's lockfile),
  never two workers at once (:func:`one_at_a_time`): sides that can share a process get
  one, holding both; else the workers run one after another, each opening the device in
  turn (:func:`vmapcheck.bench.verdict.pairs.sessions`: A B A ..., each process timing its
  halves of the pairs of the processes before and after it, a process pair per voting
  group). The driver itself stays off the device (:func:`keep_off_device`).

Why several processes: pairing cancels load that changes between the halves of a pair,
but not a difference between two processes that lasts the whole comparison. Measured under load
10-16 with one process a side: in 3 of 23 A/A comparisons one process was 1.2-1.5x slower
at 4,096 rows in every pair (its memory placement or its threads' cores, not its code).
One process a side cannot tell that from slower code; with three, one such process moves
a third of the pairs, and the rule below asks a majority of the process pairs to agree.

Statistics (:func:`judge_paired`), per cell:

- per pair: ``log(median(B half) / median(A half))``: the load both halves saw cancels,
  and as which side goes first alternates, an order effect cancels over the pairs;
- ``ratio``: exp of the median of those logs (above 1: the current side is slower), with
  a bootstrap confidence interval (percentile) that resamples process pairs, then pairs
  within each: a process pair unlike the others widens it;
- ``process_ratios``: the same ratio within each process pair;
- ``p_slower``/``p_faster``: one-sided Wilcoxon signed-rank tests of the logs against 0,
  adjusted over the cells with Benjamini-Hochberg, as the stored-run verdict does.

A cell is a **regression** when it is significant (adjusted ``p_slower < alpha``), its
ratio is beyond ``factor`` (asv's rule, ``bench.regression``), AND the ratio within a
majority of the process pairs is beyond ``factor`` too; an **improvement** is the mirror
image. No control or load rule withholds the verdict: both sides saw the same machine,
and the load measured during the run is reported. Sides that differ in a required
context key (vmapcheck.bench.verdict.baseline.CONTEXT: machine, backend, dtype...) are ``not
comparable``; a JAX or model difference is noted (``require_same`` to refuse it).

Too few pairs cannot reach significance after the adjustment: with ``n`` pairs the
smallest one-sided Wilcoxon p is ``2**-n``, and one significant cell among ``m`` needs
``m * 2**-n < alpha``. :func:`min_pairs` is that bound plus a margin of two (one pair
against the others still passes); fewer is refused (:class:`InsufficientRoundsError`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.bench.verdict.baseline import BenchRecord
from vmapcheck.bench.verdict.paired_report import (
    concurrent_design,
    design_head,
    finished,
    format_paired,
)
from vmapcheck.bench.verdict.pairs import (
    BASELINE,
    CURRENT,
    SequentialPlan,
    judge_paired,
    min_pairs,
    pair_medians,
    process_of_pair,
    schedule,
    session_pairs,
    sessions,
)
from vmapcheck.bench.verdict.records import PairedDesign, PairedHead, PairedReport, SideReady
from vmapcheck.bench.verdict.regression import NOT_COMPARABLE, comparability
from vmapcheck.bench.verdict.sides import (
    START_TIMEOUT_S,
    Channel,
    SideSpec,
    Worker,
    WorkerError,
    keep_off_device,
    nothing_to_compare,
    one_at_a_time,
    ready_sides,
    side_ready,
    side_spec,
    why_not_one_process,
)
from vmapcheck.bench.verdict.worker import BLOCKS, cell_name
from vmapcheck.errors import ConfigError, VmapcheckError
from vmapcheck.io import atomic_write_json

# Pairs per cell. 40, not 20: validated on two cores under load about 4 (docs/benchmark.md,
# "Validation under load"), 40 pairs found a planted +25% of rows in nearly every
# comparison where 20 found it in 56-86%, with no more false alarms. The cost: a
# comparison of 6 cells took 18 s instead of 14 on a quiet machine (26 s at load 4).
DEFAULT_ROUNDS = 40
DEFAULT_SAMPLES = 10
# Worker processes a side (module docstring): three, so that one process unlike the others
# is outvoted by two.
DEFAULT_PROCESSES = 3
# A cell's block of samples lasts at least this long (vmapcheck.bench.verdict.worker.Side): a time
# slice given to another tenant (milliseconds) then hits a minority of a block's samples.
MIN_BLOCK_MS = 25.0
PAIRED_REPORT = "perf_verdict_paired.json"
# One at a time on the device: a worker that finds it still held (the previous one just
# ended: the chip can refuse a process started right after another) is started again,
# after this many seconds, at most START_TRIES times. Its error then names one of these.
DEVICE_BUSY = ("lockfile", "resource busy", "already in use")
START_TRIES, RESTART_WAIT_S = 3, 5.0


# --- the driver: worker processes taking turns ----------------------------------------


def _load() -> float:
    return os.getloadavg()[0]


def run_paired(
    baseline: SideSpec,
    current: SideSpec,
    paths: Sequence[str],
    batch_sizes: Sequence[int],
    factor: float,
    alpha: float,
    rounds: int = DEFAULT_ROUNDS,
    samples: int = DEFAULT_SAMPLES,
    warmup: int = 3,
    confidence: float = 0.95,
    require_same: Iterable[str] = (),
    log=None,
    order: str = BLOCKS,
    processes: int = DEFAULT_PROCESSES,
    share: bool = True,
    looks: int = 1,
) -> PairedReport:
    """Start ``processes`` worker processes (each holding both sides where they can
    share one, :func:`why_not_one_process`, and ``share``; else ``processes`` a side),
    time ``rounds`` rounds a side in ABBA order (the process pairs taking turns, pair by
    pair), judge the pairs.

    ``looks``: the group-sequential test's looks (vmapcheck.bench.verdict.pairs.SequentialPlan):
    a cell decided at a look is not timed any more, and the comparison ends when every
    cell is (``order="blocks"`` only; 1: every pair of every cell).

    Before any worker starts (:func:`nothing_to_compare`): a side without the data it
    needs is an error, and sides whose files already show them not comparable (another
    model contract or dtype) come back ``not comparable`` in a second.

    On a backend that allows one process on the device (:func:`one_at_a_time`), never two
    workers at once: one process holding both sides where they can share one (whatever
    ``processes``); else ``processes`` rounded up to even process pairs run one after
    another (:func:`_run_one_at_a_time`; one look).

    ``log``: a callable taking one line of progress (None: silent). Returns the report:
    :func:`judge_paired`'s result plus ``design``, ``load`` (1-minute load average
    during the rounds, and the cores), ``baseline``/``current`` (project, interpreter,
    code, context), ``differences`` and ``skipped``. Sides that differ in a required
    context key come back ``not comparable`` without being timed.

    Raises:
        InsufficientRoundsError: ``rounds`` too few for the cells (checked before timing).
        WorkerError: a worker failed (its message and stderr's tail).
    """
    say = log or (lambda _line: None)
    _check_arguments(paths, batch_sizes, rounds, samples, processes, looks)
    early = nothing_to_compare(baseline, current, require_same)
    if early is not None:
        return early
    alone = one_at_a_time(baseline, current)
    asked = processes
    if alone is not None:
        apart = why_not_one_process(baseline, current) if share else "asked for (--no-share)"
        if apart is not None:
            return _run_one_at_a_time(
                baseline,
                current,
                paths,
                batch_sizes,
                factor,
                alpha,
                rounds,
                samples,
                warmup,
                confidence,
                require_same,
                say,
                order,
                processes,
                apart,
                alone,
                looks,
            )
        processes = 1  # one process holds both sides: the only one on the device
    cores = len(os.sched_getaffinity(0))
    args = _worker_args(paths, batch_sizes, samples, warmup, order)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="vmapcheck-paired-") as tmp:
        apart = why_not_one_process(baseline, current) if share else "asked for (--no-share)"
        workers: list[Worker] = []
        try:
            channels = _start_workers(baseline, current, processes, apart, args, Path(tmp), workers)
            shape = "both sides in each" if apart is None else "one a side"
            shape += f"; {alone}" if alone is not None else ""
            say(f"paired verdict: starting {len(workers)} worker process(es), {shape}")
            ready = ready_sides(workers, apart is None)
            for spec in (baseline, current):
                spec.context = ready[spec.role]["context"]
            design = concurrent_design(
                rounds, samples, warmup, order, processes, apart, alone, asked
            )
            head, refusal = _comparison_head(
                baseline, current, ready, paths, batch_sizes, design, order, require_same
            )
            if refusal is not None:
                return refusal
            shared = sorted(set(ready[BASELINE]["cells"]) & set(ready[CURRENT]["cells"]))
            if rounds < min_pairs(len(shared), alpha):  # refuse before spending the time
                judge_paired(
                    schedule(rounds), [{c: [1.0] for c in shared}] * (2 * rounds), factor, alpha
                )
            taken, loads, looks = _time_pairs(
                channels, shared, rounds, processes, order, looks, factor, alpha, confidence, say
            )
        finally:
            for w in workers:
                w.close()
    result = judge_paired(
        schedule(rounds)[: len(taken)],
        taken,
        factor,
        alpha,
        confidence,
        processes,
        looks=looks,
        planned_pairs=rounds,
    )
    return finished(result, head, ready, loads, cores, started)


def _check_arguments(
    paths: Sequence[str],
    batch_sizes: Sequence[int],
    rounds: int,
    samples: int,
    processes: int,
    looks: int,
) -> None:
    """Refuse what :func:`run_paired` cannot run, before anything starts.

    Raises:
        ConfigError: an unknown batch path, a batch size below 1, rounds or samples
            below 1, or processes or looks outside 1 to ``rounds``.
    """
    from vmapcheck.core.paths import PATHS

    unknown = [p for p in paths if p not in PATHS or PATHS[p].takes != "batch"]
    if unknown or not paths:
        known = ", ".join(n for n, p in PATHS.items() if p.takes == "batch")
        raise ConfigError(f"paths: unknown batch path(s) {', '.join(unknown)}; known: {known}")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes: expected positive row counts, found {list(batch_sizes)}")
    for name, value in (("rounds", rounds), ("samples", samples)):
        if value < 1:  # checked first: the processes' bound below is the rounds
            raise ConfigError(f"{name}: expected a whole number of at least 1, found {value}")
    if not 1 <= processes <= rounds:
        raise ConfigError(
            f"processes: expected 1 to {rounds} (the rounds a side), found {processes}"
        )
    if not 1 <= looks <= rounds:
        raise ConfigError(f"looks: expected 1 to {rounds} (the rounds a side), found {looks}")


def _start_workers(
    baseline: SideSpec,
    current: SideSpec,
    processes: int,
    apart: str | None,
    args: list[str],
    tmp: Path,
    workers: list[Worker],
) -> dict[str, list[Channel]]:
    """Start ``processes`` worker processes holding both sides (``apart`` None: why they
    cannot share one), else ``processes`` a side, each logging its stderr in ``tmp``.
    Returns ``channels[role][k]``: side ``role`` in process pair k. Each worker is
    appended to ``workers`` as it starts, so that the caller closes every one started
    when a later one fails."""
    channels: dict[str, list[Channel]] = {BASELINE: [], CURRENT: []}
    for k in range(processes):
        if apart is None:
            # The baseline's spec starts it; the current project is its side 1.
            both = replace(baseline, role=f"{BASELINE} and {CURRENT}")
            extra = [*args, "--project", str(current.project)]
            worker = Worker(both, extra, tmp / f"both-{k}.log")
            workers.append(worker)
            channels[BASELINE].append(Channel(worker, 0))
            channels[CURRENT].append(Channel(worker, 1))
            continue
        for spec in (baseline, current):
            worker = Worker(spec, args, tmp / f"{spec.role}-{k}.log")
            workers.append(worker)
            channels[spec.role].append(Channel(worker))
    return channels


def _time_pairs(
    channels: dict[str, list[Channel]],
    shared: Sequence[str],
    rounds: int,
    processes: int,
    order: str,
    looks: int,
    factor: float,
    alpha: float,
    confidence: float,
    say,
) -> tuple[list[dict[str, list[float]]], list[float], int]:
    """The pairs of :func:`run_paired`'s workers, after a discarded round per side and
    process: blocks of the ``shared`` cells (:func:`_time_blocks`, its looks) or whole
    rounds (:func:`_time_rounds`, one look). Returns the rounds taken (of
    :func:`schedule`), the 1-minute load averages over them, and the looks taken."""
    # One discarded round per side and process: the first after warm-up pays for its idle
    # wait.
    for channel in channels[BASELINE] + channels[CURRENT]:
        channel.round(0)
    loads = [_load()]
    if order == BLOCKS:
        plan = SequentialPlan(rounds, looks, alpha, confidence) if looks > 1 else None
        taken = _time_blocks(
            channels, shared, rounds, processes, loads, say, plan=plan, factor=factor
        )
        return taken, loads, looks
    # Whole rounds of every cell: no cell can leave early.
    return _time_rounds(channels, schedule(rounds), processes, loads, say), loads, 1


def _worker_args(
    paths: Sequence[str], batch_sizes: Sequence[int], samples: int, warmup: int, order: str
) -> list[str]:
    """A worker's command-line flags (vmapcheck.bench.verdict.worker) but its ``--project``."""
    return [
        "--paths",
        ",".join(paths),
        "--batch-sizes",
        ",".join(str(b) for b in batch_sizes),
        "--samples",
        str(samples),
        "--warmup",
        str(warmup),
        "--order",
        order,
        "--min-block-ms",
        str(MIN_BLOCK_MS),
    ]


def _start_alone(spec: SideSpec, args: list[str], log: Path, say) -> tuple[Worker, dict]:
    """A worker started while no other holds the device, and its ``ready``. One that finds
    the device still held (:data:`DEVICE_BUSY`: the previous worker's just ended) is
    started again after :data:`RESTART_WAIT_S`, :data:`START_TRIES` times in all."""
    for attempt in range(1, START_TRIES + 1):
        worker = Worker(spec, args, log)
        try:
            return worker, worker.receive(START_TIMEOUT_S)
        except WorkerError as exc:
            worker.close()
            if attempt == START_TRIES or not any(m in str(exc) for m in DEVICE_BUSY):
                raise
            say(f"paired verdict: the device is still held ({exc}); again in {RESTART_WAIT_S} s")
            time.sleep(RESTART_WAIT_S)
    raise AssertionError("unreachable")  # the last attempt returned or raised


def _run_one_at_a_time(
    baseline: SideSpec,
    current: SideSpec,
    paths: Sequence[str],
    batch_sizes: Sequence[int],
    factor: float,
    alpha: float,
    rounds: int,
    samples: int,
    warmup: int,
    confidence: float,
    require_same: Iterable[str],
    say,
    order: str,
    processes: int,
    apart: str,
    alone: str,
    looks: int = 1,
) -> PairedReport:
    """:func:`run_paired` where the sides need a process each and the device allows one
    process at a time: the workers of :func:`vmapcheck.bench.verdict.pairs.sessions` (A B A ...,
    ``processes`` rounded up to even pairs of consecutive processes), one after another,
    each started once the previous one has exited, after a discarded round of its own.
    The pairs of consecutive processes are the voting groups of :func:`judge_paired` (its
    ``processes``). One look: a look would need every group's pairs so far, and a group's
    second halves come a process later.

    The first baseline process times every cell it has; the cells that the current side
    lacks are dropped once its first process has said which it has (then the comparability
    of the two contexts and the rounds needed are checked, as :func:`run_paired` does
    once its workers are ready).
    """
    from vmapcheck.bench.timing.sampling import balanced_orders

    # Refused before any process opens the device: a bad factor or alpha, or rounds too
    # few for even one cell (the cells' own bound is checked once both sides are known).
    judge_paired(schedule(rounds), [{"cell": [1.0]}] * (2 * rounds), factor, alpha)
    groups = session_pairs(processes, rounds)
    plan = sessions(rounds, groups)
    requested = sorted({cell_name(p, b) for p in paths for b in batch_sizes})
    orders = balanced_orders(len(requested))
    args = _worker_args(paths, batch_sizes, samples, warmup, order)
    specs = {BASELINE: baseline, CURRENT: current}
    letters = " ".join("A" if role == BASELINE else "B" for role, _ in plan)
    say(f"paired verdict: {len(plan)} worker processes one after another ({letters}), {alone}")
    if looks > 1:
        say(f"paired verdict: one look, not {looks}: every pair of every cell is timed")
    cores = len(os.sched_getaffinity(0))
    started = time.time()
    ready: dict[str, SideReady] = {}
    taken: list[dict[str, list[float]]] = [{} for _ in range(2 * rounds)]
    loads = [_load()]
    design: PairedDesign = {
        "rounds_per_side": rounds,
        "samples_per_round": samples,
        "warmup": warmup,
        "within_round": order,
        "process_pairs": groups,
        "one_process_for_both": False,
        "why_apart": apart,
        "one_at_a_time": alone,
        "sessions": [role for role, _ in plan],
        "processes_asked": processes,
    }
    head: PairedHead | None = None
    with tempfile.TemporaryDirectory(prefix="vmapcheck-paired-") as tmp:
        for j, (role, work) in enumerate(plan):
            other = CURRENT if role == BASELINE else BASELINE
            worker, answer = _start_alone(specs[role], args, Path(tmp) / f"{role}-{j}.log", say)
            try:
                if role not in ready:
                    ready[role] = side_ready(answer, f"{role} worker ({specs[role].project})")
                    specs[role].context = answer["context"]
                if len(ready) == 2 and head is None:
                    head, refusal = _comparison_head(
                        baseline, current, ready, paths, batch_sizes, design, order, require_same
                    )
                    if refusal is not None:
                        return refusal
                    shared = sorted(set(ready[BASELINE]["cells"]) & set(ready[CURRENT]["cells"]))
                    judge_paired(  # refuses too few rounds for these cells
                        schedule(rounds), [{c: [1.0] for c in shared}] * (2 * rounds), factor, alpha
                    )
                mine = set(answer["cells"]) & set(ready.get(other, answer)["cells"])
                channel = Channel(worker)
                channel.round(0)  # discarded: the first after warm-up pays for its idle wait
                for i, half in work:
                    cells = [requested[k] for k in orders[i % len(orders)]]
                    cells = [c for c in cells if c in mine]
                    if order != BLOCKS:
                        taken[2 * i + half] = channel.round(1 + i // groups)
                    elif cells:
                        taken[2 * i + half] = channel.round(1 + i // groups, cells)
                    loads.append(_load())
            finally:
                worker.close()
            say(
                f"paired verdict: process {j + 1}/{len(plan)} ({role}) timed {len(work)} "
                f"halves of pairs, load {loads[-1]:.1f}"
            )
    shared_cells = set(ready[BASELINE]["cells"]) & set(ready[CURRENT]["cells"])
    taken = [{c: v for c, v in half.items() if c in shared_cells} for half in taken]
    result = judge_paired(schedule(rounds), taken, factor, alpha, confidence, groups)
    assert head is not None  # the plan runs both sides: made once the second was ready
    return finished(result, head, ready, loads, cores, started)


def _time_blocks(
    channels: dict[str, list[Channel]],
    cells: Sequence[str],
    rounds: int,
    processes: int,
    loads: list[float],
    say,
    plan: SequentialPlan | None = None,
    factor: float = 1.1,
) -> list[dict[str, list[float]]]:
    """Blocks: pair ``r`` of a cell is that cell's block of samples on one side right
    after the same cell's block on the other, by process pair ``r mod processes``; the
    cells go in a balanced order that changes with ``r``. So the two blocks of a pair are
    tens of milliseconds apart, not a whole round. Returns the rounds of
    :func:`schedule` (round ``2r`` the first side of pair ``r``), for :func:`judge_paired`.

    ``plan``: at each of its looks, every cell still timed that its
    :meth:`~vmapcheck.bench.verdict.pairs.SequentialPlan.decision` decides is timed no more;
    when none is left the rounds end (fewer than ``rounds``)."""
    from vmapcheck.bench.timing.sampling import balanced_orders

    design = balanced_orders(len(cells))
    order = schedule(rounds)
    active = set(cells)
    taken: list[dict[str, list[float]]] = []
    for r, first_side in enumerate(order[::2]):
        sides = (first_side, CURRENT if first_side == BASELINE else BASELINE)
        halves: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
        for k in design[r % len(design)]:
            if cells[k] not in active:
                continue
            for side in sides:
                channel = channels[side][process_of_pair(r, processes)]
                halves[side] |= channel.round(1 + r // processes, [cells[k]])
        taken += [halves[sides[0]], halves[sides[1]]]
        loads.append(_load())
        look = plan.look_at(r + 1) if plan is not None else None
        if plan is not None and look is not None and r + 1 < rounds:
            decided = {}
            for cell in sorted(active):
                base, cur = pair_medians(order[: len(taken)], taken, cell)
                groups = np.array([process_of_pair(i, processes) for i in range(base.size)])
                why = plan.decision(np.log(cur / base), factor, groups, plan.confidence)
                if why is not None:
                    decided[cell] = why
            active -= set(decided)
            said = ", ".join(f"{c} {w}" for c, w in decided.items()) or "none"
            say(
                f"paired verdict: look {look + 1}/{plan.looks} after {r + 1} pairs, load "
                f"{loads[-1]:.1f}: decided {said}; {len(active)} cell(s) go on"
            )
            if not active:
                break
        elif (r + 1) % 5 == 0 or r + 1 == rounds:
            say(f"paired verdict: {r + 1}/{rounds} pairs of blocks, load {loads[-1]:.1f}")
    return taken


def _time_rounds(
    channels: dict[str, list[Channel]],
    sides: Sequence[str],
    processes: int,
    loads: list[float],
    say,
) -> list[dict[str, list[float]]]:
    """Interleaved: whole rounds, every cell in the worker's own passes, in the order of
    ``sides`` (:func:`schedule`), pair ``i`` by process pair ``i mod processes``."""
    taken: list[dict[str, list[float]]] = []
    for i, role in enumerate(sides):
        pair = i // 2
        channel = channels[role][process_of_pair(pair, processes)]
        # Each side's own round index: its samples' slots, and its balanced order.
        taken.append(channel.round(1 + pair // processes))
        loads.append(_load())
        if (i + 1) % 10 == 0 or i + 1 == len(sides):
            say(f"paired verdict: {i + 1}/{len(sides)} rounds, load {loads[-1]:.1f}")
    return taken


def _comparison_head(
    baseline: SideSpec,
    current: SideSpec,
    ready: dict[str, SideReady],
    paths: Sequence[str],
    batch_sizes: Sequence[int],
    design: PairedDesign,
    order: str,
    require_same: Any,
) -> tuple[PairedHead, PairedReport | None]:
    """The result's head once both sides are loaded (``ready``: each side's first
    answer), and the whole result when the sides are not comparable (None: they are).
    Fills ``design`` with the block settings of a ``blocks`` order."""
    if order == BLOCKS:
        design["min_block_ms"] = MIN_BLOCK_MS
        design["block_samples"] = ready[CURRENT].get("block_samples")
    head = design_head(baseline, current, paths, batch_sizes, design)
    records = [BenchRecord(s.role, {}, s.context) for s in (baseline, current)]
    not_comparable, differences = comparability(records[0], records[1], require_same)
    head["differences"] = differences
    head["skipped"] = ready[BASELINE]["skipped"] | ready[CURRENT]["skipped"]
    if not not_comparable:
        return head, None
    return head, {
        "verdict": NOT_COMPARABLE,
        "reasons": not_comparable,
        "why": f"{NOT_COMPARABLE}: {'; '.join(not_comparable)}",
        "regressions": [],
        "improvements": [],
        **head,
    }


def run_verdict_paired(
    current_project: Path,
    baseline_project: Path,
    paths: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    rounds: int = DEFAULT_ROUNDS,
    samples: int = DEFAULT_SAMPLES,
    factor: float | None = None,
    alpha: float | None = None,
    out: Path | None = None,
    baseline_python: str | None = None,
    current_python: str | None = None,
    require_same: Iterable[str] = (),
    order: str = BLOCKS,
    processes: int = DEFAULT_PROCESSES,
    share: bool = True,
    looks: int | None = None,
) -> int:
    """``vmapcheck verdict-paired``: time both projects ABBA and judge; print the table,
    write the report (default ``reports/perf_verdict_paired.json`` of the current
    project). Exit 1 on a regression, 2 on an error, else 0. Defaults (paths: the jit
    paths on one device; batch sizes, warm-up, factor, alpha: the current project's
    ``bench`` config)."""
    from vmapcheck.config import load_config
    from vmapcheck.core.paths import batch_paths
    from vmapcheck.layout import Layout

    keep_off_device()  # the workers open it, one at a time where it allows only one
    try:
        layout = Layout(Path(current_project).resolve())
        config = load_config(layout.params_yaml)
        base = side_spec(BASELINE, baseline_project, baseline_python)
        cur = side_spec(CURRENT, layout.root, current_python)
        chosen = list(paths or [p.name for p in batch_paths() if p.jit and not p.distributed])
        sizes = list(batch_sizes or config.bench.batch_sizes)
        regression = config.bench.regression
        result = run_paired(
            base,
            cur,
            chosen,
            sizes,
            factor if factor is not None else regression.factor,
            alpha if alpha is not None else regression.alpha,
            rounds,
            samples,
            config.bench.warmup,
            config.bench.confidence_level,
            require_same,
            log=lambda line: print(line, file=sys.stderr, flush=True),
            order=order,
            processes=processes,
            share=share,
            looks=looks if looks is not None else config.bench.early_stop.paired_looks,
        )
    except VmapcheckError as exc:
        print(f"verdict-paired: error: {exc}", file=sys.stderr)
        return 2
    print(format_paired(result))
    target = out if out is not None else layout.report(PAIRED_REPORT)
    atomic_write_json(target, result)
    print(f"report: {target}")
    return 1 if result["verdict"] == "regression" else 0
