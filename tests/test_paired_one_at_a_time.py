"""The paired verdict on a backend whose device one process at a time may hold
(``backend.exclusive_device``: a TPU, where a second process that opens the chip dies on
libtpu's lockfile): never two worker processes alive at once. Forced on CPU here."""

from __future__ import annotations

import itertools
import os
import threading
import time

import psutil
import pytest

from vmapcheck.bench.verdict import paired, sides
from vmapcheck.bench.verdict.paired_report import format_paired
from vmapcheck.bench.verdict.pairs import (
    BASELINE,
    CURRENT,
    min_pairs,
    schedule,
    session_pairs,
    sessions,
)
from vmapcheck.config import BackendConfig

ONE_AT_A_TIME = "one process at a time (backend cpu allows one process on the device)"


@pytest.mark.parametrize("rounds", [3, 7, 12, 40])
@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_the_processes_one_after_another_time_every_half_of_every_pair_once(rounds, processes):
    groups = session_pairs(processes, rounds)
    assert groups % 2 == 0 and 2 <= groups <= rounds
    plan = sessions(rounds, groups)
    order = schedule(rounds)
    # A B A B ... A: the sides alternate, one process more than the process pairs.
    assert [role for role, _ in plan] == [(BASELINE, CURRENT)[j % 2] for j in range(groups + 1)]
    halves = [(i, half) for _, work in plan for i, half in work]
    assert sorted(halves) == [(i, h) for i in range(rounds) for h in (0, 1)]
    for j, (role, work) in enumerate(plan):
        for i, half in work:
            assert order[2 * i + half] == role  # the side schedule() gives that round
            # Pair i's first half in process i mod groups, its second in the next one.
            assert j == i % groups + half
    # As many pairs time the baseline first as the current side (up to one): ABBA.
    firsts = [order[2 * i] for i in range(rounds)]
    assert abs(firsts.count(BASELINE) - firsts.count(CURRENT)) <= 1


def test_only_cpu_lets_processes_share_the_device_unless_the_backend_says():
    from tests.helpers.config import compose_config

    def backend(**keys):
        return BackendConfig(num_devices=None, **keys).exclusive_device

    assert backend(name="cpu", platform="cpu") is False
    assert backend(name="tpu", platform="tpu") is True
    assert backend(name="gpu", platform="cuda") is True
    assert backend(name="cpu", platform="cpu", exclusive_device=True) is True
    assert compose_config("backend=cpu").backend.exclusive_device is False
    assert compose_config("backend=gpu").backend.exclusive_device is True
    config = compose_config("backend=cpu", "+backend.exclusive_device=true")
    assert config.backend.exclusive_device is True


def test_a_worker_that_finds_the_device_still_held_is_started_again(monkeypatch, tmp_path):
    """The chip can refuse a process started right after another ended: the worker is
    started again (each failed one ended first); any other failure is not retried."""
    started: list[_FakeWorker] = []
    busy = "RuntimeError: Internal error when accessing libtpu multi-process lockfile"

    class _FakeWorker:
        error = busy  # what a start that fails says

        def __init__(self, spec, args, log) -> None:
            started.append(self)
            self.closed = False

        def receive(self, timeout: float) -> dict:
            if len(started) < 3:
                raise sides.WorkerError(f"baseline worker (x): {self.error}")
            return {"event": "ready"}

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(paired, "Worker", _FakeWorker)
    monkeypatch.setattr(paired, "RESTART_WAIT_S", 0.0)
    lines: list[str] = []
    worker, ready = paired._start_alone(None, [], tmp_path / "log", lines.append)
    assert ready == {"event": "ready"} and worker is started[-1] and not worker.closed
    assert len(started) == 3 and all(w.closed for w in started[:2])
    assert len(lines) == 2 and "the device is still held" in lines[0]
    started.clear()
    _FakeWorker.error = "ValueError: no cell to time"
    with pytest.raises(sides.WorkerError, match="no cell to time"):
        paired._start_alone(None, [], tmp_path / "log", lines.append)
    assert len(started) == 1 and started[0].closed


def test_a_worker_on_this_interpreter_keeps_its_pythonpath_after_its_sides_code(
    monkeypatch, tmp_path
):
    """Where JAX and libtpu come through PYTHONPATH (this workplace's TPU machines), a
    worker on the driver's interpreter still finds them, after its side's code; a worker
    on a side's own interpreter gets its code alone, as before."""
    import sys

    spec = sides.SideSpec(BASELINE, tmp_path, sys.executable, "/side/src", False)
    monkeypatch.setenv("PYTHONPATH", "/opt/jax")
    assert sides.worker_pythonpath(spec) == os.pathsep.join(["/side/src", "/opt/jax"])
    other = sides.SideSpec(BASELINE, tmp_path, "/other/.venv/bin/python", "/side/src", False)
    assert sides.worker_pythonpath(other) == "/side/src"
    monkeypatch.delenv("PYTHONPATH")
    assert sides.worker_pythonpath(spec) == "/side/src"


class _Lifetimes:
    """Every worker's lifetime as the driver sees it (from just before its Popen to just
    after its exit was waited for: the process lives within), and the most worker
    processes a poller saw alive at once (psutil, every 10 ms: this process's children
    that run vmapcheck.bench.verdict.worker)."""

    def __init__(self, monkeypatch) -> None:
        self.spans: list[list[float | None]] = []
        self.most_alive = 0
        spans = self.spans

        class Recorded(paired.Worker):
            def __init__(self, *args, **kwargs) -> None:
                span: list[float | None] = [time.monotonic(), None]
                super().__init__(*args, **kwargs)
                spans.append(span)
                self._span = span

            def close(self) -> None:
                super().close()
                if self._span[1] is None:
                    self._span[1] = time.monotonic()

        monkeypatch.setattr(paired, "Worker", Recorded)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process(os.getpid())
        while not self._stop.is_set():
            alive = 0
            # The workers are this process's children. Not their own: a worker forks
            # briefly (platform.platform() runs `uname -p`), and until it execs, its child
            # has the worker's command line.
            for child in me.children():
                try:
                    if child.status() != psutil.STATUS_ZOMBIE and (
                        "vmapcheck.bench.verdict.worker" in child.cmdline()
                    ):
                        alive += 1
                except psutil.Error:  # ended meanwhile
                    pass
            self.most_alive = max(self.most_alive, alive)
            time.sleep(0.01)

    def __enter__(self) -> _Lifetimes:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def assert_one_at_a_time(self, processes: int) -> None:
        assert len(self.spans) == processes
        assert all(end is not None for _, end in self.spans), "a worker was never ended"
        ordered = sorted(self.spans)
        for (_, end), (start, _) in itertools.pairwise(ordered):
            assert end < start, f"two workers alive at once: {ordered}"
        assert self.most_alive == 1


@pytest.fixture(scope="module")
def exclusive_project(tmp_path_factory):
    """A tiny trained project whose backend (cpu) says one process at a time."""
    from tests.helpers.inprocess import run_stages, write_params

    root = tmp_path_factory.mktemp("exclusive")
    write_params(
        root,
        "data.n_rows=240",
        "data.standard_batch=8",
        "train.steps=0",
        "+backend.exclusive_device=true",
    )
    run_stages(root, "prepare", "train")
    return root


@pytest.mark.stages
def test_sides_apart_run_one_process_after_another(exclusive_project, monkeypatch):
    """Sides that need a process each (--no-share), with the default 3 processes: A B A B A,
    never two alive at once, each started after the previous one exited; every pair timed
    and judged (A/A)."""
    lines: list[str] = []
    rounds = min_pairs(2, 0.01)
    with _Lifetimes(monkeypatch) as lifetimes:
        result = paired.run_paired(
            sides.side_spec(BASELINE, exclusive_project),
            sides.side_spec(CURRENT, exclusive_project),
            ["vmap_jit", "direct_jit"],
            [16],
            factor=1.5,
            alpha=0.01,
            rounds=rounds,
            samples=3,
            warmup=1,
            processes=3,
            share=False,
            log=lines.append,
        )
    lifetimes.assert_one_at_a_time(5)
    design = result["design"]
    assert design["sessions"] == [BASELINE, CURRENT] * 2 + [BASELINE]
    assert design["processes"] == 5 and design["processes_asked"] == 3
    assert design["one_at_a_time"] == ONE_AT_A_TIME and ONE_AT_A_TIME in design["name"]
    assert design["why_apart"] == "asked for (--no-share)"
    assert sorted(result["cells"]) == ["direct_jit/b16", "vmap_jit/b16"]
    assert all(c["pairs"] == rounds for c in result["cells"].values())
    # The four pairs of consecutive processes (A B, B A, A B, B A) vote, as process pairs
    # do: one process unlike the others (a B process moves two of them) is outvoted.
    assert result["processes"] == 4
    assert all(len(c["process_ratios"]) == 4 for c in result["cells"].values())
    # A/A. Factor 1.5: on two busy cores one process can time a few-microsecond call
    # 2x slower than the next (seen at load 7); the point here is the processes' order.
    assert result["verdict"] == "no regression", format_paired(result)
    assert ONE_AT_A_TIME in format_paired(result)
    assert any("5 worker processes one after another (A B A B A)" in line for line in lines)


@pytest.mark.stages
def test_sides_that_share_a_process_get_one_whatever_processes_asks(exclusive_project, monkeypatch):
    with _Lifetimes(monkeypatch) as lifetimes:
        result = paired.run_paired(
            sides.side_spec(BASELINE, exclusive_project),
            sides.side_spec(CURRENT, exclusive_project),
            ["vmap_jit"],
            [16],
            factor=1.5,
            alpha=0.01,
            rounds=min_pairs(1, 0.01),
            samples=3,
            warmup=1,
            processes=3,
        )
    lifetimes.assert_one_at_a_time(1)
    design = result["design"]
    assert design["one_process_for_both"] and design["processes"] == 1
    assert design["process_pairs"] == 1 and design["processes_asked"] == 3
    assert ONE_AT_A_TIME in design["name"]
    assert result["verdict"] == "no regression"
