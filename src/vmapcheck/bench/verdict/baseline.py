"""What a benchmark is to its verdicts, the regression one
(:mod:`vmapcheck.bench.verdict.regression`) and the paired one
(:mod:`vmapcheck.bench.verdict.paired`).

- :class:`BenchRecord`: one run's latency samples and its context, read from a
  ``bench_details.json`` (:func:`record_from_details`, :func:`read_bench_file`; an
  MLflow run's artifact is read by :mod:`vmapcheck.tracking.baselines`);
- :data:`CONTEXT`: the facts about a run that decide whether its latencies compare with
  another's (the verdict's ``comparability``).

The baseline named on the command line (a file, a run id, or ``last-verified``) is
resolved by :func:`vmapcheck.tracking.baselines.resolve_baseline`: reading runs from the
MLflow store is tracking's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.config import MIN_SAMPLES
from vmapcheck.errors import ArtifactError
from vmapcheck.io import read_json


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
        # The control is timed at the run's dtype (vmapcheck.bench.timing.control.matmul_call).
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
