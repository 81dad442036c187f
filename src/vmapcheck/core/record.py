"""The forward record (``data/forward/record.json``): what each path did with each case,
where it ran, and what the forward stage ran under, as one type built in one place for
the pipeline's forward stage and the Python API (:mod:`vmapcheck.testing`), which both
hand it to :func:`vmapcheck.check.checks.run_checks`.

Loads no JAX: the check's schema (:mod:`vmapcheck.check.schema`) and the report read it.
"""

# No `from __future__ import annotations` here: TypedDict sees NotRequired only in
# evaluated annotations (as strings, every key counted as required: a record without
# `composition` or `budget`, written before they existed, was refused).
from typing import TYPE_CHECKING, Any, Literal, NotRequired, Required, TypedDict

if TYPE_CHECKING:
    from vmapcheck.config import ToleranceConfig


class ToleranceRecord(TypedDict):
    """A tolerance as the records state it (:class:`vmapcheck.config.ToleranceConfig`):
    ``precision.tolerance`` and ``precision.cross_run_tolerance`` in check_details.json,
    the reference's ``tolerance_used``, the diagnosis' settings."""

    rtol: float
    atol: float
    # "terms" or "output" (vmapcheck.core.compare); absent in records older than the
    # scale, which judged by "output".
    scale: NotRequired[str]


def tolerance_record(tolerance: "ToleranceConfig") -> ToleranceRecord:
    """``tolerance`` as the records hold it: its fields, in their order."""
    return {"rtol": tolerance.rtol, "atol": tolerance.atol, "scale": tolerance.scale}


class InputLeafRecord(TypedDict):
    """One leaf of a model's input contract as the records state it (:meth:`vmapcheck.
    core.contract.Leaf.describe`: contract.json's ``inputs.leaves``, the report): its
    name, one example's shape (no batch axis), dtype kind, an id leaf's range and what it
    means, in words."""

    leaf: str
    shape: list[int]
    dtype: str  # "float", "int32" or "bool"
    range: NotRequired[list[int]]  # [0, vocab - 1]
    meaning: NotRequired[str]


class RuntimeRecord(TypedDict):
    """What actually ran (:class:`vmapcheck.core.runtime.RuntimeInfo`, as every report
    records it: ``runtime`` in the forward record, check_details.json and
    bench_details.json). Records written before ``device_memory_gib``,
    ``platform_version`` and ``accelerator_runtime`` lack them."""

    backend: str
    platform: str
    device_kind: str
    device_count: int
    device_memory_gib: NotRequired[float | None]  # one device's, GiB; None on CPU
    jax_version: str
    jaxlib_version: str
    platform_version: NotRequired[str]
    accelerator_runtime: NotRequired[dict[str, str]]  # package -> version; {} on CPU
    python_version: str
    os_platform: str
    enable_x64: bool
    matmul_precision: str
    xla_flags: str


class MeshRecord(TypedDict):
    """What a distributed path ran on (``Compiled.about``: :meth:`vmapcheck.core.forms.
    ShardedForward.describe`, :meth:`vmapcheck.core.mesh.MeshForward.describe`): ``sharded``
    and each entry of ``meshes`` in the records. A record needs only the path and its
    device count (what the headline names); both describes write every key, and
    records older than the mesh paths lack ``parallelism`` (then data-parallel:
    sharded_jit's)."""

    path: str
    devices: int
    form: NotRequired[str]  # what it computes, in words
    parallelism: NotRequired[str]  # "data-parallel", "tensor-parallel", ...
    mesh_shape: NotRequired[dict[str, int]]  # axis -> size
    device_ids: NotRequired[list[int]]
    platform: NotRequired[str]
    device_kind: NotRequired[str]
    padding: NotRequired[str]  # how a batch is padded to the mesh, or "none: ..."
    note: NotRequired[str]  # a mesh of one device on the model axis: nothing split
    # The forward stage's ``sharded``: the processes the mesh spans, each (by index) with
    # its devices' ids.
    processes: NotRequired[int]
    process_devices: NotRequired[dict[str, list[int]]]


class Comparison(TypedDict):
    """One comparison of two outputs under the rule of :mod:`vmapcheck.core.compare`:
    ``a`` against ``b``, errors in float64."""

    max_abs: float | None
    max_rel: float | None
    passed: bool
    reason: str  # "" when passed
    # The rule ("output" or "terms"), the largest |a - b| / (atol + rtol * S) and the
    # element (index) where it is reached, and S there; absent where nothing compared.
    rule: NotRequired[str]
    bound_ratio: NotRequired[float | None]
    element: NotRequired[list[int] | None]
    scale_at_worst: NotRequired[float | None]
    # Rows compared, where a capped path covered fewer than the case's; rows judged by
    # the terms' magnitude, where it covered fewer than those compared.
    rows: NotRequired[int]
    terms_rows: NotRequired[int]
    # The stored output compared with, where a reference older than this path stands
    # in with the one computing the same program.
    stored_path: NotRequired[str]
    # Rows (batch axis 0) where both held the same NaN/Inf at the same elements: not
    # measured (both computed it); the check judges the non-finite output itself.
    same_non_finite_rows: NotRequired[list[int]]


class WorstElement(TypedDict):
    """The worst element over a set of comparisons (the largest bound ratio): its
    ratio, ``S`` there, and the pair it is in; all None when nothing was compared."""

    bound_ratio: float | None
    scale_at_worst: float | None
    worst_pair: str | None


# The tolerance a measurement was judged under, and the setting it comes from
# (``precision.tolerance``, ``exact``, ...). Functional form: ``from`` is a keyword.
ToleranceUsed = TypedDict("ToleranceUsed", {"rtol": float, "atol": float, "from": str})


class Measurement(Comparison):
    """:func:`vmapcheck.core.compare.measure`: a :class:`Comparison` with its ULP distance
    and the tolerance it was judged under, every key present (None where nothing was
    compared: shapes differ)."""

    max_ulp: int | None
    ulp_dtype: str | None  # the float dtype the ULPs count in, or "integer"
    tolerance: ToleranceUsed
    non_finite: NotRequired[dict[str, int]]  # {"a": count, "b": count}, when any


class ExactResult(TypedDict, total=False):
    """:func:`vmapcheck.core.compare.exact`: stored against re-derived, bit for bit.
    ``passed`` and ``reason`` always; the tolerance (exact) and the :class:`Measurement`
    figures where arrays of the same shape were compared."""

    passed: Required[bool]
    reason: Required[str]
    tolerance: ToleranceUsed
    max_abs: float | None
    max_rel: float | None
    rule: str
    bound_ratio: float | None
    element: list[int] | None
    scale_at_worst: float | None
    max_ulp: int | None
    ulp_dtype: str | None
    non_finite: dict[str, int]
    same_non_finite_rows: list[int]
    rows: int
    terms_rows: int
    stored_path: str


class RowCap(TypedDict):
    """What a budget cut: the first ``rows_run`` of ``rows_of`` rows, by ``capped_by``
    (a path's, in the forward record: vmapcheck.core.forward.cap_entry)."""

    rows_run: int
    rows_of: int
    capped_by: str


class Capped(RowCap):
    """A :class:`RowCap` with how the rows past the cap were judged (the check's)."""

    beyond: NotRequired[str]  # how the rows past the cap were judged


class NanProbe(TypedDict):
    """A NaN planted in one target: the loss must come out non-finite (detected, not
    masked); the gradients are reported (a relu that is off passes no gradient)."""

    planted: str  # where the NaN was put
    loss_finite: bool
    grads_finite: bool


class GradientProbe(TypedDict):
    """What :func:`vmapcheck.core.gradients.gradient_probe` found on the standard batch
    (the forward record's ``gradients``)."""

    loss: float
    loss_finite: bool
    grads_finite: bool
    per_example_finite: bool
    nan_probe: NanProbe
    # The trainable leaves whose batch or per-example gradient has NaN or Inf, in tree
    # order (absent in records older than it).
    nonfinite_leaves: NotRequired[list[str]]
    # The case the probe ran on: the pipeline's standard case (absent: it), or the Python
    # API's examples (vmapcheck.testing).
    case: NotRequired[str]
    # Set by the forward stage: the rows the probe ran, and the budget's cut if any.
    rows: NotRequired[int]
    capped: NotRequired[Capped]


class GradientProbeError(TypedDict):
    """The gradient probe raised (the forward record's ``gradients``): a model JAX cannot
    differentiate (a primitive without a JVP rule, a ``pure_callback``), said by the
    check as a model finding rather than a traceback that hides the forward's verdict."""

    error: str  # the exception's type and message
    case: str


class PathRun(TypedDict, total=False):
    """What one path did with one case: an output's shape and dtype, or a refusal or
    crash with the error's type and message."""

    refused: bool
    crashed: bool
    error: str
    message: str
    shape: list[int]
    dtype: str
    # A path the budget capped (vmapcheck.core.forward.cap_entry): the first rows_run of
    # the case's rows_of rows, and the budget.* key that capped it.
    rows_run: int
    rows_of: int
    capped_by: str


class KeysRecord(TypedDict):
    """How a stochastic model's forwards got their keys (``Model.stochastic``), and what
    that leaves the float64 oracle: written by the forward stage and the Python API."""

    seed: int  # the run's seed
    stream: str  # the named key stream's entry split into row keys
    rule: str  # how row i's key is drawn, the same on every path
    # The check's oracle line when the float64 run cannot repeat the draws: "not judged:
    # <why>" (a model whose draws it repeats is judged, with its rows' keys).
    oracle: str


# Why the float64 oracle does not judge a forward that samples, when it cannot repeat its
# draws (vmapcheck.core.oracle.same_draws).
ORACLE_NOT_JUDGED = (
    "not judged: the model samples (stochastic=True) and its jax.random draws take more "
    "bits under float64 (jax_enable_x64: a draw whose dtype follows the default float), so "
    "from the same keys a float64 run draws other numbers: another sample, not the same "
    "computation more precisely; the paths are judged against each other, row i with the "
    "same key on each (a draw in an explicit dtype, e.g. float32, is repeated and judged)"
)


def keys_record(seed: int, stream: str) -> KeysRecord:
    """The record of a stochastic run's keys: row ``i`` of every batch gets
    ``jax.random.split(named_keys(seed)[stream], rows)[i]``."""
    return {
        "seed": seed,
        "stream": stream,
        "rule": f"row i of a batch of n rows gets jax.random.split(named_keys({seed})"
        f"[{stream!r}], n)[i] on every path; a regrouped row keeps its key",
        "oracle": ORACLE_NOT_JUDGED,
    }


class TrainMetrics(TypedDict):
    """``reports/train.json`` (:func:`vmapcheck.core.training.fit`): whether the params
    were trained (False: given, or a model that is not trainable, and evaluated), the
    step whose params were kept (lowest validation loss), and the mean squared error of
    the kept params on each split; logged to MLflow as ``train/<name>``."""

    trained: bool
    best_step: int
    train_loss: float
    val_loss: float
    test_loss: float


class RaisedError(TypedDict):
    """A path that raised where an output was expected: the exception's type and
    message (the forward record's ``composition.cases.<case>.raised``)."""

    error: str
    message: str


# The train.json keys the tracking logs as metrics (train/<name>).
TRAIN_METRICS: tuple[Literal["train_loss", "val_loss", "test_loss", "best_step"], ...] = (
    "train_loss",
    "val_loss",
    "test_loss",
    "best_step",
)


class ReferenceStatus(TypedDict):
    """What the forward stage found of the stored reference before recomputing its
    outputs: ``status`` ("ok", "missing", "corrupt", "incompatible") and why, in words."""

    status: str
    message: str


class ForwardRecord(TypedDict):
    """``data/forward/record.json``, written by the forward stage."""

    runtime: RuntimeRecord  # backend, device, versions (vmapcheck.core.runtime)
    dtype: str
    params_sha256: str
    not_provided: dict[str, str]  # path -> why the model lacks it
    sharded: MeshRecord | None  # devices and mesh of the distributed path
    # Every distributed path's (vmapcheck.core.paths.describe_meshes): its parallelism,
    # devices and mesh shape by axis; absent in records older than the mesh paths.
    meshes: NotRequired[dict[str, MeshRecord]]
    reference: ReferenceStatus  # status of the stored reference's recomputation
    gradients: GradientProbe | GradientProbeError | None  # None: not run
    cases: dict[str, dict[str, PathRun]]  # case -> path -> what it did
    # The regroupings run (vmapcheck.core.composition): {"regroupings": {name: about},
    # "cases": {case: {"rows", <regrouping>: its plan, "paths", "raised"}}}. Absent in
    # records older than it. A plain mapping: a case's plans are keyed by the
    # REGROUPINGS registry's names beside fixed keys (PEP 728, not in this mypy).
    composition: NotRequired[dict[str, Any]]
    # The budget the forward stage ran under (vmapcheck.config.BudgetConfig); absent in
    # records older than it.
    budget: NotRequired[dict[str, int]]
    # Bitwise batch invariance measured on the run's backend (vmapcheck.core.bitwise:
    # check/schema.py's BitwiseReport, without the verdict); absent when not measured.
    bitwise: NotRequired["BitwiseReport"]
    # A stochastic model's keys (KeysRecord); absent for a deterministic model.
    keys: NotRequired[KeysRecord]


def forward_record(
    *,
    runtime: RuntimeRecord,
    dtype: str,
    cases: dict[str, dict[str, PathRun]],
    composition: dict[str, Any],
    not_provided: dict[str, str],
    sharded: MeshRecord | None,
    reference: ReferenceStatus,
    gradients: GradientProbe | GradientProbeError | None,
    params_sha256: str = "",
    budget: dict[str, int] | None = None,
    bitwise: "BitwiseReport | None" = None,
    keys: KeysRecord | None = None,
    meshes: dict[str, MeshRecord] | None = None,
) -> ForwardRecord:
    """The record of one forward run: ``runtime`` (:class:`vmapcheck.core.runtime.
    RuntimeInfo` as a dict), the run's ``dtype`` name, per case and path what it did
    (:func:`vmapcheck.core.forward.run_forward`), the regroupings
    (:func:`vmapcheck.core.forward.run_composition`), the paths not run and why, the
    distributed path's mesh (None: not run), the stored reference's status, the
    gradient probe (None: not run), the params' digest ("" where none is stored) and
    the budget applied (None: none, the Python API), the bitwise measurement
    (:func:`vmapcheck.core.bitwise.measure`; None: not measured), and a stochastic model's
    keys (:func:`keys_record`; None: a deterministic model)."""
    record: ForwardRecord = {
        "runtime": runtime,
        "dtype": dtype,
        "params_sha256": params_sha256,
        "not_provided": not_provided,
        "sharded": sharded,
        "reference": reference,
        "gradients": gradients,
        "cases": cases,
        "composition": composition,
    }
    if meshes is not None:
        record["meshes"] = meshes
    if budget is not None:
        record["budget"] = budget
    if bitwise is not None:
        record["bitwise"] = bitwise.copy()  # the check adds its verdict to its own
    if keys is not None:
        record["keys"] = keys
    return record


# Bitwise batch invariance (vmapcheck.core.bitwise), measured by the forward stage and
# judged by the check (check_details.json's "bitwise" section).


class BitwiseAgainst(TypedDict):
    """A batch path's outputs on the batch against the same rows computed another way
    (alone, regrouped, or by the plain loop), bit for bit (vmapcheck.core.bitwise)."""

    rows: int  # rows compared
    rows_differing: int  # rows whose bits differ in any element
    first_row: int | None
    max_ulp: int  # in the run dtype; between finite values
    argmax_flips: int | None  # None: no class outputs


class BitwiseFirstOp(TypedDict):
    """Where a row alone and the same row in the batch first part in bits: a jaxpr
    equation (``found_at`` "jaxpr"), else a layer ("layer"), else "none" with ``why``."""

    found_at: Literal["jaxpr", "layer", "none"]
    row: int
    equation: int | None  # index among the equations walked (calls walked into)
    primitive: str | None
    source: str | None  # the user's line, as JAX records it
    # The first layer whose row parts, op by op as the walk runs (with "jaxpr"), or as
    # the path runs (with "layer"); None: none, or the model exposes no layers.
    layer: str | None
    why: str
    # With "jaxpr": the first layer as the path runs (compiled), where it is not `layer`.
    layer_as_run: NotRequired[str | None]


class BitwisePathReport(TypedDict):
    """One batch path: bitwise under every composition, the figures, the first op."""

    bitwise: bool
    rows: int
    rows_differing: int  # rows differing in some composition
    max_ulp: int
    argmax_flips: int | None  # rows whose argmax flips in some composition
    compositions: dict[str, BitwiseAgainst]  # "alone", and each regrouping
    vs_plain: BitwiseAgainst | None  # against the plain loop; None for the loop itself
    first_op: BitwiseFirstOp | None  # None: every row alone is bitwise
    # The path raised on a row alone: not measured (and not bitwise), the error said.
    alone_error: NotRequired[str]


class BitwiseFlips(TypedDict):
    """Rows whose argmax is not the same in every output measured, of the rows covered."""

    rows: int
    flipped: int


class BitwiseReport(TypedDict):
    """Bitwise batch invariance of every batch path on one case (vmapcheck.core.bitwise):
    measured in the forward stage on the run's backend; ``mode`` and ``passed`` added
    by the check ("report": never failed; "require": a path not bitwise fails)."""

    case: str
    rows: int
    rows_alone: int  # rows run as a batch of 1 (a budget may cap them)
    capped_by: str | None
    backend: str
    device_kind: str
    dtype: str
    plain: str
    class_outputs: bool
    paths: dict[str, BitwisePathReport]
    argmax_flips: BitwiseFlips | None
    mode: NotRequired[Literal["report", "require", "off"]]
    passed: NotRequired[bool]
