"""Regression verdict: is a benchmark slower than its baseline, beyond this machine's noise?

For every path and batch size present in both runs (``samples_ms`` of
``bench_details.json``: per-call latencies in milliseconds, in the order they were
taken):

- ``ratio``: median(current) / median(baseline); above 1 is slower;
- the unit of the statistics is a **block** of consecutive samples (each run's samples
  cut into ``BLOCKS`` contiguous blocks: the bench stage's rounds, spread over the run),
  not a single sample. Samples taken a few
  milliseconds apart are not independent on a shared machine: a spell of interference
  slows a whole stretch of them, and a per-sample test reads that as a highly
  significant shift (measured here: two back-to-back runs of the same code had cells
  16-35% apart with p < 0.005). A slowdown of the code shifts every block;
- ``ci_low``/``ci_high``: a bootstrap confidence interval of that ratio, resampling
  whole blocks of each run (cluster bootstrap, percentile method, fixed seed);
- ``p_slower``/``p_faster``: one-sided Mann-Whitney U tests on the block medians (is the
  current run's latency stochastically larger / smaller?), then adjusted over all cells
  of the comparison with Benjamini-Hochberg, since one comparison tests a dozen cells
  or more. With 10 blocks a side the smallest p is 5.4e-6.
- optionally (``compare(normalize_rounds=True)``, off: docs/benchmark.md
  has its measured effect) each block is first divided by its round's slowdown common
  to all cells (:func:`round_index`).

A cell is a **regression** only when the slowdown is both significant (adjusted
``p_slower < alpha``) and larger than ``factor`` (``ratio > factor``), asv's rule: a
shared machine makes tiny shifts between two processes significant, and the factor is
what keeps those from being reported. An **improvement** is the mirror image
(``ratio < 1 / factor``). docs/benchmark.md gives this detector's measured false-alarm and
detection rates on this machine (``benchmarks/validate_verdict.py``).

The baseline is a ``bench_details.json`` file, an MLflow run id, or ``last-verified``:
the newest complete run in the store that passed its checks with the same model, backend
and precision, other than the run being judged. A run is read only when complete
(vmapcheck.tracking.store.COMPLETE_FILTER: a ``track`` that was killed leaves an
incomplete one). ``vmapcheck verdict --baseline ...`` (``make verdict``) prints the table
and exits 1 on a regression (0 for "no regression" and "inconclusive"). Judging the
reports on disk, the run that logged them (:func:`run_of_reports`) is never their
baseline; when ``last-verified`` finds no other run it says so and exits 0.
"""

from __future__ import annotations

import io
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from vmapcheck.errors import ArtifactError, ConfigError, VmapcheckError
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.layout import Layout
from vmapcheck.tracking.store import complete_filter, incomplete_because

LAST_VERIFIED = "last-verified"
BENCH_ARTIFACT = "bench_details.json"
# The context that makes two benchmarks comparable, or explains why they differ.
CONTEXT_KEYS = ("model", "backend", "device_kind", "dtype", "jax_version", "cpu_model")
MIN_SAMPLES = 5
# Blocks of consecutive samples per run and cell: the statistics' unit (module docstring).
BLOCKS = 10


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
    machine = details.get("machine") or {}
    before = machine.get("before") or {}
    runtime = details.get("runtime") or {}
    context = {
        "model": details.get("model"),
        "backend": runtime.get("backend", before.get("backend")),
        "device_kind": runtime.get("device_kind", before.get("device_kind")),
        "dtype": details.get("dtype"),
        "jax_version": runtime.get("jax_version", before.get("jax_version")),
        "cpu_model": before.get("cpu_model"),
    }
    peak_info = details.get("peak") or {}
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
                f"{source}: peak.samples_ms: expected a list of finite positive latencies (ms)"
            )
    return BenchRecord(source, samples, context, bool(machine.get("noisy", False)), peak, control)


def read_bench_file(path: Path) -> BenchRecord:
    """A ``bench_details.json`` on disk (see :func:`record_from_details`)."""
    return record_from_details(read_json(Path(path)), str(path))


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
    tracking_uri: str, experiment: str, tags: dict[str, str], exclude: str | None = None
) -> str | None:
    """Id of the newest complete run of ``experiment`` (vmapcheck.tracking.store.
    COMPLETE_FILTER) with tag verdict=passed and ``tags`` equal."""
    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    conditions = ["tags.verdict = 'passed'"] + [
        f"tags.{key} = '{value}'" for key, value in sorted(tags.items())
    ]
    runs = client.search_runs(
        [found.experiment_id],
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
    experiment: str | None = None,
    tags: dict[str, str] | None = None,
    exclude: str | None = None,
    role: str = "baseline",
) -> BenchRecord:
    """The baseline named by ``spec``: a file, an MLflow run id, or ``last-verified``
    (``role``: what the messages call it, "baseline" or "current run").

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
    if spec == LAST_VERIFIED:
        run_id = last_verified_run(tracking_uri, experiment or "", tags or {}, exclude)
        if run_id is None:
            wanted = ", ".join(f"{k}={v}" for k, v in sorted((tags or {}).items()))
            other = f" other than run {exclude} (the run judged)" if exclude else ""
            raise NoBaselineError(
                f"{role} {LAST_VERIFIED}: no complete passed run with {wanted or 'any tags'}"
                f"{other} in experiment {experiment!r} of {tracking_uri}"
            )
        return bench_from_run(tracking_uri, run_id, role)
    if len(spec) == 32 and all(c in "0123456789abcdef" for c in spec):
        return bench_from_run(tracking_uri, spec, role)
    raise ConfigError(
        f"{role} {spec!r}: expected a bench_details.json file, an MLflow run id "
        f"(32 hex digits) or {LAST_VERIFIED!r}"
    )


def blocks_of(samples: np.ndarray, blocks: int = BLOCKS) -> list[np.ndarray]:
    """``samples`` (1-D, in time order) cut into ``min(blocks, len)`` contiguous blocks."""
    return np.array_split(samples, min(blocks, samples.size))


def _cluster_bootstrap_medians(
    groups: list[np.ndarray], n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Median of the pooled samples of ``len(groups)`` blocks drawn with replacement, for
    each of ``n_resamples`` resamples: shape (n_resamples,)."""
    picks = rng.integers(0, len(groups), size=(n_resamples, len(groups)))
    # Blocks as rows of one matrix, short ones padded with NaN: one vectorized median.
    width = max(g.size for g in groups)
    matrix = np.full((len(groups), width), np.nan)
    for row, group in enumerate(groups):
        matrix[row, : group.size] = group
    pooled = matrix[picks].reshape(n_resamples, -1)
    if all(g.size == width for g in groups):
        return np.median(pooled, axis=1)
    return np.nanmedian(pooled, axis=1)


def round_index(record: BenchRecord, blocks: int = BLOCKS) -> np.ndarray | None:
    """How slow each round of a run was, across all its cells: shape (blocks,).

    For every cell, each block's median over the cell's median; then, per block, the
    median of that over all cells. The bench times every cell in every round, so a spell
    of interference from another tenant slows every cell of the rounds it falls in (seen
    here: single rounds 1.2-2x slower in every cell), while a change of the code moves a
    cell in all rounds alike and leaves its own ratios near 1. Dividing each block by its
    round's factor takes the spell out before the test. None when the run has fewer than
    3 cells or a cell has fewer than ``blocks`` samples (nothing to take the median of).
    """
    rows = [
        [np.median(b) / np.median(v) for b in blocks_of(v, blocks)]
        for by_batch in record.samples_ms.values()
        for v in by_batch.values()
    ]
    if len(rows) < 3 or any(len(r) != blocks for r in rows):
        return None
    return np.median(np.array(rows), axis=0)


def compare_cell(
    baseline: np.ndarray,
    current: np.ndarray,
    confidence: float = 0.95,
    seed: int = 0,
    blocks: int = BLOCKS,
    base_rounds: np.ndarray | None = None,
    cur_rounds: np.ndarray | None = None,
) -> dict[str, float]:
    """Ratio of medians (current / baseline) with its cluster-bootstrap CI and one-sided
    Mann-Whitney p-values on block medians (module docstring).

    ``baseline``, ``current``: per-call latencies (ms) of one cell, in time order.
    ``base_rounds``, ``cur_rounds``: each run's :func:`round_index` (one factor per
    block), or None; when given, every block's samples are divided by its round's factor
    before the statistics (``raw_ratio`` keeps the undivided ratio of medians).
    """
    base_blocks, cur_blocks = blocks_of(baseline, blocks), blocks_of(current, blocks)
    if base_rounds is not None and len(base_rounds) == len(base_blocks):
        base_blocks = [b / f for b, f in zip(base_blocks, base_rounds, strict=True)]
    if cur_rounds is not None and len(cur_rounds) == len(cur_blocks):
        cur_blocks = [b / f for b, f in zip(cur_blocks, cur_rounds, strict=True)]
    base_medians = np.array([np.median(b) for b in base_blocks])
    cur_medians = np.array([np.median(b) for b in cur_blocks])
    rng = np.random.default_rng(seed)
    n_resamples = 2000
    ratios = _cluster_bootstrap_medians(cur_blocks, n_resamples, rng) / (
        _cluster_bootstrap_medians(base_blocks, n_resamples, rng)
    )
    tail = (1.0 - confidence) / 2.0
    ci_low, ci_high = np.quantile(ratios, [tail, 1.0 - tail])
    # Exact null distribution at these sizes (the normal approximation overstates the
    # smallest p 17-fold at 10 a side); it assumes no ties, so ties use the approximation.
    tied = np.unique(np.concatenate([base_medians, cur_medians])).size < (
        base_medians.size + cur_medians.size
    )
    small = max(base_medians.size, cur_medians.size) <= 20
    method = "exact" if small and not tied else "asymptotic"
    return {
        "ratio": float(
            np.median(np.concatenate(cur_blocks)) / np.median(np.concatenate(base_blocks))
        ),
        "raw_ratio": float(np.median(current) / np.median(baseline)),
        "ci_low": float(ci_low),
        "ci_high": float(ci_high),
        "p_slower": float(
            stats.mannwhitneyu(
                cur_medians, base_medians, alternative="greater", method=method
            ).pvalue
        ),
        "p_faster": float(
            stats.mannwhitneyu(cur_medians, base_medians, alternative="less", method=method).pvalue
        ),
        "n_baseline": int(baseline.size),
        "n_current": int(current.size),
        "blocks_baseline": len(base_blocks),
        "blocks_current": len(cur_blocks),
        "baseline_p50_ms": float(np.median(baseline)),
        "current_p50_ms": float(np.median(current)),
    }


def compare(
    baseline: BenchRecord,
    current: BenchRecord,
    factor: float,
    alpha: float,
    confidence: float = 0.95,
    blocks: int = BLOCKS,
    normalize_rounds: bool = False,
) -> dict[str, Any]:
    """Judge every path and batch size the two runs share; see the module docstring.

    ``blocks``: blocks per cell (a number above the sample count tests single samples,
    the per-sample test this tool used before; benchmarks/validate_verdict.py compares).

    A run with regressions is judged ``inconclusive`` instead when either run was noisy
    (load above the core count) or the machine itself changed speed by more than
    ``factor`` between them (``machine_slowdown``: the ratio of the matmul throughput both
    runs measured, > 1 when the current run's machine was slower).

    Returns {"verdict": "regression" | "no regression" | "inconclusive", "regressions":
    ["path/b<batch>"],
    "improvements": [...], "cells": {path: {label: {...}}}, "only_in_baseline",
    "only_in_current", "differences": {key: [baseline, current]}, "noisy", ...}.
    """
    if not factor > 1.0:
        raise ConfigError(f"bench.regression.factor: expected > 1, found {factor}")
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"bench.regression.alpha: expected 0 < alpha < 1, found {alpha}")
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    keys: list[tuple[str, str]] = []
    base_rounds = round_index(baseline, blocks) if normalize_rounds else None
    cur_rounds = round_index(current, blocks) if normalize_rounds else None
    only_base, only_cur = [], []
    for path in sorted(set(baseline.samples_ms) | set(current.samples_ms)):
        base_batches = baseline.samples_ms.get(path, {})
        cur_batches = current.samples_ms.get(path, {})
        for label in sorted(set(base_batches) | set(cur_batches), key=_batch_order):
            if label not in cur_batches:
                only_base.append(f"{path}/{label}")
            elif label not in base_batches:
                only_cur.append(f"{path}/{label}")
            else:
                cell = compare_cell(
                    base_batches[label],
                    cur_batches[label],
                    confidence,
                    blocks=blocks,
                    base_rounds=base_rounds,
                    cur_rounds=cur_rounds,
                )
                cells.setdefault(path, {})[label] = cell
                keys.append((path, label))
    if keys:
        # Benjamini-Hochberg over the cells of this comparison, one direction at a time.
        for direction in ("p_slower", "p_faster"):
            raw = np.array([cells[p][b][direction] for p, b in keys])
            adjusted = stats.false_discovery_control(raw, method="bh")
            for (p, b), q in zip(keys, adjusted, strict=True):
                cells[p][b][f"{direction}_adjusted"] = float(q)
    regressions, improvements = [], []
    for path, label in keys:
        cell = cells[path][label]
        if cell["ratio"] > factor and cell["p_slower_adjusted"] < alpha:
            cell["status"] = "regression"
            regressions.append(f"{path}/{label}")
        elif cell["ratio"] < 1.0 / factor and cell["p_faster_adjusted"] < alpha:
            cell["status"] = "improvement"
            improvements.append(f"{path}/{label}")
        else:
            cell["status"] = "no change"
    # The control: the same matmul timed in both runs. When the machine itself got slower
    # by more than the factor, a slowdown of the code cannot be told from it.
    if baseline.control_ms is not None and current.control_ms is not None:
        control = float(np.median(current.control_ms) / np.median(baseline.control_ms))
    elif baseline.peak_gflops and current.peak_gflops:  # runs from before the rounds
        control = baseline.peak_gflops / current.peak_gflops
    else:
        control = None
    noisy = baseline.noisy or current.noisy
    unstable = control is not None and not 1.0 / factor <= control <= factor
    if not regressions:
        verdict = "no regression"
    elif noisy or unstable:
        verdict = "inconclusive"
    else:
        verdict = "regression"
    differences = {
        key: [baseline.context.get(key), current.context.get(key)]
        for key in CONTEXT_KEYS
        if baseline.context.get(key) != current.context.get(key)
    }
    return {
        "verdict": verdict,
        "baseline": {"source": baseline.source, **baseline.context, "noisy": baseline.noisy},
        "current": {"source": current.source, **current.context, "noisy": current.noisy},
        "factor": factor,
        "alpha": alpha,
        "confidence_level": confidence,
        "regressions": regressions,
        "improvements": improvements,
        "cells": cells,
        "only_in_baseline": only_base,
        "only_in_current": only_cur,
        "differences": differences,
        "noisy": noisy,
        "machine_slowdown": control,
        "round_index": {
            "baseline": None if base_rounds is None else base_rounds.tolist(),
            "current": None if cur_rounds is None else cur_rounds.tolist(),
        },
        "machine_unstable": unstable,
    }


def _batch_order(label: str) -> tuple[int, str]:
    digits = label.lstrip("b")
    return (int(digits), label) if digits.isdigit() else (math.inf, label)  # type: ignore[return-value]


def format_table(result: dict[str, Any]) -> str:
    """The comparison as text: one line per path and batch size, regressions marked."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"benchmark verdict: {result['verdict'].upper()}")
    for column in ("path", "batch", "base p50 ms", "cur p50 ms", "ratio", "ratio CI", "p slower"):
        table.add_column(column, justify="left" if column in ("path", "batch") else "right")
    table.add_column("status")
    for path, by_batch in result["cells"].items():
        for label, cell in by_batch.items():
            style = {"regression": "bold red", "improvement": "green"}.get(cell["status"], "")
            table.add_row(
                path,
                label,
                f"{cell['baseline_p50_ms']:.4g}",
                f"{cell['current_p50_ms']:.4g}",
                f"{cell['ratio']:.3f}",
                f"[{cell['ci_low']:.3f}, {cell['ci_high']:.3f}]",
                f"{cell['p_slower_adjusted']:.2g}",
                cell["status"],
                style=style,
            )
    buffer = io.StringIO()
    Console(file=buffer, width=120, force_terminal=False).print(table)
    lines = [buffer.getvalue().rstrip()]
    lines.append(
        f"regression = ratio of medians > {result['factor']} and Mann-Whitney p on block medians "
        f"(BH-adjusted) < {result['alpha']}; baseline: {result['baseline']['source']}"
    )
    for key, (base, cur) in result["differences"].items():
        if base is None or cur is None:
            side = "baseline" if base is None else "current run"
            lines.append(f"note: {key} not recorded in the {side} (an older bench_details.json)")
        else:
            lines.append(f"note: {key} differs: baseline {base!r}, current {cur!r}")
    if result["noisy"]:
        lines.append("note: a run was marked noisy (load above the core count): read with care")
    if result["machine_slowdown"] is not None:
        lines.append(
            "control: the same matmul took "
            f"{result['machine_slowdown']:.2f}x the baseline's time in the current run"
            + (
                " (beyond the factor: slowdowns here are not attributable to the code)"
                if result["machine_unstable"]
                else ""
            )
        )
    for name in ("only_in_baseline", "only_in_current"):
        if result[name]:
            lines.append(f"note: {name.replace('_', ' ')}: {', '.join(result[name])}")
    return "\n".join(lines)


def run_of_reports(layout: Layout, tracking_uri: str) -> str | None:
    """The MLflow run that logged the benchmark now in ``layout.bench_details``: the run
    ``reports/track.json`` names, when that run's ``bench_details.json`` artifact is this
    very file. None when there is no track.json, its run is not in this store, or the
    benchmark ran again since (then that run is a fair baseline)."""
    from mlflow.exceptions import MlflowException

    if not layout.track_report.is_file():
        return None
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
) -> int:
    """``vmapcheck verdict``: judge ``current`` (default: ``layout.bench_details``) against
    ``baseline`` and print the table. Exit 1 on a regression, 2 when either cannot be
    read, else 0 (also when ``last-verified`` finds no run to compare with: it says so).
    ``factor``/``alpha`` None: the config's ``bench.regression``."""
    from vmapcheck.config import load_config
    from vmapcheck.tracking.store import experiment_name, resolve_tracking_uri

    current = str(layout.bench_details) if current is None else current
    try:
        config = load_config(layout.params_yaml)
        uri = resolve_tracking_uri(config.tracking, layout.root)
        tags = {
            "model": config.model.name,
            "backend": config.backend.name,
            "precision": config.precision.name,
        }
        experiment = experiment_name(config)
        judged = resolve_baseline(current, uri, experiment, tags, role="current run")
        exclude = _run_id(current)
        if exclude is None and Path(current).resolve() == layout.bench_details.resolve():
            exclude = run_of_reports(layout, uri)
        try:
            base = resolve_baseline(baseline, uri, experiment, tags, exclude=exclude)
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
        )
    except VmapcheckError as exc:
        print(f"verdict: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    if out:
        atomic_write_json(out, result)
    return 1 if result["verdict"] == "regression" else 0


def _run_id(spec: str) -> str | None:
    return None if Path(spec).is_file() else spec
