"""The guard's replay (:class:`vmapcheck.guard.predictor.Guard`), as the bench stage runs it.

:func:`request_stream` draws a reproducible stream of requests around real rows (random
batch sizes 1..max_batch, a share of every invalid kind: :func:`invalid_kinds`, an
optional planted canary, :data:`REQUEST_CANARY`), :func:`replay` sends a stream through
a guard and :func:`run_replay` compares the bucketed guard with an un-bucketed one (a
plain jit at each exact batch size). :func:`replay_passed`, :func:`replay_figures` and
:func:`replay_summary` read its report.

A request's ``x`` is a batch with the batch axis 0: ``(batch, in_features)`` for a flat
vector, else a dict of leaves each ``(batch, ...)``. The replay keeps no request's
values: its report holds outcomes, counts and latencies only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import jax.numpy as jnp
import numpy as np

from vmapcheck.bench.timing.latency import latency_stats
from vmapcheck.bench.timing.progress import Eta, Phase, Progress, silent
from vmapcheck.bench.timing.records import GuardMetrics, LatencyCell, ReplayReport
from vmapcheck.config import GuardConfig
from vmapcheck.core.contract import EXTRA_LEAF, VECTOR_LEAF, InputSpec, leaf_arrays
from vmapcheck.core.contract import rows as rows_of_tree
from vmapcheck.core.models import Model, Params
from vmapcheck.errors import InvalidInputError, NonFiniteOutputError
from vmapcheck.guard.predictor import Guard, invalid_kinds

# Planted in requests when guard.replay.plant_canary is true (finite: valid requests stay
# valid). float32 holds 123456.7890625, so every decimal form of it starts "123456.7".
REQUEST_CANARY = 123456.789
# What a replay reports for a request that ran but whose output was refused.
NON_FINITE_OUTPUT = "non_finite_output"
SERVED = "served"


@dataclass(frozen=True)
class Request:
    """One request of a stream: ``x``, and the outcome it must get (``served`` or a reason)."""

    x: Any
    expected: str


def request_stream(
    template_rows: Any, dtype: Any, config: GuardConfig, contract: InputSpec | None = None
) -> Iterator[Request]:
    """``config.replay.n_requests`` requests, drawn one at a time (never all held at once).

    ``template_rows``: real rows of the input ``contract`` (every leaf with batch axis 0;
    None: a flat ``(n, in_features)`` table). Each valid request has a batch size drawn
    uniformly from 1..``config.max_batch``; its rows are template rows drawn with
    replacement, float leaves plus Gaussian noise of ``replay.noise_std`` times each
    element's standard deviation (ids and masks as drawn). A share
    ``replay.invalid_share`` of requests is made invalid, the kind drawn uniformly from
    :func:`invalid_kinds`. With ``replay.plant_canary``, :data:`REQUEST_CANARY` is
    planted in one cell of the first float leaf of every request. The same config gives
    the same stream (numpy Generator seeded by ``replay.seed``).
    """
    replay_config = config.replay
    dtype = jnp.dtype(dtype)
    if contract is None:
        width = np.shape(template_rows)[1] if np.ndim(template_rows) == 2 else 1
        contract = InputSpec.vector(width)
    if contract.flat and (np.ndim(template_rows) != 2 or np.shape(template_rows)[0] == 0):
        raise InvalidInputError(
            f"template rows: expected a non-empty (n, in_features) table, got shape "
            f"{np.shape(template_rows)}",
            reason="rank",
        )
    template = {k: np.asarray(v) for k, v in leaf_arrays(template_rows).items()}
    n_template = rows_of_tree(template)
    floats = [leaf.name for leaf in contract.leaves if leaf.dtype == "float"]
    template = {k: v.astype(np.float64) if k in floats else v for k, v in template.items()}
    scale = {k: replay_config.noise_std * template[k].std(axis=0) for k in floats}
    other_dtype = np.dtype(np.float64 if dtype != np.float64 else np.float32)
    row_bytes = sum(leaf.size * leaf.array_dtype(dtype).itemsize for leaf in contract.leaves)
    first = contract.leaves[0]
    kinds = invalid_kinds(contract)
    rng = np.random.default_rng(replay_config.seed)

    def rows_of(n: int) -> dict[str, np.ndarray]:
        picked = rng.integers(0, n_template, n)
        out = {}
        for leaf in contract.leaves:
            chosen = template[leaf.name][picked]
            if leaf.dtype == "float":
                noise = rng.normal(size=chosen.shape) * scale[leaf.name]
                chosen = (chosen + noise).astype(dtype)
            out[leaf.name] = chosen
        if replay_config.plant_canary and floats:
            cells = out[floats[0]].reshape(n, -1)
            cells[rng.integers(0, n), rng.integers(0, cells.shape[1])] = REQUEST_CANARY
        return out

    for _ in range(replay_config.n_requests):
        rows = int(rng.integers(1, config.max_batch + 1))
        kind = str(rng.choice(kinds)) if rng.random() < replay_config.invalid_share else SERVED
        if kind == "batch_too_large":
            # Over max_batch by up to one full batch, within the byte limit when it can be.
            over = min(2 * config.max_batch, config.max_request_bytes // row_bytes)
            rows = int(rng.integers(config.max_batch + 1, max(over, config.max_batch + 1) + 1))
        arrays: dict[str, Any]
        if kind == "too_many_bytes":
            # Read-only broadcast views: gigabytes if anything materialised them.
            huge = max(config.max_request_bytes // row_bytes + 1, 1 << 28)
            arrays = {k: np.broadcast_to(v, (huge, *v.shape[1:])) for k, v in rows_of(1).items()}
        else:
            arrays = rows_of(rows)
        head = arrays[first.name]
        if kind == "type":
            arrays[first.name] = head.tolist()
        elif kind == "rank":
            flatten = contract.flat and rng.random() >= 0.5
            arrays[first.name] = head.reshape(-1) if flatten else head[None]
        elif kind in ("features", "shape"):
            arrays[first.name] = np.concatenate([head, head[..., :1]], axis=-1)
        elif kind == "empty":
            arrays = {k: v[:0] for k, v in arrays.items()}
        elif kind == "dtype":
            wrong = other_dtype if first.dtype == "float" else np.dtype(np.float32)
            arrays[first.name] = head.astype(wrong)
        elif kind == "non_finite_input":
            cells = arrays[floats[0]].reshape(rows, -1)
            cells[rng.integers(0, rows), rng.integers(0, cells.shape[1])] = rng.choice(
                [np.nan, np.inf]
            )
        elif kind == "id_range":
            ids = next(leaf for leaf in contract.leaves if leaf.dtype == "int32")
            cells = arrays[ids.name].reshape(rows, -1)
            cells[rng.integers(0, rows), rng.integers(0, cells.shape[1])] = ids.vocab
        elif kind == "missing_leaf":
            del arrays[contract.leaves[-1].name]
        elif kind == "extra_leaf":
            arrays[EXTRA_LEAF] = np.zeros((rows, 1), np.float32)
        elif kind == "batch_sizes":
            arrays[first.name] = head[:-1] if rows > 1 else np.concatenate([head, head])
        x = arrays[VECTOR_LEAF] if contract.flat else arrays
        # The byte limit is checked first (after the type): under a tight limit a wider,
        # longer or wider-typed request is refused for its size.
        nbytes = sum(v.nbytes for v in arrays.values() if isinstance(v, np.ndarray))
        if kind != "type" and nbytes > config.max_request_bytes:
            kind = "too_many_bytes"
        yield Request(x, kind)


class _Replayed(TypedDict):
    """One guard's replay of a stream: requests sent, whether the budget cut it short,
    the outcomes (and those not planted), its compiles meanwhile, the served requests'
    latency (None: none served) and the guard's aggregates after it."""

    requests: int
    stopped_by_budget: bool
    outcomes: dict[str, int]
    mismatched: dict[str, int]
    compiles_during_replay: int
    latency_ms: LatencyCell | None
    metrics: GuardMetrics


def _replay(
    guard: Guard,
    stream: Iterable[Request],
    step: Phase | None = None,
    time_budget_s: float | None = None,
) -> tuple[_Replayed, np.ndarray, np.ndarray, np.ndarray]:
    """Send ``stream`` through ``guard``: (summary, per-request seconds, rows served and
    whether it compiled), seconds NaN and rows 0 where a request was not served.
    ``step``: a progress phase advanced by one per request. ``time_budget_s``: wall
    seconds after which no further request is drawn from ``stream`` (None: all of it);
    the summary's ``stopped_by_budget`` says whether it cut the stream short."""
    compiles_before = guard.compiles
    started = time.perf_counter()
    stopped_by_budget = False
    seconds: list[float] = []
    rows: list[int] = []
    compiled: list[bool] = []
    outcomes: Counter[str] = Counter()
    mismatched: Counter[str] = Counter()
    requests = iter(stream)
    while True:
        over_budget = time_budget_s is not None and time.perf_counter() - started > time_budget_s
        if over_budget and seconds:
            # Checked before drawing: a request drawn is always sent, so the stream's
            # prefix that was sent is exactly what the figures describe (one at least).
            stopped_by_budget = next(requests, None) is not None
            break
        request = next(requests, None)
        if request is None:
            break
        compiles = guard.compiles
        start = time.perf_counter()
        try:
            out = guard.predict(request.x)
        except InvalidInputError as exc:
            outcome = exc.reason
        except NonFiniteOutputError:
            outcome = NON_FINITE_OUTPUT
        else:
            outcome = SERVED
        elapsed = time.perf_counter() - start
        seconds.append(elapsed if outcome == SERVED else math.nan)
        rows.append(out.shape[0] if outcome == SERVED else 0)
        compiled.append(guard.compiles > compiles)
        outcomes[outcome] += 1
        if outcome != request.expected:
            mismatched[f"{request.expected}->{outcome}"] += 1
        if step is not None:
            step.advance()
    samples = np.asarray(seconds, dtype=np.float64)
    served_rows = np.asarray(rows, dtype=np.int64)
    summary: _Replayed = {
        "requests": int(samples.size),
        "stopped_by_budget": stopped_by_budget,
        "outcomes": dict(sorted(outcomes.items())),
        # Requests that did not get the outcome the stream planted (expected->got).
        "mismatched": dict(sorted(mismatched.items())),
        "compiles_during_replay": guard.compiles - compiles_before,
        "latency_ms": _latency(samples, served_rows),
        "metrics": guard.metrics(),
    }
    return summary, samples, served_rows, np.asarray(compiled, dtype=bool)


def _latency(seconds: np.ndarray, rows: np.ndarray) -> LatencyCell | None:
    """latency_stats of the served requests (seconds not NaN); rows_per_s is at their mean
    batch size."""
    served = ~np.isnan(seconds)
    if not served.any():
        return None
    return latency_stats(seconds[served], max(1, round(float(rows[served].mean()))))


def replay(guard: Guard, stream: Iterable[Request]) -> _Replayed:
    """Send every request of ``stream`` through ``guard`` and report, JSON-able.

    ``outcomes``: how many requests were served or refused, by reason; ``mismatched``:
    requests that got another outcome than planted (should be empty); ``latency_ms``:
    the distribution of served requests' latency (bench.latency_stats);
    ``compiles_during_replay``; ``metrics``: the guard's own aggregates afterwards.
    """
    return _replay(guard, stream)[0]


def run_replay(
    model: Model,
    params: Params,
    template_rows: np.ndarray,
    dtype: Any,
    config: GuardConfig,
    progress: Progress | None = None,
) -> ReplayReport:
    """Replay ``config.replay``'s stream through a bucketed guard, then its first
    ``replay.unbucketed_requests`` through an un-bucketed one; the report, JSON-able.
    ``progress``: where the two replays show their progress (None: not shown); the ETA
    is the requests left at the rate measured over the replay so far (the stream's batch
    sizes are drawn at random, so the requests done are a fair sample of those left).

    The un-bucketed guard differs only in running each request at its exact batch size
    (every new size compiles, inside that request's latency). Both are compared on the
    same prefix of the stream (``latency_ms.bucketed_prefix`` vs ``unbucketed_prefix``);
    ``latency_ms.bucketed`` covers the whole stream.
    """
    progress = progress or silent()
    n_requests = config.replay.n_requests
    budget_s = config.replay.time_budget_s
    guard = Guard(model, params, dtype, config)
    stream = request_stream(template_rows, dtype, config, model.contract)
    started = time.perf_counter()
    with progress.phase(
        f"guard replay ({len(config.buckets)} buckets)",
        n_requests,
        unit="requests",
        eta=Eta(n_requests),
    ) as step:
        bucketed, seconds, rows, _ = _replay(guard, stream, step, budget_s)
        if bucketed["stopped_by_budget"]:
            step.drop(n_requests - bucketed["requests"], n_requests - bucketed["requests"])
    replay_s = time.perf_counter() - started
    # The comparison replays a prefix of what the bucketed guard was sent.
    n_plain = min(config.replay.unbucketed_requests, bucketed["requests"])
    metrics = bucketed["metrics"]
    report: ReplayReport = {
        "requests": bucketed["requests"],
        "requests_planned": n_requests,
        "time_budget_s": budget_s,
        "stopped_by_budget": bucketed["stopped_by_budget"],
        "buckets": list(config.buckets),
        "compiles": guard.compiles,
        "compiles_within_bound": guard.compiles <= len(config.buckets),
        "compiles_during_replay": bucketed["compiles_during_replay"],
        "padding_overhead": metrics["padding_overhead"],
        "invalid_share": metrics["invalid_share"],
        "invalid_share_total": metrics["invalid_share_total"],
        "numeric_errors": metrics["numeric_errors"],
        "outcomes": bucketed["outcomes"],
        "mismatched": bucketed["mismatched"],
        "latency_ms": {"bucketed": bucketed["latency_ms"]},
        "bucketed_metrics": metrics,
        # Wall seconds of each replay (guard construction and precompile included in
        # the bucketed one): where the bench's own time goes.
        "wall_s": {"bucketed": round(replay_s, 3)},
    }
    if n_plain:
        started = time.perf_counter()
        plain = Guard(model, params, dtype, config, bucketed=False)
        stream = itertools.islice(
            request_stream(template_rows, dtype, config, model.contract), n_plain
        )
        # Each new batch size compiles here, more often early in the stream than late:
        # this ETA starts high and comes down.
        with progress.phase(
            "guard replay without buckets", n_plain, unit="requests", eta=Eta(n_plain)
        ) as step:
            # The same budget again: each new batch size compiles here, and a big
            # model's compiles would otherwise take minutes of a quick profile.
            unbucketed, plain_s, plain_rows, plain_compiled = _replay(plain, stream, step, budget_s)
            if unbucketed["stopped_by_budget"]:
                step.drop(n_plain - unbucketed["requests"], n_plain - unbucketed["requests"])
        sent = unbucketed["requests"]
        report["latency_ms"]["bucketed_prefix"] = _latency(seconds[:sent], rows[:sent])
        report["latency_ms"]["unbucketed_prefix"] = unbucketed["latency_ms"]
        # Requests at an already-seen size: the cost of padding without that of compiling.
        report["latency_ms"]["unbucketed_prefix_no_compile"] = _latency(
            np.where(plain_compiled, np.nan, plain_s), plain_rows
        )
        report["unbucketed"] = {
            "requests": sent,
            "requests_planned": n_plain,
            "stopped_by_budget": unbucketed["stopped_by_budget"],
            "compiles": plain.compiles,
            "compile_s": unbucketed["metrics"]["compile_s"],
            "distinct_batch_sizes": unbucketed["metrics"]["distinct_batch_sizes"],
        }
        report["wall_s"]["unbucketed"] = round(time.perf_counter() - started, 3)
    budget_note = (
        f"The replay stopped after {bucketed['requests']} of {n_requests} requests: its "
        f"time budget of {budget_s} s (bench.replay_time_budget_s) ran out."
        if bucketed["stopped_by_budget"]
        else f"All {n_requests} requests were sent (bench.replay_requests)."
    )
    report["notes"] = [
        "Latency is per request on the host: limits, validation, padding, transfer, "
        "forward and copy back; a refused request's time is not in it.",
        "Compiles of the bucketed guard include its warm-up when guard.precompile is true.",
        budget_note,
        f"The un-bucketed comparison replays only the first {report['unbucketed']['requests']} "
        f"of {bucketed['requests']} requests (guard.replay.unbucketed_requests, "
        f"{n_plain}, within the same time budget): each new "
        "batch size compiles there, and the whole stream would take minutes; the bucketed "
        "guard's latency over the same prefix is bucketed_prefix; "
        "unbucketed_prefix_no_compile keeps the requests at an already-seen size (what "
        "padding costs, compilation aside)."
        if n_plain
        else "No un-bucketed comparison (guard.replay.unbucketed_requests is 0).",
    ]
    return report


# The latencies a replay reports (ReplayLatency), in its order: the figures' names.
REPLAY_LATENCIES: tuple[
    Literal["bucketed", "bucketed_prefix", "unbucketed_prefix", "unbucketed_prefix_no_compile"],
    ...,
] = ("bucketed", "bucketed_prefix", "unbucketed_prefix", "unbucketed_prefix_no_compile")


def replay_passed(report: ReplayReport) -> bool:
    """The replay's own checks: compiles bounded by the buckets, every request got the
    outcome planted for it (invalid ones refused for their reason, valid ones served)."""
    return bool(report["compiles_within_bound"]) and not report["mismatched"]


def replay_figures(report: ReplayReport) -> dict[str, float]:
    """The replay's headline figures, flat (reports/bench.json ``replay``, MLflow
    ``replay/...``): compiles vs buckets, latency with and without buckets, padding,
    invalid share."""
    latency = report["latency_ms"]
    figures: dict[str, float] = {
        "passed": float(replay_passed(report)),
        "requests": float(report["requests"]),
        "compiles": float(report["compiles"]),
        "buckets": float(len(report["buckets"])),
        "padding_overhead": float(report["padding_overhead"]),
        "invalid_share": float(report["invalid_share_total"]),
        "numeric_errors": float(report["numeric_errors"]),
        "mismatched": float(sum(report["mismatched"].values())),
    }
    # In the order the replay writes them (REPLAY_LATENCIES), each where it was measured.
    for name in REPLAY_LATENCIES:
        stats = latency.get(name)
        for stat in ("p50", "p90", "p99"):
            if stats is not None:
                figures[f"{name}_{stat}_ms"] = float(stats[stat])
    if "unbucketed" in report:
        figures["unbucketed_compiles"] = float(report["unbucketed"]["compiles"])
    return figures


def replay_summary(report: ReplayReport) -> str:
    """One line for the log: compiles, latency with and without buckets, verdict."""
    f = replay_figures(report)
    sent = f"{int(f['requests'])} requests"
    if report.get("stopped_by_budget"):
        sent += (
            f" (of {report['requests_planned']}: its {report['time_budget_s']:g} s budget ran out)"
        )
    text = (
        f"{sent}, {int(f['compiles'])} compile(s) for "
        f"{int(f['buckets'])} bucket(s); p50 {f.get('bucketed_p50_ms', math.nan):.3g} ms "
        f"(p99 {f.get('bucketed_p99_ms', math.nan):.3g})"
    )
    if "unbucketed_prefix_p50_ms" in f:
        text += (
            f"; first {report['unbucketed']['requests']} without buckets: p50 "
            f"{f['unbucketed_prefix_p50_ms']:.3g} ms vs {f['bucketed_prefix_p50_ms']:.3g} "
            f"with, {int(f['unbucketed_compiles'])} compile(s)"
        )
    text += (
        f"; padding overhead {f['padding_overhead']:.2f}, invalid share "
        f"{f['invalid_share']:.1%}: {'ok' if f['passed'] else 'FAILED'}"
    )
    return text
