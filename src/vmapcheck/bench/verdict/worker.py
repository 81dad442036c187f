"""One side of a paired benchmark (vmapcheck.bench.verdict.paired): a process that times one
project's cells, a round at a time, on the driver's command.

``python -m vmapcheck.bench.verdict.worker --project DIR --paths vmap_jit,direct_jit
--batch-sizes 256,1024 --samples 5 --warmup 3`` loads the project at ``DIR`` as the
``bench`` stage does (its ``params.yaml``, ``data/params``, ``data/cases``; plug-in models
under ``DIR`` importable), compiles and warms up every cell (a path at a batch size),
then speaks JSON lines:

- to stdout, once ready: ``{"event": "ready", "context": {...}, "cells": ["path/b256",
  ...], "skipped": {"path/b4096": "why"}}``;
- from stdin: ``{"cmd": "round", "index": i}``; answer: ``{"event": "round", "index": i,
  "samples_ms": {"path/b256": [ms, ...]}}`` (``--samples`` per cell, in time order);
  ``{"cmd": "round", "index": i, "cells": ["path/b256"]}`` times only those cells, each
  one's samples back to back, in that order (the driver's blocks);
- several ``--project`` flags: the projects share this process, ``ready`` lists them
  (``{"event": "ready", "sides": [{"context", "cells", "skipped"}, ...]}``) and a round
  command names one by its position (``"side": 1``);
- from stdin: ``{"cmd": "quit"}`` (or end of input): the process exits 0;
- on a failure: ``{"event": "error", "message": "..."}``, exit 2.

A round is what the bench stage's rounds are (vmapcheck.bench.timing.run): per batch size,
the jit cells then the eager cells take turns in a balanced Latin-square order
(``sample_passes``, the design's passes continued from round to round), every timed
call right after a discarded call of the same cell, nothing compiled while timing. With
``--order blocks``, each cell's samples are taken back to back instead (still each after
a discarded call), the cells in a balanced order that changes from round to round: a
cell then follows another cell's calls once per round, not before every sample.
Anything the libraries print goes to stderr: stdout carries the protocol only.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TextIO

# Each cell is keyed "path/b<rows>", as in the verdict's regressions list.
Cell = str
# How a round orders its samples: the bench stage's passes over the cells (interleaved at
# the level of single calls), or each cell's samples back to back (blocks).
INTERLEAVED, BLOCKS = "interleaved", "blocks"


def cell_name(path: str, rows: int) -> Cell:
    return f"{path}/b{rows}"


def parse_names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"{flag}: expected a comma-separated list, found {text!r}")
    return names


def parse_sizes(text: str, flag: str = "--batch-sizes") -> list[int]:
    try:
        sizes = [int(n) for n in parse_names(text, flag)]
    except ValueError:
        raise ValueError(f"{flag}: expected positive integers, found {text!r}") from None
    if any(s < 1 for s in sizes):
        raise ValueError(f"{flag}: expected positive integers, found {text!r}")
    return sizes


def samples_per_block(samples: int, inner: int, per_call_s: float, min_block_ms: float) -> int:
    """How many samples a cell timed alone (a block) takes: enough to last
    ``min_block_ms``, never fewer than ``samples`` and at most 20x ``samples``. A sample
    costs its ``inner`` loop of calls plus the discarded call before it, each
    ``per_call_s`` (measured at warm-up, so a loaded machine's slower calls take fewer).

    >>> samples_per_block(3, 1, 1e-6, 25.0), samples_per_block(3, 1, 0.01, 25.0)
    (60, 3)
    """
    return min(
        20 * samples, max(samples, math.ceil(min_block_ms / 1e3 / ((inner + 1) * per_call_s)))
    )


class Side:
    """The compiled, warmed-up cells of one project, ready to time round by round.

    ``groups``: per batch size, the jit cells then the eager cells (as the bench stage
    groups them: a tiny jit call right after an eager one's dispatches, or a batch-1 call
    after a batch-4096 one, would be timed with what they left behind).
    """

    def __init__(
        self,
        project: Path,
        paths: list[str],
        batch_sizes: list[int],
        samples: int,
        warmup: int,
        order: str = INTERLEAVED,
        min_block_ms: float = 0.0,
    ) -> None:
        import jax
        import jax.numpy as jnp

        from vmapcheck.bench.timing.machine import conditions
        from vmapcheck.bench.timing.sampling import bench_input, warm_up
        from vmapcheck.bench.verdict.baseline import RUNTIME_CONTEXT_KEYS
        from vmapcheck.config import load_config
        from vmapcheck.core.forms import cast_tree, validate_batch
        from vmapcheck.core.mesh import run_mesh
        from vmapcheck.core.models import build_model
        from vmapcheck.core.paths import PATHS, not_provided
        from vmapcheck.core.runtime import configure_jax
        from vmapcheck.data.regression import STANDARD_CASE, load_cases
        from vmapcheck.errors import ConfigError
        from vmapcheck.io import read_json
        from vmapcheck.layout import Layout
        from vmapcheck.params_io import contract_digest, load_model_params

        unknown = [p for p in paths if p not in PATHS or PATHS[p].takes != "batch"]
        if unknown:
            known = ", ".join(n for n, p in PATHS.items() if p.takes == "batch")
            raise ConfigError(
                f"--paths: unknown batch path(s) {', '.join(unknown)}; known: {known}"
            )
        layout = Layout(project)
        config = load_config(layout.params_yaml)
        # A plug-in model named by module path (models/<name>.py) lives in the project.
        sys.path.insert(0, str(layout.root))
        runtime = configure_jax(config.backend, config.precision)
        model = build_model(config.model)
        params, _ = load_model_params(model, layout.params)
        template = load_cases(layout.cases)[STANDARD_CASE]["x"]
        dtype = jnp.dtype(config.precision.dtype)
        mesh = (
            run_mesh(config.backend.num_devices, config.backend.model_axis)
            if any(PATHS[p].distributed for p in paths)
            else None
        )
        absent = not_provided(model)
        run_params = jax.device_put(cast_tree(params, dtype))
        self.skipped: dict[Cell, str] = {}
        self.groups: list[dict[Hashable, Callable[[], Any]]] = []
        built = {p: PATHS[p].compile(model, mesh) for p in paths if p not in absent}
        for rows in batch_sizes:
            x = bench_input(template, rows, dtype)
            validate_batch(x, model, dtype)
            by_mode: dict[str, dict[Hashable, Callable[[], Any]]] = {"jit": {}, "eager": {}}
            for name in paths:
                path = PATHS[name]
                cell = cell_name(name, rows)
                if name in absent:
                    self.skipped[cell] = f"not provided: {absent[name]}"
                    continue
                cap = getattr(config.bench, path.bench_cap) if path.bench_cap else None
                if cap is not None and rows > cap:
                    self.skipped[cell] = f"{name} capped at {cap} rows (bench.{path.bench_cap})"
                    continue
                compiled = built[name]
                if compiled is None:
                    # not_provided names every form the model lacks; a path that still
                    # built none is left out the same way, never timed as something else.
                    self.skipped[cell] = f"not provided: {name} has no form for this model"
                    continue
                args = compiled.place(run_params, x)
                # Through the jitted function, as the bench stage times it.
                by_mode[path.mode][cell] = functools.partial(compiled.fn, *args)
            self.groups += [g for g in by_mode.values() if g]
        self.inner: dict[Hashable, int] = {}
        per_call: dict[Hashable, float] = {}
        for group in self.groups:
            _, inner = warm_up(group, warmup, per_call)
            self.inner |= inner
        self.samples = samples
        # A cell timed alone (a block) takes enough samples to last ``min_block_ms``, at
        # most 20x ``samples``: another tenant's time slice (milliseconds) then lands on a
        # minority of a block's samples, which its median ignores, not on all of a
        # 10-sample block of a 0.1 ms call. A sample costs its inner loop plus the
        # discarded call before it.
        self.block_samples = {
            cell: samples_per_block(samples, self.inner[cell], per_call[cell], min_block_ms)
            for cell in per_call
        }
        self.order = order
        machine = conditions()
        self.context = {
            "model": config.model.name,
            "model_contract": contract_digest(read_json(layout.contract)),
            "dtype": dtype.name,
            "cpu_model": machine["cpu_model"],
            "usable_cores": machine["usable_cores"],
            **{k: runtime.as_dict().get(k, machine.get(k)) for k in RUNTIME_CONTEXT_KEYS},
        }
        self.cells = [c for g in self.groups for c in g]
        self.calls = {c: call for g in self.groups for c, call in g.items()}

    def round(self, index: int, cells: list[Cell] | None = None) -> dict[Cell, list[float]]:
        """Round ``index``: per cell, its samples (ms per call, in time order):
        ``samples`` each when timed in a group, its ``block_samples`` when timed alone.

        ``cells``: time only these, each one's samples back to back, in the order given
        (the driver's blocks: a cell's block on one side right before or after the same
        cell's block on the other side). Default: every cell, in this worker's order.
        """
        import numpy as np

        from vmapcheck.bench.timing.sampling import no_compiles, sample_passes

        if cells is not None:
            unknown = [c for c in cells if c not in self.calls]
            if unknown:
                raise ValueError(f"round {index}: unknown cell(s) {unknown}; known: {self.cells}")
        timed: dict[Cell, list[float]] = {}
        with no_compiles(f"{len(cells or self.cells)} cells of a paired round"):
            for block in self._blocks(index, cells):
                # A cell alone takes its block's samples; a group, ``samples`` each.
                n = self.block_samples[next(iter(block))] if len(block) == 1 else self.samples
                start, stop = index * n, (index + 1) * n
                secs = {c: np.empty(stop) for c in block}
                # Indices continue from round to round: the Latin square's passes too.
                sample_passes(block, self.inner, secs, range(start, stop))
                timed |= {str(c): [float(v * 1e3) for v in secs[c][start:stop]] for c in block}
        return timed

    def _blocks(self, index: int, cells: list[Cell] | None) -> list[dict[Hashable, Any]]:
        """The groups of calls a round times, one ``sample_passes`` each, in order:
        the named cells one by one; else, interleaved, each batch size's jit then eager
        group whole; else (blocks) each cell alone, in a balanced order that changes from
        round to round within its group."""
        from vmapcheck.bench.timing.sampling import balanced_orders

        if cells is not None:
            return [{cell: self.calls[cell]} for cell in cells]
        if self.order == INTERLEAVED:
            return list(self.groups)
        blocks = []
        for group in self.groups:
            names = list(group)
            design = balanced_orders(len(names))
            blocks += [{names[k]: group[names[k]]} for k in design[index % len(design)]]
        return blocks


def serve(sides: list[Side], commands: TextIO, replies: TextIO) -> None:
    """Answer the driver's commands until ``quit`` or the end of its input. A round
    command's ``side`` (default 0) picks which of this process's projects it times."""
    for line in commands:
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("cmd") == "quit":
            return
        cells = message.get("cells")
        side = message.get("side", 0)
        if (
            message.get("cmd") != "round"
            or not isinstance(message.get("index"), int)
            or not (cells is None or (isinstance(cells, list) and cells))
            or side not in range(len(sides))
        ):
            raise ValueError(f"expected a round or quit command, found {line.strip()[:80]!r}")
        began = time.time()
        samples = sides[side].round(message["index"], cells)
        reply = {"event": "round", "index": message["index"], "samples_ms": samples}
        reply["seconds"] = time.time() - began
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vmapcheck.bench.verdict.worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--project",
        type=Path,
        action="append",
        required=True,
        help="a project folder; repeat it to time several in this one process (side 0, 1...)",
    )
    parser.add_argument("--paths", required=True, help="comma-separated path names")
    parser.add_argument("--batch-sizes", required=True, help="comma-separated rows")
    parser.add_argument("--samples", type=int, required=True, help="samples per cell and round")
    parser.add_argument("--warmup", type=int, required=True, help="discarded calls per cell")
    parser.add_argument("--order", choices=(INTERLEAVED, BLOCKS), default=INTERLEAVED)
    parser.add_argument(
        "--min-block-ms", type=float, default=0.0, help="a cell timed alone lasts at least this"
    )
    args = parser.parse_args(argv)
    # The protocol's own copy of stdout; everything else printed goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        if args.samples < 1 or args.warmup < 0 or args.min_block_ms < 0:
            raise ValueError("expected --samples >= 1, --warmup >= 0 and --min-block-ms >= 0")
        sides = [
            Side(
                project.resolve(),
                parse_names(args.paths, "--paths"),
                parse_sizes(args.batch_sizes),
                args.samples,
                args.warmup,
                args.order,
                args.min_block_ms,
            )
            for project in args.project
        ]
        for project, side in zip(args.project, sides, strict=True):
            if not side.cells:
                raise ValueError(
                    f"{project}: no cell to time: every one was skipped ({side.skipped})"
                )
        described = [
            {
                "context": s.context,
                "cells": s.cells,
                "skipped": s.skipped,
                "block_samples": {str(c): n for c, n in s.block_samples.items()},
            }
            for s in sides
        ]
        # One project: its description at the top level, as the driver of one side reads it.
        ready = {"event": "ready", **described[0]} if len(sides) == 1 else {"sides": described}
        protocol.write(json.dumps({"event": "ready", **ready}) + "\n")
        protocol.flush()
        serve(sides, sys.stdin, protocol)
    except Exception as exc:  # reported to the driver, which names the side
        protocol.write(
            json.dumps({"event": "error", "message": f"{type(exc).__name__}: {exc}"}) + "\n"
        )
        protocol.flush()
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
