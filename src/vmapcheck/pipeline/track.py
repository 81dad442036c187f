"""Stage `track`: one MLflow run with config, metrics, versions and artifacts.

Before logging it judges the benchmark against its baseline (bench.regression) and
writes the HTML report (reports/report.html), both logged with the run whatever the
verdict. A failed check does not fail this stage (DVC would keep no experiment of it):
the next stage, gate (vmapcheck.pipeline.gate), makes it the pipeline's exit status.

The store is opened first (vmapcheck.tracking.store): a tracking server that does not answer fails
the stage within seconds, naming its URI, and the reports stay on disk for the next
`dvc repro`; a run is logged once per pipeline state (tag ``pipeline_key``). Runs that
an earlier, killed ``track`` left unfinished are marked FAILED first, so they are never
taken as the baseline (only complete runs are).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmapcheck import clock
from vmapcheck.bench.timing.records import BenchDetails, read_bench_details
from vmapcheck.bench.verdict.baseline import record_from_details
from vmapcheck.bench.verdict.labels import verdict_headline
from vmapcheck.bench.verdict.regression import compare, format_table
from vmapcheck.check.schema import CheckDetails, read_check_details, read_diagnosis
from vmapcheck.config import Config, read_params
from vmapcheck.core.record import TrainMetrics
from vmapcheck.errors import ArtifactError, SettingsChangedError, VmapcheckError, first_line
from vmapcheck.io import atomic_write_json, atomic_write_text, read_json_typed
from vmapcheck.layout import Layout
from vmapcheck.params_io import ModelContract, read_model_contract
from vmapcheck.pause import pause_point
from vmapcheck.pipeline.stage import (
    LAST_STAGE,
    declared_params,
    leaf_digests,
    read_stage_times,
    settings_changed,
    stage_params,
    text_sha256,
)
from vmapcheck.provenance import git_state
from vmapcheck.report.html import render_report
from vmapcheck.report.summary import verdict_line
from vmapcheck.running import StageTime, dvc_run_began
from vmapcheck.tracking.attempts import mark_failed, pipeline_key, settle_earlier_attempts
from vmapcheck.tracking.baselines import resolve_baseline, run_of_timing
from vmapcheck.tracking.log import (
    experiment_name,
    log_diagnosis,
    log_perf_verdict,
    log_run,
    log_timeline,
    resolve_tracking_uri,
    run_name,
    run_start,
    verdict_note,
)
from vmapcheck.tracking.records import TrackReport
from vmapcheck.tracking.registry import (
    move_verified_alias,
    outcome_line,
    register_if_verified,
    settle_pending_alias,
)
from vmapcheck.tracking.review import registry_url, review_url
from vmapcheck.tracking.run_inputs import dvc_exp_name, gather_run_inputs, pip_freeze
from vmapcheck.tracking.server import reaching
from vmapcheck.tracking.sqlite_store import store_faults, writer_lock
from vmapcheck.tracking.store import (
    MODEL_CONTRACT_TAG,
    PIPELINE_KEY_TAG,
    mark_complete,
    model_experiments,
    open_store,
    resolve_artifact_root,
    store_root,
)
from vmapcheck.tracking.uri import shown

if TYPE_CHECKING:
    from vmapcheck.bench.verdict.records import PerfOutcome

# The verdict of a run whose bench DVC skipped: its timing was judged when it was made.
NOT_RERUN = "bench not rerun"


def bench_not_rerun(
    stages: dict[str, StageTime],
    dvc_began: float | None = None,
    timing_run: str | None = None,
) -> str | None:
    """Why this run has no timing of its own (None: bench ran in this pipeline run): DVC
    skipped bench (its inputs unchanged, e.g. only a tolerance changed), so its
    bench_details.json is an earlier run's, and comparing it would judge that timing
    against itself or again.

    ``dvc_began``: when the ``dvc`` process running track started
    (:func:`vmapcheck.running.dvc_run_began`); a bench that started before it
    is an earlier run's. None (track outside DVC): the chain of stages that ran one after
    another up to track (:func:`vmapcheck.tracking.log.run_start`), which cannot tell a
    skipped bench from one that ended less than ``RUN_GAP_S`` before (a tolerance changed
    a minute after a full run got a verdict of the old timing against itself). A run
    without stage records (track called by hand) is treated as fresh. ``timing_run``:
    the MLflow run that logged that timing, named when known
    (:func:`vmapcheck.tracking.baselines.run_of_timing`)."""
    bench, own = stages.get("bench"), stages.get(LAST_STAGE)
    if bench is None or own is None:
        return None
    began = float(bench["start"])
    # The same second of slack as refuse_changed_settings: a process's start time is
    # rounded, a stage's is not.
    if dvc_began is not None and began >= dvc_began - 1.0:
        return None
    if dvc_began is None and began >= run_start(stages, float(own["start"])):
        return None
    when = datetime.fromtimestamp(began, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    source = (
        f"timing from run {timing_run}, made at {when}" if timing_run else f"timing made at {when}"
    )
    return (
        f"bench not rerun: {source} (DVC skipped bench: its inputs are unchanged), judged when "
        "it was first logged; no new benchmark verdict"
    )


def judge_performance(
    config: Config,
    layout: Layout,
    bench: BenchDetails,
    exclude: str | None = None,
    stages: dict[str, StageTime] | None = None,
) -> PerfOutcome:
    """This run's benchmark (``bench``: its bench_details.json, parsed) against
    bench.regression.baseline (None: not compared). ``stages``: the stage time records;
    a run whose bench did not run now gets no verdict (:func:`bench_not_rerun`).

    A regression is reported (and logged), not fatal: latency on a shared machine is
    judged by people; the agreement checks gate the pipeline.
    """
    stale = bench_not_rerun(stages or {}, dvc_run_began())
    if stale is not None:
        # The run that logged that timing, by its span and its artifact (None: not in
        # this store).
        logged = run_of_timing(
            resolve_tracking_uri(config.tracking, layout.root),
            model_experiments(config),
            layout.bench_details,
            float((stages or {})["bench"]["start"]),
        )
        # The same finding, now naming the run that logged the timing.
        stale = bench_not_rerun(stages or {}, dvc_run_began(), timing_run=logged) or stale
        print(f"track: {stale}")
        return {"verdict": NOT_RERUN, "why": stale}
    spec = config.bench.regression.baseline
    if spec is None:
        return {"verdict": "not compared", "why": "bench.regression.baseline is null"}
    current = record_from_details(bench, str(layout.bench_details))
    tags = {
        "model": config.model.name,
        "backend": config.backend.name,
        "precision": config.precision.name,
    }
    # Never a run of another network of the same name (another width, other leaves): the
    # digest the bench stage recorded of what it timed.
    if current.context.get("model_contract"):
        tags[MODEL_CONTRACT_TAG] = current.context["model_contract"]
    uri = resolve_tracking_uri(config.tracking, layout.root)
    try:
        # This run is not logged yet: "last-verified" is the newest earlier one.
        # The same bench profile: a quick run is never judged against a full one.
        # Both layouts: the project's experiment, and this model's own from before.
        baseline = resolve_baseline(
            spec,
            uri,
            model_experiments(config),
            tags,
            exclude,
            params={"bench.name": config.bench.name},
        )
    except VmapcheckError as exc:
        print(f"track: no benchmark baseline ({exc})")
        return {"verdict": "no baseline", "why": str(exc)}
    regression = config.bench.regression
    result = compare(
        baseline, current, regression.factor, regression.alpha, config.bench.confidence_level
    )
    print(format_table(result))
    return result


def report_line(layout: Layout) -> str:
    """Where the HTML report is. In a queued experiment (``dvc queue start``) the stage
    runs in a temporary copy under the repository's .dvc/tmp, removed when the experiment
    ends: the line says how to get the report instead of naming a path about to go."""
    original = store_root(layout.root)
    if original == layout.root.resolve():
        return f"track: HTML report: {layout.html_report} (also an artifact of the run)"
    name = dvc_exp_name() or "<experiment>"
    return (
        f"track: HTML report: an artifact of the run (report.html); this queued "
        f"experiment's temporary copy goes when it ends: `dvc exp apply {name}` in "
        f"{original} puts it at {original / layout.html_report.relative_to(layout.root)}"
    )


# How to run several experiments without one rewriting the settings of another.
ONE_AT_A_TIME = (
    "run experiments one after another in this workspace, or queue them: `dvc exp run "
    "--queue -S ...` for each, then `dvc queue start` (each in its own copy; vmapcheck docs: "
    "server-and-sweeps.md)"
)


def refuse_changed_settings(layout: Layout, stages: dict[str, StageTime]) -> None:
    """Refuse to log a run whose stages did not all run with the params.yaml track read
    (:func:`vmapcheck.pipeline.stage.settings_changed`; the stages the ``dvc`` process
    running track ran, :func:`vmapcheck.running.dvc_run_began`), or whose
    params.yaml changed since track read it (the artifact logged would not be what track
    ran with).

    Raises:
        SettingsChangedError: naming each stage and key, or the file.
    """
    # Only the stages this `dvc` process ran (outside DVC: none): one DVC skipped, or that
    # `dvc repro --single-item` left as it was, ran with settings DVC tracks (`dvc status`).
    began = dvc_run_began()
    changed = (
        settings_changed(
            {name: r for name, r in stages.items() if float(r["start"]) >= began - 1.0},
            LAST_STAGE,
        )
        if began is not None
        else {}
    )
    if changed:
        where = "; ".join(f"{stage}: {', '.join(keys)}" for stage, keys in changed.items())
        raise SettingsChangedError(
            "params.yaml changed during this run, so its stages ran with different settings "
            f"(other values than track read, of {where}): another `dvc exp run` in this "
            "workspace rewrote it? Nothing is logged or registered; " + ONE_AT_A_TIME
        )
    refuse_stale_outputs(layout, stages, skip=set(changed))
    own = stage_params(stages, LAST_STAGE)
    mine = own.get("file_sha256") if own else None
    if mine is not None:
        text, _ = read_params(layout.params_yaml)
        if text_sha256(text) != mine:
            raise SettingsChangedError(
                f"{layout.params_yaml} changed while track ran: the settings it would log "
                "are not the ones it read. Nothing is logged or registered; " + ONE_AT_A_TIME
            )


def _same(recorded: Any, now: str | None) -> bool:
    """A recorded leaf digest and today's agree (a record may keep a longer digest)."""
    if not isinstance(recorded, str) or now is None:
        return recorded is None and now is None
    return recorded.startswith(now) or now.startswith(recorded)


def stale_outputs(layout: Layout, stages: dict[str, StageTime]) -> dict[str, list[str]]:
    """Per stage, the leaves of its own params keys (``train.steps``) whose values in
    params.yaml now differ from those it ran with (its time record, a DVC output that
    travels with the stage's other outputs): the outputs in the workspace were not made
    with the settings params.yaml, and so dvc.lock, say. Empty when all agree; a record
    without leaves (written before stages kept them) is compared by key."""
    _, raw = read_params(layout.params_yaml)
    own = stage_params(stages, LAST_STAGE)
    now_keys = (own.get("sha256") if own else None) or {}
    # Only the stages dvc.yaml has now: a record left by a stage since removed or renamed
    # made no output this run uses.
    current = declared_params(layout)
    stale: dict[str, list[str]] = {}
    for name, record in stages.items():
        theirs = record.get("params") if name != LAST_STAGE else None
        if not theirs or (current and name not in current):
            continue
        leaves = theirs.get("leaves")
        if isinstance(leaves, dict):
            now = leaf_digests(raw, list(theirs.get("keys", [])))
            keys = sorted(k for k in set(leaves) | set(now) if not _same(leaves.get(k), now.get(k)))
        else:
            keys = [k for k in theirs.get("keys", []) if theirs["sha256"].get(k) != now_keys.get(k)]
        if keys:
            stale[name] = keys
    return stale


def refuse_stale_outputs(
    layout: Layout, stages: dict[str, StageTime], skip: set[str] | None = None
) -> None:
    """Refuse to log or register a run whose stages' outputs were made with other values
    than params.yaml holds (:func:`stale_outputs`), e.g. params.yaml edited while train
    ran: DVC wrote the new values into dvc.lock when train ended, so the next ``dvc
    repro`` skips train and would register @verified with ``train.steps`` that did not
    make its params. ``skip``: stages already named by :func:`refuse_changed_settings`.

    Raises:
        SettingsChangedError: naming each stage and leaf, and the command that remakes them.
    """
    found = stale_outputs(layout, stages)
    # In dvc.yaml's order: the first is the one to rerun (DVC reruns those after it).
    order = [*declared_params(layout), *found]
    stale = {
        name: found[name]
        for name in dict.fromkeys(order)
        if name in found and name not in (skip or set())
    }
    if not stale:
        return
    where = "; ".join(f"{stage}: {', '.join(keys)}" for stage, keys in stale.items())
    first = next(iter(stale))
    raise SettingsChangedError(
        f"the outputs of stage(s) {', '.join(stale)} were made with other settings than "
        f"{layout.params_yaml} holds now ({where}): it was edited while they ran, and "
        "dvc.lock recorded the new values. Nothing is logged or registered, so the "
        "registered version, its metrics and dvc.lock never disagree; remake them with "
        f"`dvc repro --force --single-item {first}`, then `dvc repro`"
    )


def refuse_full_cache(layout: Layout) -> None:
    """Refuse to start when the DVC cache has no room for track's outputs
    (:func:`dvc_cache_problem`): DVC caches them after track ends, so it would fail only
    after track logged the run and moved @verified.

    Raises:
        ArtifactError: naming the folder, its free space and what is needed.
    """
    problem = dvc_cache_problem(layout)
    if problem is not None:
        raise ArtifactError(
            f"{problem} (DVC caches them after track ends, and would fail after @verified "
            "moved): nothing is logged or registered. Free space there, then `dvc repro` "
            "again"
        )


def local_artifact_folder(config: Config, layout: Layout, uri: str) -> Path | None:
    """The folder this run's artifacts go to, named when a write there fails for lack of
    room: the experiment's own artifact location when it exists in the store (it may be
    another folder than the config says: one set when the experiment was made), else the
    configured root; None for a server's own store."""
    from mlflow.tracking import MlflowClient

    location = resolve_artifact_root(config.tracking, layout.root) or ""
    if not uri.startswith("sqlite:"):
        return None  # a server's store: not asked here (a dead one would be waited for)
    with contextlib.suppress(Exception):  # no store or experiment yet: the config's root
        found = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment_name(config))
        if found is not None and found.artifact_location:
            location = found.artifact_location
    path = location.removeprefix("file://")
    return Path(path) if path.startswith("/") else None


def run(config: Config, layout: Layout) -> int:
    # First: a run whose settings changed under it is never logged (nor its store opened).
    refuse_changed_settings(layout, read_stage_times(layout))
    refuse_full_cache(layout)
    # MLflow draws a progress bar for each artifact it downloads (the registry's checks of
    # a few kB of params): noise among the stage's lines, unless the user asked for them.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Before any work: a stopped server fails here, naming its URI. The lock makes parallel
    # experiments (dvc queue start -j N) take turns on a sqlite store.
    uri = open_store(config.tracking, layout.root)
    folder = local_artifact_folder(config, layout, uri)
    with reaching(uri, config.tracking), writer_lock(uri), store_faults(uri, folder):
        return track(config, layout)


def track(config: Config, layout: Layout) -> int:
    """Judge the benchmark, write the HTML report, log the run (once per pipeline state)."""
    key = pipeline_key(layout.root)
    # Before the baseline is looked for: a half-logged run of an earlier attempt, and any
    # run left RUNNING by a track that is gone, is marked FAILED; a complete run of this
    # state is kept and nothing is logged twice (vmapcheck.tracking.store).
    uri = resolve_tracking_uri(config.tracking, layout.root)
    earlier = settle_earlier_attempts(uri, key)
    # `pip freeze` (a subprocess, ~0.5 s) runs while this process judges the benchmark and
    # writes the report; a state logged before needs none.
    freezing = ThreadPoolExecutor(max_workers=1) if earlier is None else None
    frozen = freezing.submit(pip_freeze) if freezing is not None else None
    # A track that died after completing its run but before moving alias `verified` (this
    # state's, when `earlier` is it, or another's): the move is made now.
    # Not while DVC's cache has no room for this stage's outputs (complete_run).
    no_room = dvc_cache_problem(layout)
    if config.registry.registered_model is not None and no_room is None:
        for line in settle_pending_alias(uri, config.registry.registered_model):
            print(f"track: registry: {line}")
    check = read_check_details(layout.check_details)
    bench = read_bench_details(layout.bench_details)
    train = read_json_typed(layout.train_report, TrainMetrics)
    contract = read_model_contract(layout.contract)
    git = git_state(layout.root)
    # The run spans this pipeline run: from the start of its first stage that ran now (not
    # one DVC skipped: its record is an earlier run's) to the end of this one.
    stages = read_stage_times(layout)
    perf = judge_performance(
        config, layout, bench, exclude=earlier["run_id"] if earlier else None, stages=stages
    )
    atomic_write_json(layout.perf_verdict, perf)
    # One name for the report and the run: it carries the DVC experiment's name, if any.
    name = run_name(config, check["runtime"], git, dvc_exp_name())
    start_ms = int(1000 * run_start(stages, clock.now()))
    # Written before logging: a failed check is reported (and logged) like a passed one.
    reports = RunReports(check, bench, train, contract, perf, git)
    write_report(config, layout, reports, name)
    # Again just before logging: params.yaml is logged as it is on disk now.
    refuse_changed_settings(layout, read_stage_times(layout))
    if earlier is None:
        assert frozen is not None and freezing is not None  # started above for this case
        requirements = frozen.result()
        freezing.shutdown()
        info = create_run(
            config,
            layout,
            reports,
            extra_tags={PIPELINE_KEY_TAG: key},
            frozen=requirements,
            name=name,
            start_ms=start_ms,
        )
        complete_run(config, layout, info, check, perf, stages)
    else:
        info = {**earlier, "forward_outputs_sha256": check.get("forward_outputs_sha256")}
    return announce(layout, info, logged_now=earlier is None, check=check, bench=bench)


@dataclass(frozen=True)
class RunReports:
    """What this pipeline run wrote and track judged, read once: the HTML report and the
    MLflow run are made from it."""

    check: CheckDetails
    bench: BenchDetails
    train: TrainMetrics  # reports/train.json
    contract: ModelContract  # data/params/contract.json: the model's input and output contract
    perf: PerfOutcome  # the timing verdict (reports/perf_verdict.json)
    git: dict[str, str]  # commit and dirty state (vmapcheck.provenance.git_state)


def write_report(config: Config, layout: Layout, reports: RunReports, name: str) -> None:
    """Write the HTML report (layout.html_report) of this run, named ``name``."""
    perf = reports.perf
    report = render_report(
        reports.check,
        reports.bench,
        reports.train,
        reports.contract,
        perf=perf,
        git=reports.git,
        run={
            "MLflow experiment": experiment_name(config),
            "MLflow run name": name,
            "config (model, precision, backend, bench)": (
                f"{config.model.name}, {config.precision.name}, {config.backend.name}, "
                f"{config.bench.name}"
            ),
            "benchmark vs baseline": verdict_headline(perf),
        },
        # The bench stage drew them from the same bench_details.json: not drawn again.
        drawn_plots={
            plot_id: path.read_bytes()
            for plot_id, path in (
                ("plot-latency", layout.latency_png),
                ("plot-speedup", layout.speedup_png),
            )
            if path.is_file()
        },
        # The check stage's diagnosis of a failed check (where the paths first diverge).
        diagnosis=read_diagnosis(layout.diagnosis) if layout.diagnosis.is_file() else None,
    )
    atomic_write_text(layout.html_report, report)


def run_artifacts(layout: Layout) -> list[Path]:
    """The files and folders a run holds (those that exist are logged)."""
    return [
        layout.html_report,
        layout.check_report,
        layout.check_details,
        layout.bench_report,
        layout.bench_details,
        layout.perf_verdict,
        layout.train_report,
        # The diagnosis of a failed check (the first stage, layer and leaf that diverge).
        layout.diagnosis,
        layout.diagnosis_text,
        layout.plots,
        layout.params,
        layout.contract,
        layout.cases_manifest,
        layout.params_yaml,
        layout.dvc_lock,
    ]


def create_run(
    config: Config,
    layout: Layout,
    reports: RunReports,
    extra_tags: dict[str, str],
    frozen: str,
    name: str,
    start_ms: int,
) -> TrackReport:
    """Log the run with its artifacts, left RUNNING for :func:`complete_run`; return
    :func:`vmapcheck.tracking.log.log_run`'s ids. ``frozen``: ``pip freeze``'s output."""
    # Datasets (full sha256 digests), dvc.lock digest, DVC experiment name, environment/.
    with tempfile.TemporaryDirectory() as scratch:
        inputs = gather_run_inputs(layout, Path(scratch), frozen=frozen)
        return log_run(
            config,
            layout.root,
            reports.check,
            reports.bench,
            reports.train,
            [*run_artifacts(layout), inputs.environment],
            reports.contract,
            extra_tags={**inputs.tags, **extra_tags},
            datasets=inputs.datasets,
            finish=False,  # RUNNING until mark_complete in complete_run
            name=name,
            start_time=start_ms,
            note=verdict_note(reports.check, reports.bench, reports.perf),
        )


def complete_run(
    config: Config,
    layout: Layout,
    info: TrackReport,
    check: CheckDetails,
    perf: PerfOutcome,
    stages: dict[str, StageTime],
) -> None:
    """The run's last writes (verdict, diagnosis, registry, timeline), then mark it
    complete and move alias `verified` if the registry made a version. ``info`` gains
    ``perf_verdict`` and ``registry``. An error marks the run FAILED, then propagates."""
    pause_point("run created")  # RUNNING, not complete: a test may kill track here
    try:
        log_perf_verdict(info["tracking_uri"], info["run_id"], perf)
        log_diagnosis(info["tracking_uri"], info["run_id"], read_diagnosis(layout.diagnosis))
        info["perf_verdict"] = perf["verdict"]
        # Registry: a passing run's params become a new version; alias `verified` moves
        # to it only once the run is complete (below).
        info["registry"] = register_if_verified(
            config, info, check["runtime"], layout.params, move_alias=False
        )
        pause_point("registered")
        # This stage's own record has no end yet: it ends now, as the run does.
        log_timeline(info["tracking_uri"], info["run_id"], stages, time.time())
        # The run's last writes (pipeline_complete, then FINISHED, or FAILED for a failed
        # check, so that the runs list shows it at a glance): an attempt that dies
        # before them is marked FAILED by the next track, and this state logged afresh.
        mark_complete(info["tracking_uri"], info["run_id"], info["verdict"])
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the store may be what failed
            mark_failed(
                info["tracking_uri"],
                info["run_id"],
                f"track failed before completing it: {type(exc).__name__}: {first_line(exc)}",
            )
        raise
    pause_point("run complete")  # the alias move (if any) not yet made
    # The alias moves only once DVC can keep this stage's outputs: with its cache full,
    # DVC fails after this stage and would leave @verified on a run its lock does not
    # record. Left pending, the next track (the rerun, once there is room) moves it.
    no_room = dvc_cache_problem(layout) if info["registry"].get("verified_alias") else None
    if info["registry"].get("verified_alias") == "pending" and no_room is None:
        move_verified_alias(info["tracking_uri"], info["registry"])
        info["registry"]["verified_alias"] = "moved"
    if info["registry"].get("verified_alias") == "pending":
        print(
            f"track: registry: params registered as {info['registry']['uri']}; alias "
            f"verified NOT moved to it yet: {no_room}. The move is pending: free space, "
            "then `dvc repro` (the next track makes it)"
        )
    else:
        print(f"track: registry: {outcome_line(info['registry'])}")
    version_page = registry_url(info)
    if version_page:
        print(f"track: registry: open the version: {version_page}")


# What DVC's cache must have free after track for the outputs it caches then (track's
# and gate's: a few small JSON files and the HTML report), beyond the report's size.
CACHE_SLACK_BYTES = 8 * 2**20


def dvc_cache_folder(layout: Layout) -> Path | None:
    """The DVC cache of this project (``cache.dir`` of ``.dvc/config`` or
    ``config.local``, relative to ``.dvc/``; default ``.dvc/cache``) of the repository
    DVC runs in (a queued experiment's: the original's, vmapcheck.tracking.store); None
    outside a DVC project."""
    import configparser

    dvc = store_root(layout.root) / ".dvc"
    if not dvc.is_dir():
        return None
    folder = dvc / "cache"
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(dvc / name)
            if parser.has_option("cache", "dir"):
                folder = dvc / parser.get("cache", "dir").strip().strip("'\"")
    return folder


def dvc_cache_problem(layout: Layout, need: int | None = None) -> str | None:
    """Why DVC could not cache this stage's outputs now (None: it can): its cache's disk
    has less free than ``need`` bytes (default: the HTML report's size and
    :data:`CACHE_SLACK_BYTES`)."""
    folder = dvc_cache_folder(layout)
    if folder is None:
        return None
    if need is None:
        report = layout.html_report
        need = (report.stat().st_size if report.is_file() else 0) + CACHE_SLACK_BYTES
    probe_at = folder
    while not probe_at.exists() and probe_at != probe_at.parent:
        probe_at = probe_at.parent
    try:
        free = shutil.disk_usage(probe_at).free
    except OSError as exc:
        return f"the DVC cache {folder} cannot be read ({exc.strerror or exc})"
    if free >= need:
        return None
    return (
        f"the DVC cache {folder} has {free / 2**20:.1f} MB free, under the "
        f"{need / 2**20:.1f} MB this stage's outputs need there"
    )


def announce(
    layout: Layout,
    info: TrackReport,
    logged_now: bool,
    check: CheckDetails,
    bench: BenchDetails,
) -> int:
    """Write track_report.json, print where the run and the report are and the verdict;
    return the stage's exit code: 0 whatever the verdict (the stage gate exits non-zero
    on a failed one)."""
    # The report and the terminal name the store without a user name or password: a
    # server's URI may carry them (MLFLOW_TRACKING_URI in a CI job).
    info = {**info, "tracking_uri": shown(info["tracking_uri"])}
    atomic_write_json(layout.track_report, info)
    logged = "logged" if logged_now else "the same inputs were logged before (not again):"
    print(f"track: {logged} run {info['run_id']} ({info['run_name']}) to {info['tracking_uri']}")
    print(report_line(layout))
    # The last lines of `dvc repro` and `dvc exp run`: the verdict and where to review it.
    print(verdict_line(check, bench))
    print(f"open the run: {review_url(info)}")
    # A failed verdict is data, logged above: track succeeds, so that `dvc exp run` keeps
    # the failed run as an experiment; the last stage, gate, turns it into the exit
    # status (vmapcheck.pipeline.gate).
    if info["verdict"] != "passed":
        print("track: the check FAILED (logged above); the stage gate decides the exit status")
    replay = bench.get("replay", {}).get("figures", {})
    if replay and not replay["passed"]:
        print(
            "track: the guard's replay FAILED (compiles above the bucket count, or a request "
            "got another outcome than planted; logged above as replay/*); the stage gate "
            "decides the exit status"
        )
    return 0
