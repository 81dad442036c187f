"""The guard: a batched predictor that serves verified params.

:class:`Guard` answers requests ``X`` of shape ``(batch, in_features)`` (batch axis 0)
with ``(batch, out_features)`` through ``jax.jit(jax.vmap(forward_one, in_axes=(None,
0)))``, the path vmapcheck verifies. Per request, in this order:

1. **Limits, on metadata only.** The request must be a plain numpy or JAX array, not a
   masked or object array (else reason ``type``); ``prod(shape) * itemsize`` must not
   exceed ``guard.max_request_bytes`` (``too_many_bytes``); the shape must be
   ``(batch >= 1, in_features)`` (``rank``, ``features``, ``empty``); ``batch`` must
   not exceed ``guard.max_batch`` (``batch_too_large``). Nothing is read, copied,
   padded or sent to a device before these pass: an oversized request costs nothing but
   its refusal.
2. **Contract**, by :func:`vmapcheck.core.forms.validate_batch`, the rules every forward path
   shares: the dtype of the run (``dtype``), finite values (``non_finite_input``).
3. **Padding** to the smallest bucket of ``guard.buckets`` that holds the batch, with
   zero rows. Zeros come from no request, so the padded buffer holds no more copies of
   request values than the request itself; rows of a vmapped forward are independent, so
   padding rows cannot change the real rows' results (bit-for-bit equality is not
   promised: XLA may pick another kernel for another batch size, within float rounding).
   Their outputs are dropped and never checked.
4. **One compilation per bucket**: every call has one of ``len(buckets)`` shapes, so jit
   compiles at most that many times, eagerly at construction (``guard.precompile``) or on
   a bucket's first request.
5. **Output check**: a real row with NaN or Inf is refused with
   :class:`~vmapcheck.errors.NonFiniteOutputError` (counts and the first row index, never
   values); no output is returned.

Metrics are aggregates only (:meth:`Guard.metrics`, JSON-able): requests, refusals and
their share by reason, numeric errors, compiles (counted from ``jax.monitoring`` events,
as the benchmark does) and their seconds, rows served and padded (padding overhead = pad
rows / real rows), requests per bucket, and the latency of served requests as a
histogram over fixed edges plus exact percentiles over the last ``guard.latency_window``
requests. The guard never stores or logs a request's values; error messages name shapes,
dtypes, counts and indices only.

The bench stage's replay of a request stream through a guard is
:mod:`vmapcheck.guard.replay`.

Limits: one guard is not thread-safe (one request at a time); compiles are counted
process-wide during the guard's own calls, so a compilation by another thread in that
window would be counted too; latency is measured on the host around the whole request
(validation, padding, transfer, forward, copy back), on whatever machine runs it.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.bench.timing.records import GuardLatency, GuardMetrics
from vmapcheck.bench.timing.sampling import CompileCounter
from vmapcheck.config import GuardConfig, byte_limit_problem
from vmapcheck.core.contract import (
    VECTOR_LEAF,
    InputSpec,
    float_dtype_problem,
    leaf_arrays,
    not_an_array,
)
from vmapcheck.core.contract import rows as batch_rows
from vmapcheck.core.forms import (
    Keyed,
    batched_forward,
    cast_tree,
    forward_keys,
    keyed_model,
    row_keys,
)
from vmapcheck.core.models import Model, Params
from vmapcheck.errors import ConfigError, InvalidInputError, NonFiniteOutputError
from vmapcheck.params_io import check_finite, check_params_like, leaf_paths

# Every reason a request can be refused for, in the order the guard checks them.
REASONS = (
    "type",
    "too_many_bytes",
    "rank",
    "features",
    "empty",
    "batch_too_large",
    "dtype",
    "non_finite_input",
)
# The reasons only a dict of leaves can give (:func:`invalid_kinds`).
TREE_REASONS = ("shape", "id_range", "missing_leaf", "extra_leaf", "batch_sizes")


class Guard:
    """Serve ``model`` with verified ``params`` at ``dtype`` under ``config``'s limits.

    Args:
        model: the model; its ``forward_one`` is vmapped over rows (params shared).
        params: params already verified (e.g. by ``params_io.load_model_params``); cast to
            ``dtype`` and put on the device once.
        dtype: the dtype every request must have (the run's precision).
        config: buckets, limits, latency histogram.
        bucketed: False serves each request at its exact batch size (one compilation per
            new size): the comparison of :func:`vmapcheck.guard.replay.run_replay`, not for serving.

    Raises:
        ConfigError: ``dtype`` is no float a run can have (int or bool, float16; float64
            with ``jax_enable_x64`` off), or ``config.max_request_bytes`` is below one
            valid full batch.
        ArtifactError: ``params`` do not have the leaves of ``model.init``'s template
            (naming the leaf: missing, extra, or of another shape), or a float leaf holds
            NaN or Inf.
    """

    def __init__(
        self,
        model: Model,
        params: Params,
        dtype: Any,
        config: GuardConfig,
        *,
        bucketed: bool = True,
    ) -> None:
        problem = float_dtype_problem(dtype)
        if problem:
            raise ConfigError(f"Guard dtype (the dtype every request must have): {problem}")
        self._dtype = jnp.dtype(dtype)
        # Before anything is cast or compiled: a leaf of another shape would otherwise
        # surface as a broadcasting error inside the forward, naming no leaf.
        check_params_like(params, jax.eval_shape(model.init, jax.random.key(0)), "Guard params")
        # A NaN or Inf leaf would make every answer non-finite: refused here, by leaf.
        check_finite(leaf_paths(params), "Guard params")
        self._contract = model.contract
        self._reasons = invalid_kinds(self._contract)
        self._config = config
        self._bucketed = bucketed
        per_example = sum(
            leaf.size * leaf.array_dtype(self._dtype).itemsize for leaf in self._contract.leaves
        )
        problem = byte_limit_problem(config, per_example)
        if problem:
            raise ConfigError(problem)
        self._params = jax.device_put(cast_tree(params, self._dtype))
        # in_axes (None, 0): params shared by every row, rows mapped over axis 0.
        mapped = batched_forward(keyed_model(model), self._params)
        # A forward that samples (Model.stochastic) is served as every path runs it: its
        # keyed_model, each row with a key of its own, fresh keys for every request
        # (padding rows included): request n's are split from fold_in(base, n) inside
        # the compiled program, so drawing them compiles nothing per request.
        self._draws: int | None = 0 if model.stochastic else None
        if model.stochastic:
            base = forward_keys(0)

            def sampled(params: Params, batch: Any, draw: jax.Array) -> jax.Array:
                keys = row_keys(jax.random.fold_in(base, draw), batch_rows(batch))
                return mapped(params, Keyed(batch, keys))

        self._forward = jax.jit(sampled if model.stochastic else mapped)
        self._edges_ms = np.asarray(config.latency_edges_ms, dtype=np.float64)
        # Aggregates only: nothing below holds a request value.
        self._requests = 0
        self._served = 0
        self._refused: Counter[str] = Counter()
        self._numeric_errors = 0
        self._compiles = 0
        self._compile_s = 0.0
        self._real_rows = 0
        self._pad_rows = 0
        self._per_bucket: Counter[int] = Counter()
        self._histogram = np.zeros(len(self._edges_ms) + 1, dtype=np.int64)
        self._window: deque[float] = deque(maxlen=config.latency_window)
        CompileCounter.start()
        if bucketed and config.precompile:
            self.warmup()

    @property
    def buckets(self) -> tuple[int, ...] | None:
        """The padded batch sizes, or None for the un-bucketed comparison."""
        return tuple(self._config.buckets) if self._bucketed else None

    @property
    def compiles(self) -> int:
        """Compilations that happened during this guard's forward calls (warm-up included)."""
        return self._compiles

    def bucket_for(self, rows: int) -> int:
        """The row count a batch of ``rows`` (1..max_batch) runs at: the smallest bucket
        that holds it (its own size when un-bucketed)."""
        if not self._bucketed:
            return rows
        return self._config.buckets[bisect.bisect_left(self._config.buckets, rows)]

    def warmup(self) -> None:
        """Compile every bucket now (on zero rows), so no request pays for a compilation."""
        for rows in self.buckets or ():
            self._run(self._contract.zeros(rows, self._dtype))

    def predict(self, x: Any) -> np.ndarray:
        """Outputs of shape (batch, out_features) for ``x`` of shape (batch, in_features).

        Raises:
            InvalidInputError: the request breaks a limit or the contract; ``reason``
                names the category (one of :data:`REASONS`).
            NonFiniteOutputError: the model returned NaN or Inf for a real row.
        """
        start = time.perf_counter()
        self._requests += 1
        try:
            rows = self._admit(x)
        except InvalidInputError as exc:
            self._refused[exc.reason] += 1
            raise
        target = self.bucket_for(rows)
        if target == rows:
            batch = x
        else:
            # Zero rows on the host (ids 0, masks all padding): padding never compiles.
            batch = jax.tree.map(
                lambda leaf, pad: np.concatenate([np.asarray(leaf), pad[: target - rows]]),
                x,
                self._contract.zeros(target, self._dtype),
            )
        out = self._run(batch)
        self._per_bucket[target] += 1
        self._real_rows += rows
        self._pad_rows += target - rows
        out = out[:rows] if target == rows else out[:rows].copy()
        bad = ~np.isfinite(out).all(axis=1)
        if bad.any():
            self._numeric_errors += 1
            raise NonFiniteOutputError(
                f"the model returned NaN or Inf for {int(bad.sum())} of {rows} row(s) "
                f"(first at row {int(np.argmax(bad))}): refused, no output returned"
            )
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self._served += 1
        self._histogram[np.searchsorted(self._edges_ms, elapsed_ms, side="left")] += 1
        self._window.append(elapsed_ms)
        return out

    def _admit(self, x: Any) -> int:
        """The request's row count, once every limit and the contract hold."""
        if self._contract.flat:
            arrays = {VECTOR_LEAF: x}
        elif isinstance(x, Mapping):
            arrays = leaf_arrays(x)
        else:
            raise InvalidInputError(
                f"expected a dict of arrays {list(self._contract.names)}, got {type(x).__name__}",
                reason="type",
            )
        for name, leaf in arrays.items():
            where = "" if self._contract.flat else f"leaf {name!r}: "
            if not isinstance(leaf, np.ndarray | jax.Array):
                raise InvalidInputError(
                    f"{where}expected a numpy or JAX array, got {type(leaf).__name__}",
                    reason="type",
                )
            # A masked array or an object array: refused on its type, nothing is read.
            problem = not_an_array(leaf)
            if problem:
                raise InvalidInputError(
                    f"{where}expected a plain numeric array, got {problem}", reason="type"
                )
        shapes = {name: tuple(int(n) for n in leaf.shape) for name, leaf in arrays.items()}
        # From metadata: a broadcast view or a lazily-backed array is never materialised.
        nbytes = sum(math.prod(shapes[n]) * leaf.dtype.itemsize for n, leaf in arrays.items())
        if nbytes > self._config.max_request_bytes:
            described = ", ".join(f"{n} {shapes[n]} {a.dtype}" for n, a in arrays.items())
            raise InvalidInputError(
                f"request of {described} takes {nbytes} bytes, over "
                f"guard.max_request_bytes={self._config.max_request_bytes}",
                reason="too_many_bytes",
            )
        self._contract.check_batch_shape(shapes[VECTOR_LEAF] if self._contract.flat else shapes)
        rows = next(iter(shapes.values()))[0]
        if rows > self._config.max_batch:
            raise InvalidInputError(
                f"expected at most guard.max_batch={self._config.max_batch} rows, got {rows}",
                reason="batch_too_large",
            )
        self._contract.validate_batch(x, self._dtype)
        return rows

    def _run(self, batch: Any) -> np.ndarray:
        before_n, before_s = CompileCounter.count, CompileCounter.seconds
        # np.asarray waits for the result and brings it to the host, where the slice and
        # the finiteness check run (a device-side slice would compile once per size).
        if self._draws is None:
            out = np.asarray(self._forward(self._params, batch))
        else:
            out = np.asarray(self._forward(self._params, batch, np.uint32(self._draws)))
            self._draws += 1
        self._compiles += CompileCounter.count - before_n
        self._compile_s += CompileCounter.seconds - before_s
        return out

    def metrics(self) -> GuardMetrics:
        """Aggregated metrics, JSON-able; no request value is, or can be, among them."""
        n = self._requests
        share = {reason: self._refused[reason] / n if n else 0.0 for reason in self._reasons}
        window = np.asarray(self._window, dtype=np.float64)
        latency: GuardLatency = {
            "histogram": {
                "upper_edges_ms": self._edges_ms.tolist(),
                "counts": self._histogram.tolist(),
            },
            "window": int(window.size),
        }
        if window.size:  # exact percentiles over the window, where it holds any
            p50, p90, p99 = (float(v) for v in np.percentile(window, [50, 90, 99]))
            latency["p50"], latency["p90"], latency["p99"] = p50, p90, p99
            latency["max"] = float(np.max(window))
        buckets = self.buckets
        return {
            "requests": n,
            "served": self._served,
            "refused": {reason: self._refused[reason] for reason in self._reasons},
            "invalid_share": share,
            "invalid_share_total": sum(self._refused.values()) / n if n else 0.0,
            "numeric_errors": self._numeric_errors,
            "compiles": self._compiles,
            "compile_s": self._compile_s,
            "buckets": list(buckets) if buckets else None,
            "compiles_within_bound": self._compiles <= len(buckets) if buckets else None,
            "requests_per_bucket": {
                str(size): count for size, count in sorted(self._per_bucket.items())
            }
            if buckets
            else None,
            "distinct_batch_sizes": len(self._per_bucket),
            "rows_real": self._real_rows,
            "rows_padding": self._pad_rows,
            "padding_overhead": self._pad_rows / self._real_rows if self._real_rows else 0.0,
            "latency_ms": latency,
        }


def invalid_kinds(contract: InputSpec) -> tuple[str, ...]:
    """The invalid kinds a stream plants for ``contract``, each refused for the reason of
    the same name: the flat vector's :data:`REASONS`; for a dict of leaves "shape" in
    place of "features", "id_range" with an int leaf, and the dict's own mistakes."""
    if contract.flat:
        return REASONS
    kinds = [r for r in REASONS if r != "features" and r != "non_finite_input"]
    kinds.insert(kinds.index("empty"), "shape")
    if contract.has("float"):
        kinds.append("non_finite_input")
    if contract.has("int32"):
        kinds.append("id_range")
    kinds += ["missing_leaf", "extra_leaf"]
    if len(contract.leaves) > 1:
        kinds.append("batch_sizes")
    return tuple(kinds)


# The invalid kinds of a flat-vector model's stream.
INVALID_KINDS = REASONS
