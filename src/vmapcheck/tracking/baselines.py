"""Benchmarks read from the MLflow store: the baselines of the regression verdict
(:mod:`vmapcheck.bench.verdict.regression`) and the ``vmapcheck verdict`` command.

- a run's ``bench_details.json`` artifact as a
  :class:`~vmapcheck.bench.verdict.baseline.BenchRecord` (:func:`bench_from_run`), read
  only from a complete run;
- the baseline named on the command line (:func:`resolve_baseline`): a file, a run id,
  or ``last-verified``, the newest complete passed run of the same model, backend and
  precision other than the run judged (:func:`last_verified_run`,
  :func:`run_of_reports`);
- the run that logged a timing (:func:`run_of_timing`, :func:`run_of_reports`);
- :func:`run_verdict`: ``vmapcheck verdict``, which resolves both runs here and has
  :mod:`vmapcheck.bench.verdict.regression` judge them.

A store that does not exist is told without opening it (:func:`missing_store`).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vmapcheck.bench.verdict.baseline import BenchRecord, read_bench_file, record_from_details
from vmapcheck.bench.verdict.regression import compare, report_verdict
from vmapcheck.config import load_config
from vmapcheck.errors import ArtifactError, ConfigError, VmapcheckError
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.layout import Layout
from vmapcheck.tracking.store import (
    MODEL_CONTRACT_TAG,
    complete_filter,
    incomplete_because,
    model_experiments,
    resolve_tracking_uri,
)
from vmapcheck.tracking.uri import sqlite_file

LAST_VERIFIED = "last-verified"
# Logged by track under its own file name (Layout.bench_details).
BENCH_ARTIFACT = Layout(Path()).bench_details.name


class NoBaselineError(ArtifactError):
    """``last-verified`` found no complete passed run to judge against."""


def missing_store(tracking_uri: str) -> str | None:
    """Why the store at ``tracking_uri`` can hold no run, known without opening it: a
    local sqlite file or file store that does not exist (no run was ever logged there).
    None when it exists or cannot be told from here (a server must be asked).

    Opening a missing sqlite store would create it and run every MLflow migration (10 s
    and more on a loaded machine) only to find nothing, and leave an empty store behind.
    """
    if (database := sqlite_file(tracking_uri)) is not None:
        where = database
    elif tracking_uri.startswith("file://"):
        where = Path(tracking_uri.removeprefix("file://"))
    elif "://" not in tracking_uri:
        where = Path(tracking_uri)
    else:
        return None
    return None if where.exists() else f"no MLflow store at {where} (no run logged there yet)"


def _client(tracking_uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def bench_from_run(tracking_uri: str, run_id: str, role: str = "baseline") -> BenchRecord:
    """The ``bench_details.json`` artifact of MLflow run ``run_id``, a complete run
    (vmapcheck.tracking.store.is_complete).

    Raises:
        ArtifactError: the run does not exist, is deleted or incomplete (a ``track`` that
            did not finish), or has no such artifact.
    """
    from mlflow.exceptions import MlflowException

    # "baseline run '<id>'", "current run '<id>'"
    named = f"{role} {run_id!r}" if role.endswith("run") else f"{role} run {run_id!r}"
    client = _client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise ArtifactError(f"{named} not found in {tracking_uri}: {exc.message}") from None
    why = incomplete_because(run)
    if why is not None:
        raise ArtifactError(
            f"{named} in {tracking_uri} is not a complete run: {why}. Only "
            "complete runs (ended by track, pipeline_complete=true, a verdict) are compared"
        )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, BENCH_ARTIFACT, tmp)
        except (MlflowException, OSError) as exc:
            raise ArtifactError(
                f"{named} in {tracking_uri} has no {BENCH_ARTIFACT} artifact: {exc}"
            ) from None
        return record_from_details(read_json(Path(local)), f"run {run_id}")


def last_verified_run(
    tracking_uri: str,
    experiment: str | Sequence[str],
    tags: dict[str, str],
    exclude: str | None = None,
    params: dict[str, str] | None = None,
) -> str | None:
    """Id of the newest complete run (vmapcheck.tracking.store.COMPLETE_FILTER) of
    ``experiment`` (a name, or several: vmapcheck.tracking.store.model_experiments, the
    project's experiment and the older one per model) with tag verdict=passed, ``tags``
    and ``params`` equal (e.g. ``{"bench.name": "full"}``: a run of another bench profile
    is not comparable). Experiments that do not exist are skipped."""
    client = _client(tracking_uri)
    names = [experiment] if isinstance(experiment, str) else list(experiment)
    ids = [e.experiment_id for e in map(client.get_experiment_by_name, names) if e is not None]
    if not ids:
        return None
    conditions = ["tags.verdict = 'passed'"] + [
        f"tags.{key} = '{value}'" for key, value in sorted(tags.items())
    ]
    conditions += [f"params.`{key}` = '{value}'" for key, value in sorted((params or {}).items())]
    runs = client.search_runs(
        ids,
        filter_string=complete_filter(*conditions),
        order_by=["attributes.start_time DESC"],
        max_results=10,
    )
    for run in runs:
        if run.info.run_id != exclude:
            return run.info.run_id
    return None


def resolve_baseline(
    spec: str,
    tracking_uri: str | None = None,
    experiment: str | Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
    exclude: str | None = None,
    role: str = "baseline",
    params: dict[str, str] | None = None,
) -> BenchRecord:
    """The baseline named by ``spec``: a file, an MLflow run id, or ``last-verified``
    (``role``: what the messages call it, "baseline" or "current run"; ``tags`` and
    ``params``: what ``last-verified``'s run must have equal, :func:`last_verified_run`).

    Raises:
        ConfigError: ``spec`` names none of these (the message says what was tried).
        ArtifactError: the file or run exists but holds no usable benchmark.
    """
    if Path(spec).is_file():
        return read_bench_file(Path(spec))
    if spec.endswith(".json"):
        raise ArtifactError(
            f"{role} {spec!r}: no such file (reports/bench_details.json is written by the "
            "bench stage: run the pipeline first)"
        )
    if tracking_uri is None:
        raise ConfigError(f"{role} {spec!r}: no such file, and no MLflow store to look in")
    absent = missing_store(tracking_uri)
    if spec == LAST_VERIFIED:
        if absent:
            raise NoBaselineError(f"{role} {LAST_VERIFIED}: {absent}")
        run_id = last_verified_run(tracking_uri, experiment or [], tags or {}, exclude, params)
        if run_id is None:
            equal = (tags or {}) | (params or {})
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(equal.items()))
            other = f" other than run {exclude} (the run judged)" if exclude else ""
            names = [experiment] if isinstance(experiment, str) else list(experiment or [])
            where = " or ".join(repr(n) for n in names) or "''"
            raise NoBaselineError(
                f"{role} {LAST_VERIFIED}: no complete passed run with {wanted or 'any tags'}"
                f"{other} in experiment {where} of {tracking_uri}"
            )
        return bench_from_run(tracking_uri, run_id, role)
    if len(spec) == 32 and all(c in "0123456789abcdef" for c in spec):
        if absent:
            raise ArtifactError(f"{role} run {spec!r}: {absent}")
        return bench_from_run(tracking_uri, spec, role)
    raise ConfigError(
        f"{role} {spec!r}: expected a bench_details.json file, an MLflow run id "
        f"(32 hex digits) or {LAST_VERIFIED!r}"
    )


def run_of_timing(
    tracking_uri: str, experiments: Sequence[str], details: Path, made_at: float
) -> str | None:
    """The complete MLflow run that logged the timing in ``details`` (a
    ``bench_details.json``) made at ``made_at`` (seconds since the epoch: the bench
    stage's start): a run of ``experiments`` whose span (the pipeline run, from its first
    stage to its track) holds that moment and whose ``bench_details.json`` artifact is
    this very file. None when none is found, or the store does not exist.

    A rerun track cannot read the run from ``reports/track.json``: DVC removes a stage's
    outputs before it runs it."""
    if missing_store(tracking_uri):
        return None
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    ids = [e.experiment_id for e in map(client.get_experiment_by_name, experiments) if e]
    if not ids:
        return None
    moment = int(made_at * 1000)
    runs = client.search_runs(
        ids,
        filter_string=complete_filter(f"attributes.start_time <= {moment}"),
        order_by=["attributes.start_time DESC"],
        max_results=5,
    )
    wanted = details.read_bytes()
    for run in runs:
        if run.info.end_time is None or run.info.end_time < moment:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                logged = client.download_artifacts(run.info.run_id, BENCH_ARTIFACT, tmp)
            except (MlflowException, OSError):
                continue
            if Path(logged).read_bytes() == wanted:
                return run.info.run_id
    return None


def run_of_reports(layout: Layout, tracking_uri: str) -> str | None:
    """The MLflow run that logged the benchmark now in ``layout.bench_details``: the run
    ``reports/track.json`` names, when that run's ``bench_details.json`` artifact is this
    very file. None when there is no track.json, its run is not in this store, or the
    benchmark ran again since (then that run is a fair baseline)."""
    if not layout.track_report.is_file() or missing_store(tracking_uri):
        return None
    from mlflow.exceptions import MlflowException

    # Read as found, not through read_track_report: a report lacking a key still names its
    # run, and only the run id matters here. A file that is not JSON is an error naming it.
    track = read_json(layout.track_report)
    run_id = track.get("run_id") if isinstance(track, dict) else None
    if not isinstance(run_id, str):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            logged = _client(tracking_uri).download_artifacts(run_id, BENCH_ARTIFACT, tmp)
        except (MlflowException, OSError):
            return None
        same = Path(logged).read_bytes() == layout.bench_details.read_bytes()
    return run_id if same else None


def run_verdict(
    layout: Layout,
    baseline: str,
    current: str | None = None,
    factor: float | None = None,
    alpha: float | None = None,
    out: Path | None = None,
    require_same: Iterable[str] = (),
) -> int:
    """``vmapcheck verdict``: judge ``current`` (default: ``layout.bench_details``) against
    ``baseline`` and print the table. Exit 1 on a regression, 2 when either cannot be
    read, else 0 (also when ``last-verified`` finds no run to compare with, and when the
    runs are not comparable: it says so and why). ``factor``/``alpha`` None: the config's
    ``bench.regression``; ``require_same``: optional context keys that must be equal too
    (:func:`vmapcheck.bench.verdict.regression.compare`)."""
    current = str(layout.bench_details) if current is None else current
    try:
        config = load_config(layout.params_yaml)
        uri = resolve_tracking_uri(config.tracking, layout.root)
        tags = {
            "model": config.model.name,
            "backend": config.backend.name,
            "precision": config.precision.name,
        }
        # This model's runs in the project's experiment and in its own from before.
        experiment = model_experiments(config)
        judged = resolve_baseline(current, uri, experiment, tags, role="current run")
        exclude = _run_id(current)
        if exclude is None and Path(current).resolve() == layout.bench_details.resolve():
            exclude = run_of_reports(layout, uri)
        # last-verified: a run of the judged run's bench profile and of the same network
        # (another is not comparable; a run recorded before contracts were is not taken).
        profile = {"bench.name": judged.context["bench"]} if judged.context.get("bench") else {}
        if judged.context.get("model_contract"):
            tags[MODEL_CONTRACT_TAG] = judged.context["model_contract"]
        try:
            base = resolve_baseline(
                baseline, uri, experiment, tags, exclude=exclude, params=profile
            )
        except NoBaselineError as exc:
            print(f"verdict: no baseline to judge against: {exc}. Nothing compared.")
            if out:
                atomic_write_json(out, {"verdict": "no baseline", "why": str(exc)})
            return 0
        regression = config.bench.regression
        result = compare(
            base,
            judged,
            factor if factor is not None else regression.factor,
            alpha if alpha is not None else regression.alpha,
            config.bench.confidence_level,
            require_same=require_same,
        )
    except VmapcheckError as exc:
        print(f"verdict: error: {exc}", file=sys.stderr)
        return 2
    return report_verdict(result, out)


def _run_id(spec: str) -> str | None:
    """The run id ``spec`` names, or None when it is a file on disk."""
    return None if Path(spec).is_file() else spec
