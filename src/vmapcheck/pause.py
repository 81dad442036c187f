"""Pause points: named events of a stage where a test can hold it still, then kill it.

A fault injected at a time (SIGKILL 2 s into a stage) lands wherever the stage happens to
be: a stage that runs faster than it did before (JAX's compile cache, a quieter machine)
ends before the kill, and the test fails by chance. A pause point makes the kill land at
a known event instead. Three environment variables, unset in every normal run (each
point is then one lookup of ``os.environ``):

- ``VMAPCHECK_PAUSE_TRACE=<file>``: each point passed appends its label to ``<file>``, one
  a line (nothing pauses): the events a run goes through, for a test to choose from;
- ``VMAPCHECK_PAUSE_AT=<label>``: the process that reaches the point of that label writes
  ``{"label", "pid", "at"}`` to ``VMAPCHECK_PAUSE_FILE`` (whole, by a rename) and then
  waits there until it is killed; after ``VMAPCHECK_PAUSE_MAX_S`` seconds (default 600)
  it exits with :data:`ABANDONED`, so a test that died never leaves it running;
- ``VMAPCHECK_PAUSE_FILE=<file>``: where (required with ``VMAPCHECK_PAUSE_AT``).

A label is ``<stage>:<event>#<n>``: the stage that runs (:func:`set_stage`, called by
:func:`vmapcheck.pipeline.stage.run_stage`; ``-`` outside a stage), the event, and which
time this process reaches it (1 the first). The events: ``start`` (the config is valid and
the stage's time record written), ``write <file name>`` (an atomic write whose temp file
is complete and not yet renamed into place, :mod:`vmapcheck.io`), ``end`` (the body
returned, its record not yet updated) and track's ``run created``, ``registered`` and
``run complete`` (:mod:`vmapcheck.pipeline.track`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

PAUSE_AT = "VMAPCHECK_PAUSE_AT"
PAUSE_FILE = "VMAPCHECK_PAUSE_FILE"
PAUSE_TRACE = "VMAPCHECK_PAUSE_TRACE"
PAUSE_MAX_S = "VMAPCHECK_PAUSE_MAX_S"
# The exit status of a process that waited at its pause point for PAUSE_MAX_S seconds
# and was never killed (a test that died): not 0, so nothing takes its outputs as done.
ABANDONED = 75

_stage: str | None = None
_passed: Counter[str] = Counter()


def set_stage(name: str | None) -> None:
    """The stage this process runs from now on (its labels' prefix); counts restart."""
    global _stage
    _stage = name
    _passed.clear()


def pause_point(event: str) -> None:
    """Mark ``event``: traced, and held here when it is the one asked for (module doc)."""
    at, trace = os.environ.get(PAUSE_AT), os.environ.get(PAUSE_TRACE)
    if not at and not trace:
        return
    _passed[event] += 1
    label = f"{_stage or '-'}:{event}#{_passed[event]}"
    if trace:
        with open(trace, "a", encoding="utf-8") as fh:
            fh.write(label + "\n")
    if at != label:
        return
    where = os.environ.get(PAUSE_FILE)
    if not where:
        print(f"vmapcheck: {PAUSE_AT}={at} needs {PAUSE_FILE}: not paused", file=sys.stderr)
        return
    path = Path(where)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"label": label, "pid": os.getpid(), "at": time.time()}))
    os.replace(tmp, path)
    deadline = time.monotonic() + float(os.environ.get(PAUSE_MAX_S) or 600)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print(
        f"vmapcheck: paused at {label} and never killed within {os.environ.get(PAUSE_MAX_S) or 600}"
        " s; exiting",
        file=sys.stderr,
    )
    os._exit(ABANDONED)
