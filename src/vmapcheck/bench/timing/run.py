"""Latency of each forward path after warm-up, as distributions, never a best run.

Method, for every path and batch size:

- jit paths are compiled ahead of time (``jax.jit(f).lower(...).compile()``): that
  compile is timed apart and gives XLA's cost analysis; every path's first call is timed
  apart too (for jit it builds the dispatch cache; eager fills per-op caches);
- ``warmup`` calls are discarded, then ``repeats`` samples are taken, each timed to
  ``block_until_ready`` (JAX dispatches asynchronously: without it we would time the
  dispatch, not the work). The samples are taken in ``ROUNDS`` rounds over every batch
  size; within a round and batch size, in passes over the jit paths (then the eager
  paths). A spell of interference from another tenant of a shared machine thus lands on
  a round or two of every cell instead of on every sample of one batch size, and the
  regression verdict tests the rounds' medians (``vmapcheck.bench.verdict.regression``); each
  cell's samples are stored in time order;
- the order of the paths within a pass follows a balanced Latin square (Williams design,
  :func:`~vmapcheck.bench.timing.sampling.balanced_orders`): over its passes every path
  directly follows every other equally often and takes every position equally often
  (:func:`~vmapcheck.bench.timing.sampling.pass_orders` shuffles the design's passes, seeded,
  so the joins between passes are balanced on average). And every timed call comes right
  after one discarded call of the *same* path, which takes whatever the previous path
  left (caches, allocator, thread pool): timed right after the unrolled ``loop_jit``,
  ``vmap_jit`` came out measurably slower than alone (docs/benchmark.md);
- when one call is too short for the timer (under
  ``vmapcheck.bench.timing.sampling.MIN_SAMPLE_TICKS`` of its resolution) a sample times a
  calibrated inner loop of calls and divides;
- a cell may stop early, at a round boundary and never before
  ``bench.early_stop.min_rounds`` rounds (:func:`vmapcheck.bench.timing.budget.early_stops`:
  its median's interval is tight enough, or the time budget asks for it); it keeps whole
  rounds, and ``round_sizes`` records them for the verdict;
- no compilation may happen while samples are taken (counted through
  ``jax.monitoring``): a recompile is a harness bug, and the run stops;
- XLA's ``cost_analysis`` gives each jit path's flops and bytes; against the device's
  matmul peak measured in the same run (:func:`vmapcheck.bench.timing.control.best_peak`: the
  best of short sweeps of square products in the run's dtype and matmul precision,
  doubled in size until the device is busy, marked when measured under contention)
  that gives the achieved share of the peak. A path cannot exceed the peak: where its
  figure would, the share is left out and the report says why
  (:func:`vmapcheck.bench.timing.bounds.roofline_share`);
- the time budget (``bench.early_stop.time_budget_s``) covers the whole bench:
  compiling, warm-up, the peak sweep and the timing, counted by a
  :class:`~vmapcheck.bench.timing.budget.BudgetClock` (on the CPU backend the fewer of wall and
  this process's CPU seconds: a loaded machine's stolen time does not spend it, and the
  projections below scale what each compile charged it). A path whose cost grows with its
  rows (the loop) is left out at a batch size where its projected compile or calls
  exceed what is left of it (:func:`vmapcheck.bench.timing.budget.over_budget`);
- a path whose p50 stays flat as the batch grows is launch-bound there
  (:func:`vmapcheck.bench.timing.bounds.launch_bound`: a line fitted to its p50s, fixed cost
  plus a cost a row, with a bootstrap interval of where it turns): its time is dispatch
  and transfer, not compute, so its ratios say nothing about the work and its rows/s
  are what matters.
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh

from vmapcheck.bench.timing import records
from vmapcheck.bench.timing.bounds import launch_bound, roofline_share
from vmapcheck.bench.timing.budget import (
    BUDGET_SETTING,
    STOP_ALL,
    BudgetClock,
    compile_over_budget,
    early_stops,
    median_interval,
    over_budget,
    round_slices,
    samples_per_round,
    stopped_line,
)
from vmapcheck.bench.timing.control import best_peak, control_figures, matmul_call, peak_budget
from vmapcheck.bench.timing.latency import latency_stats, speedup_intervals, speedups
from vmapcheck.bench.timing.machine import ConditionsSampler, conditions, machine_record
from vmapcheck.bench.timing.progress import Eta, Progress, silent
from vmapcheck.bench.timing.sampling import (
    bench_input,
    no_compiles,
    sample_cost,
    sample_passes,
    warm_up,
)
from vmapcheck.config import BENCH_ROUNDS, MIN_SAMPLES, BenchConfig
from vmapcheck.core.forms import cast_tree, validate_batch
from vmapcheck.core.models import Model, Params
from vmapcheck.core.paths import (
    PATHS,
    Compiled,
    ForwardPath,
    batch_paths,
    not_provided,
    twin,
)

# Samples are taken in this many rounds spread over the run (module docstring); the
# regression verdict tests the rounds' medians (vmapcheck.bench.verdict.regression.BLOCKS, equal).
# A cell stopped early (bench.early_stop) has fewer, whole rounds.
ROUNDS = BENCH_ROUNDS
# Key of the control matmul among the timed calls (cells are keyed (path, "b<rows>")).
CONTROL = ("control", "matmul")
# A single compile longer than this many seconds is named in the bench's log as it ends.
SLOW_COMPILE_S = 5.0
LIMITS = (
    "A CPU result says nothing about GPU or TPU.",
    "A small model's latency does not predict a large model's.",
    "jit speeds up repeated calls, but compile time (compile_ms), transfers and new "
    "shapes (one compile each) can dominate end-to-end time.",
)


def _cost(compiled: Any) -> records.CompileFigures:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jaxlibs return one dict per program
        analysis = analysis[0] if analysis else {}
    memory = compiled.memory_analysis()
    return {
        "flops": float((analysis or {}).get("flops", float("nan"))),
        "bytes_accessed": float((analysis or {}).get("bytes accessed", float("nan"))),
        "temp_bytes": float(getattr(memory, "temp_size_in_bytes", float("nan"))),
    }


def _spread_cost(
    cost: records.CompileFigures, compiled: Compiled, rows: int
) -> records.CompileFigures:
    """XLA analyses the per-device SPMD program: scale flops and bytes to the whole mesh
    (padded rows included) so gflops compares with the single-device paths."""
    return {
        **cost,
        "flops": cost["flops"] * compiled.devices,
        "bytes_accessed": cost["bytes_accessed"] * compiled.devices,
        "flops_per_device": cost["flops"],
        "devices": float(compiled.devices),
        "padded_rows": float(compiled.rows_run(rows)),
    }


def out_of_device_memory(error: Exception) -> str | None:
    """XLA's own words when ``error`` is the device running out of memory (a TPU refuses
    the compile: "the total memory required for HLO temporaries (16.52G) exceeds
    available HBM (15.75G)"; a CPU or GPU fails the allocation at the first call), else
    None: any other error is the bench's to raise."""
    if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error):
        return str(error).strip().splitlines()[0]
    return None


Cell = tuple[str, str]  # (path, "b<rows>")


class _DeviceFull(Exception):
    """A cell the device has no memory for; its message is the reason it is left out."""


@dataclass
class _Compiler:
    """The compile phase of :func:`run_bench`: which cells are left out and why, and each
    kept cell compiled (a jit path) and called once, its first call, which for an eager
    path compiles each operation it meets at the new shape. What each cost is what the
    budget's projections (:func:`over_budget`, :func:`compile_over_budget`) read.

    ``built``: path -> its :class:`Compiled` (absent ones in ``absent``: path -> why);
    ``clock``: the budget's clock, started when the bench began;
    ``least``: the fewest samples a round a cell keeps (:func:`over_budget`)."""

    built: dict[str, Compiled | None]
    absent: dict[str, str]
    run_params: Params
    config: BenchConfig
    clock: BudgetClock
    least: int
    progress: Progress
    # Cell -> its compile_ms and XLA's cost analysis ({} for an eager cell).
    figures: dict[Cell, records.CompileFigures] = field(default_factory=dict)
    # Cell -> seconds of its first call, made here so that the budget governs it.
    first_calls: dict[Cell, float] = field(default_factory=dict)
    # What each path whose cost grows with its rows (a bench_cap path) cost at the last
    # batch size: (rows, seconds), its compile (jit) or one warm call (eager). Here and
    # below, the seconds the budget was charged (BudgetClock.charged_since), which the
    # projections scale: at load 20 a 1-row loop_jit compile took 1 wall s and was
    # projected at 123 s for 128 rows (2026-12-07). compile_ms and first_call_ms are
    # the wall seconds, as reported.
    grown: dict[str, tuple[int, float]] = field(default_factory=dict)
    # Every jit path's last compile (rows, seconds), and each size's compiles so far
    # (rows -> path -> seconds); the same for the eager paths' first calls (the CNN's
    # vmap_eager on a TPU: tens of seconds at 16,384 rows).
    compile_last: dict[str, tuple[int, float]] = field(default_factory=dict)
    compiled_at: defaultdict[int, dict[str, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    first_last: dict[str, tuple[int, float]] = field(default_factory=dict)
    first_at: defaultdict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    # Path -> (rows, XLA's words) where the device ran out of memory: no larger size.
    out_of_memory: dict[str, tuple[int, str]] = field(default_factory=dict)

    def left_out(self, path: ForwardPath, rows: int) -> str | None:
        """Why ``path`` is not timed at ``rows`` (None: it is compiled)."""
        name, config = path.name, self.config
        budget = config.early_stop.time_budget_s
        first_size = rows == config.batch_sizes[0]
        if name in self.absent:
            return f"not provided: {self.absent[name]}"
        if name in self.out_of_memory:
            at, words = self.out_of_memory[name]
            return (
                f"{name} left out at {rows} rows: the device ran out of memory for it at "
                f"{at} rows ({words})"
            )
        cap = getattr(config, path.bench_cap) if path.bench_cap else None
        if cap is not None and rows > cap:
            return (
                f"{name} capped at {cap} rows (bench.{path.bench_cap}): one Python-level "
                "forward per row, unrolled by jit"
            )
        spent = self.clock.spent()
        if path.bench_cap and name in self.grown:
            over = over_budget(path, rows, self.grown[name], config, self.least, spent)
            if over:
                return over
        # Every path is timed at the first batch size; past it, once compiling has
        # spent the whole budget, the sizes still to compile are left out.
        if budget is not None and not first_size and spent > budget:
            return (
                f"{name} left out at {rows} rows: compiling had spent {spent:.3g} s, the "
                f"bench's whole budget of {budget:g} s ({BUDGET_SETTING}, counted in "
                f"{self.clock.unit()})"
            )
        # And so is a path whose compile (a jit program, or an eager path's first
        # call), projected, would end past it.
        if path.bench_cap or first_size:
            return None
        if path.jit:
            return compile_over_budget(
                name, rows, self.compiled_at[rows], self.compile_last.get(name), budget, spent
            )
        return compile_over_budget(
            name,
            rows,
            self.first_at[rows],
            self.first_last.get(name),
            budget,
            spent,
            what="its first call (compiling each operation it meets)",
        )

    def compile(self, path: ForwardPath, rows: int, x: Any) -> Callable[[], Any]:
        """``path`` compiled at ``rows`` (``x``: the batch) and called once; returns the
        call to time.

        Raises:
            _DeviceFull: the device has no memory for it (XLA's RESOURCE_EXHAUSTED); the
                path's larger sizes are left out too.
        """
        name, cell = path.name, (path.name, f"b{rows}")
        compiled = self.built[name]
        assert compiled is not None  # absent paths are left out before
        # On its device(s) already (a distributed path: split over the mesh), as every
        # path's batch is before it is timed.
        args = compiled.place(self.run_params, x)
        try:
            compile_charged = 0.0
            if path.jit:
                start, mark = time.perf_counter(), self.clock.mark()
                # A jit path's fn is jax.jit's wrapper (core.paths types it as any forward).
                cost = _cost(cast(jax.stages.Wrapped, compiled.fn).lower(*args).compile())
                self.figures[cell] = {
                    "compile_ms": (time.perf_counter() - start) * 1e3,
                    **(_spread_cost(cost, compiled, rows) if path.distributed else cost),
                }
                compile_charged = self.clock.charged_since(mark)
            start, mark = time.perf_counter(), self.clock.mark()
            jax.block_until_ready(compiled.fn(*args))
            self.first_calls[cell] = time.perf_counter() - start
            first_charged = self.clock.charged_since(mark)
            if path.bench_cap and not path.jit and self.config.early_stop.time_budget_s is not None:
                # One warm call (the first compiled each primitive it met): what a
                # per-row loop's cost at a larger size is projected from.
                mark = self.clock.mark()
                jax.block_until_ready(compiled.fn(*args))
                self.grown[name] = (rows, self.clock.charged_since(mark))
        except jax.errors.JaxRuntimeError as error:
            words = out_of_device_memory(error)
            if words is None:
                raise
            self.figures.pop(cell, None)
            self.out_of_memory[name] = (rows, words)
            raise _DeviceFull(
                f"{name} left out at {rows} rows: the device ran out of memory ({words})"
            ) from error
        if path.jit:
            seconds, what = self.figures[cell]["compile_ms"] / 1e3, "compiling"
            self.grown[name] = self.compile_last[name] = (rows, compile_charged)
            # A per-row loop's compile grows with its rows: no yardstick for the
            # batched programs.
            if not path.bench_cap:
                self.compiled_at[rows][name] = compile_charged
        else:
            self.figures[cell] = {}
            seconds, what = self.first_calls[cell], "the first call of"
            if not path.bench_cap:
                self.first_last[name] = (rows, first_charged)
                self.first_at[rows][name] = first_charged
        # A compile this slow is where an accelerator's budget goes (a TPU compiled the
        # unrolled loop_jit of a CNN in 24 s at 256 rows): named as it happens, not only
        # in bench_details once the bench is done.
        if seconds > SLOW_COMPILE_S:
            self.progress.note(f"{what} {name} at {rows} rows took {seconds:.1f} s")
        # Timed through the (jitted) function, as users call it: its C++ dispatch path
        # is faster than calling the AOT-compiled object from Python.
        return functools.partial(compiled.fn, *args)


@dataclass
class _Rounds:
    """What :func:`_time_rounds` measured: ``secs`` (cell -> seconds per sample, NaN
    where the cell took none), ``rounds`` (each round's sample indices), ``quota`` (cell
    -> samples a round), ``timed_rounds`` (cell -> rounds it took), ``stopped`` (cell ->
    why it stopped early) and the phase's wall ``seconds``."""

    secs: dict[Cell, np.ndarray]
    rounds: list[range]
    quota: dict[Cell, int]
    timed_rounds: dict[Cell, int]
    stopped: dict[Cell, str]
    seconds: float


def _time_rounds(
    groups: list[dict[Cell, Callable[[], Any]]],
    cells: int,
    per_call: dict[Cell, float],
    inner: dict[Cell, int],
    config: BenchConfig,
    timing_budget: float | None,
    least: int,
    clock: BudgetClock,
    progress: Progress,
) -> _Rounds:
    """Time ``groups`` (the control's first, then one per batch size and mode; ``cells``
    of them besides the control) in rounds (a spell of interference from another tenant
    of a shared machine then lands on a round or two of every cell, not on every sample
    of one batch size; within a group the paths take turns in a balanced order, each
    timed call right after a discarded call of its own: :func:`sample_passes`), within
    ``timing_budget`` seconds (None: no bound), each cell leaving at a round boundary
    once :func:`early_stops` says so.
    ``per_call`` and ``inner``: each cell's cost and inner loop from warm-up (wall
    seconds); ``clock``: the budget's, started when the bench began (the budget covers
    compiling and warm-up), whose seconds ``timing_budget`` is in."""
    # NaN where a cell took no sample: a cell of a reduced quota fills a prefix of
    # each round's indices.
    secs = {cell: np.full(config.repeats, np.nan) for group in groups for cell in group}
    rounds = round_slices(config.repeats)
    # The ETA's units: planned seconds (each sample's calls at the cell's measured cost).
    sample_s = {cell: sample_cost(per_call[cell], inner[cell]) for cell in secs}
    # The time budget binds from the first round: the dearest cells take fewer samples
    # a round (samples_per_round), not only fewer rounds once min_rounds are done.
    # The plan is in wall seconds, the budget in the clock's: on a loaded machine a wall
    # second of samples charges the budget less (BudgetClock.charge_rate).
    rate = clock.charge_rate()
    quota = samples_per_round(
        sample_s,
        max(len(r) for r in rounds),
        len(rounds),
        None if timing_budget is None else timing_budget / max(rate, 1e-3),
        keep=[CONTROL],
        # A cell stopped at min_rounds still holds the samples a run's reader requires.
        least=least,
    )
    planned = sum(sample_s[c] * sum(min(quota[c], len(r)) for r in rounds) for c in secs)
    planned_samples = sum(min(quota[c], len(r)) for c in secs for r in rounds)
    # Early stopping (bench.early_stop, :func:`early_stops`): a cell leaves the rounds at
    # a round boundary, so it keeps whole rounds for the verdict. The control never stops:
    # the verdict compares it round by round.
    timed_rounds: dict[tuple[str, str], int] = {cell: len(rounds) for cell in secs}
    stopped: dict[tuple[str, str], str] = {}
    with (
        no_compiles(f"{cells} cells"),
        progress.phase(
            f"timing {cells} cells and the control in {len(rounds)} rounds",
            planned,
            planned_samples,
            unit="samples",
            eta=Eta(planned, prior_rate=1.0),
        ) as timing,
    ):
        began, charged0 = time.perf_counter(), clock.spent()
        for done, indices in enumerate(rounds, start=1):
            for group in groups:
                for i in indices:
                    # A cell of quota q takes the first q indices of every round.
                    active = {
                        c: f
                        for c, f in group.items()
                        if c not in stopped and i - indices.start < quota[c]
                    }
                    if not active:  # every cell of this batch size and mode is done
                        continue
                    sample_passes(
                        active,
                        inner,
                        secs,
                        range(i, i + 1),
                        on_sample=lambda c: timing.advance(sample_s[c]),
                    )
            going = [c for c in secs if c != CONTROL and c not in stopped]
            # Since the bench began: the budget covers compiling and warm-up too.
            elapsed = clock.spent()
            # A round's cost as planned in warm-up, scaled by what a planned second has
            # charged the budget so far: more under a load that began after warm-up, less
            # where the clock counts CPU seconds the load did not steal.
            pace = (elapsed - charged0) / timing.done if timing.done > 0 else 1.0
            now = early_stops(
                {
                    c: [float(np.nanmedian(secs[c][r.start : r.stop])) for r in rounds[:done]]
                    for c in going
                },
                {c: pace * sample_s[c] * min(quota[c], len(indices)) for c in going},
                done,
                len(rounds),
                elapsed,
                config.early_stop,
                config.confidence_level,
            )
            for cell, why in now.items():
                stopped[cell] = why
                timed_rounds[cell] = done
                # The work it leaves is no longer planned: the ETA counts what is left.
                left = sum(min(quota[cell], len(r)) for r in rounds[done:])
                timing.drop(left * sample_s[cell], left)
        if stopped:
            progress.note(stopped_line(stopped, cells))
    return _Rounds(secs, rounds, quota, timed_rounds, stopped, time.perf_counter() - began)


def _cell_results(
    names: list[str],
    figures: dict[Cell, records.CompileFigures],
    first: dict[Cell, float],
    inner: dict[Cell, int],
    timed: _Rounds,
    peak_gflops: float,
    config: BenchConfig,
) -> records.CellResults:
    """Each timed cell's figures, by kind ("figures", "latency", "samples",
    "round_sizes", "stopping"), each path -> "b<rows>" -> value, for the paths
    ``names``: its latency distribution over the whole rounds it kept, its samples (ms),
    how its timing ended, and its compile, first call, flops and share of the
    ``peak_gflops``."""
    per_path: dict[str, dict[str, records.CellFigures]] = {name: {} for name in names}
    latency: dict[str, dict[str, records.LatencyCell]] = {name: {} for name in names}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    round_sizes: dict[str, dict[str, list[int]]] = {name: {} for name in names}
    stopping: dict[str, dict[str, records.CellStop]] = {name: {} for name in names}
    secs, rounds, quota = timed.secs, timed.rounds, timed.quota
    for cell in figures:
        name, label = cell
        rows = int(label[1:])
        kept = rounds[: timed.timed_rounds[cell]]
        # Whole rounds, each the prefix of its indices the cell's quota took.
        by_round = [secs[cell][r.start : r.stop][: quota[cell]] for r in kept]
        taken = np.concatenate(by_round)
        stats_ = latency_stats(taken, rows, config.confidence_level)
        latency[name][label] = stats_
        samples[name][label] = [float(v * 1e3) for v in taken]
        round_sizes[name][label] = [len(r) for r in by_round]
        medians = [float(np.median(r)) for r in by_round]
        low, high = median_interval(np.asarray(medians), config.confidence_level)
        stopping[name][label] = {
            "rounds": len(kept),
            "samples": int(taken.size),
            "stopped": timed.stopped.get(cell, STOP_ALL),
            # Samples a round it took: fewer than the round's size when the time budget
            # made it give some up (samples_per_round).
            "samples_per_round": min(quota[cell], max(len(r) for r in kept)),
            "interval_half_width": (high - low) / (2.0 * float(np.median(medians))),
        }
        # Eager paths do the same arithmetic as their jit twin: use its flop count; a
        # path whose loop XLA counts once uses the count of its flops_as path.
        jit_twin = twin(PATHS[name])
        twin_figures = figures.get((jit_twin.name, label), {}) if jit_twin else {}
        flops = figures[cell].get("flops", twin_figures.get("flops", float("nan")))
        flops_as = PATHS[name].flops_as
        if flops_as is not None:
            flops = figures.get((flops_as, label), {}).get("flops", float("nan"))
        gflops = flops / (stats_["p50"] / 1e3) / 1e9
        per_path[name][label] = {
            **figures[cell],
            "first_call_ms": first[cell] * 1e3,
            "inner_loop": inner[cell],
            "flops": flops,
            "gflops": gflops,
            "roofline": roofline_share(gflops, peak_gflops),
        }
    return {
        "figures": per_path,
        "latency": latency,
        "samples": samples,
        "round_sizes": round_sizes,
        "stopping": stopping,
    }


def _compile_groups(
    compiler: _Compiler,
    paths: list[ForwardPath],
    model: Model,
    template_rows: Any,
    dtype: Any,
    skipped: dict[str, dict[str, str]],
    progress: Progress,
) -> list[dict[Cell, Callable[[], Any]]]:
    """Every cell compiled (and first called) by ``compiler``, one batch size at a time
    (``template_rows`` tiled to it, batch axis 0), in groups of one batch size and mode
    (jit, eager) for :func:`run_bench`'s timing. Fills ``skipped[path][label]`` with why
    a cell is left out (the budget, the device's memory)."""
    groups: list[dict[Cell, Callable[[], Any]]] = []
    batch_sizes = compiler.config.batch_sizes
    # Compile times are not known before (an unrolled loop's grows with its rows): a
    # count, no ETA.
    with progress.phase("compiling", len(batch_sizes), unit="batch sizes") as step:
        for rows in batch_sizes:
            x = bench_input(template_rows, rows, dtype)
            validate_batch(x, model, dtype)
            label = f"b{rows}"
            by_mode: dict[str, dict[Cell, Callable[[], Any]]] = {"jit": {}, "eager": {}}
            for path in paths:
                why = compiler.left_out(path, rows)
                if why is None:
                    try:
                        by_mode[path.mode][(path.name, label)] = compiler.compile(path, rows, x)
                    except _DeviceFull as full:
                        why = str(full)
                        progress.note(why)
                if why is not None:
                    skipped[path.name][label] = why
            groups += [group for group in by_mode.values() if group]
            step.advance()
    return groups


def _warm_groups(
    groups: list[dict[Cell, Callable[[], Any]]],
    warmup: int,
    first_calls: dict[Cell, float],
    progress: Progress,
) -> tuple[dict[Cell, float], dict[Cell, int], dict[Cell, float]]:
    """Every cell of ``groups`` warmed up (:func:`warm_up`): (first-call seconds, inner
    loop, per-call seconds) by cell, the first call being the one made right after its
    compile (``first_calls``) where there was one."""
    first: dict[Cell, float] = {}
    inner: dict[Cell, int] = {}
    per_call: dict[Cell, float] = {}
    with progress.phase("warming up", sum(len(g) for g in groups), unit="cells") as warming:
        for group in groups:
            f, i = warm_up(group, warmup, per_call)
            first |= f | {cell: first_calls[cell] for cell in group if cell in first_calls}
            inner |= i
            warming.advance(len(group), len(group))
    return first, inner, per_call


def _measure_peak(
    dtype: Any, start_size: int, budget: float | None, clock: BudgetClock, progress: Progress
) -> records.Peak:
    """The device's peak (:func:`best_peak`: the best of short sweeps), in the run's
    dtype and matmul precision, at sizes that fill it; :func:`peak_budget` of the bench's
    ``budget`` at most, in the ``clock``'s seconds (the first sweep always runs)."""
    with progress.phase("measuring the matmul peak", 1, unit="sweeps") as sweeping:
        peak = best_peak(dtype, start_size, peak_budget(budget, jax.default_backend()), clock.spent)
        sweeping.advance()
    progress.note(
        f"matmul peak {peak['gflops']:.1f} GFLOP/s ({peak['size']}^3 {peak['dtype']}, "
        f"matmul precision {peak['matmul_precision']}; best of {len(peak['sweeps_gflops'])} "
        f"sweep(s); sweep stopped: {peak['stopped']})"
    )
    return peak


def run_bench(
    model: Model,
    params: Params,
    template_rows: np.ndarray,
    config: BenchConfig,
    dtype: Any,
    progress: Progress | None = None,
    mesh: Mesh | None = None,
    sampler: ConditionsSampler | None = None,
) -> records.BenchResult:
    """Time every path at every batch size; returns figures, skips and conditions.

    ``progress``: where the phases are shown (compiling, warming up, timing; None: not
    shown). The timing's ETA plans with each cell's per-call cost measured in warm-up
    (:func:`sample_cost`), so it does not jump from a cheap cell to a dear one.
    ``mesh``: the devices of the data-parallel ``sharded_jit`` path (None: all present).
    It is timed on its padded batch already split over the mesh, as every other path's
    batch is already on its device; its flops count every device's share.
    ``sampler``: a running :class:`~vmapcheck.bench.timing.machine.ConditionsSampler` whose span
    covers more than this call (None: one from the start of this call to its end).
    """
    progress = progress or silent()
    # The load and frequency from here to the end (a caller timing more, the bench stage
    # with its replays, passes its own sampler, started before and stopped after).
    own_sampler = sampler is None
    sampler = (sampler or ConditionsSampler()).start()
    # Where the bench's own time goes (the profile's bound is read off these); the time
    # budget counts from here: compiling, warm-up and the peak sweep spend it too, on the
    # CPU backend in the CPU seconds a loaded machine does not steal (BudgetClock).
    phase_began = time.perf_counter()
    clock = BudgetClock(cpu_work=jax.default_backend() == "cpu").start()
    budget = config.early_stop.time_budget_s
    paths = batch_paths()
    absent = not_provided(model)
    built = {p.name: p.compile(model, mesh) for p in paths if p.name not in absent}
    run_params = jax.device_put(cast_tree(params, dtype))
    before = conditions()
    # The control: a matmul timed in every round like the cells (so it sees the same
    # machine), the verdict's yardstick for "the machine itself changed speed". Timed
    # once, before the rounds, it swung 0.56x to 2.2x between quiet runs here. It is
    # small (bench.peak_matmul_size): not the peak, which peak_sweep measures.
    control = {CONTROL: matmul_call(dtype, config.peak_matmul_size)}
    skipped: dict[str, dict[str, str]] = {p.name: {} for p in paths}
    # Every cell is compiled (and its cost analysed) before any is timed. A cell is one
    # path at one batch size, keyed (path, "b<rows>"). Jit cells are timed interleaved
    # with each other and eager cells with each other (an eager call's many small
    # dispatches would otherwise leave a tiny jit call behind them measurably slower),
    # one batch size at a time (a batch-1 call right after a batch-4096 one would be
    # timed with the caches the big one left): one group per batch size and mode.
    groups: list[dict[Cell, Callable[[], Any]]] = [control]
    # Samples a round a cell keeps at least (samples_per_round).
    least = min(
        max(len(r) for r in round_slices(config.repeats)),
        math.ceil(MIN_SAMPLES / min(config.early_stop.min_rounds, ROUNDS)),
    )
    compiler = _Compiler(built, absent, run_params, config, clock, least, progress)
    figures = compiler.figures
    groups += _compile_groups(compiler, paths, model, template_rows, dtype, skipped, progress)
    compile_s = time.perf_counter() - phase_began
    phase_began = time.perf_counter()
    first, inner, per_call = _warm_groups(groups, config.warmup, compiler.first_calls, progress)
    warm_up_s = time.perf_counter() - phase_began
    phase_began = time.perf_counter()
    peak = _measure_peak(dtype, config.peak_matmul_size, budget, clock, progress)
    peak_s = time.perf_counter() - phase_began
    # What the timing may still spend: compiling, warm-up and the sweep came first.
    before_timing_s = clock.spent()
    timing_budget = None if budget is None else max(budget - before_timing_s, 0.0)
    timed = _time_rounds(
        groups, len(figures), per_call, inner, config, timing_budget, least, clock, progress
    )
    control_ = control_figures(config.peak_matmul_size, timed.secs[CONTROL])
    cells_by_path = _cell_results(
        [p.name for p in paths], figures, first, inner, timed, peak["gflops"], config
    )
    latency, samples = cells_by_path["latency"], cells_by_path["samples"]
    after = conditions()
    if own_sampler:
        sampler.stop()
    return {
        "batch_sizes": list(config.batch_sizes),
        "latency_ms": latency,
        "figures": cells_by_path["figures"],
        "speedup": speedups(latency),
        "speedup_ci": speedup_intervals(samples, config.confidence_level),
        "peak": peak,
        "control": control_,
        # Fitted over every size, its interval from each cell's samples.
        "launch_bound": launch_bound(latency, samples),
        "skipped": skipped,
        "samples_ms": samples,
        # Samples in each of a cell's rounds, in order (the verdict's blocks; a cell
        # stopped early has fewer rounds), and why each cell's timing ended.
        "round_sizes": cells_by_path["round_sizes"],
        "early_stop": {
            "settings": config.early_stop.model_dump(),
            "cells": cells_by_path["stopping"],
            # What the budget was counted in and what the bench spent of it, beside its
            # wall and CPU seconds: at load the wall seconds run far past the budget.
            "budget_clock": clock.record(),
        },
        # Noisy: the highest load over the whole bench (so far, for a caller's sampler
        # still running: vmapcheck.pipeline.bench records it again at its end).
        "machine": machine_record(before, after, sampler.summary()),
        "limits": list(LIMITS),
        "phases_s": {
            "compile": round(compile_s, 3),
            "warm_up": round(warm_up_s, 3),
            "peak_sweep": round(peak_s, 3),
            "timing": round(timed.seconds, 3),
        },
    }
