"""vmapcheck's batching checks from a test suite, in seconds, without the DVC pipeline.

:func:`assert_batching_consistent` runs a user's :class:`~vmapcheck.core.models.Model`
on a batch of examples the way the pipeline's ``forward`` and ``check`` stages run the
regression set, in this process, and raises ``AssertionError`` with the pipeline's own
wording when a check fails (docs/python-api.md):

- every forward path of the registry :data:`vmapcheck.core.paths.PATHS` the model
  provides (the distributed one over the devices present; ``forward_one`` on one
  example; docs/checks.md lists them), each pair judged by the one
  tolerance rule (:mod:`vmapcheck.core.compare`, scaled by the terms' magnitude of
  :mod:`vmapcheck.core.magnitude` when the precision says ``scale: terms``);
- every path against the float64 oracle (:mod:`vmapcheck.core.oracle`), for a float32
  or bfloat16 run;
- every batch path against itself on the batch regrouped (rows reversed; split in
  halves: :mod:`vmapcheck.core.composition`);
- the regression set's invalid inputs (:func:`vmapcheck.data.regression.regression_cases`,
  built for the model's input contract) refused by every path, the problem named.

Nothing here judges anything itself: the cases are the pipeline's case kinds, the
outputs come from :mod:`vmapcheck.core.forward` and the verdict from
:func:`vmapcheck.check.checks.run_checks`, so a test and a pipeline run of the same model
fail on the same rule with the same ``failure:`` lines.

Only what needs no JAX is imported at module level (the pytest plugin imports this
module in every test session; JAX loads on the first check).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from vmapcheck.config import PrecisionConfig
from vmapcheck.config import describe_errors as _describe
from vmapcheck.core.cases import CASE_KINDS, kind_of
from vmapcheck.errors import ConfigError
from vmapcheck.versions import require_supported_jax

if TYPE_CHECKING:
    from vmapcheck.core.models import Model, Params

# Where the shipped precision options live: one <name>.yaml each, the same files the
# pipeline composes (``-S precision=<name>``).
PRECISION_PACKAGE = "vmapcheck.conf"
PRECISION_GROUP = "precision"
DEFAULT_PRECISION = "f32"

# The failures an AssertionError lists, like the pipeline's verdict (`vmapcheck summary`);
# every one is in the report's ``failures``.
SHOWN_FAILURES = 10

# The case names: the user's batch, its first row as a batch of one and unbatched. The
# last two are the names the check compares a vector case with
# (vmapcheck.data.regression.SINGLE_CASE).
EXAMPLES_CASE = "examples"
SINGLE_VECTOR_CASE = "single_vector"
# The case kinds whose regression cases run with edge_cases=True (built from the
# examples, as prepare builds them from the table); invalid cases always.
EDGE_KINDS = tuple(kind.name for kind in CASE_KINDS.values() if kind.edge)


# --- precision ---------------------------------------------------------------------------


def precision_names() -> tuple[str, ...]:
    """The shipped precision options: the files ``vmapcheck/conf/precision/<name>.yaml``."""
    folder = importlib.resources.files(PRECISION_PACKAGE) / PRECISION_GROUP
    return tuple(
        sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    )


def precision_config(
    name: str = DEFAULT_PRECISION, *, rtol: float | None = None, atol: float | None = None
) -> PrecisionConfig:
    """The precision option ``name`` as the pipeline reads it (``precision.*`` of
    params.yaml), validated by :class:`vmapcheck.config.PrecisionConfig`.

    ``rtol`` / ``atol``: replace ``tolerance.rtol`` / ``tolerance.atol`` (between paths,
    and a path against itself regrouped) before validation, as ``-S
    precision.tolerance.rtol=...`` does; ``cross_run_tolerance`` (the float64 oracle)
    stays the file's.

    Raises:
        ConfigError: ``name`` is no shipped option (the message lists them), or a value
            is refused by the config model (the message names the key, expected and
            found).
    """
    names = precision_names()
    if not isinstance(name, str) or name not in names:
        raise ConfigError(
            f"precision={name!r}: expected one of {', '.join(names)} (the files of "
            f"{PRECISION_PACKAGE.replace('.', '/')}/{PRECISION_GROUP}/)"
        )
    source = f"{PRECISION_PACKAGE.replace('.', '/')}/{PRECISION_GROUP}/{name}.yaml"
    resource = importlib.resources.files(PRECISION_PACKAGE) / PRECISION_GROUP / f"{name}.yaml"
    raw = yaml.safe_load(resource.read_text(encoding="utf-8"))
    overrides = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
    if overrides and isinstance(raw, dict) and isinstance(raw.get("tolerance"), dict):
        raw = {**raw, "tolerance": {**raw["tolerance"], **overrides}}
        source += f" with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}"
    try:
        return PrecisionConfig.model_validate(raw)
    except ValidationError as exc:
        # The keys as params.yaml spells them (precision.tolerance.rtol), in the config
        # module's own wording.
        errors = [{**e, "loc": (PRECISION_GROUP, *e["loc"])} for e in exc.errors()]
        raise ConfigError(_describe(errors, source, {PRECISION_GROUP: raw})) from None


# --- the report --------------------------------------------------------------------------


@dataclass(frozen=True)
class PairFigures:
    """One pair of paths, its worst figures over a group of cases (the examples the
    caller passed, or the edge cases), each figure with the case it comes from.

    ``pair``: ``"<pathA>-vs-<pathB>"`` as the check names it (``one_jit-vs-single.
    vmap_jit``: ``forward_one`` on the first example against row 0 of a batch path on the
    batch of one). ``bound_ratio``: the largest fraction of its bound that a difference
    uses (``compare``'s ``bound_ratio``; at most 1 when they agree), reached on case
    ``case``; ``max_rel`` / ``max_abs``: the largest errors, reached on ``max_rel_case`` /
    ``max_abs_case`` (a figure is never shown beside another case's name: a
    large_magnitude case's absolute error of 1e12 is its own); ``passed``: agreed on
    every case of the group.
    """

    pair: str
    max_abs: float | None
    max_rel: float | None
    bound_ratio: float | None
    case: str | None
    passed: bool
    max_abs_case: str | None = None
    max_rel_case: str | None = None

    def __str__(self) -> str:
        """``bound_ratio=0.031 (examples) max_rel=2.1e-07 (single) max_abs=2.4e-07
        (examples)``: the deciding figure first, each with its case."""
        from vmapcheck.report.elements import figure_text  # no JAX at import (module doc)

        return figure_text(
            self.bound_ratio,
            self.max_rel,
            self.max_abs,
            cases=(self.case, self.max_rel_case, self.max_abs_case),
        )


@dataclass(frozen=True)
class BatchingReport:
    """What :func:`assert_batching_consistent` found (returned when every check passed).

    Attributes:
        passed: every check passed.
        precision: the option's name (``f32``); ``dtype`` the float dtype the paths ran in;
            ``tolerance`` / ``cross_run_tolerance``: ``{"rtol", "atol", "scale"}`` used
            between paths and against the float64 oracle.
        paths: the paths run, in registry order; ``not_run``: path -> why not (not
            provided by the model, or left out by ``paths=``).
        pairs: ``"<pathA>-vs-<pathB>"`` -> :class:`PairFigures`, worst over the cases
            of the examples the caller passed (``examples``, its first row as a batch of
            one, ``single``, and unbatched, ``single_vector``), each figure naming its case.
        edge_pairs: the same over the edge cases (those of :data:`EDGE_KINDS`, with
            ``edge_cases=True``; else empty): reported apart, so that an edge batch's
            figures (a large_magnitude case's absolute errors) never read as the
            examples'.
        oracle: path -> worst ``max_rel`` against the float64 oracle over the examples'
            cases (empty for f64); ``edge_oracle`` the same over the edge cases.
        composition: path -> regrouping (``permuted``, ``split``) -> ``max_abs`` of the
            path's outputs on the regrouped batch against its own on the batch as given,
            over the examples' cases; ``edge_composition`` the same over the edge cases.
        refused / invalid_total: invalid inputs refused by every path, of how many.
        failures: every failed check, in the pipeline's wording.
        summary: the verdict as text (the lines an AssertionError shows).
        details: the check's whole report, as ``reports/check_details.json`` holds it
            for a pipeline run (:class:`vmapcheck.check.schema.CheckDetails`).
    """

    passed: bool
    precision: str
    dtype: str
    tolerance: Mapping[str, Any]
    cross_run_tolerance: Mapping[str, Any]
    paths: tuple[str, ...]
    not_run: Mapping[str, str]
    pairs: Mapping[str, PairFigures]
    oracle: Mapping[str, float]
    composition: Mapping[str, Mapping[str, float | None]]
    refused: int
    invalid_total: int
    failures: tuple[str, ...]
    summary: str = field(repr=False)
    details: Mapping[str, Any] = field(repr=False)
    edge_pairs: Mapping[str, PairFigures] = field(default_factory=dict)
    edge_oracle: Mapping[str, float] = field(default_factory=dict)
    edge_composition: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)

    @property
    def worst(self) -> PairFigures | None:
        """The pair closest to (or furthest past) its bound: the largest ``bound_ratio``,
        over :attr:`pairs` and :attr:`edge_pairs` (its ``case`` says which)."""
        judged = [
            p
            for p in (*self.pairs.values(), *self.edge_pairs.values())
            if p.bound_ratio is not None
        ]
        return max(judged, key=lambda p: p.bound_ratio) if judged else None

    @property
    def worst_bound_ratio(self) -> float | None:
        """The largest fraction of its bound used, over every pair and case."""
        worst = self.worst
        return worst.bound_ratio if worst is not None else None

    def __str__(self) -> str:
        return self.summary


class BatchingCheckError(AssertionError):
    """A batching check failed. The message is the verdict in the pipeline's wording
    (:attr:`BatchingReport.summary`); ``report`` holds every figure and every failure
    (the message lists the first ten)."""

    def __init__(self, report: BatchingReport) -> None:
        super().__init__(report.summary)
        self.report = report


# --- the check ---------------------------------------------------------------------------


def check_batching(
    model: Model,
    params: Params,
    examples: Any,
    *,
    precision: str = DEFAULT_PRECISION,
    paths: Iterable[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    edge_cases: bool = False,
) -> BatchingReport:
    """Run the checks and return the report, passed or not (report first, then assert:
    :func:`assert_batching_consistent` raises on it). Arguments as there."""
    # Before JAX loads: a jax/jaxlib outside vmapcheck's ranges is refused, named.
    require_supported_jax()
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.contract import output_contract_problem
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.models import Model

    if not isinstance(model, Model):
        raise ConfigError(
            f"model: expected a vmapcheck.core.models.Model (what a model factory returns, "
            f"docs/own-model.md), got {type(model).__name__}"
        )
    config = precision_config(precision, rtol=rtol, atol=atol)
    selected = _select_paths(model, paths)
    # The run's numerics as the forward stage pins them (configure_jax), but scoped to
    # this call: a test suite's other tests keep their own x64 and matmul settings.
    with (
        jax.enable_x64(config.enable_x64),
        jax.default_matmul_precision(config.matmul_precision),
    ):
        dtype = jnp.dtype(config.dtype)
        _check_params(model, params)
        x = _checked_examples(model, examples, dtype)
        # Shapes only: an output off the contract is named, not a traceback from a path.
        problem = output_contract_problem(model, cast_tree(params, dtype), x)
        if problem:
            raise ConfigError(f"model {model.name!r}: {problem}")
        cases = _cases(model, x, dtype, selected, edge_cases)
        outputs, regrouped, record = _forward(model, params, cases, dtype, selected)
    oracle, magnitudes = _float64_side(model, params, cases, config)
    details = _judge(model, config, cases, outputs, regrouped, record, oracle, magnitudes)
    return _report(model, config, details, selected)


def assert_batching_consistent(
    model: Model,
    params: Params,
    examples: Any,
    *,
    precision: str = DEFAULT_PRECISION,
    paths: Iterable[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    edge_cases: bool = False,
) -> BatchingReport:
    """Assert that ``model``'s forward paths agree on ``examples``, as the pipeline checks.

    Args:
        model: a :class:`vmapcheck.core.models.Model` (what a model factory returns):
            ``forward_one(params, x)`` maps one example to ``(out_features,)``, and the
            optional ``forward_batch(params, X)`` a batch to ``(batch, out_features)``.
        params: its params pytree (the leaves of ``jax.eval_shape(model.init, key)``,
            any float dtype: they are cast to the precision's dtype, shared by every row).
        examples: a batch with the batch on axis 0: an array ``(n, in_features)``, or
            for a model with an input contract (``model.inputs``) a dict of its leaves,
            each ``(n, *leaf.shape)``. ``n >= 1``; the composition check needs ``n >= 2``
            (one row has no batch-mates), and a few rows (4 to 32) keep it fast. Float
            arrays are cast to the precision's dtype (as the pipeline casts its cases);
            int and bool leaves must have the contract's dtype.
        precision: a shipped precision option (``f32``, ``f64``, ``bf16``): the dtype,
            matmul precision and tolerances of ``vmapcheck/conf/precision/<name>.yaml``.
        paths: the names of the paths to run (:data:`vmapcheck.core.paths.PATHS`); None:
            every path the model provides.
        rtol, atol: replace the file's ``tolerance.rtol`` / ``tolerance.atol`` (between
            paths and regroupings; the oracle keeps ``cross_run_tolerance``).
        edge_cases: also run the regression set's zeros, boundary (the examples' min and
            max), large-magnitude and subnormal batches, built from the examples as the
            pipeline builds them from its table.

    Returns:
        The :class:`BatchingReport`, every check passed: per-pair worst figures, the
        float64 oracle's, the regroupings', the refusals.

    Raises:
        BatchingCheckError: (an ``AssertionError``) a check failed; its ``report`` holds
            every figure and failure. The message is the pipeline's verdict: the
            forms, backend and tolerance; the first pair of paths that disagrees and the
            paths that disagree with the plain loop; one line per case (``[shape] worst
            pair: max_abs= max_rel= (<fraction> of its bound, rule ...)``); the invalid
            inputs refused; then the first ten ``failure:`` lines of the check.
        ConfigError: ``model`` is no Model or returns outputs off its contract (a
            tuple, another shape, a non-float dtype: found from shapes, before any
            compute), ``precision`` no shipped option, an
            ``rtol``/``atol`` refused, or ``paths`` names a path that is unknown or that
            the model does not provide.
        ArtifactError: ``params`` do not match the model's params (the leaf named,
            expected and found shape), or hold NaN/Inf.
        InvalidInputError: ``examples`` do not match the model's input contract (the leaf
            named, expected and found).
        UnsupportedVersionError: the installed jax or jaxlib is outside the range
            vmapcheck supports (:mod:`vmapcheck.versions`; named, with the range).
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    report = check_batching(
        model,
        params,
        examples,
        precision=precision,
        paths=paths,
        rtol=rtol,
        atol=atol,
        edge_cases=edge_cases,
    )
    if not report.passed:
        raise BatchingCheckError(report)
    return report


# --- the steps ---------------------------------------------------------------------------


def _select_paths(model: Model, paths: Iterable[str] | None) -> tuple[str, ...]:
    """The registry's paths to run, in registry order: those named, else every one the
    model provides (a missing one is reported as not provided, as in the pipeline)."""
    from vmapcheck.core.paths import PATHS, not_provided

    lacking = not_provided(model)
    if paths is None:
        return tuple(name for name in PATHS if name not in lacking)
    if isinstance(paths, str):  # one name would be iterated letter by letter
        paths = [paths]
    wanted = list(paths)
    unknown = [name for name in wanted if name not in PATHS]
    if unknown:
        raise ConfigError(
            f"paths: unknown forward path {unknown[0]!r}; expected names from "
            f"vmapcheck.core.paths.PATHS: {', '.join(PATHS)}"
        )
    absent = [name for name in wanted if name in lacking]
    if absent:
        raise ConfigError(f"paths: {absent[0]} cannot run: {lacking[absent[0]]}")
    if not wanted:
        raise ConfigError("paths: expected at least one forward path, got none")
    return tuple(name for name in PATHS if name in wanted)


def _check_params(model: Model, params: Params) -> None:
    """The train stage's verification of given params: the model's leaves, shapes and
    (any float) dtypes, every value finite."""
    import jax

    from vmapcheck.params_io import check_finite, check_params_like, leaf_paths

    template = jax.eval_shape(model.init, jax.random.key(0))
    check_params_like(params, template, where="params")
    check_finite(leaf_paths(params), "params")


def _checked_examples(model: Model, examples: Any, dtype: Any) -> Any:
    """``examples`` at the run's dtype, validated against the model's input contract.

    Float arrays are cast as the pipeline casts its stored cases; anything else (a list,
    an int array for a float leaf) is left as it is, so that the contract refuses it by
    name rather than this function converting it.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from vmapcheck.core import contract, forms
    from vmapcheck.errors import InvalidInputError

    def at_run_dtype(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(leaf, dtype=dtype)
        return leaf

    x = contract.tree_map(at_run_dtype, examples) if _array_or_dict(examples) else examples
    try:
        forms.validate_batch(x, model, dtype)
    except InvalidInputError as exc:
        raise InvalidInputError(f"examples: {exc}", reason=exc.reason) from None
    return x


def _array_or_dict(x: Any) -> bool:
    import jax
    import numpy as np

    return isinstance(x, Mapping | np.ndarray | jax.Array)


def _shape_of(x: Any) -> Any:
    """A case's input shape as the cases manifest records it: a list, or per leaf."""
    import numpy as np

    if isinstance(x, Mapping):
        return {k: list(np.shape(v)) for k, v in x.items()}
    return list(np.shape(x))


def _table(model: Model, x: Any) -> Any:
    """The examples as the table ``prepare`` builds cases from: ``(rows, size)`` float,
    each leaf's elements row-major in declared order (the inverse of
    :meth:`InputSpec.from_table`); at least 4 rows (repeated in order), what the
    regression set's invalid cases of a dict contract are built from."""
    import numpy as np

    from vmapcheck.core.contract import leaf_arrays, rows, tile_rows

    x = tile_rows(x, max(rows(x), 4))
    arrays = leaf_arrays(x)
    n = rows(x)
    # float64: exact for float32/bfloat16 values, ids and 0/1 masks alike.
    return np.concatenate(
        [
            np.asarray(arrays[leaf.name], dtype=np.float64).reshape(n, leaf.size)
            for leaf in model.contract.leaves
        ],
        axis=1,
    )


def _cases(
    model: Model, x: Any, dtype: Any, selected: Sequence[str], edge_cases: bool
) -> dict[str, dict[str, Any]]:
    """The cases run: the examples as a batch, their first row as a batch of one and
    unbatched (when a vector path runs), the regression set's invalid inputs for the
    model's contract and, with ``edge_cases``, its edge batches; each with the manifest
    keys the check reads (kind, shape, about; expect and runs_on for a refusal)."""
    import numpy as np

    from vmapcheck.core.contract import rows, take
    from vmapcheck.core.paths import PATHS
    from vmapcheck.data.regression import SINGLE_CASE, regression_cases

    vector_paths = any(PATHS[name].takes == "vector" for name in selected)
    batch_paths = any(PATHS[name].takes == "batch" for name in selected)
    cases: dict[str, dict[str, Any]] = {}
    if batch_paths:
        cases[EXAMPLES_CASE] = {
            "x": x,
            "kind": "batch",
            "about": f"the {rows(x)} example(s) given, batch axis 0",
        }
        # The batch of one the vector case is compared with, row by row.
        cases[SINGLE_CASE] = {
            "x": take(x, slice(0, 1)),
            "kind": "batch",
            "about": "the first example, as a batch of one",
        }
    if vector_paths:
        cases[SINGLE_VECTOR_CASE] = {
            "x": take(x, 0),
            "kind": "vector",
            "about": "the first example unbatched, for forward_one",
        }
    table = _table(model, x)
    regression = regression_cases(
        train_x=table,
        test_x=table,
        test_y=np.zeros((table.shape[0], model.out_features), np.float32),
        standard_batch=1,
        contract=model.contract,
    )
    for name, case in regression.items():
        kind = kind_of(case, name)
        if kind.valid and not (edge_cases and kind.edge):
            continue
        if not any(p in selected for p in kind.paths(case)):
            continue  # no path selected takes it
        cases[name] = case
    return {name: {**case, "shape": _shape_of(case["x"])} for name, case in cases.items()}


def _forward(
    model: Model,
    params: Params,
    cases: dict[str, dict[str, Any]],
    dtype: Any,
    selected: Sequence[str],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The forward stage on ``cases``: (outputs, regrouped outputs, forward record)."""
    import jax

    from vmapcheck.core.forms import data_mesh
    from vmapcheck.core.forward import build_all, run_composition, run_forward
    from vmapcheck.core.paths import PATHS, describe_distributed, not_provided

    mesh = data_mesh()  # every device present (one on a plain CPU process)
    built = {
        takes: {name: fn for name, fn in by_name.items() if name in selected}
        for takes, by_name in build_all(model, dtype, mesh).items()
    }
    outputs, per_case = run_forward(model, params, cases, dtype, mesh, built=built)
    regrouped, composition = run_composition(
        model, params, cases, dtype, outputs, mesh, built=built
    )
    # A path left out is reported like one the model lacks: the check skips it.
    skipped = {
        **not_provided(model),
        **{
            name: f"not run: left out by paths={list(selected)}"
            for name in PATHS
            if name not in selected and name not in not_provided(model)
        },
    }
    distributed = any(PATHS[name].distributed for name in selected)
    device = jax.devices()[0]
    record = {
        "runtime": {
            "backend": jax.default_backend(),
            "platform": device.platform,
            "device_kind": device.device_kind,
            "device_count": jax.device_count(),
            "jax_version": jax.__version__,
            "jaxlib_version": _jaxlib_version(),
            "enable_x64": bool(jax.config.jax_enable_x64),
            "matmul_precision": str(jax.config.jax_default_matmul_precision),
        },
        "dtype": str(dtype),
        "params_sha256": "",
        "not_provided": skipped,
        "sharded": describe_distributed(model, mesh) if distributed else None,
        "reference": {"status": "missing", "message": "the Python API compares no reference"},
        "gradients": None,
        "cases": per_case,
        "composition": composition,
    }
    return outputs, regrouped, record


def _jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def _float64_side(
    model: Model, params: Params, cases: dict[str, dict[str, Any]], config: PrecisionConfig
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(float64 oracle outputs, terms' magnitudes), as the check stage computes them: on
    CPU with x64 (scoped to this call), params and inputs first rounded to the run's
    dtype. No oracle for a float64 run; no magnitudes unless a tolerance scales by the
    terms."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.magnitude import case_magnitudes
    from vmapcheck.core.oracle import float64_outputs

    run_dtype = jnp.dtype(config.dtype)
    uses_terms = "terms" in (config.tolerance.scale, config.cross_run_tolerance.scale)
    # Both skip the invalid cases themselves (by their kind's entry in CASE_KINDS).
    with (
        jax.enable_x64(True),
        jax.default_device(_cpu_device()),
        jax.default_matmul_precision("highest"),
    ):
        oracle = None
        if run_dtype != jnp.float64:
            oracle = float64_outputs(model, params, cases, run_dtype)
        magnitudes = None
        if uses_terms:
            magnitudes = case_magnitudes(model.forward_one, params, cases, run_dtype)
    return oracle, magnitudes


def _cpu_device() -> Any:
    """The CPU device the check stage computes the oracle on; the default device when
    this process runs without JAX's CPU backend (``JAX_PLATFORMS`` naming only an
    accelerator): float64 is computed there instead."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return jax.devices()[0]


def _judge(
    model: Model,
    precision: PrecisionConfig,
    cases: dict[str, dict[str, Any]],
    outputs: dict[str, Any],
    regrouped: dict[str, Any],
    record: dict[str, Any],
    oracle: dict[str, Any] | None,
    magnitudes: dict[str, Any] | None,
) -> dict[str, Any]:
    """The check stage's verdict (:func:`vmapcheck.check.checks.run_checks`)."""
    from vmapcheck.check.checks import run_checks
    from vmapcheck.config import Config, ModelConfig, ReferenceConfig

    # run_checks reads model.out_features (the contract's output shape), precision and
    # reference.required; the other groups configure stages this API does not run (data,
    # train, bench, guard, tracking, registry), so they are left unset rather than
    # invented. There is no stored reference here: not required. No budget: this API
    # runs every path, the oracle and the magnitude on every row.
    config = Config.model_construct(
        budget=None,
        model=ModelConfig.model_construct(
            name=model.name,
            in_features=model.in_features,
            out_features=model.out_features,
        ),
        precision=precision,
        reference=ReferenceConfig(dir="(none: the Python API)", required=False),
    )
    manifest = {
        "cases": {name: {k: v for k, v in c.items() if k != "x"} for name, c in cases.items()}
    }
    return dict(
        run_checks(
            config,
            manifest,
            outputs,
            record,
            oracle=oracle,
            magnitudes=magnitudes,
            composition=regrouped,
        )
    )


# --- the report --------------------------------------------------------------------------


def _pair_figures(details: Mapping[str, Any], cases: Iterable[str]) -> dict[str, PairFigures]:
    """Every pair's worst figures over ``cases`` (names of ``details["cases"]``), each
    figure with the case where it was reached."""
    merged: dict[str, dict[str, Any]] = {}
    for case_name in cases:
        for pair, result in details["cases"][case_name]["pairs"].items():
            entry = merged.setdefault(pair, {"ok": True})
            for stat, where in (
                ("max_abs", "max_abs_case"),
                ("max_rel", "max_rel_case"),
                ("bound_ratio", "case"),
            ):
                value = result.get(stat)
                if value is not None and (entry.get(stat) is None or value > entry[stat]):
                    entry[stat], entry[where] = value, case_name
            if not result["passed"]:
                entry["ok"] = False
                entry["case"] = entry.get("case") or case_name
    return {
        pair: PairFigures(
            pair=pair,
            max_abs=e.get("max_abs"),
            max_rel=e.get("max_rel"),
            bound_ratio=e.get("bound_ratio"),
            case=e.get("case"),
            passed=e["ok"],
            max_abs_case=e.get("max_abs_case"),
            max_rel_case=e.get("max_rel_case"),
        )
        for pair, e in merged.items()
    }


def _oracle_figures(details: Mapping[str, Any], cases: Iterable[str]) -> dict[str, float]:
    """Every path's worst ``max_rel`` against the float64 oracle over ``cases``."""
    oracle: dict[str, float] = {}
    for case_name in cases:
        for path, result in details["cases"][case_name].get("oracle", {}).items():
            if result.get("max_rel") is not None:
                oracle[path] = max(oracle.get(path, 0.0), result["max_rel"])
    return oracle


def _composition_figures(
    details: Mapping[str, Any], cases: Iterable[str]
) -> dict[str, dict[str, float | None]]:
    """Every batch path's worst ``max_abs`` against itself regrouped, per regrouping,
    over ``cases``."""
    composition: dict[str, dict[str, float | None]] = {}
    judged = details.get("composition", {})
    for case_name in cases:
        for path, result in judged.get(case_name, {}).items():
            into = composition.setdefault(path, {})
            for regrouping, figures in result.items():
                if regrouping == "passed":
                    continue
                value = figures.get("max_abs")
                before = into.get(regrouping)
                into[regrouping] = (
                    value if before is None else before if value is None else max(before, value)
                )
    return composition


def _groups(details: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The judged cases split: (the examples the caller passed, the edge cases)."""
    cases = details["cases"]
    edge = [name for name, case in cases.items() if kind_of(case, name).edge]
    return [name for name in cases if name not in edge], edge


def first_diverging_pair(details: Mapping[str, Any]) -> str | None:
    """``"<case>/<pathA>-vs-<pathB>"``: the first pair that disagrees, in case and
    registry order (the order of the check's ``failures``); None when every pair agrees."""
    for case_name, case in details["cases"].items():
        for pair, result in case["pairs"].items():
            if not result["passed"]:
                return f"{case_name}/{pair}"
    return None


def diverging_from_plain(details: Mapping[str, Any]) -> list[str]:
    """The paths that disagree with the plain per-example path (``loop_eager``) on some
    case, in registry order: usually the culprits, since the loop sees one row at a time."""
    from vmapcheck.core.paths import PATHS, plain_path

    plain = plain_path()
    found = set()
    for case in details["cases"].values():
        for pair, result in case["pairs"].items():
            if result["passed"]:
                continue
            left, _, right = pair.partition("-vs-")
            if plain in (left, right):
                found.add(right if left == plain else left)
    return [name for name in PATHS if name in found]


def _summary(model: Model, details: Mapping[str, Any], precision: PrecisionConfig) -> str:
    """The verdict as the pipeline prints it (``vmapcheck summary``; the composition line
    as the check stage prints it), without what this API does not run (reference,
    benchmark, MLflow), with the first diverging pair named."""
    from vmapcheck.check.rules import summary_lines as rule_lines
    from vmapcheck.core.composition import composition_line
    from vmapcheck.core.paths import not_provided, plain_path
    from vmapcheck.report.check_sections import leaves_text, not_provided_lines
    from vmapcheck.report.summary import case_line, refusals_line, verdict_line

    lines = [f"{verdict_line(details)} (precision {precision.name}, vmapcheck.testing)"]
    first = first_diverging_pair(details)
    if first is not None:
        lines.append(f"  first diverging pair: {first}")
        culprits = diverging_from_plain(details)
        if culprits:
            lines.append(
                f"  disagree with {plain_path()} (the plain per-example loop): "
                + ", ".join(culprits)
            )
    # Paths the model lacks, as the pipeline words them; those left out by ``paths=``
    # (also skipped by the check) on one line.
    lacking = not_provided(model)
    lines += [f"  -    {line}" for line in not_provided_lines({"not_provided": lacking})]
    left_out = [name for name in details["not_provided"] if name not in lacking]
    if left_out:
        lines.append(f"  -    left out by paths=: {', '.join(left_out)}")
    contract = model.contract
    lines.append(
        "  inputs: "
        + (
            f"one float vector ({model.in_features},)"
            if contract.flat
            else leaves_text(contract.describe())
        )
        + ", batch axis 0"
    )
    # The caller's examples first, the edge batches built from them apart: a figure of
    # one group is never read as the other's.
    examples, edges = _groups(details)
    tol = details["tolerance"]
    lines += [case_line(name, details["cases"][name], tol) for name in examples]
    if edges:
        lines.append("  edge cases (edge_cases=True), built from the examples:")
        lines += [case_line(name, details["cases"][name], tol) for name in edges]
    lines += rule_lines(details["cases"])  # the rules case kinds add
    lines += [
        composition_line(name, by_path) for name, by_path in details.get("composition", {}).items()
    ]
    lines.append(refusals_line(details["negative"]))
    failures = details["failures"]
    lines += [f"  failure: {failure}" for failure in failures[:SHOWN_FAILURES]]
    if len(failures) > SHOWN_FAILURES:
        lines.append(
            f"  ... and {len(failures) - SHOWN_FAILURES} more failure(s) "
            "(report.failures lists them all)"
        )
    return "\n".join(lines)


def _report(
    model: Model, precision: PrecisionConfig, details: dict[str, Any], selected: Sequence[str]
) -> BatchingReport:
    examples, edges = _groups(details)
    negative = details["negative"]
    return BatchingReport(
        passed=bool(details["passed"]),
        precision=precision.name,
        dtype=details["dtype"],
        tolerance=details["tolerance"],
        cross_run_tolerance=details["cross_run_tolerance"],
        paths=tuple(selected),
        not_run=details["not_provided"],
        pairs=_pair_figures(details, examples),
        oracle=_oracle_figures(details, examples),
        composition=_composition_figures(details, examples),
        refused=sum(bool(n["passed"]) for n in negative.values()),
        invalid_total=len(negative),
        failures=tuple(details["failures"]),
        summary=_summary(model, details, precision),
        details=details,
        edge_pairs=_pair_figures(details, edges),
        edge_oracle=_oracle_figures(details, edges),
        edge_composition=_composition_figures(details, edges),
    )
