"""The one clock vmapcheck reads for the times it records: a stage's start and end
(``reports/stages/<stage>.json``, vmapcheck.pipeline.stage) and the time a run is filed
at in MLflow (vmapcheck.tracking.clock checks it against the store).

A module-level function, so that a test sets another clock here for the whole process,
as ``faketime`` would (``monkeypatch.setattr(vmapcheck.clock, "now", ...)``). Kept on the
bottom floor, apart from MLflow: every stage reads it, and no stage but track loads the
tracking package.
"""

from __future__ import annotations

import time


def now() -> float:
    """Seconds since the epoch, from the system clock."""
    return time.time()
