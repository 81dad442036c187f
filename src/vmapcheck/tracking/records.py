"""The records ``track`` writes for the commands after it: ``reports/track.json``
(:class:`TrackReport`, read back by :func:`read_track_report`) with the registry's
outcome (:class:`RegistryOutcome`). No MLflow and no JAX here: ``vmapcheck summary``,
``reference`` and ``verdict`` read them.
"""

# No `from __future__ import annotations`: read_json_typed asks each TypedDict for its
# required keys at run time, which NotRequired inside a string annotation would hide.
from pathlib import Path
from typing import Literal, NotRequired, Required, TypedDict

from vmapcheck.io import read_json_typed


class OffTarget(TypedDict):
    """For a run off the deployment target that re-verified a version: the version
    ``@verified`` holds (None: none), whether the alias "stays" elsewhere or is "held" by
    the version re-verified, and how the run is off the target."""

    previous: str | None
    verified_alias: str
    off_target: str


class RegistryOutcome(TypedDict, total=False):
    """What :func:`vmapcheck.tracking.registry.register_if_verified` did, as
    ``reports/track.json``'s ``registry`` holds it. ``status`` always: "registered",
    "re-verified" or "not registered".

    "registered" (:func:`vmapcheck.tracking.registry.register_verified`): every key but
    ``why``: the model, the version's number and URI, the alias and where it stands
    (``verified_alias``: "moved", "pending" for
    :func:`vmapcheck.tracking.registry.move_verified_alias`, or "stays": off the
    target), the version ``@verified`` held before (None: none), why the run is off the
    deployment target (None: it is the target), the logged model's source and id, and
    the params' sha256. "re-verified": ``registered_model``, ``version`` and ``why``;
    off the target also the :class:`OffTarget` keys. "not registered": ``why``."""

    status: Required[Literal["registered", "re-verified", "not registered"]]
    why: str
    registered_model: str
    version: str
    uri: str
    alias: str
    previous: str | None
    verified_alias: str
    off_target: str | None
    source: str
    model_id: str
    params_sha256: str


class LoggedRun(TypedDict):
    """An MLflow run ``track`` logged: its id and name, the experiment's name and id, the
    store, the verdict ("passed" or "failed"; "unknown" for a run of this state logged
    before whose tag is gone), the git state it was made from
    (:func:`vmapcheck.provenance.git_state`), and, once the run is complete, the
    regression verdict's word. A run of the same state logged before
    (:func:`vmapcheck.tracking.attempts.settle_earlier_attempts`) says so
    (``logged_before``) and lacks the rewritten outputs."""

    run_id: str
    run_name: str
    experiment: str
    experiment_id: str
    tracking_uri: str
    verdict: str
    git_commit: str
    git_dirty: str
    git_outputs_rewritten: NotRequired[str]
    perf_verdict: NotRequired[str]
    logged_before: NotRequired[bool]


class TrackReport(LoggedRun):
    """``reports/track.json``: the :class:`LoggedRun` (its store named with no user name
    or password), the forward outputs it judged (their sha256: a reference made from the
    same outputs links to this run; None from a check that recorded none), and what the
    registry did with its params (absent for a run logged before)."""

    forward_outputs_sha256: str | None
    registry: NotRequired[RegistryOutcome]


def read_track_report(path: Path) -> TrackReport:
    """``path`` (``reports/track.json``) read back, every key :class:`TrackReport`
    requires present; an error names the file and the missing keys
    (:func:`vmapcheck.io.read_json_typed`)."""
    return read_json_typed(path, TrackReport)
