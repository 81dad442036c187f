"""The two sides of a paired verdict (:mod:`vmapcheck.bench.verdict.paired`) and their worker
processes.

- :class:`SideSpec` (:func:`side_spec`): a side's project folder, and the interpreter and
  code its worker runs (:func:`worker_pythonpath`);
- :class:`Worker`: a running ``python -m vmapcheck.bench.verdict.worker`` (or the worker
  module of a side's own older code) and its JSON lines;
  :class:`Channel`: one side's rounds in one worker (a worker may hold both sides);
- whether the sides may share a process (:func:`why_not_one_process`), and whether the
  device takes one process at a time (:func:`one_at_a_time`, :func:`keep_off_device`);
- what a side's files say before any worker starts (:func:`static_context`), and the
  report of sides they already show not comparable (:func:`nothing_to_compare`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmapcheck.bench.verdict.baseline import CONTEXT, BenchRecord
from vmapcheck.bench.verdict.records import (
    PairedReport,
    SideDescription,
    SideReady,
    StaticContext,
)
from vmapcheck.bench.verdict.regression import NOT_COMPARABLE, comparability
from vmapcheck.errors import ConfigError, VmapcheckError

# The worker's module, looked for in a side's own src/ newest layout first: a baseline
# checkout of a revision before bench/ was split by job (issue 47) holds its worker at
# vmapcheck/bench/worker.py, and its worker is started by that name, its code unchanged.
WORKER_MODULES = ("vmapcheck.bench.verdict.worker", "vmapcheck.bench.worker")

# Seconds a worker may take to start (import, compile, warm up), and to time one round.
START_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 300.0


class WorkerError(VmapcheckError):
    """A side's worker process failed, stopped or answered out of protocol."""


@dataclass
class SideSpec:
    """One side: its project folder, and the interpreter and code its worker runs."""

    role: str
    project: Path
    python: str
    pythonpath: str | None
    own_code: bool
    context: dict[str, Any] = field(default_factory=dict)
    # The module its worker runs as (``python -m``): the side's code's (WORKER_MODULES).
    worker_module: str = WORKER_MODULES[0]

    def describe(self) -> SideDescription:
        return {
            "project": str(self.project),
            "python": self.python,
            "pythonpath": self.pythonpath,
            "code": "the project's own src/" if self.own_code else "the driver's vmapcheck",
            "worker": self.worker_module,
        }


def side_spec(role: str, project: Path, python: str | None = None) -> SideSpec:
    """How to start ``project``'s worker: ``python`` (default: the project's
    ``.venv/bin/python`` when present, else this interpreter) with the project's own
    ``src/`` first on the path when it holds a vmapcheck with a worker (another revision's
    code), else this process's vmapcheck (plug-in models still come from the project).

    Raises:
        ConfigError: ``project`` has no params.yaml, or ``python`` is not a file.
    """
    from vmapcheck.layout import Layout

    project = Path(project).resolve()
    if not Layout(project).params_yaml.is_file():
        raise ConfigError(
            f"{role} project {project}: no params.yaml (expected a vmapcheck project folder "
            "after `dvc repro train`: params.yaml, data/params, data/cases)"
        )
    venv = project / ".venv" / "bin" / "python"
    chosen = python or (str(venv) if venv.is_file() else sys.executable)
    if not Path(chosen).is_file():
        raise ConfigError(f"{role} python {chosen!r}: no such file")
    src = project / "src"
    own = [m for m in WORKER_MODULES if (src / Path(*m.split("."))).with_suffix(".py").is_file()]
    # The src/ this driver runs from: one folder up per part of this module's name.
    here = str(Path(__file__).resolve().parents[len(__name__.split(".")) - 1])
    return SideSpec(
        role,
        project,
        chosen,
        str(src) if own else here,
        bool(own),
        worker_module=own[0] if own else WORKER_MODULES[0],
    )


def worker_pythonpath(spec: SideSpec) -> str:
    """A worker's PYTHONPATH: its side's code first (``spec.pythonpath``); then, for a
    worker on this interpreter, this process's own PYTHONPATH, where a machine may provide
    JAX and its accelerator runtime (this workplace's TPU machines put JAX and libtpu
    there). A worker on another interpreter (a side's own ``.venv``) gets its code alone:
    its own packages, not those of this process's environment."""
    paths = [spec.pythonpath] if spec.pythonpath else []
    inherited = os.environ.get("PYTHONPATH", "")
    if inherited and spec.python == sys.executable:
        paths.append(inherited)
    return os.pathsep.join(paths)


class Worker:
    """A running worker process and a thread reading its JSON lines."""

    def __init__(self, spec: SideSpec, args: list[str], log: Path) -> None:
        self.spec = spec
        env = {**os.environ, "PYTHONPATH": worker_pythonpath(spec)}
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [spec.python, "-m", spec.worker_module, "--project", str(spec.project), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            cwd=spec.project,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next message; raises WorkerError on an error message, exit or timeout."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(
                f"{self.spec.role} worker ({self.spec.project}): no answer in {timeout:.0f} s"
            ) from None
        if line is None:
            raise WorkerError(
                f"{self.spec.role} worker ({self.spec.project}) exited "
                f"({self.proc.wait()}): {self._tail()}"
            )
        message = json.loads(line)
        if message.get("event") == "error":
            raise WorkerError(
                f"{self.spec.role} worker ({self.spec.project}): {message['message']}"
            )
        return message

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"{self.spec.role} worker exited: {self._tail()}") from None

    def _tail(self) -> str:
        self._log_file.flush()
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:]) or "nothing on its stderr"

    def close(self) -> None:
        """Ask the worker to quit; stop it if it does not within 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(WorkerError):
                self.send({"cmd": "quit"})
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)  # it ends at the end of the worker's output
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a pipe the worker already broke
                    stream.close()
        self._log_file.close()


@dataclass
class Channel:
    """One side's rounds in one worker process: ``side`` is the project's position in a
    worker that holds both (None: the worker holds this side only)."""

    worker: Worker
    side: int | None = None

    def round(self, index: int, cells: Sequence[str] | None = None) -> dict[str, list[float]]:
        message: dict[str, Any] = {"cmd": "round", "index": index}
        if cells is not None:
            message["cells"] = list(cells)
        if self.side is not None:
            message["side"] = self.side
        self.worker.send(message)
        return self.worker.receive(ROUND_TIMEOUT_S)["samples_ms"]


def why_not_one_process(baseline: SideSpec, current: SideSpec) -> str | None:
    """Why the two sides cannot share a worker process, or None when they can: the same
    interpreter and code, the same backend and precision (set once per process), and no
    plug-in model module outside vmapcheck that the two folders could each hold under
    one name."""
    from vmapcheck.config import load_config
    from vmapcheck.layout import Layout

    if (baseline.python, baseline.pythonpath) != (current.python, current.pythonpath):
        return "the sides run different interpreters or code"
    configs = [load_config(Layout(s.project).params_yaml) for s in (baseline, current)]
    for key in ("backend", "precision"):
        if getattr(configs[0], key) != getattr(configs[1], key):
            return f"{key} differs (set once per process)"
    if baseline.project != current.project:
        for spec, config in zip((baseline, current), configs, strict=True):
            target = (config.model.factory or {}).get("_target_", "vmapcheck.")
            if not target.startswith("vmapcheck."):
                return f"{spec.role}'s model comes from its own module ({target})"
    return None


def one_at_a_time(baseline: SideSpec, current: SideSpec) -> str | None:
    """Why the worker processes must hold the device one at a time, or None where they
    may run at once: a side's backend has ``exclusive_device`` (vmapcheck.config.
    BackendConfig; absent from its params.yaml, every platform but cpu)."""
    from vmapcheck.config import load_config
    from vmapcheck.layout import Layout

    for spec in (baseline, current):
        backend = load_config(Layout(spec.project).params_yaml).backend
        if backend.exclusive_device:
            return (
                f"one process at a time (backend {backend.name} allows one process on the device)"
            )
    return None


def keep_off_device() -> None:
    """This process (the driver) starts JAX's CPU backend only, if any: it reads files and
    judges, and a device it opened would be held from its workers. Its environment is
    left as it is, so its workers' is too (they pick their backend, vmapcheck.core.runtime.
    configure_jax)."""
    import jax

    jax.config.update("jax_platforms", "cpu")


def static_context(spec: SideSpec) -> StaticContext:
    """What a side's files say of its context before any worker starts: its model
    contract (the digest the worker computes from the same file) and dtype.

    Raises:
        ConfigError: the project lacks the params, cases or contract a worker loads
            (naming the missing files and the command that makes them).
    """
    from vmapcheck.config import load_config
    from vmapcheck.layout import Layout
    from vmapcheck.params_io import contract_digest, read_model_contract

    layout = Layout(spec.project)
    # The contract lives in the params folder: named only when the folder is there.
    missing = [p for p in (layout.params, layout.cases) if not p.exists()] or [
        p for p in (layout.contract,) if not p.exists()
    ]
    if missing:
        names = ", ".join(str(p.relative_to(layout.root)) for p in missing)
        raise ConfigError(
            f"{spec.role} project {spec.project}: nothing to time: no {names} (run `dvc repro "
            "train` there first: a paired verdict times the params and cases it makes)"
        )
    config = load_config(layout.params_yaml)
    return {
        "model": config.model.name,
        "model_contract": contract_digest(read_model_contract(layout.contract)),
        "dtype": config.precision.dtype,
    }


def side_ready(answer: dict[str, Any], where: str) -> SideReady:
    """A side's part of a worker's ``ready`` message (vmapcheck.bench.verdict.worker),
    checked: its ``context`` an object, ``cells`` a list, ``skipped`` an object, and
    ``block_samples`` (where sent) an object.

    Raises:
        WorkerError: a key missing or of another kind, naming ``where`` (the worker) and
            the key: a worker of another vmapcheck speaking another protocol.
    """
    for key, kind in (("context", dict), ("cells", list), ("skipped", dict)):
        if not isinstance(answer.get(key), kind):
            raise WorkerError(
                f"{where}: its ready message's {key!r}: expected a {kind.__name__}, found "
                f"{type(answer.get(key)).__name__} (a worker of another vmapcheck?)"
            )
    ready: SideReady = {
        "context": answer["context"],
        "cells": [str(c) for c in answer["cells"]],
        "skipped": answer["skipped"],
    }
    if "block_samples" in answer:
        if not isinstance(answer["block_samples"], dict):
            raise WorkerError(
                f"{where}: its ready message's 'block_samples': expected an object, found "
                f"{type(answer['block_samples']).__name__}"
            )
        ready["block_samples"] = answer["block_samples"]
    return ready


def ready_sides(workers: list[Worker], both: bool) -> dict[str, SideReady]:
    """Wait for every worker's ``ready``; per side (baseline, current), what the first
    process said of it (:func:`side_ready`: context, cells, skipped): every process loads
    the same project the same way. ``both``: one process holds both sides.

    Raises:
        WorkerError: a worker failed, or answered in another shape (naming it)."""
    from vmapcheck.bench.verdict.pairs import BASELINE, CURRENT  # scipy: where it is used

    answers = [w.receive(START_TIMEOUT_S) for w in workers]
    where = [f"{w.spec.role} worker ({w.spec.project})" for w in workers]
    if both:
        sides = answers[0].get("sides")
        if not (
            isinstance(sides, list) and len(sides) == 2 and all(isinstance(s, dict) for s in sides)
        ):
            raise WorkerError(
                f"{where[0]}: its ready message's 'sides': expected a list of 2 objects, "
                f"found {type(sides).__name__} (a worker of another vmapcheck?)"
            )
        return {
            BASELINE: side_ready(sides[0], f"{where[0]}, baseline side"),
            CURRENT: side_ready(sides[1], f"{where[0]}, current side"),
        }
    return {BASELINE: side_ready(answers[0], where[0]), CURRENT: side_ready(answers[1], where[1])}


def nothing_to_compare(
    baseline: SideSpec, current: SideSpec, require_same: Iterable[str] = ()
) -> PairedReport | None:
    """The report of sides that cannot be compared, known from their files alone (another
    model contract or dtype: :func:`static_context`), before any worker starts: a second
    instead of every worker's start, compile and warm-up. None when they may compare (the
    workers' full context is checked again once they are ready)."""
    contexts = [static_context(s) for s in (baseline, current)]
    records = [
        BenchRecord(s.role, {}, {**c}) for s, c in zip((baseline, current), contexts, strict=True)
    ]
    reasons, differences = comparability(records[0], records[1], require_same)
    if not reasons:
        return None
    return {
        "verdict": NOT_COMPARABLE,
        "reasons": reasons,
        "why": f"{NOT_COMPARABLE}: {'; '.join(reasons)}",
        "regressions": [],
        "improvements": [],
        "differences": differences,
        "baseline": {**baseline.describe(), **contexts[0]},
        "current": {**current.describe(), **contexts[1]},
        "required_same": [k.name for k in CONTEXT if k.required],
        "timed": False,
    }
