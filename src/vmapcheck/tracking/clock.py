"""The time a run is filed at, from a checked clock.

MLflow orders runs by their start time (``compare``'s "newest first", the baselines of
the performance verdict): with the system clock a year behind, a new run was filed in the
past and ``compare -n 2`` left it out. :func:`checked_start_ms` compares the clock's
reading with the newest run already in the store; a reading before it is said (one line
on stderr) and the run is filed 1 ms after that newest run, so the store's order stays
the order in which runs were made. The clock's own reading is kept in the run's tag
:data:`CLOCK_TAG`.

:func:`vmapcheck.clock.now` is the one clock it reads (tests set another clock there, as
``faketime`` would for the process).
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

from vmapcheck import clock as system_clock

# The run's tag holding what the clock read when it was filed later than that.
CLOCK_TAG = "clock_start"


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def newest_start_ms(client: Any) -> int | None:
    """The start time (ms) of the newest run of any active experiment of the store of
    ``client`` (an ``MlflowClient``), deleted runs included (they keep their place in the
    order), or None for an empty store."""
    from mlflow.entities import ViewType

    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    runs = client.search_runs(
        experiments,
        run_view_type=ViewType.ALL,
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return int(runs[0].info.start_time) if runs and runs[0].info.start_time else None


def checked_start_ms(client: Any, start_ms: int | None) -> tuple[int, dict[str, str]]:
    """The start time to file a new run at (ms since the epoch) and the tags that go with
    it: ``start_ms`` (None: :func:`now`), unless the store already holds a run that started
    at or after it; then 1 ms after that run, with the clock's reading in
    :data:`CLOCK_TAG` and a warning on stderr naming both times."""
    read = int(1000 * system_clock.now()) if start_ms is None else int(start_ms)
    newest = newest_start_ms(client)
    if newest is None or read > newest:
        return read, {}
    filed = newest + 1
    print(
        f"track: warning: the clock reads {_utc(read)}, not after the newest run in the "
        f"store ({_utc(newest)}): the system clock is behind, or was ahead then. This run is "
        f"filed at {_utc(filed)} so that newest-first lists keep the order runs were made "
        f"(its clock's reading is in tag {CLOCK_TAG}); check the clock (timedatectl)",
        file=sys.stderr,
    )
    return filed, {CLOCK_TAG: _utc(read)}
