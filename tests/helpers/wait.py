"""Waiting in tests for something another process does (a server answering, a file
appearing, a stage reaching its pause point), on a machine at any load.

A busy CI machine (load 15 on two cores: `scripts/load`) runs every process many times
slower than a quiet one, so a test must not bet on how long a step takes: it polls for
the event, with backoff (a quick first look, then ever fewer looks, which would otherwise
take CPU from the very process it waits for), and gives up only after :data:`HANG_S`,
a limit that only a hang reaches. A subprocess's or a request's ``timeout=`` is such a
limit too: :data:`HANG_S` for a step, :data:`COMMAND_HANG_S` for a whole pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

# Only a hang takes this long: the slowest wait for another process seen at load 15 on
# two cores (an `mlflow server` starting: tens of seconds) many times over. It exists so
# that a stuck process fails the test with a message instead of holding CI until its
# own limit.
HANG_S = 900.0
# The same for a whole command that runs pipelines (`dvc repro`, `dvc exp run`, a
# numerics sweep): a few minutes quiet, eight times that at load 15 on two cores.
COMMAND_HANG_S = 3600.0


def polls(
    what: str,
    limit_s: float = HANG_S,
    first_s: float = 0.05,
    most_s: float = 1.0,
    detail: Callable[[], str] | None = None,
) -> Iterator[float]:
    """Yield the seconds waited so far, sleeping between yields: ``first_s`` at first,
    doubling up to ``most_s``. The caller breaks out once the event happened. After
    ``limit_s`` it raises AssertionError ``"<what> not within <limit_s> s"``, followed by
    what ``detail()`` returns then (e.g. the tail of the process's log).

    ``for waited in polls("the server answers"): if answer(): break``
    """
    started = time.monotonic()
    pause = first_s
    while True:
        waited = time.monotonic() - started
        if waited > limit_s:
            said = f":\n{detail()}" if detail is not None else ""
            raise AssertionError(f"{what} not within {limit_s:g} s{said}")
        yield waited
        time.sleep(pause)
        pause = min(pause * 2, most_s)
