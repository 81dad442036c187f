"""Where to review a run: the MLflow run's lines of the printed verdict, and
``vmapcheck summary`` itself (``make demo`` ends with it).

The verdict's own lines (cases, refusals, reference, the benchmark's figures) are
:func:`vmapcheck.report.summary.summarize`'s; this module adds what only the tracking
floor knows: the run's page on the tracking server or in ``vmapcheck ui``, and what the
registry did with its params.
"""

from __future__ import annotations

import sys

from vmapcheck.errors import ArtifactError
from vmapcheck.layout import Layout
from vmapcheck.report.summary import summarize
from vmapcheck.running import failed_stages, killed_stages
from vmapcheck.tracking.records import TrackReport, read_track_report
from vmapcheck.tracking.ui import model_version_url, run_url, ui_base


def review_url(track: TrackReport) -> str:
    """Where to open the run of ``track`` (reports/track.json): its page on the tracking
    server, or for the local store `vmapcheck ui`, then its page there (MLflow's ML view,
    not its GenAI one: vmapcheck.tracking.ui)."""
    base, first = ui_base(str(track["tracking_uri"]))
    page = run_url(base, track["experiment_id"], track["run_id"])
    return f"{first}, then {page}" if first else page


def registry_url(track: TrackReport) -> str | None:
    """Where to open the model version that ``track`` (reports/track.json) registered or
    re-verified, as :func:`review_url` says it; None when it made or names none."""
    registered = track.get("registry")
    if not registered or not registered.get("registered_model") or not registered.get("version"):
        return None
    base, first = ui_base(str(track["tracking_uri"]))
    page = model_version_url(base, registered["registered_model"], registered["version"])
    return f"{first}, then {page}" if first else page


def tracked_lines(layout: Layout) -> list[str]:
    """The MLflow run of ``track`` (reports/track.json): its id, name, experiment and
    store, where to open it, and what the registry did with its params; a line saying
    there is none yet when ``track`` has not run."""
    if not layout.track_report.exists():
        return ["MLflow run: none yet (the track stage has not run)"]
    track = read_track_report(layout.track_report)
    lines: list[str] = []
    lines.append(
        f"MLflow run: {track['run_id']} ({track['run_name']}) in experiment "
        f"'{track['experiment']}' at {track['tracking_uri']}"
    )
    lines.append(f"open it: {review_url(track)}")
    lines.append("compare it with earlier runs (every model): vmapcheck compare")
    registered = track.get("registry")  # vmapcheck.tracking.registry.register_if_verified
    if registered and registered.get("off_target"):
        from vmapcheck.tracking.registry import outcome_line  # imports jax: only here

        lines.append(f"registry: {outcome_line(registered)}")
    elif registered and registered["status"] == "registered":
        lines.append(
            f"registry: params registered as {registered['uri']}, alias verified moved "
            "to it (vmapcheck registry lists the versions, vmapcheck rollback moves it back)"
        )
    elif registered:
        lines.append(f"registry: {registered['status']}: {registered['why']}")
    version_page = registry_url(track)
    if version_page:
        lines.append(f"registry: open the version: {version_page}")
    return lines


def run_summary(layout: Layout, repro_status: int = 0) -> int:
    """``vmapcheck summary``: print :func:`summarize`; exit 1 when the reports are missing.

    ``repro_status``: the exit status of the ``dvc repro`` that just ran (``make demo``);
    when not 0, a note says the figures may be from an earlier run."""
    if repro_status != 0:
        print(
            f"dvc repro exited {repro_status}. If `gate` failed, the verdict below is this "
            "run's and it failed; if a stage before it failed (see its error above), the "
            "figures below are from an earlier run: `dvc status` lists what is stale."
        )
    # A stage the system killed (out of memory: DVC says only "exited with -9") is named,
    # and a stage that stopped on an error (train refusing NaN params) says why.
    for line in killed_stages(layout) + failed_stages(layout):
        print(f"summary: {line}")
    try:
        print(summarize(layout, tracked_lines(layout)))
    except ArtifactError as exc:
        print(f"summary: {exc}", file=sys.stderr)
        return 1
    return 0
