"""How long the bench times each cell: its rounds, its stop at a round boundary and the
time budget.

- :func:`round_slices`: the samples of each round;
- :func:`early_stops`: the cells that stop at a round boundary (their median's interval,
  :func:`median_interval`, is tight enough; or the budget asks for it), and why
  (:data:`STOP_CI`, :data:`STOP_BUDGET`; :data:`STOP_ALL`: a cell that took every round);
- :func:`samples_per_round`: each cell's samples a round, so that the planned timing
  fits the budget (the dearest cell gives up samples first);
- :func:`over_budget`, :func:`compile_over_budget`: a path left out at a batch size
  whose projected calls or compile exceed what is left of the budget.

The budget is ``bench.early_stop.time_budget_s``; it covers the whole bench (compiling,
warm-up, the peak sweep and the timing: :mod:`vmapcheck.bench.timing.run`), counted by a
:class:`BudgetClock`: on the CPU backend in this process's CPU seconds where they are
fewer than the wall seconds (a loaded machine steals wall time, not our CPU time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from vmapcheck.bench.timing.records import BudgetClockRecord
from vmapcheck.config import BENCH_ROUNDS, BenchConfig, EarlyStopConfig
from vmapcheck.core.paths import ForwardPath

# A cell's key, whatever the caller times (a (path, label) pair, a worker's cell name):
# the maps in and out share it.
K = TypeVar("K", bound=Hashable)

# Why a cell's timing ended (bench_details.json's ``early_stop``): it reached its interval
# target, the time budget stopped it, or it took every round.
STOP_CI, STOP_BUDGET, STOP_ALL = "interval within target", "time budget", "all rounds"
# The setting that bounds the whole bench: every reason the budget gives for leaving a
# cell out names it (bench_details.json's ``skipped``), and what it cut is told by it
# (:func:`left_out_by_budget`).
BUDGET_SETTING = "bench.early_stop.time_budget_s"
# On the CPU backend a budget second is a CPU second, but never fewer than this many wall
# seconds: the bench's wall time stays within WALL_PER_BUDGET_S x the budget however busy
# the machine. At load 18-25 on two cores the bench's process got one CPU second in 12-14
# wall seconds (benchmarks/bench_under_load_20261207.json: 162-209 wall s for 13-17 CPU s)
# and the CPU seconds still decide, so every 128-row cell is timed there; on a machine
# busier still the wall decides, and the cells that do not fit are left out and named,
# as the budget leaves them out on a quiet machine.
WALL_PER_BUDGET_S = 16.0


class BudgetClock:
    """What the bench has spent of its time budget since :meth:`start`, in seconds.

    On the CPU backend every part of the bench (compiling, warm-up, the peak sweep, the
    timed calls) is this process's CPU work, so the budget charges the lesser of the wall
    seconds and this process's CPU seconds (every thread's: ``time.process_time``).
    On a machine busier than its cores the wall clock runs while other tenants hold the
    CPU: at load 11+ on two cores, compiling the quick profile took 13.5-13.8 of its 14
    wall seconds (issue 44) and the 128-row cells were left out, while the process had
    spent a fraction of that in CPU. On a quiet machine XLA's threads spend CPU seconds
    faster than wall ones, and the wall seconds are charged, as before.

    The CPU seconds are not charged below one budget second per :data:`WALL_PER_BUDGET_S`
    wall seconds, so that a machine many times busier than its cores cannot stretch the
    bench without bound.

    On an accelerator (``cpu_work=False``) the device's time is not this process's CPU
    time (a wait in ``block_until_ready`` spends none), so the wall seconds are charged.

    ``wall`` and ``cpu``: the clocks (injectable, so that a unit test drives a loaded
    machine deterministically)."""

    def __init__(
        self,
        cpu_work: bool,
        wall: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self.cpu_work = cpu_work
        self._wall, self._cpu = wall, cpu
        self._wall0, self._cpu0 = wall(), cpu()

    def start(self) -> BudgetClock:
        """Counts from now; returns itself."""
        self._wall0, self._cpu0 = self._wall(), self._cpu()
        return self

    def wall_s(self) -> float:
        """Wall seconds since :meth:`start`."""
        return self._wall() - self._wall0

    def cpu_s(self) -> float:
        """This process's CPU seconds since :meth:`start`."""
        return self._cpu() - self._cpu0

    def spent(self) -> float:
        """The budget's seconds since :meth:`start`: on the CPU backend the lesser of
        wall and CPU seconds, but at least the wall seconds / :data:`WALL_PER_BUDGET_S`;
        wall seconds on an accelerator."""
        return self._charge(self.wall_s(), self.cpu_s())

    def _charge(self, wall: float, cpu: float) -> float:
        """Budget seconds for ``wall`` and ``cpu`` seconds spent (:meth:`spent`)."""
        if not self.cpu_work:
            return wall
        return max(min(wall, cpu), wall / WALL_PER_BUDGET_S)

    def mark(self) -> tuple[float, float]:
        """Now on both clocks (wall, CPU), for :meth:`charged_since`."""
        return self._wall(), self._cpu()

    def charged_since(self, mark: tuple[float, float]) -> float:
        """The budget's seconds since ``mark`` (:meth:`mark`), counted as :meth:`spent`
        counts them: what one compile or call charged, which the budget's projections
        (:func:`over_budget`, :func:`compile_over_budget`) scale, so that a compile slowed
        by a loaded machine is not projected at its stolen wall seconds."""
        return self._charge(self._wall() - mark[0], self._cpu() - mark[1])

    def charge_rate(self) -> float:
        """Budget seconds charged per wall second so far (1.0 before any time passed):
        about 1/6 for a process sharing two cores with ten busy ones. A plan made in wall
        seconds (each cell's cost from warm-up) times this rate is in budget seconds."""
        wall = self.wall_s()
        return min(self.spent() / wall, 1.0) if wall > 0 else 1.0

    def record(self) -> BudgetClockRecord:
        """``{"counts", "spent_s", "wall_s", "cpu_s"}`` now, read once (bench_details.json's
        ``early_stop.budget_clock``): what the budget was counted in and spent, beside the
        wall and CPU seconds it was read from."""
        wall, cpu = self.wall_s(), self.cpu_s()
        spent = self._charge(wall, cpu)
        return {
            "counts": self.unit(),
            "spent_s": round(spent, 3),
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
        }

    def unit(self) -> str:
        """How the budget is counted, for a reason or a record: ``"the fewer of wall and
        this process's CPU seconds"`` or ``"wall seconds"``."""
        if self.cpu_work:
            return (
                "the fewer of wall and this process's CPU seconds, "
                f"at least 1 per {WALL_PER_BUDGET_S:g} wall seconds"
            )
        return "wall seconds"


def round_slices(repeats: int, rounds: int = BENCH_ROUNDS) -> list[range]:
    """Sample indices of each round: ``repeats`` cut into ``min(rounds, repeats)``
    contiguous, near-equal ranges (``np.array_split``'s cut, which the verdict's blocks
    use too, so a block is exactly one round)."""
    return [
        range(int(c[0]), int(c[-1]) + 1)
        for c in np.array_split(np.arange(repeats), min(rounds, repeats))
    ]


def budget_clock_line(record: Mapping[str, Any], budget_s: float | None) -> str:
    """The bench log's line on what the budget was counted in and what was spent
    (``record``: :meth:`BudgetClock.record`; ``budget_s``: the setting, None: none):
    ``budget: spent 3.1 s of 14 s, counted in the fewer of wall and this process's CPU
    seconds, at least 1 per 16 wall seconds (wall 30.5 s, CPU 3.1 s)``. Under load the
    wall seconds run far past the budget: this says why."""
    of = f" of {budget_s:g} s" if budget_s is not None else " (no budget)"
    return (
        f"budget: spent {record['spent_s']:.1f} s{of}, counted in {record['counts']} "
        f"(wall {record['wall_s']:.1f} s, CPU {record['cpu_s']:.1f} s)"
    )


def stopped_line(stopped: Mapping[K, str], cells: int) -> str:
    """The bench's line on the cells whose timing ended before every round, as a
    sentence: ``11 of 11 cells stopped early by the time budget
    (bench.early_stop.time_budget_s: raise it to time every round)``; with two
    reasons, each with its count: ``5 of 12 cells stopped early: 2 with their interval
    within target (bench.early_stop.ci_target), 3 by the time budget (...)``.
    ``stopped``: cell -> why (:data:`STOP_BUDGET`, :data:`STOP_CI`), ``cells``: every
    cell timed."""

    def part(why: str) -> str:
        if why == STOP_BUDGET:
            return f"by the time budget ({BUDGET_SETTING}: raise it to time every round)"
        if why == STOP_CI:
            return "with their interval within target (bench.early_stop.ci_target)"
        return f"({why})"

    counts = {why: sum(w == why for w in stopped.values()) for why in sorted(set(stopped.values()))}
    head = f"{len(stopped)} of {cells} cells stopped early"
    if len(counts) == 1:
        [(why, _)] = counts.items()
        return f"{head} {part(why)}"
    return f"{head}: " + ", ".join(f"{n} {part(why)}" for why, n in counts.items())


def left_out_by_budget(skipped: Mapping[str, Mapping[str, str]]) -> dict[str, list[int]]:
    """The paths the time budget left out (bench_details.json's ``skipped``: path ->
    ``b<rows>`` -> why), each with the batch sizes it was left out at, ascending; a path
    left out for another reason (a cap, the device's memory) is not one of them."""
    out: dict[str, list[int]] = {}
    for path, by_label in skipped.items():
        rows = sorted(
            int(label.lstrip("b")) for label, why in by_label.items() if BUDGET_SETTING in why
        )
        if rows:
            out[path] = rows
    return out


def budget_caveat(bench: Mapping[str, Any], measured: bool = True) -> str | None:
    """What the verdict says of a bench whose time budget left paths out (None: it left
    none out): which paths at which batch sizes, and the setting to raise, with its value
    in that run. ``measured``: whether a headline speed-up was measured at all; when none
    was, the bench measured too little to compare, and the caveat says so first."""
    left = left_out_by_budget(bench.get("skipped") or {})
    if not left:
        return None
    by_sizes: dict[tuple[int, ...], list[str]] = {}
    for path, rows in left.items():
        by_sizes.setdefault(tuple(rows), []).append(path)
    # "every path" only when no path timed was spared: the paths of latency_ms and skipped.
    benched = set(bench.get("latency_ms") or {}) | set(bench.get("skipped") or {})
    every = len(by_sizes) == 1 and len(left) > 1 and set(left) == benched
    where = "; ".join(
        f"{'every path' if every else ', '.join(paths)} left out at "
        f"{', '.join(map(str, rows))} rows"
        for rows, paths in by_sizes.items()
    )
    budget = ((bench.get("early_stop") or {}).get("settings") or {}).get("time_budget_s")
    now = f", {budget:g} s in this run," if isinstance(budget, int | float) else ""
    head = (
        "the benchmark measured too little to compare speeds"
        if not measured
        else "the benchmark left paths untimed"
    )
    return f"{head}: {where} by its time budget (raise {BUDGET_SETTING}{now} to time them)"


def median_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """A distribution-free interval of the median of ``values`` (n,): the order
    statistics ``x_(j)``, ``x_(n+1-j)`` with the largest ``j`` whose binomial coverage is
    at least ``confidence`` ([min, max] for 7 values at 95%: coverage 98.4%). No
    resampling: it runs at every round boundary of every cell."""
    # Imported here, not at the top: scipy.stats takes about a second to import, and
    # the report's summary (which every check of the Python API imports) reaches this
    # module only for budget_caveat.
    from scipy import stats

    x = np.sort(np.asarray(values, float))
    n = x.size
    j = 1
    while j < (n + 1) // 2 and 2 * stats.binom.cdf(j, n, 0.5) <= 1.0 - confidence:
        j += 1
    return float(x[j - 1]), float(x[n - j])


def early_stops(
    round_medians: dict[K, list[float]],
    round_cost_s: dict[K, float],
    rounds_done: int,
    rounds_total: int,
    elapsed_s: float,
    config: EarlyStopConfig,
    confidence: float,
) -> dict[K, str]:
    """Which of the cells still being timed stop now, at the boundary after round
    ``rounds_done`` (1-based) of ``rounds_total``, and why (:data:`STOP_CI`,
    :data:`STOP_BUDGET`).

    ``round_medians``: per cell, the median of each of its rounds so far (all
    ``rounds_done`` of them); ``round_cost_s``: per cell, the seconds one round of it
    costs (its samples' planned cost); ``elapsed_s``: the bench so far (compiling and
    warm-up included: the budget covers them).

    No cell stops before ``config.min_rounds`` rounds. A cell stops when its median's
    interval over its round medians (:func:`median_interval`) has a relative half-width
    within ``config.ci_target``. Then, when finishing every remaining round of the cells
    left would end beyond ``config.time_budget_s``, the dearest cells stop (dearest
    first: the cheap ones cost the budget nothing and keep the verdict's rounds) until
    the rest fits or none may stop.
    """
    if rounds_done < config.min_rounds or rounds_done >= rounds_total:
        return {}
    stops: dict[K, str] = {}
    for cell, medians in round_medians.items():
        low, high = median_interval(np.asarray(medians), confidence)
        center = float(np.median(medians))
        if center > 0 and (high - low) / (2.0 * center) <= config.ci_target:
            stops[cell] = STOP_CI
    if config.time_budget_s is not None:
        left = rounds_total - rounds_done
        going = sorted((c for c in round_medians if c not in stops), key=lambda c: -round_cost_s[c])
        projected = elapsed_s + left * sum(round_cost_s[c] for c in going)
        for cell in going:
            if projected <= config.time_budget_s:
                break
            stops[cell] = STOP_BUDGET
            projected -= left * round_cost_s[cell]
    return stops


def samples_per_round(
    sample_s: dict[K, float],
    round_size: int,
    rounds: int,
    budget_s: float | None,
    keep: Iterable[K] = (),
    least: int = 1,
) -> dict[K, int]:
    """How many samples of each cell every round takes (``least`` to ``round_size``) so that
    the planned timing, ``rounds`` rounds of each cell's quota at its ``sample_s``
    seconds a sample, fits ``budget_s`` (None: every cell takes whole rounds).

    The dearest cell gives up a sample a round first, then whichever is dearest again,
    until the plan fits or every cell is down to ``least``: cheap cells cost the budget
    nothing and keep their samples, and a cell of a second a call no longer holds the
    others' rounds hostage. ``keep``: cells never reduced (the control, which the
    verdict compares round by round)."""
    quota = dict.fromkeys(sample_s, round_size)
    if budget_s is None:
        return quota
    kept = set(keep)

    def planned() -> float:
        return rounds * sum(quota[c] * sample_s[c] for c in quota)

    while planned() > budget_s:
        reducible = [c for c in quota if quota[c] > least and c not in kept]
        if not reducible:
            break
        dearest = max(reducible, key=lambda c: quota[c] * sample_s[c])
        quota[dearest] -= 1
    return quota


def over_budget(
    path: ForwardPath,
    rows: int,
    last: tuple[int, float],
    config: BenchConfig,
    least: int,
    spent_s: float = 0.0,
) -> str | None:
    """Why ``path`` is left out at ``rows`` (None: it is timed): a path whose cost grows
    with its rows (one forward per row), projected linearly from ``last`` (rows,
    seconds it charged the budget: :meth:`BudgetClock.charged_since`) at a smaller batch
    size, would alone take more than what is left of the
    bench's budget (``bench.early_stop.time_budget_s`` less ``spent_s``, the seconds the
    bench has run so far: compiling and warm-up count; None: never left out). A jit
    path's projection is its compile; an eager path's, its warm-up calls and the fewest
    samples its rounds keep (``least`` a round over ``min_rounds``, each after a
    discarded call)."""
    budget = config.early_stop.time_budget_s
    if budget is None:
        return None
    left = budget - spent_s
    last_rows, last_s = last
    scaled = last_s * rows / last_rows
    if path.jit:
        projected, what = scaled, f"its compile (from {last_s:.2g} s at {last_rows} rows)"
    else:
        calls = config.warmup + 2 + 2 * least * config.early_stop.min_rounds
        projected = scaled * calls
        what = f"{calls} calls of {scaled:.2g} s (from {last_s:.2g} s at {last_rows} rows)"
    if projected <= left:
        return None
    return (
        f"{path.name} left out at {rows} rows: {what}, about {projected:.3g} s, exceeds the "
        f"{max(left, 0.0):.3g} s left of the bench's budget of {budget:g} s "
        f"({BUDGET_SETTING}; compiling and warm-up count)"
    )


def compile_over_budget(
    name: str,
    rows: int,
    at_this_size: dict[str, float],
    own_last: tuple[int, float] | None,
    budget_s: float | None,
    spent_s: float,
    what: str = "compiling it",
) -> str | None:
    """Why path ``name`` is left out at ``rows`` (None: it is compiled): its compile,
    projected, would end past the bench's budget (``budget_s``, less ``spent_s``, the
    seconds the bench has run so far; None: never left out).

    The projection is the larger of two floors: the dearest compile another path of its
    kind has taken at this batch size (``at_this_size``: path -> seconds; the vmap,
    direct and sharded programs of one model are near-identical, and on a TPU v5e each
    took 35-37 s at 4,096 rows of the CNN at matmul precision highest where 256 rows
    took 1.4 s), and this path's own last compile (``own_last``: rows, seconds) at a
    smaller size, a compile's cost only growing with its rows. Either alone misleads: a
    ``lax.map`` compiled first at a size (0.5 s whatever its rows) said nothing of
    vmap_jit's 35 s there. ``what``: the compile's name in the reason (an eager path's
    first call, which compiles each operation it meets). One compile can still overrun:
    its cost is known only once it is done."""
    if budget_s is None:
        return None
    floors: list[tuple[float, str]] = []
    if at_this_size:
        like, seconds = max(at_this_size.items(), key=lambda item: item[1])
        floors.append((seconds, f"as {like} took at this size"))
    if own_last is not None:
        floors.append((own_last[1], f"as it took at {own_last[0]} rows"))
    if not floors:
        return None
    projected, basis = max(floors, key=lambda floor: floor[0])
    left = budget_s - spent_s
    if projected <= left:
        return None
    return (
        f"{name} left out at {rows} rows: {what} would take about {projected:.3g} s "
        f"({basis}), more than the {max(left, 0.0):.3g} s left of the bench's budget of "
        f"{budget_s:g} s ({BUDGET_SETTING}; compiling and warm-up count)"
    )
