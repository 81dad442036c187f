"""Config group ``guard``: the serving guard's limits and its replay, and the byte size of
an example that its request limit is checked against."""

from __future__ import annotations

import itertools
from typing import Annotated, Any

from pydantic import Field, model_validator

from vmapcheck.config.fields import NonNegativeFloat, PositiveInt, Seed, Strict
from vmapcheck.config.model import ModelConfig


class GuardReplayConfig(Strict):
    """The request stream the guard's replay sends (vmapcheck.guard.replay.request_stream)."""

    n_requests: PositiveInt
    # Wall seconds after which the bucketed replay sends no further request (the
    # profile's bench.replay_time_budget_s); null: all n_requests are sent.
    time_budget_s: Annotated[float, Field(gt=0.0)] | None = None
    # Share of requests made invalid on purpose, spread evenly over the invalid kinds.
    invalid_share: Annotated[float, Field(ge=0.0, lt=1.0)]
    # Seeds the numpy Generator that draws batch sizes, kinds and values.
    seed: Seed
    # Noise added to the real rows a request is drawn around, in units of each feature's
    # standard deviation over those rows.
    noise_std: NonNegativeFloat
    # How many of the stream's first requests the un-bucketed comparison replays (each
    # new batch size compiles there: replaying all would take minutes); 0 skips it.
    unbucketed_requests: Annotated[int, Field(ge=0)]
    # Plant vmapcheck.guard.replay.REQUEST_CANARY in one cell of every request, for privacy tests
    # that search every output for it afterwards. The value lives in the code, not here:
    # the config itself is logged (params.yaml, MLflow params), and must not hold it.
    plant_canary: bool = False

    @model_validator(mode="after")
    def _comparison_within_stream(self) -> GuardReplayConfig:
        if self.unbucketed_requests > self.n_requests:
            raise ValueError(
                f"guard.replay.unbucketed_requests={self.unbucketed_requests} exceeds "
                f"guard.replay.n_requests={self.n_requests}: the comparison replays a prefix "
                "of the same stream"
            )
        return self


def _strictly_increasing(key: str, values: list[Any]) -> None:
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{key} must be strictly increasing, found {values}")


class GuardConfig(Strict):
    """The batched predictor that serves verified params (vmapcheck.guard.predictor)."""

    # Every request is padded up to the smallest of these row counts that holds it: at
    # most one compilation per bucket, whatever batch sizes arrive.
    buckets: Annotated[list[PositiveInt], Field(min_length=1)]
    # Requests with more rows are refused (before any copy); at most the largest bucket.
    max_batch: PositiveInt
    # Requests whose shape x itemsize exceeds this are refused (before any copy).
    max_request_bytes: PositiveInt
    # Compile every bucket when the guard is built (true), or on its first request.
    precompile: bool
    # Upper edges (ms) of the latency histogram's bins; one more bin counts the rest.
    latency_edges_ms: Annotated[list[Annotated[float, Field(gt=0.0)]], Field(min_length=1)]
    # Percentiles are exact over the last this many served requests.
    latency_window: PositiveInt
    replay: GuardReplayConfig

    @model_validator(mode="after")
    def _consistent(self) -> GuardConfig:
        _strictly_increasing("guard.buckets", self.buckets)
        _strictly_increasing("guard.latency_edges_ms", self.latency_edges_ms)
        if self.max_batch > self.buckets[-1]:
            raise ValueError(
                f"guard.max_batch={self.max_batch} exceeds the largest bucket "
                f"guard.buckets[-1]={self.buckets[-1]}: such a request would fit no bucket"
            )
        return self


# Bytes per element of each configurable dtype (bfloat16 is not a numpy dtype).
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}


# Bytes per element of the leaves that are not float (float leaves: the run's dtype).
LEAF_BYTES = {"int32": 4, "bool": 1}


def example_bytes(model: ModelConfig, float_bytes: int) -> int:
    """The bytes of one valid example: every leaf's elements x its itemsize (float leaves
    at ``float_bytes``, the run's precision)."""
    if model.inputs is None:
        return model.in_features * float_bytes
    return sum(
        leaf.size * LEAF_BYTES.get(leaf.dtype, float_bytes) for leaf in model.inputs.values()
    )


def byte_limit_problem(guard: GuardConfig, per_example: int) -> str | None:
    """Why ``guard.max_request_bytes`` would refuse a valid full batch, or None.

    ``per_example``: the bytes of one valid example (:func:`example_bytes`). A valid
    request's size is fixed by its row count, so a byte limit below one full batch
    would make ``guard.max_batch`` a promise the guard cannot keep.
    """
    full = guard.max_batch * per_example
    if full <= guard.max_request_bytes:
        return None
    return (
        f"guard.max_request_bytes={guard.max_request_bytes} is below one valid request of "
        f"guard.max_batch={guard.max_batch} rows x {per_example} bytes per example "
        f"= {full}: raise guard.max_request_bytes or lower guard.max_batch"
    )
