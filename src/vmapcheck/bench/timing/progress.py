"""Progress of the long work (the bench's timing, the guard's replay), with a stable ETA.

Work is reported in **phases**. A phase plans its work in units before it starts: for
the bench's timing, the seconds its calls should take (every cell's samples x calls per
sample x its per-call cost, measured in warm-up); for the guard's replay, requests. The
ETA is the work left at the rate measured over the whole phase so far (:class:`Eta`), so a
cell at 4,096 rows and one at 1 row move it alike: it does not jump with the last
cell's time, as an estimate from the recent speed does when cells cost 1,000x apart.

Shown as rich progress bars on a terminal (:class:`RichBars`), and as plain lines, at
most one per ``every_s`` seconds a phase, when the output is not a terminal
(:class:`PlainLines`: ``dvc repro`` piped into a CI log). :func:`open_progress` picks.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TextIO


@dataclass(frozen=True)
class Eta:
    """Seconds left in a phase of ``total`` work units.

    ``prior_rate``: the units per second expected before anything is measured (the
    bench's units are planned seconds: 1.0), counted as if ``prior_share`` of the work
    had been done at that rate; the measured rate takes over as work is done, with no
    jump. None: no estimate until ``min_share`` of the work is done.
    """

    total: float
    prior_rate: float | None = None
    prior_share: float = 0.05
    min_share: float = 0.01

    def remaining_s(self, done: float, elapsed_s: float) -> float | None:
        """The ETA after ``done`` units in ``elapsed_s`` seconds; None: not known yet."""
        left = max(self.total - done, 0.0)
        if left == 0.0:
            return 0.0
        if self.prior_rate is not None and self.prior_rate > 0:
            weight = self.prior_share * self.total
            rate = (done + weight) / (elapsed_s + weight / self.prior_rate)
        elif done < self.min_share * self.total or elapsed_s <= 0:
            return None
        else:
            rate = done / elapsed_s
        return left / rate if rate > 0 else None


def clock_text(seconds: float | None) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour), or ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class Phase:
    """One phase of work: ``advance`` as units are done (and ``count`` items: samples,
    requests, cells, what a reader counts)."""

    label: str
    total: float
    count_total: int
    unit: str
    eta: Eta | None
    started: float
    renderer: Renderer
    clock: Callable[[], float]
    done: float = 0.0
    count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    @property
    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total > 0 else 1.0

    def remaining_s(self) -> float | None:
        return None if self.eta is None else self.eta.remaining_s(self.done, self.elapsed_s)

    def advance(self, units: float = 1.0, count: int = 1) -> None:
        self.done += units
        self.count += count
        self.renderer.update(self)

    def drop(self, units: float, count: int) -> None:
        """Work that will not be done after all (a cell stopped early): taken out of the
        totals, so that the share done and the ETA count only what is left."""
        self.total -= units
        self.count_total -= count
        if self.eta is not None:
            self.eta = replace(self.eta, total=self.eta.total - units)
        self.renderer.update(self)

    def status(self) -> str:
        """``41% (1,886/4,600 samples), 0:42 elapsed, ETA 1:01``."""
        text = (
            f"{self.fraction:.0%} ({self.count:,}/{self.count_total:,} {self.unit}), "
            f"{clock_text(self.elapsed_s)} elapsed"
        )
        return text if self.eta is None else f"{text}, ETA {clock_text(self.remaining_s())}"


class Renderer(Protocol):
    def start(self, phase: Phase) -> None: ...
    def update(self, phase: Phase) -> None: ...
    def finish(self, phase: Phase) -> None: ...
    def note(self, message: str) -> None: ...


class Progress:
    """Phases of work shown by ``renderer``; ``clock``: seconds (monotonic)."""

    def __init__(self, renderer: Renderer, clock: Callable[[], float] = time.monotonic) -> None:
        self.renderer = renderer
        self.clock = clock

    @contextlib.contextmanager
    def phase(
        self,
        label: str,
        total: float,
        count_total: int | None = None,
        unit: str = "calls",
        eta: Eta | None = None,
    ) -> Iterator[Phase]:
        """A phase of ``total`` units (``count_total`` items, default ``total``); ``eta``
        None shows no ETA (work whose cost is not known in advance: compiling)."""
        phase = Phase(
            label,
            float(total),
            int(total if count_total is None else count_total),
            unit,
            eta,
            self.clock(),
            self.renderer,
            self.clock,
        )
        self.renderer.start(phase)
        yield phase
        self.renderer.finish(phase)

    def note(self, message: str) -> None:
        self.renderer.note(message)


class Silent:
    """Shows nothing (a library caller's default)."""

    def start(self, phase: Phase) -> None:
        pass

    def update(self, phase: Phase) -> None:
        pass

    def finish(self, phase: Phase) -> None:
        pass

    def note(self, message: str) -> None:
        pass


def silent() -> Progress:
    return Progress(Silent())


class PlainLines:
    """One line when a phase starts, then at most one per ``every_s`` seconds, and one
    when it ends: what a log can hold (``dvc repro`` piped into a file, CI)."""

    def __init__(self, prefix: str, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self.prefix = prefix
        self.stream = stream
        self.every_s = every_s

    def _print(self, text: str) -> None:
        print(f"{self.prefix}: {text}", file=self.stream or sys.stdout, flush=True)

    def start(self, phase: Phase) -> None:
        phase.extra["last_line"] = phase.started
        planned = f"{phase.count_total:,} {phase.unit}"
        if phase.eta is not None and phase.eta.prior_rate:
            planned += f", about {clock_text(phase.total / phase.eta.prior_rate)}"
        self._print(f"{phase.label}: {planned}")

    def update(self, phase: Phase) -> None:
        now = phase.clock()
        if now - phase.extra["last_line"] >= self.every_s:
            phase.extra["last_line"] = now
            self._print(f"{phase.label}: {phase.status()}")

    def finish(self, phase: Phase) -> None:
        self._print(
            f"{phase.label}: done, {phase.count:,} {phase.unit} in {clock_text(phase.elapsed_s)}"
        )

    def note(self, message: str) -> None:
        self._print(message)


class RichBars:
    """A rich progress bar a phase, with its count and this module's ETA."""

    def __init__(self, prefix: str, bars: Any) -> None:
        self.prefix = prefix
        self.bars = bars

    def start(self, phase: Phase) -> None:
        phase.extra["task"] = self.bars.add_task(
            f"{self.prefix}: {phase.label}", total=phase.total or 1.0, **self._fields(phase)
        )

    @staticmethod
    def _fields(phase: Phase) -> dict[str, str]:
        eta = "" if phase.eta is None else f"ETA {clock_text(phase.remaining_s())}"
        return {"count": f"{phase.count:,}/{phase.count_total:,} {phase.unit}", "eta": eta}

    def update(self, phase: Phase) -> None:
        self.bars.update(phase.extra["task"], completed=phase.done, **self._fields(phase))

    def finish(self, phase: Phase) -> None:
        self.bars.update(
            phase.extra["task"], completed=phase.total or 1.0, **self._fields(phase) | {"eta": ""}
        )

    def note(self, message: str) -> None:
        # As written: a message's brackets are no rich markup, its numbers no highlight.
        self.bars.console.print(f"{self.prefix}: {message}", markup=False, highlight=False)


@contextlib.contextmanager
def open_progress(prefix: str, every_s: float = 10.0) -> Iterator[Progress]:
    """Rich bars when stderr is a terminal, else plain lines on stdout (module docstring)."""
    from rich.console import Console
    from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

    console = Console(stderr=True)
    if not console.is_terminal:
        yield Progress(PlainLines(prefix, every_s=every_s))
        return
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[count]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}", markup=False),
    )
    with Bars(*columns, console=console) as bars:
        yield Progress(RichBars(prefix, bars))
