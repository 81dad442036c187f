"""Where a benchmark and its baseline come from, for the regression verdict
(:mod:`vmapcheck.bench.verdict`) and the paired one (:mod:`vmapcheck.bench.paired`).

- :class:`BenchRecord`: one run's latency samples and its context, read from a
  ``bench_details.json`` (:func:`record_from_details`, :func:`read_bench_file`) or from
  an MLflow run's artifact (:func:`bench_from_run`);
- :data:`CONTEXT`: the facts about a run that decide whether its latencies compare with
  another's (the verdict's ``comparability``);
- the baseline named on the command line (:func:`resolve_baseline`): a file, a run id,
  or ``last-verified``, the newest complete passed run of the same model, backend and
  precision other than the run judged (:func:`last_verified_run`,
  :func:`run_of_reports`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.config import MIN_SAMPLES
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import read_json
from vmapcheck.layout import Layout
from vmapcheck.tracking.store import complete_filter, incomplete_because

LAST_VERIFIED = "last-verified"
# Logged by track under its own file name (Layout.bench_details).
BENCH_ARTIFACT = Layout(Path()).bench_details.name


@dataclass(frozen=True)
class ContextKey:
    """One fact about a run that decides whether its latencies compare with another's.

    ``name``: the key in :attr:`BenchRecord.context` and in the result's ``differences``;
    ``plural``: how a difference is named ("bench profiles" -> "bench profiles differ
    (quick vs full)"); ``required``: runs that differ here are not comparable (else they
    are compared and the difference noted, unless the caller asks for it with
    ``require_same``).
    """

    name: str
    plural: str
    required: bool


# The context of a benchmark, in the order differences are named (module docstring).
CONTEXT = (
    ContextKey("bench", "bench profiles", True),
    # The profile's timing settings: an override (-S bench.repeats=...) keeps the name.
    ContextKey("batch_sizes", "batch sizes", True),
    ContextKey("warmup", "warm-up calls", True),
    ContextKey("repeats", "samples per cell", True),
    ContextKey("cpu_model", "machines (CPU model)", True),
    ContextKey("usable_cores", "usable cores", True),
    ContextKey("backend", "backends", True),
    ContextKey("device_kind", "device kinds", True),
    ContextKey("device_count", "device counts", True),
    ContextKey("dtype", "dtypes", True),
    ContextKey("matmul_precision", "matmul precisions", True),
    # What a verdict usually judges (a JAX upgrade, a model change): compared, noted.
    ContextKey("jax_version", "JAX versions", False),
    ContextKey("jaxlib_version", "jaxlib versions", False),
    ContextKey("model", "models", False),
    # What the model is (params leaves and shapes, input leaves, outputs:
    # vmapcheck.params_io.contract_digest): two networks of one name are not compared.
    ContextKey("model_contract", "model contracts (params, inputs or outputs)", True),
)
CONTEXT_KEYS = tuple(key.name for key in CONTEXT)
# The keys a caller may add to the required ones (``compare(require_same=...)``).
OPTIONAL_KEYS = tuple(key.name for key in CONTEXT if not key.required)
# The context keys read from the JAX runtime (bench_details.json's ``runtime``; a live
# worker's configured runtime): one list for both readers.
RUNTIME_CONTEXT_KEYS = (
    "backend",
    "device_kind",
    "device_count",
    "matmul_precision",
    "jax_version",
    "jaxlib_version",
)


class NoBaselineError(ArtifactError):
    """``last-verified`` found no complete passed run to judge against."""


@dataclass(frozen=True)
class BenchRecord:
    """One run's latency samples (ms, by path then ``b<batch>`` label) and its context."""

    source: str
    samples_ms: dict[str, dict[str, np.ndarray]]
    context: dict[str, Any] = field(default_factory=dict)
    noisy: bool = False
    # This machine's matmul throughput measured in the same run: the control ...
    peak_gflops: float | None = None
    # ... and its per-call samples (ms), timed in every round with the cells (newer runs).
    control_ms: np.ndarray | None = None
    # The control's shape: a (size x size) @ (size x size) matmul at dtype ``control_dtype``.
    control_size: int | None = None
    control_dtype: str | None = None
    # Samples in each round of each cell, in order (by path then label), as the bench
    # stage recorded them since early stopping (a cell stopped early has fewer rounds).
    # None: an older record, whose cells all have ROUNDS rounds of equal size.
    round_sizes: dict[str, dict[str, list[int]]] | None = None

    def rounds_of(self, path: str, label: str) -> list[int] | None:
        """The recorded samples per round of one cell, or None (an older record)."""
        return None if self.round_sizes is None else self.round_sizes.get(path, {}).get(label)


def record_from_details(details: Any, source: str) -> BenchRecord:
    """Validate a parsed ``bench_details.json`` and keep what the verdict needs.

    Raises:
        ArtifactError: naming ``source`` and the key that is missing or malformed.
    """
    if not isinstance(details, dict) or not isinstance(details.get("samples_ms"), dict):
        raise ArtifactError(
            f"{source}: expected a bench_details.json with a 'samples_ms' mapping "
            "(written by the bench stage)"
        )
    samples: dict[str, dict[str, np.ndarray]] = {}
    for path, by_batch in details["samples_ms"].items():
        if not isinstance(by_batch, dict):
            raise ArtifactError(f"{source}: samples_ms.{path}: expected a mapping of batch labels")
        for label, values in by_batch.items():
            where = f"{source}: samples_ms.{path}.{label}"
            try:
                array = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                raise ArtifactError(f"{where}: expected a list of numbers") from None
            if array.ndim != 1 or array.size < MIN_SAMPLES:
                raise ArtifactError(
                    f"{where}: expected a list of at least {MIN_SAMPLES} latencies, "
                    f"found shape {array.shape}"
                )
            if not (np.isfinite(array).all() and (array > 0).all()):
                raise ArtifactError(f"{where}: expected finite positive latencies (ms)")
            samples.setdefault(path, {})[label] = array
    round_sizes = _round_sizes(details.get("round_sizes"), samples, source)
    machine = details.get("machine") or {}
    before = machine.get("before") or {}
    runtime = details.get("runtime") or {}
    bench = details.get("bench") or {}
    context = {
        "bench": bench.get("name"),
        "batch_sizes": bench.get("batch_sizes", details.get("batch_sizes")),
        "warmup": bench.get("warmup"),
        "repeats": bench.get("repeats"),
        "cpu_model": before.get("cpu_model"),
        "usable_cores": before.get("usable_cores"),
        **{key: runtime.get(key, before.get(key)) for key in RUNTIME_CONTEXT_KEYS},
        "dtype": details.get("dtype"),
        "model": details.get("model"),
        "model_contract": details.get("model_contract"),
    }
    # The control matmul timed in every round; a record from before the peak sweep
    # kept it as "peak".
    peak_info = details.get("control") or details.get("peak") or {}
    peak = peak_info.get("gflops")
    peak = float(peak) if isinstance(peak, int | float) and peak > 0 else None
    control = None
    if peak_info.get("samples_ms") is not None:
        control = np.asarray(peak_info["samples_ms"], dtype=np.float64)
        if (
            control.ndim != 1
            or control.size < 1
            or not (np.isfinite(control) & (control > 0)).all()
        ):
            raise ArtifactError(
                f"{source}: {'control' if 'control' in details else 'peak'}.samples_ms: "
                "expected a list of finite positive latencies (ms)"
            )
    size = peak_info.get("size")
    return BenchRecord(
        source,
        samples,
        context,
        bool(machine.get("noisy", False)),
        peak,
        control,
        control_size=int(size) if isinstance(size, int) and size > 0 else None,
        # The control is timed at the run's dtype (vmapcheck.bench.timing.matmul_call).
        control_dtype=details.get("dtype"),
        round_sizes=round_sizes,
    )


def _round_sizes(
    raw: Any, samples: dict[str, dict[str, np.ndarray]], source: str
) -> dict[str, dict[str, list[int]]] | None:
    """``round_sizes`` of a bench_details.json, checked against its samples: per cell, a
    list of positive counts summing to the cell's samples. None when absent (a record
    from before early stopping: every cell has ROUNDS rounds of equal size)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ArtifactError(f"{source}: round_sizes: expected a mapping of paths")
    out: dict[str, dict[str, list[int]]] = {}
    for path, by_batch in samples.items():
        for label, values in by_batch.items():
            sizes = (raw.get(path) or {}).get(label) if isinstance(raw.get(path), dict) else None
            where = f"{source}: round_sizes.{path}.{label}"
            if sizes is None:
                raise ArtifactError(f"{where}: missing (every timed cell records its rounds)")
            if (
                not isinstance(sizes, list)
                or not sizes
                or not all(isinstance(n, int) and n > 0 for n in sizes)
                or sum(sizes) != values.size
            ):
                raise ArtifactError(
                    f"{where}: expected positive sample counts summing to the cell's "
                    f"{values.size} samples, found {sizes!r}"
                )
            out.setdefault(path, {})[label] = sizes
    return out


def read_bench_file(path: Path) -> BenchRecord:
    """A ``bench_details.json`` on disk (see :func:`record_from_details`)."""
    return record_from_details(read_json(Path(path)), str(path))


def missing_store(tracking_uri: str) -> str | None:
    """Why the store at ``tracking_uri`` can hold no run, known without opening it: a
    local sqlite file or file store that does not exist (no run was ever logged there).
    None when it exists or cannot be told from here (a server must be asked).

    Opening a missing sqlite store would create it and run every MLflow migration (10 s
    and more on a loaded machine) only to find nothing, and leave an empty store behind.
    """
    if tracking_uri.startswith("sqlite:///"):
        where = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
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
            "complete runs (status FINISHED, pipeline_complete=true, a verdict) are compared"
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
