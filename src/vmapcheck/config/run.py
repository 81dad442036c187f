"""Config groups ``train``, ``backend`` and ``precision``: how the params are made, on
which device the model runs, and at which dtype, judged with which tolerances."""

from __future__ import annotations

import functools
import importlib.resources
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import AfterValidator, Field, field_validator, model_validator

from vmapcheck.config.fields import MODELS_URI_PATTERN, PositiveInt, Strict

MAX_LEARNING_RATE = 10.0
# float32's smallest normal number (numpy.finfo(numpy.float32).tiny): a smaller rate is 0
# or subnormal in float32, so no step moves the params (and train reports best step 0).
MIN_LEARNING_RATE = 1.1754943508222875e-38


# The options of a shipped config group are its files, vmapcheck/conf/<group>/<name>.yaml:
# the names of the precisions and backends (and a precision's dtype) are read from the
# folder, so a new precision or backend is one new file, no list to keep in step.
CONF_PACKAGE = "vmapcheck.conf"
PRECISION_GROUP = "precision"


def conf_folder(group: str) -> str:
    """``vmapcheck/conf/<group>/``, as errors name it."""
    return f"{CONF_PACKAGE.replace('.', '/')}/{group}/"


PRECISION_FOLDER = conf_folder(PRECISION_GROUP)


@functools.cache
def conf_options(group: str) -> tuple[str, ...]:
    """The shipped options of config group ``group``, sorted: the files
    ``vmapcheck/conf/<group>/<name>.yaml``."""
    folder = importlib.resources.files(CONF_PACKAGE) / group
    return tuple(
        sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    )


def _shipped(group: str) -> AfterValidator:
    """A validator refusing a name that is no shipped option of ``group``."""

    def known(name: str) -> str:
        if name not in conf_options(group):
            raise ValueError(
                f"expected one of {', '.join(conf_options(group))} (the files of "
                f"{conf_folder(group)})"
            )
        return name

    return AfterValidator(known)


def precision_names() -> tuple[str, ...]:
    """The shipped precision options, sorted: the files ``vmapcheck/conf/precision/
    <name>.yaml``.

    >>> "f32" in precision_names()
    True
    """
    return conf_options(PRECISION_GROUP)


def precision_file(name: str) -> dict[str, Any]:
    """A fresh parse of the file of the precision option ``name`` (one of
    :func:`precision_names`), as composed into ``precision`` of params.yaml.

    Raises:
        ValueError: ``name`` is no shipped option (the message lists them), or its file
            is not a mapping.
    """
    if name not in precision_names():
        raise ValueError(
            f"expected one of {', '.join(precision_names())} (the files of {PRECISION_FOLDER})"
        )
    resource = importlib.resources.files(CONF_PACKAGE) / PRECISION_GROUP / f"{name}.yaml"
    raw = yaml.safe_load(resource.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(
            f"{PRECISION_FOLDER}{name}.yaml: expected a mapping of precision keys, found "
            f"{type(raw).__name__}"
        )
    return raw


def precision_dtype(name: str) -> str:
    """The float dtype the precision option ``name`` runs in (its file's ``dtype``;
    f32_default is float32 at the backend's own matmul precision)."""
    dtype = precision_file(name).get("dtype")
    if not isinstance(dtype, str):
        raise ValueError(f"{PRECISION_FOLDER}{name}.yaml: expected key dtype, found {dtype!r}")
    return dtype


# A precision's and a backend's name, validated against the shipped files (a Literal
# would be a second list to keep in step with them).
PrecisionName = Annotated[str, _shipped(PRECISION_GROUP)]
BackendName = Annotated[str, _shipped("backend")]


class TrainConfig(Strict):
    optimizer: Literal["adam", "sgd"]
    steps: Annotated[int, Field(ge=0)]
    batch_size: PositiveInt
    # Above MAX_LEARNING_RATE no optimizer step stays finite on any model here, below
    # MIN_LEARNING_RATE none moves the params: refused at the door, not found after the work.
    learning_rate: Annotated[float, Field(gt=0.0, le=MAX_LEARNING_RATE)]
    eval_every: PositiveInt
    # Bring your own params: a safetensors file and its expected sha256 (both or neither).
    # When given, nothing is trained: the file is verified and evaluated.
    params_file: str | None = None
    params_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    # Or verified params from the MLflow Model Registry (vmapcheck.tracking.registry): a pinned
    # version models:/<name>/<version>, or an alias models:/<name>@<alias>.
    params_source: Annotated[str, Field(pattern=MODELS_URI_PATTERN)] | None = None

    @field_validator("learning_rate", mode="after")
    @classmethod
    def _rate_moves_float32_params(cls, rate: float) -> float:
        if rate < MIN_LEARNING_RATE:
            raise ValueError(
                f"expected at least float32's smallest normal number {MIN_LEARNING_RATE:.8g} "
                "(a smaller rate is 0 or subnormal in float32: no step would move the params)"
            )
        return rate

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


class BackendConfig(Strict):
    name: BackendName
    platform: Literal["cpu", "cuda", "rocm", "tpu"]
    # Devices of the data-parallel (sharded_jit) path's 1-D mesh; null: every device present.
    # On CPU, JAX is started with this many emulated CPU devices (jax_num_cpu_devices).
    # The other paths run on one device whatever this says.
    num_devices: PositiveInt | None
    # Devices on the "model" axis of the 2-D (data x model) path data_model_jit: a divisor
    # of the mesh's device count, the "data" axis taking the rest. null: the data axis is
    # the count's smallest prime factor (8 devices: 2 x 4). tensor_parallel_jit puts every
    # device on "model", sharded_jit every device on "data" (vmapcheck.core.mesh).
    model_axis: PositiveInt | None = None
    # Whether one process at a time may open the devices: on a TPU, a process that opens
    # the chip while another holds it fails (libtpu's lockfile). The paired verdict
    # (vmapcheck.bench.verdict.paired) then never runs two worker processes at once. Absent: true
    # on every platform but cpu (the validator below), so a backend that does not say is
    # treated as exclusive.
    exclusive_device: bool = True
    # Processes of the forward stage (docs/multiprocess.md). 1: this process alone. N > 1 on
    # cpu: the stage starts N local processes joined by jax.distributed (a coordinator on
    # 127.0.0.1), each holding num_devices / N emulated devices of the mesh; process 0
    # writes the records. Started by a cluster instead (a TPU slice, SLURM, GKE): the
    # cluster's process count, which the stage checks. Absent from conf/backend/*.yaml, as
    # exclusive_device: `-S +backend.processes=4`.
    processes: PositiveInt = 1
    # The coordinator's TCP port on 127.0.0.1 for a local multi-process run; null: a free
    # port, chosen when the stage starts.
    coordinator_port: Annotated[int, Field(ge=1024, le=65535)] | None = None

    @model_validator(mode="after")
    def _model_axis_divides_the_devices(self) -> BackendConfig:
        # Refused here, before any stage starts, when the device count is known; with
        # num_devices null it is checked when the mesh is made (vmapcheck.core.mesh).
        axis, devices = self.model_axis, self.num_devices
        if axis is not None and devices is not None and devices % axis:
            raise ValueError(
                f"backend.model_axis={axis}: expected a divisor of backend.num_devices="
                f"{devices} (the 2-D mesh is data x model = {devices} devices); found {axis}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _exclusive_unless_cpu(cls, data: Any) -> Any:
        if isinstance(data, dict) and "exclusive_device" not in data:
            return {**data, "exclusive_device": data.get("platform") != "cpu"}
        return data

    @model_validator(mode="after")
    def _devices_split_over_processes(self) -> BackendConfig:
        n, processes = self.num_devices, self.processes
        if n is not None and n % processes:
            raise ValueError(
                f"backend.num_devices={n} with backend.processes={processes}: expected a "
                f"multiple of {processes} (each process holds num_devices / processes devices "
                "of the mesh)"
            )
        return self


# What the relative tolerance is relative to (vmapcheck.core.compare.scale_of): "output",
# max(|a|, |b|); "terms", the magnitude of the terms each output element is made of
# (vmapcheck.core.magnitude), at least max(|a|, |b|).
ToleranceScale = Literal["terms", "output"]


# The loosest rtol and atol a check accepts. Past it a check no longer tells a batching
# mistake from rounding: bfloat16, the coarsest dtype here, rounds to 2^-8 (0.4%) and its
# shipped tolerances are 1.6e-2 to 3.2e-2 (conf/precision/bf16.yaml); an rtol of 1e300
# passed every mistake (and overflowed).
MAX_TOLERANCE = 0.1


class ToleranceConfig(Strict):
    """Agreement between two outputs a, b, elementwise: ``|a - b|`` within ``atol`` plus
    ``rtol`` times the magnitude ``scale`` names (the rule: vmapcheck.core.compare).
    Both at most :data:`MAX_TOLERANCE`."""

    rtol: Annotated[float, Field(ge=0.0, le=MAX_TOLERANCE)]
    atol: Annotated[float, Field(ge=0.0, le=MAX_TOLERANCE)]
    # conf/precision/*.yaml set it ("terms"); the default serves tolerances built in code.
    scale: ToleranceScale = "terms"


class PrecisionConfig(Strict):
    name: PrecisionName
    dtype: Literal["float32", "float64", "bfloat16"]
    enable_x64: bool
    matmul_precision: Literal["default", "high", "highest"]
    # Between forward paths within one run.
    tolerance: ToleranceConfig
    # Against the stored reference and the float64 oracle (another run, other numerics).
    cross_run_tolerance: ToleranceConfig

    @property
    def uses_terms(self) -> bool:
        """Whether a tolerance judges by the terms' magnitude (``scale: terms``): the
        run then computes each case's magnitude (vmapcheck.core.magnitude)."""
        return "terms" in (self.tolerance.scale, self.cross_run_tolerance.scale)

    @model_validator(mode="after")
    def _x64_matches_dtype(self) -> PrecisionConfig:
        if self.dtype == "float64" and not self.enable_x64:
            raise ValueError("dtype float64 needs enable_x64: true (JAX truncates to float32)")
        return self


# The kinds of finding a failed check can be (vmapcheck.check.kinds.FINDING_KINDS holds
# what each means; its entries are these names, checked when it is imported).
FindingKindName = Literal["batching", "numerical", "model", "contract"]
FINDING_KIND_NAMES: tuple[FindingKindName, ...] = get_args(FindingKindName)


class VerdictConfig(Strict):
    """What fails the run (``verdict`` in params.yaml; docs/checks.md, "What kind of
    finding").

    ``fail_on``: the kinds of finding that fail the check and the pipeline; a kind left
    out is still found, reported and logged, as a finding that does not fail. The
    default is every kind: a deployment gate fails on anything that makes the served
    outputs wrong, and a user who accepts float32's error for a model says so here.
    ``bitwise``: ``report`` says whether every row is bitwise the same whatever the batch
    around it (vmapcheck.core.bitwise); ``require`` also fails the check when one is not
    (a batching finding); ``off`` does not measure it (it runs each row alone).
    """

    fail_on: list[FindingKindName] = Field(default_factory=lambda: list(FINDING_KIND_NAMES))
    bitwise: Literal["report", "require", "off"] = "report"

    @model_validator(mode="after")
    def _each_kind_once(self) -> VerdictConfig:
        twice = sorted({k for k in self.fail_on if self.fail_on.count(k) > 1})
        if twice:
            raise ValueError(f"verdict.fail_on: names {twice[0]!r} twice: list each kind once")
        return self
