"""Typed, validated configuration read from params.yaml.

params.yaml is the composition of conf/ by Hydra (written by ``dvc exp run`` or
``make params``). Stages never read it raw: :func:`load_config` validates it into
:class:`Config`, so an unknown key, a wrong type or an impossible value stops a stage
with a :class:`~vmapcheck.errors.ConfigError` that names the key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from vmapcheck.errors import ConfigError, redact

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]


class _Strict(BaseModel):
    # strict: "32" is not silently turned into 32; forbid: typos are errors, not ignored;
    # allow_inf_nan off: every float (tolerances first) is finite, so rtol=inf is refused
    # here rather than making every comparison fail with a NaN bound.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


BUILTIN_MODELS = ("toy", "mlp")


class LeafConfig(_Strict):
    """One input leaf of a model whose example is a dict of leaves (model.inputs.<leaf>):
    its per-example shape, dtype ("float": the run's precision; "int32" ids in
    [0, vocab); "bool" a mask) and meaning (vmapcheck.core.contract.Leaf)."""

    shape: Annotated[list[PositiveInt], Field(min_length=1)]
    dtype: Literal["float", "int32", "bool"]
    vocab: PositiveInt | None = None
    meaning: str = ""

    @model_validator(mode="after")
    def _ids_have_a_vocab(self) -> LeafConfig:
        if (self.dtype == "int32") != (self.vocab is not None):
            raise ValueError(
                "expected vocab (ids are in [0, vocab)) exactly for an int32 leaf, found "
                f"dtype {self.dtype} with vocab {self.vocab}"
            )
        return self

    @property
    def size(self) -> int:
        """The table columns the leaf takes: the product of its shape."""
        size = 1
        for n in self.shape:
            size *= n
        return size


class ModelConfig(_Strict):
    """Which model, and its layer widths. ``toy`` is the seed's fixed 3 -> 2 model.

    Any other name is a user's model: ``factory`` is a Hydra ``_target_`` (with its
    keyword arguments) returning a :class:`vmapcheck.core.models.Model`. ``hidden`` (the
    hidden layer widths) is read by the built-in ``mlp`` only, which requires it; a
    user's model may leave it out (its factory gets whatever its own keys pass).
    """

    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    in_features: PositiveInt
    # validate_default: a missing hidden is checked too (required for mlp).
    hidden: Annotated[list[PositiveInt] | None, Field(validate_default=True)] = None
    out_features: PositiveInt
    factory: dict[str, Any] | None = None
    # None: one example is a flat float vector (in_features,). Else a dict of leaves, in
    # this order, taking in_features table columns together.
    inputs: dict[str, LeafConfig] | None = None

    @model_validator(mode="after")
    def _inputs_take_the_features(self) -> ModelConfig:
        if self.inputs is None:
            return self
        if self.name in BUILTIN_MODELS:
            raise ValueError(f"model {self.name!r} takes a flat vector: model.inputs must be null")
        if not self.inputs:
            raise ValueError("expected at least one leaf in model.inputs, found none")
        sizes = {name: leaf.size for name, leaf in self.inputs.items()}
        if sum(sizes.values()) != self.in_features:
            raise ValueError(
                f"model.inputs take {sum(sizes.values())} table columns "
                f"({', '.join(f'{k}: {v}' for k, v in sizes.items())}) but "
                f"model.in_features={self.in_features}: they must be equal"
            )
        return self

    @field_validator("hidden", mode="after")
    @classmethod
    def _mlp_needs_hidden(cls, hidden: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if hidden is None and info.data.get("name") == "mlp":
            raise ValueError(
                "expected the hidden layer widths of the built-in model 'mlp' (a list such "
                "as [32, 32], or [] for none; conf/model/mlp.yaml sets them)"
            )
        return hidden

    @model_validator(mode="after")
    def _factory_for_own_models(self) -> ModelConfig:
        if self.name in BUILTIN_MODELS and self.factory is not None:
            raise ValueError(f"model {self.name!r} is built in: model.factory must be null")
        if self.name not in BUILTIN_MODELS and not (self.factory or {}).get("_target_"):
            raise ValueError(
                f"model {self.name!r} is not built in ({', '.join(BUILTIN_MODELS)}): "
                "model.factory._target_ must name a function returning a vmapcheck Model"
            )
        return self

    @model_validator(mode="after")
    def _toy_is_fixed(self) -> ModelConfig:
        # toy reads no hidden: leaving it out is the same as its fixed [].
        hidden = [] if self.hidden is None else self.hidden
        if self.name == "toy" and (self.in_features, hidden, self.out_features) != (
            3,
            [],
            2,
        ):
            raise ValueError(
                "model 'toy' is the seed's fixed model: expected in_features=3, hidden=[], "
                f"out_features=2, found in_features={self.in_features}, "
                f"hidden={self.hidden}, out_features={self.out_features}"
            )
        return self


class SplitConfig(_Strict):
    train: Fraction
    val: Fraction
    test: Fraction

    @model_validator(mode="after")
    def _sums_to_one(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"split fractions must sum to 1, found {total:g}")
        return self


QuasiPolicy = Literal["drop", "year", "decade", "band10", "prefix1", "prefix2", "prefix3"]


class AnonymizeConfig(_Strict):
    """What leaves ``prepare``: identifiers are dropped, except an optional keyed join key."""

    # An identifier column kept as an HMAC-SHA256 pseudonym (null: drop every identifier).
    join_key: str | None
    # Name of the environment variable holding the HMAC secret (never its value).
    secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    # An identifier column whose equal values are one record: a record never spans splits.
    group_by: str | None


class _DataCommon(_Strict):
    quasi_identifiers: dict[str, QuasiPolicy]
    anonymize: AnonymizeConfig
    split: SplitConfig
    standard_batch: PositiveInt


class SyntheticDataConfig(_DataCommon):
    """A raw table generated from the key stream: identifiers, quasi-identifiers, numbers."""

    source: Literal["synthetic"]
    n_rows: Annotated[int, Field(ge=20)]
    n_features: PositiveInt
    n_targets: PositiveInt
    noise_std: NonNegativeFloat


class _DeclaredColumns(_DataCommon):
    """A table whose feature and target columns are declared by name, in order."""

    features: Annotated[list[str], Field(min_length=1)]
    targets: Annotated[list[str], Field(min_length=1)]

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_targets(self) -> int:
        return len(self.targets)


class FileDataConfig(_DeclaredColumns):
    """The user's table (.csv or .parquet) with a declared schema; every column declared."""

    source: Literal["csv"]
    path: Annotated[str, Field(min_length=1)]
    delimiter: Annotated[str, Field(min_length=1, max_length=1)]
    identifiers: list[str]


class _BundledTableConfig(_DeclaredColumns):
    """A table scikit-learn ships, its columns declared by name (no file, no identifier)."""


class DiabetesDataConfig(_BundledTableConfig):
    """The diabetes table scikit-learn ships (vmapcheck.data.builtin.diabetes_raw_table):
    442 patients, unscaled, no identifier. Every column of it in exactly one role (checked
    by ``prepare`` against the table: vmapcheck.data.builtin.diabetes_schema)."""

    source: Literal["diabetes"]


class DigitsDataConfig(_BundledTableConfig):
    """The handwritten digits scikit-learn ships (vmapcheck.data.builtin.digits_raw_table):
    1,797 8x8 images, 64 pixel columns and the label as ten indicator columns; no
    identifier or quasi-identifier. Every column of it in exactly one role (checked by
    ``prepare`` against the table: vmapcheck.data.builtin.digits_schema)."""

    source: Literal["digits"]


class DigitTokensDataConfig(_BundledTableConfig):
    """The same digits as token sequences (vmapcheck.data.builtin.digit_tokens_raw_table):
    each image's 64 pixels row-major are ids 0..16, cropped to a length drawn from a
    fixed-seed generator and padded (id 0, mask 0); 64 id columns, 64 mask columns and the
    label as ten indicator columns; no identifier or quasi-identifier. Every column of it
    in exactly one role (checked by ``prepare`` against the table:
    vmapcheck.data.builtin.digit_tokens_schema)."""

    source: Literal["digit_tokens"]


DataConfig = Annotated[
    SyntheticDataConfig
    | FileDataConfig
    | DiabetesDataConfig
    | DigitsDataConfig
    | DigitTokensDataConfig,
    Field(discriminator="source"),
]


# A registered model's name as vmapcheck.tracking.registry writes it into models:/ URIs (MLflow
# forbids '/' and ':' in names; '@' would read as an alias).
REGISTERED_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
# models:/<name>/<version> (pinned) or models:/<name>@<alias>.
MODELS_URI_PATTERN = (
    r"^models:/[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}(/[1-9][0-9]{0,9}|@[A-Za-z][A-Za-z0-9_\-]{0,63})$"
)


MAX_LEARNING_RATE = 10.0


class TrainConfig(_Strict):
    optimizer: Literal["adam", "sgd"]
    steps: Annotated[int, Field(ge=0)]
    batch_size: PositiveInt
    # Above MAX_LEARNING_RATE no optimizer step stays finite on any model here: refused
    # at the door, not as a NaN loss after the work has started.
    learning_rate: Annotated[float, Field(gt=0.0, le=MAX_LEARNING_RATE)]
    eval_every: PositiveInt
    # Bring your own params: a safetensors file and its expected sha256 (both or neither).
    # When given, nothing is trained: the file is verified and evaluated.
    params_file: str | None = None
    params_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    # Or verified params from the MLflow Model Registry (vmapcheck.tracking.registry): a pinned
    # version models:/<name>/<version>, or an alias models:/<name>@<alias>.
    params_source: Annotated[str, Field(pattern=MODELS_URI_PATTERN)] | None = None

    @model_validator(mode="after")
    def _file_with_its_digest(self) -> TrainConfig:
        if (self.params_file is None) != (self.params_sha256 is None):
            raise ValueError(
                "train.params_file and train.params_sha256 go together: a params file is "
                "used only with the sha256 it must have"
            )
        if self.params_file is not None and self.params_source is not None:
            raise ValueError(
                "train.params_file and train.params_source both name params: give one of them"
            )
        return self


class BackendConfig(_Strict):
    name: Literal["cpu", "gpu", "tpu"]
    platform: Literal["cpu", "cuda", "rocm", "tpu"]
    # Devices of the data-parallel (sharded_jit) path's 1-D mesh; null: every device present.
    # On CPU, JAX is started with this many emulated CPU devices (jax_num_cpu_devices).
    # The other paths run on one device whatever this says.
    num_devices: PositiveInt | None
    # Whether one process at a time may open the devices: on a TPU, a process that opens
    # the chip while another holds it fails (libtpu's lockfile). The paired verdict
    # (vmapcheck.bench.paired) then never runs two worker processes at once. Absent: true
    # on every platform but cpu (the validator below), so a backend that does not say is
    # treated as exclusive.
    exclusive_device: bool = True

    @model_validator(mode="before")
    @classmethod
    def _exclusive_unless_cpu(cls, data: Any) -> Any:
        if isinstance(data, dict) and "exclusive_device" not in data:
            return {**data, "exclusive_device": data.get("platform") != "cpu"}
        return data


# What the relative tolerance is relative to (vmapcheck.core.compare.scale_of): "output",
# max(|a|, |b|); "terms", the magnitude of the terms each output element is made of
# (vmapcheck.core.magnitude), at least max(|a|, |b|).
ToleranceScale = Literal["terms", "output"]


# The loosest rtol and atol a check accepts. Past it a check no longer tells a batching
# mistake from rounding: bfloat16, the coarsest dtype here, rounds to 2^-8 (0.4%) and its
# shipped tolerances are 1.6e-2 to 3.2e-2 (conf/precision/bf16.yaml); an rtol of 1e300
# passed every mistake (and overflowed).
MAX_TOLERANCE = 0.1


class ToleranceConfig(_Strict):
    """Agreement between two outputs a, b, elementwise: ``|a - b|`` within ``atol`` plus
    ``rtol`` times the magnitude ``scale`` names (the rule: vmapcheck.core.compare).
    Both at most :data:`MAX_TOLERANCE`."""

    rtol: Annotated[float, Field(ge=0.0, le=MAX_TOLERANCE)]
    atol: Annotated[float, Field(ge=0.0, le=MAX_TOLERANCE)]
    # conf/precision/*.yaml set it ("terms"); the default serves tolerances built in code.
    scale: ToleranceScale = "terms"


# The float dtype each precision option (conf/precision/<name>.yaml) runs in; f32_default
# is float32 at the backend's own matmul precision (bfloat16 operands on a TPU).
PRECISION_DTYPES = {
    "f32": "float32",
    "f32_default": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
}
PrecisionName = Literal["f32", "f32_default", "f64", "bf16"]


class PrecisionConfig(_Strict):
    name: PrecisionName
    dtype: Literal["float32", "float64", "bfloat16"]
    enable_x64: bool
    matmul_precision: Literal["default", "high", "highest"]
    # Between forward paths within one run.
    tolerance: ToleranceConfig
    # Against the stored reference and the float64 oracle (another run, other numerics).
    cross_run_tolerance: ToleranceConfig

    @model_validator(mode="after")
    def _x64_matches_dtype(self) -> PrecisionConfig:
        if self.dtype == "float64" and not self.enable_x64:
            raise ValueError("dtype float64 needs enable_x64: true (JAX truncates to float32)")
        return self


class RegressionConfig(_Strict):
    """When a benchmark counts as slower than its baseline (vmapcheck.bench.verdict)."""

    # A cell regresses only when median(current) / median(baseline) exceeds this ...
    factor: Annotated[float, Field(gt=1.0, le=10.0)]
    # ... and the BH-adjusted one-sided Mann-Whitney p-value on block medians is below this.
    alpha: Fraction
    # Compared after every run in `track`: "last-verified" (the newest passed run with
    # the same model, backend and precision in the store), a bench_details.json, a run
    # id, or null for no comparison.
    baseline: str | None

    @field_validator("baseline", mode="after")
    @classmethod
    def _a_baseline_track_can_find(cls, spec: str | None) -> str | None:
        # Judged in track, after the whole pipeline: a value that can name nothing is
        # refused here, before any work (a file's existence is track's to check).
        if spec is None or spec == "last-verified" or spec.endswith(".json"):
            return spec
        if re.fullmatch(r"[0-9a-f]{32}", spec):
            return spec
        raise ValueError(
            "expected last-verified, an MLflow run id (32 hex digits), a path to a "
            "bench_details.json, or null (no comparison)"
        )


# Rounds the bench stage times every cell in (vmapcheck.bench.timing.ROUNDS): a cell
# stopped early has fewer (EarlyStopConfig), never more.
BENCH_ROUNDS = 10
# The fewest latencies a cell keeps (vmapcheck.bench.timing.samples_per_round) and a stored
# baseline's cell must hold to be compared (vmapcheck.bench.baseline): one number for both.
MIN_SAMPLES = 5


class EarlyStopConfig(_Strict):
    """When timing stops before its maximum (docs/benchmark.md, "Early stopping").

    The bench stage (vmapcheck.bench.timing.run_bench) stops a cell at a round boundary,
    never within a round, once it has ``min_rounds`` rounds and either its median's
    confidence interval over those rounds is within ``ci_target`` or the timing has run
    ``time_budget_s``. The paired verdict (vmapcheck.bench.paired) looks at its pairs
    ``paired_looks`` times, a group-sequential test (vmapcheck.bench.sequential).
    """

    # The stored-run verdict tests round medians (Mann-Whitney): 7 rounds a side still
    # reach p = 2.9e-4, under alpha / 30 cells (0.01 / 30) after Benjamini-Hochberg.
    # A run with fewer rounds than this (bench.repeats under min_rounds, as the tests'
    # short runs have) takes every round: nothing stops early.
    min_rounds: Annotated[int, Field(ge=2, le=BENCH_ROUNDS)]
    # Relative half-width of a cell's median interval over its round medians (the
    # order-statistic interval at bench.confidence_level) at which the cell stops.
    ci_target: Fraction
    # Wall seconds the timing phase plans to fit (vmapcheck.bench.timing): the dearest
    # cells take fewer samples a round from the first round on (samples_per_round), a
    # loop path whose projected cost alone exceeds it is left out at that batch size
    # (over_budget), and from min_rounds on the cells stop at a round boundary once the
    # rest would overrun it; null: no budget.
    time_budget_s: Annotated[float, Field(gt=0.0)] | None
    # Looks of the paired verdict's group-sequential test, equally spaced up to its
    # pairs; 1: the fixed-sample test.
    paired_looks: Annotated[int, Field(ge=1, le=10)]


MAX_REPEATS = 100_000


class BenchConfig(_Strict):
    name: str
    batch_sizes: Annotated[list[PositiveInt], Field(min_length=1)]
    warmup: PositiveInt
    # At most MAX_REPEATS: the timing keeps a float per sample and cell, and the rounds
    # stop early long before (bench.early_stop); 1e9 was killed for memory after 132 s.
    repeats: Annotated[int, Field(ge=5, le=MAX_REPEATS)]
    loop_max_batch: PositiveInt
    # Of the bootstrap confidence interval reported for each median.
    confidence_level: Annotated[float, Field(gt=0.5, lt=1.0)]
    # Side of the control matmul timed in every round (the verdict's yardstick), and the
    # first size of the peak sweep, which doubles it until the device is busy
    # (vmapcheck.bench.timing.peak_sweep).
    peak_matmul_size: Annotated[int, Field(ge=64, le=8192)]
    # Requests the serving guard's replay sends (guard.replay.n_requests interpolates it):
    # the replay is part of the bench, so its profile bounds it too.
    replay_requests: PositiveInt
    # Wall seconds the guard's bucketed replay may run (guard.replay.time_budget_s
    # interpolates it): past it the stream stops before its next request, and the report
    # says how many of replay_requests were sent. A bigger model serves fewer requests in
    # the same time, so the profile bounds the replay for every model; null: no budget.
    replay_time_budget_s: Annotated[float, Field(gt=0.0)] | None = None
    regression: RegressionConfig
    early_stop: EarlyStopConfig


class BudgetConfig(_Strict):
    """How much of each case the costliest parts of the check compute, in rows of a batch
    case (batch axis 0): each runs on the case's first ``*_max_rows`` rows at most, and
    the check report says how many rows each covered and that the budget capped it
    (docs/checks.md, "Budgets"). A row count, not a time: the outputs, and so what DVC
    caches, must not depend on the machine's speed or load.
    """

    # The float64 oracle (vmapcheck.core.oracle): forward_one row by row in float64.
    oracle_max_rows: PositiveInt
    # The terms' magnitude (vmapcheck.core.magnitude): forward_one's jaxpr interpreted on
    # magnitudes in float64, row by row. Rows beyond it are judged by the output rule.
    magnitude_max_rows: PositiveInt
    # The loop paths in `forward` (every PATHS entry with forward_cap): one Python-level
    # forward per row, which jit unrolls into one program (compile time grows with rows).
    loop_max_rows: PositiveInt
    # The gradient probe in `forward` on the standard case: vmap(grad) holds one gradient
    # per row, rows x parameters numbers.
    gradient_max_rows: PositiveInt


class GuardReplayConfig(_Strict):
    """The request stream the guard's replay sends (vmapcheck.bench.guard.request_stream)."""

    n_requests: PositiveInt
    # Wall seconds after which the bucketed replay sends no further request (the
    # profile's bench.replay_time_budget_s); null: all n_requests are sent.
    time_budget_s: Annotated[float, Field(gt=0.0)] | None = None
    # Share of requests made invalid on purpose, spread evenly over the invalid kinds.
    invalid_share: Annotated[float, Field(ge=0.0, lt=1.0)]
    # Seeds the numpy Generator that draws batch sizes, kinds and values.
    seed: Annotated[int, Field(ge=0)]
    # Noise added to the real rows a request is drawn around, in units of each feature's
    # standard deviation over those rows.
    noise_std: NonNegativeFloat
    # How many of the stream's first requests the un-bucketed comparison replays (each
    # new batch size compiles there: replaying all would take minutes); 0 skips it.
    unbucketed_requests: Annotated[int, Field(ge=0)]
    # Plant vmapcheck.bench.guard.REQUEST_CANARY in one cell of every request, for privacy tests
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


class GuardConfig(_Strict):
    """The batched predictor that serves verified params (vmapcheck.bench.guard)."""

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


# The stores this project logs to: a sqlite file (tracking=local) or a tracking server.
SQLITE_URI = "sqlite:///"
HTTP_SCHEMES = ("http://", "https://")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be the MLflow store here, or None when it can; the caller names
    the key (``tracking.tracking_uri``, ``MLFLOW_TRACKING_URI``) and the value found.

    Accepted: ``sqlite:///<path>`` and ``http(s)://host...``. A bare folder or file and a
    ``file:`` URI (MLflow's file store, in maintenance mode) get the sqlite URI to use
    instead; any other scheme is refused (MLflow would fail later, with a traceback).
    """
    if uri.startswith(SQLITE_URI):
        if not uri[len(SQLITE_URI) :].split("?", 1)[0].strip():
            return "expected sqlite:///<path to a .db file>, with a path"
        return None
    if uri.startswith(HTTP_SCHEMES):
        return None
    if "://" not in uri or uri.startswith("file:"):
        path = uri.removeprefix("file://").removeprefix("file:").rstrip("/") or "."
        suggested = path if path.endswith(".db") else f"{path}/mlflow.db"
        return (
            "a folder or file is MLflow's file store (in maintenance mode, not supported "
            f"here): use sqlite:///<path>/mlflow.db, e.g. sqlite:///{suggested}"
        )
    scheme = uri.split("://", 1)[0]
    return (
        "expected sqlite:///<path> (tracking=local) or the http:// or https:// URL of an "
        f"MLflow tracking server (tracking=server), not scheme {scheme!r}"
    )


class TrackingConfig(_Strict):
    """Where runs are logged (``tracking=local``: a sqlite file; ``tracking=server``: an
    MLflow tracking server) and how long to wait for a server (vmapcheck.tracking.store).

    The ``http_*`` settings apply whenever the store is reached over HTTP (also when
    ``MLFLOW_TRACKING_URI`` names a server) and replace MLflow's defaults, which wait about
    four minutes on a dead server: each request waits at most ``http_timeout_s`` per
    attempt and is retried ``http_max_retries`` times, sleeping ``http_backoff_factor`` x
    (0, 2, 4, ...) s plus up to ``http_backoff_jitter`` s between attempts.
    """

    name: Literal["local", "server"]
    tracking_uri: Annotated[str, Field(min_length=1)]
    # null: the server's own artifact store (mlflow server --artifacts-destination).
    artifact_root: Annotated[str, Field(min_length=1)] | None
    # The experiment of every model's runs, or with experiment_per_model the prefix of one
    # per model (``<experiment>-<model.name>``). No quotes or spaces: it goes into search
    # filters.
    experiment: Annotated[str, Field(pattern=r"^[A-Za-z0-9_./-]+$")]
    experiment_per_model: bool
    # MLflow reads these as integers (MLFLOW_HTTP_REQUEST_TIMEOUT, ..._MAX_RETRIES,
    # ..._BACKOFF_FACTOR) and bounds retries by 10 and the factor by 120.
    http_timeout_s: Annotated[int, Field(gt=0, le=600)]
    http_max_retries: Annotated[int, Field(ge=0, le=10)]
    http_backoff_factor: Annotated[int, Field(ge=0, le=120)]
    http_backoff_jitter: Annotated[float, Field(ge=0.0, le=60.0)]

    @field_validator("tracking_uri", mode="after")
    @classmethod
    def _a_store_mlflow_supports_here(cls, uri: str) -> str:
        problem = tracking_uri_problem(uri)
        if problem:
            raise ValueError(problem)
        parts = urllib.parse.urlsplit(uri)
        if parts.username is not None or parts.password is not None:
            # Said without the secret: the error is printed, and logs keep it. (The
            # environment's MLFLOW_TRACKING_URI may hold them: it is never written.)
            raise ValueError(
                "a user or password in the URL would be stored in params.yaml, dvc.lock "
                "and MLflow's tags: give the URL without them, and the credentials in "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                "MLFLOW_TRACKING_TOKEN), which MLflow reads"
            )
        if parts.query or parts.fragment:
            # A token in a query string is a credential stored in params.yaml as well.
            raise ValueError(
                "expected a URL without a query or fragment (?... or #...): a token there "
                "would be stored in params.yaml, dvc.lock and MLflow's tags; give a token in "
                "MLFLOW_TRACKING_TOKEN, which MLflow reads"
            )
        return uri

    @model_validator(mode="after")
    def _uri_fits_the_store(self) -> TrackingConfig:
        is_http = self.tracking_uri.startswith(("http://", "https://"))
        if self.name == "server":
            if not is_http or not self.tracking_uri.split("://", 1)[1].strip("/"):
                raise ValueError(
                    "tracking.tracking_uri must be an http:// or https:// URL of an MLflow "
                    "tracking server when tracking.name='server' (e.g. http://127.0.0.1:5000)"
                )
            if self.artifact_root is not None and "://" not in self.artifact_root:
                raise ValueError(
                    "tracking.artifact_root must be null (the server's own artifact store) or "
                    "a URI the server and this machine both reach (s3://...) when "
                    "tracking.name='server', not a local folder"
                )
        else:
            if is_http:
                raise ValueError(
                    "tracking.tracking_uri names a server but tracking.name='local': use "
                    "tracking=server (e.g. dvc exp run -S tracking=server "
                    "-S tracking.tracking_uri=...)"
                )
            if self.artifact_root is None:
                raise ValueError(
                    "tracking.artifact_root must name a folder (or URI) for the local store"
                )
        return self


class DeploymentTargetConfig(_Strict):
    """What ``@verified`` serves (registry.target; docs/registry.md, "The deployment
    target"). A passing run moves the alias only when its settings are these; any other
    passing run is registered without it (vmapcheck.tracking.registry.off_target).

    Each key names a config group's option as ``-S <group>=<option>`` does, with the key
    of the run's config it is compared with: ``model`` (model.name), ``hidden``
    (model.hidden, the layer widths; null: any), ``backend`` (backend.name), ``precision``
    (precision.name and its dtype), ``bench`` (bench.name, the benchmark profile).
    """

    model: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    hidden: list[PositiveInt] | None
    backend: Literal["cpu", "gpu", "tpu"]
    precision: PrecisionName
    bench: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]


class RegistryConfig(_Strict):
    """The MLflow Model Registry entry of verified params (vmapcheck.tracking.registry)."""

    # A run whose check passed registers its params as a new version of this model and
    # moves alias `verified` to it when it matches `target`; null: never register.
    registered_model: Annotated[str, Field(pattern=REGISTERED_MODEL_PATTERN)] | None
    # The deployment target: the settings of the runs whose params @verified may serve.
    target: DeploymentTargetConfig


class ReferenceConfig(_Strict):
    dir: Annotated[str, Field(min_length=1)]
    required: bool


class Config(_Strict):
    """The whole validated configuration (one field per conf/ group, plus the seed)."""

    seed: Annotated[int, Field(ge=0)]
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    backend: BackendConfig
    precision: PrecisionConfig
    bench: BenchConfig
    guard: GuardConfig
    budget: BudgetConfig
    tracking: TrackingConfig
    registry: RegistryConfig
    reference: ReferenceConfig
    # The top-level keys of params.yaml that belong to the project vmapcheck joined (its
    # own stages read them; `vmapcheck init` lists them from the project's params, which
    # it keeps in conf/project.yaml). vmapcheck leaves them alone; any other unknown key
    # is refused (a typo of one of vmapcheck's).
    project_keys: list[str] = []

    @model_validator(mode="after")
    def _data_fits_model(self) -> Config:
        features = "data.n_features" if self.data.source == "synthetic" else "data.features"
        targets = "data.n_targets" if self.data.source == "synthetic" else "data.targets"
        if self.data.n_features != self.model.in_features:
            raise ValueError(
                f"{features} gives {self.data.n_features} features but model.in_features="
                f"{self.model.in_features}: the table must have as many features as the model"
            )
        if self.data.n_targets != self.model.out_features:
            raise ValueError(
                f"{targets} gives {self.data.n_targets} targets but model.out_features="
                f"{self.model.out_features}"
            )
        return self

    @model_validator(mode="after")
    def _full_batch_within_byte_limit(self) -> Config:
        problem = byte_limit_problem(
            self.guard, example_bytes(self.model, DTYPE_BYTES[self.precision.dtype])
        )
        if problem:
            raise ValueError(problem)
        return self


# The discriminator of a tagged union (data.source): pydantic puts the tag's value into an
# error's location (data.synthetic.split), where it is no key of params.yaml.
_TAG_KEYS = ("source",)


def _key_path(loc: tuple[Any, ...], raw: Any = None) -> str:
    """The params.yaml key an error's ``loc`` points at (``data.split``), without the
    union tags pydantic inserts (``data.synthetic.split``)."""
    path = ""
    node = raw
    for part in loc:
        if (
            isinstance(node, dict)
            and isinstance(part, str)
            and part not in node
            and any(node.get(tag) == part for tag in _TAG_KEYS)
        ):
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
        try:
            node = node[part]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            node = None
    return path or "<root>"


# A value found in params.yaml is shown at most this long (an unknown key may hold a list
# of thousands); a mapping is named by its kind only.
_SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """A value found in the config as an error shows it: its repr, cut; ``a mapping``."""
    if isinstance(value, dict):
        return "a mapping"
    # A URL's user and password are never shown (the error is printed, and kept in logs).
    text = redact(repr(value))
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _tag_key(key: str, err: dict[str, Any]) -> str:
    """The key of a tagged union's tag (``data.source``) for an error pydantic reports
    on the whole section (``data``)."""
    tag = str(err.get("ctx", {}).get("discriminator", "")).strip("'\"")
    return f"{key}.{tag}" if tag and key != "<root>" else tag or key


def _describe(errors: list[dict[str, Any]], source: str, raw: Any = None) -> str:
    lines = [f"invalid configuration in {source}:"]
    for err in errors:
        key = _key_path(err["loc"], raw)
        if err["type"] == "extra_forbidden":
            found = err["input"]
            what = _shown(found) if isinstance(found, dict) else f"value {_shown(found)}"
            hint = (
                " (a key of your project's own, read by its stages: list it in project_keys, "
                "conf/config.yaml)"
                if len(err["loc"]) == 1
                else ""
            )
            lines.append(f"  {key}: unknown key (found {what}){hint}")
        elif err["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        elif err["type"] == "union_tag_invalid":
            # Reported on the section (its input: the whole mapping); the tag is the key.
            ctx = err.get("ctx", {})
            lines.append(
                f"  {_tag_key(key, err)}: expected one of {ctx.get('expected_tags')}, "
                f"found {ctx.get('tag')!r}"
            )
        elif err["type"] == "union_tag_not_found":
            lines.append(f"  {_tag_key(key, err)}: required key is missing")
        elif err["type"] == "value_error":
            # Our own validators' messages say what was expected and found; the input is
            # then the whole section (a mapping), which adds nothing.
            message = err["msg"].removeprefix("Value error, ")
            found = err.get("input")
            shown = "" if isinstance(found, dict) else f", found {_shown(found)}"
            lines.append(f"  {key}: {message}{shown}")
        elif key.endswith("secret_env"):
            # The name of a variable is asked for: a value that is not one may be the
            # secret itself, pasted in, and is not shown.
            lines.append(
                f"  {key}: {err['msg']} (the name of an environment variable), found a "
                "value that is not one (not shown: it may be the secret itself)"
            )
        else:
            found = err.get("input")
            lines.append(f"  {key}: {err['msg']}, found {_shown(found)}")
    return "\n".join(lines)


def validate_config(raw: Any, source: str = "params.yaml") -> Config:
    """Validate a mapping (parsed params.yaml) into a :class:`Config`.

    Raises:
        ConfigError: naming every offending key with what was expected and found.
    """
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, found {type(raw).__name__}"
        )
    raw = without_project_keys(raw, source)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors(), source, raw)) from None


def without_project_keys(raw: dict[str, Any], source: str = "params.yaml") -> dict[str, Any]:
    """``raw`` without the project's own keys (``project_keys``: a list of names, none of
    them one of vmapcheck's), which vmapcheck does not read.

    Raises:
        ConfigError: ``project_keys`` is not a list of names, or names a key of vmapcheck's.
    """
    keys = raw.get("project_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"{source}: project_keys: expected a list of the project's own top-level keys, "
            f"found {keys!r}"
        )
    clash = sorted(set(keys) & (set(Config.model_fields) - {"project_keys"}))
    if clash:
        raise ConfigError(
            f"{source}: project_keys: {', '.join(clash)} is vmapcheck's own key, not the "
            "project's: rename the project's key (conf/project.yaml and the stages reading it)"
        )
    return {k: v for k, v in raw.items() if k not in keys}


def read_params(path: str | Path = "params.yaml") -> tuple[str, Any]:
    """params.yaml's text and what it parses to (not validated).

    Raises:
        ConfigError: the file is missing or not YAML.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: not found; run `vmapcheck params` to compose it from conf/"
        ) from None
    try:
        return text, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_config(path: str | Path = "params.yaml") -> Config:
    """Read and validate params.yaml (the composed Hydra config)."""
    _, raw = read_params(path)
    return validate_config(raw, source=str(path))


def config_digest(config: Config) -> str:
    """sha256 of the settings that determine params and cases (seed, model, data, train)."""
    subset = config.model_dump(include={"seed", "model", "data", "train"})
    return hashlib.sha256(json.dumps(subset, sort_keys=True).encode()).hexdigest()


def flatten(config: Config) -> dict[str, Any]:
    """Flatten to dotted keys (``precision.tolerance.rtol``) for logging as params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            out[prefix] = value

    walk("", config.model_dump())
    return out
