"""Progress of the bench and the guard's replay: a stable ETA, plain lines in logs.

No test here reads the real clock: a fake clock plays the time calls would take.
"""

import io

import numpy as np
import pytest

from vmapcheck.bench.timing.progress import (
    Eta,
    PlainLines,
    Progress,
    clock_text,
    open_progress,
)
from vmapcheck.bench.timing.sampling import pass_orders, sample_cost


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _simulated_timing(seed: int, machine: float, sigma: float):
    """A bench=full-like timing phase played on a fake clock: 46 cells whose per-call
    costs span 4 decades, 10 rounds of 10 samples, each cell's order within a pass
    balanced as run_bench takes them. The planned cost of a sample is what warm-up
    measured; its true time is ``machine`` times that, with lognormal noise ``sigma``
    (a loaded machine, a spell of interference). Returns the ETA after each sample, the
    true seconds left then, and each sample's true seconds."""
    rng = np.random.default_rng(seed)
    planned = 10 ** rng.uniform(-5, -1, size=46)  # seconds a sample, 10 us to 100 ms
    clock = FakeClock()
    progress = Progress(PlainLines("bench", stream=io.StringIO()), clock=clock)
    order = [cell for o in pass_orders(46, 100, seed) for cell in o]
    true_s = planned[order] * machine * rng.lognormal(0.0, sigma, size=len(order))
    total = 100 * planned.sum()
    left = np.cumsum(true_s[::-1])[::-1]  # true seconds left before each sample
    etas = []
    with progress.phase("timing", total, 4600, "samples", Eta(total, prior_rate=1.0)) as phase:
        for i, cell in enumerate(order):
            clock.now += true_s[i]
            phase.advance(planned[cell])
            etas.append(phase.remaining_s())
    return np.array(etas), np.append(left[1:], 0.0), true_s


@pytest.mark.parametrize(
    ("machine", "sigma"), [(1.0, 0.1), (1.7, 0.3), (0.6, 0.3), (2.5, 0.5)], ids=str
)
def test_the_eta_from_work_units_stays_close_to_the_truth(machine, sigma):
    """Planned per-call costs right up to a common factor (the machine slower or faster
    than in warm-up) and noisy: after a tenth of the work the ETA is within 30% of the
    time truly left, whatever cell was timed last."""
    etas, left, true_s = _simulated_timing(0, machine, sigma)
    spent = np.cumsum(true_s)
    later = spent >= 0.1 * spent[-1]
    still = left > 0.05 * spent[-1]  # near the end a few seconds are a large share
    error = np.abs(etas - left)[later & still] / left[later & still]
    assert error.max() < 0.3
    assert etas[-1] == 0.0


def test_the_eta_does_not_jump_with_the_last_cells_time():
    """From one sample to the next, the ETA moves by about the time that sample took,
    never by the gap between a 10 us cell and a 100 ms one (an estimate from the last
    cell's time jumped 0:20 <-> 2:50 in bench=full)."""
    etas, _, true_s = _simulated_timing(1, 1.7, 0.3)
    total_s = true_s.sum()
    # Expected change: minus the sample's own time. Beyond that, at most 2.5% of the run
    # in one step (early, while the measured rate replaces the planned one), then 1%.
    surprise = np.abs(np.diff(etas) + true_s[1:])
    assert surprise.max() < 0.025 * total_s
    assert surprise[np.cumsum(true_s)[1:] >= 0.1 * total_s].max() < 0.01 * total_s
    # What "the last cell's time x samples left" would have said swings 100-fold.
    naive = true_s[:-1] * np.arange(len(true_s) - 1, 0, -1)
    assert naive.max() / naive[naive > 0].min() > 100


def test_an_eta_with_no_prior_waits_for_a_share_of_the_work():
    eta = Eta(10_000)
    assert eta.remaining_s(50, 0.5) is None  # under 1% done: no estimate yet
    assert eta.remaining_s(1000, 10.0) == pytest.approx(90.0)
    assert eta.remaining_s(10_000, 100.0) == 0.0


def test_plain_lines_when_the_output_is_not_a_terminal():
    """A log gets a line at the start, at most one per every_s seconds, and one at the
    end: no escape codes, no carriage returns, whatever the number of updates."""
    out = io.StringIO()
    clock = FakeClock()
    progress = Progress(PlainLines("bench", stream=out, every_s=10.0), clock=clock)
    with progress.phase("guard replay", 10_000, unit="requests", eta=Eta(10_000)) as phase:
        for _ in range(10_000):
            clock.now += 0.0067  # 67 s in all
            phase.advance()
    progress.note("matmul peak 139.3 GFLOP/s (512^3)")
    lines = out.getvalue().splitlines()
    assert lines[0] == "bench: guard replay: 10,000 requests"
    assert lines[1] == "bench: guard replay: 15% (1,493/10,000 requests), 0:10 elapsed, ETA 0:57"
    assert len(lines) == 1 + 6 + 1 + 1  # start, one per 10 s of 67, end, the note
    assert lines[-2] == "bench: guard replay: done, 10,000 requests in 1:07"
    assert lines[-1] == "bench: matmul peak 139.3 GFLOP/s (512^3)"
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_a_phase_planned_in_seconds_says_how_long_it_should_take():
    out = io.StringIO()
    progress = Progress(PlainLines("bench", stream=out), clock=FakeClock())
    with progress.phase("timing", 95.0, 4700, "samples", Eta(95.0, prior_rate=1.0)):
        pass
    assert out.getvalue().splitlines()[0] == "bench: timing: 4,700 samples, about 1:35"


def test_open_progress_prints_plain_lines_in_a_log(capsys):
    """Under pytest, as under `dvc repro > log`, stderr is no terminal."""
    with open_progress("bench", every_s=0.0) as progress:
        assert isinstance(progress.renderer, PlainLines)
        with progress.phase("compiling", 2, unit="batch sizes") as phase:
            phase.advance()
            phase.advance()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "bench: compiling: 2 batch sizes"
    assert lines[1].startswith("bench: compiling: 50% (1/2 batch sizes), 0:00 elapsed")
    assert "ETA" not in lines[1]  # compile times are not known in advance
    assert lines[-1].startswith("bench: compiling: done, 2 batch sizes in")


def test_clock_text_and_sample_cost():
    assert [clock_text(s) for s in (None, 5.4, 170, 3725)] == ["?", "0:05", "2:50", "1:02:05"]
    # An inner loop of 8 calls after one discarded call.
    assert sample_cost(0.002, 8) == pytest.approx(0.018)
    assert sample_cost(0.002, 8, isolate=False) == pytest.approx(0.016)


def test_rich_bars_on_a_terminal_show_the_count_and_the_eta():
    from rich.console import Console
    from rich.progress import Progress as Bars
    from rich.progress import TextColumn

    from vmapcheck.bench.timing.progress import RichBars

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    clock = FakeClock()
    columns = (TextColumn("{task.description}"), TextColumn("{task.fields[count]}"))
    columns += (TextColumn("{task.fields[eta]}"),)
    with Bars(*columns, console=console, auto_refresh=False) as bars:
        progress = Progress(RichBars("bench", bars), clock=clock)
        with progress.phase("guard replay", 100, unit="requests", eta=Eta(100)) as phase:
            for _ in range(40):
                clock.now += 0.5
                phase.advance()
            bars.refresh()
            shown = out.getvalue()
            assert "bench: guard replay" in shown and "40/100 requests" in shown
            assert "ETA 0:30" in shown  # 60 left at 2 a second
        progress.note("matmul peak 1.0 GFLOP/s (512^3)")
    assert "bench: matmul peak 1.0 GFLOP/s (512^3)" in out.getvalue()
