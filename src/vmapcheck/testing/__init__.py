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
  built for the model's input contract) refused by every path, the problem named;
- the loss and its gradients (:func:`vmapcheck.core.gradients.gradient_probe`): finite,
  the mean of the per-example gradients equal to the batch gradient, a NaN target not
  masked (``gradients=False`` leaves them out).

Nothing here judges anything itself: the cases are the pipeline's case kinds, the
outputs come from :mod:`vmapcheck.core.forward` and the verdict from
:func:`vmapcheck.check.checks.run_checks`, so a test and a pipeline run of the same model
fail on the same rule with the same ``failure:`` lines.

Only what needs no JAX is imported at module level (the pytest plugin imports this
module in every test session; JAX loads on the first check).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from vmapcheck.config import PrecisionConfig, VerdictConfig, precision_names
from vmapcheck.config import describe_errors as _describe
from vmapcheck.config.fields import MAX_SEED
from vmapcheck.config.run import PRECISION_FOLDER, PRECISION_GROUP, precision_file
from vmapcheck.core.bitwise_verdict import PathBitwise, check_mode
from vmapcheck.errors import ConfigError, api_error
from vmapcheck.testing._run import (
    EDGE_KINDS,
    EXAMPLES_CASE,
    SINGLE_VECTOR_CASE,
    build_cases,
    check_params,
    check_rows,
    checked_examples,
    checked_targets,
    float64_side,
    forward,
    gradient_side,
    judge,
    select_paths,
)
from vmapcheck.testing.report import (
    SHOWN_FAILURES,
    BatchingCheckError,
    BatchingReport,
    GradientFigures,
    PairFigures,
    build_report,
    diverging_from_plain,
    first_diverging_pair,
)
from vmapcheck.versions import require_supported_jax

if TYPE_CHECKING:
    from vmapcheck.core.models import Model, Params

# The public API (docs/python-api.md); the run's steps are vmapcheck.testing._run's, the
# report's vmapcheck.testing.report's.
__all__ = [
    "DEFAULT_PRECISION",
    "EDGE_KINDS",
    "EXAMPLES_CASE",
    "SHOWN_FAILURES",
    "SINGLE_VECTOR_CASE",
    "BatchingCheckError",
    "BatchingReport",
    "GradientFigures",
    "PairFigures",
    "PathBitwise",
    "assert_batching_consistent",
    "check_batching",
    "diverging_from_plain",
    "first_diverging_pair",
    "precision_config",
    "precision_names",
]

DEFAULT_PRECISION = "f32"
# The most rows of examples a check runs unless told more (``max_rows``): each loop path
# runs one forward per row, eagerly for loop_eager (about a millisecond a row on a CPU),
# and the float64 oracle every row again: 10,000 rows is about a minute of loops.
MAX_ROWS = 10_000


# --- precision ---------------------------------------------------------------------------


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

    >>> precision = precision_config("f32", rtol=1e-4)
    >>> precision.dtype, precision.tolerance.rtol
    ('float32', 0.0001)
    """
    if not isinstance(name, str) or name not in precision_names():
        raise ConfigError(
            f"precision={name!r}: expected one of {', '.join(precision_names())} (the files "
            f"of {PRECISION_FOLDER})"
        )
    source = f"{PRECISION_FOLDER}{name}.yaml"
    try:
        raw = precision_file(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    overrides = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
    if overrides and isinstance(raw, dict) and isinstance(raw.get("tolerance"), dict):
        raw = {**raw, "tolerance": {**raw["tolerance"], **overrides}}
        source += f" with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}"
    try:
        return PrecisionConfig.model_validate(raw)
    except ValidationError as exc:
        # The keys as params.yaml spells them (precision.tolerance.rtol), in the config
        # module's own wording.
        errors: list[ErrorDetails] = [
            {**e, "loc": (PRECISION_GROUP, *e["loc"])} for e in exc.errors()
        ]
        raise ConfigError(_describe(errors, source, {PRECISION_GROUP: raw})) from None


# --- the check ---------------------------------------------------------------------------


def verdict_config(fail_on: Iterable[str] | None) -> VerdictConfig:
    """``verdict.fail_on`` for this call, validated as the pipeline validates it (an
    unknown kind is a ConfigError that names it and the kinds there are)."""
    if fail_on is None:
        return VerdictConfig()
    if isinstance(fail_on, str):  # one name would be iterated letter by letter
        fail_on = [fail_on]
    try:
        return VerdictConfig.model_validate({"fail_on": list(fail_on)})
    except ValidationError as exc:
        errors: list[ErrorDetails] = [{**e, "loc": ("verdict", *e["loc"])} for e in exc.errors()]
        raise ConfigError(_describe(errors, "fail_on")) from None


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
    fail_on: Iterable[str] | None = None,
    gradients: bool = True,
    targets: Any = None,
    bitwise: str = "report",
    seed: int = 0,
    max_rows: int = MAX_ROWS,
) -> BatchingReport:
    """Run the checks and return the report, passed or not (report first, then assert:
    :func:`assert_batching_consistent` raises on it). Arguments as there.

    A hand-batched forward that returns its rows reversed (``examples`` ``(4, 3)``, batch
    axis 0; the shipped ``toy`` model, its eager paths from the registry, gradients and
    bitwise left out to keep it fast):

    >>> import dataclasses
    >>> import numpy as np
    >>> from vmapcheck.config import ModelConfig
    >>> from vmapcheck.core.models import build_model, toy_params
    >>> from vmapcheck.core.paths import PATHS
    >>> toy = build_model(ModelConfig(name="toy", in_features=3, out_features=2))
    >>> reversed_rows = dataclasses.replace(
    ...     toy, forward_batch=lambda params, X: toy.forward_batch(params, X)[::-1]
    ... )
    >>> examples = np.random.default_rng(0).normal(size=(4, 3))
    >>> eager = [path.name for path in PATHS.values() if not path.jit]
    >>> report = check_batching(
    ...     reversed_rows, toy_params(), examples, paths=eager, gradients=False, bitwise="off"
    ... )
    >>> report.passed
    False
    >>> for line in report.summary.splitlines()[1:3]:
    ...     print(line)
      first diverging pair: examples/loop_eager-vs-direct_eager
      disagree with loop_eager (the plain per-example loop): direct_eager

    Raises:
        ConfigError: ``model`` is no Model or returns outputs off its contract (a
            tuple, another shape, a non-float dtype: found from shapes, before any
            compute), ``precision`` no shipped option, an
            ``rtol``/``atol`` refused, ``paths`` names a path that is unknown or that
            the model does not provide, ``gradients`` is not a bool, or (with
            ``gradients``) a params leaf is neither float nor declared state
            (:func:`vmapcheck.core.state.partition`, as ``train`` refuses it).
        ArtifactError: ``params`` do not match the model's params (the leaf named,
            expected and found shape), or hold NaN/Inf.
        InvalidInputError: ``examples`` do not match the model's input contract (the leaf
            named, expected and found), have more rows than ``max_rows``, or ``targets``
            are not a finite float array ``(n, out_features)`` (named, expected and found).
        ModelCodeError: the model's own code raised (its init or forward): the model
            named, where in its code, and the fix when known (a ``jax.pure_callback``
            without ``vmap_method``). An OSError, decode, recursion, overflow or memory
            error is a one-line :class:`vmapcheck.errors.VmapcheckError`; with
            ``VMAPCHECK_DEBUG=1`` each stays the original exception.
        UnsupportedVersionError: the installed jax or jaxlib is outside the range
            vmapcheck supports (:mod:`vmapcheck.versions`; named, with the range).
    """
    try:
        return _check_batching(
            model,
            params,
            examples,
            precision=precision,
            paths=paths,
            rtol=rtol,
            atol=atol,
            edge_cases=edge_cases,
            fail_on=fail_on,
            gradients=gradients,
            targets=targets,
            bitwise=bitwise,
            seed=seed,
            max_rows=max_rows,
        )
    except Exception as exc:
        # The API's boundary: a bad file or value, or the model's own code raising, in
        # one line naming it (the original chained; VMAPCHECK_DEBUG=1 keeps it as is).
        error = api_error(exc, getattr(model, "name", None))
        if error is None:
            raise
        raise error from exc


def _check_batching(
    model: Model,
    params: Params,
    examples: Any,
    *,
    precision: str,
    paths: Iterable[str] | None,
    rtol: float | None,
    atol: float | None,
    edge_cases: bool,
    fail_on: Iterable[str] | None,
    gradients: bool,
    targets: Any,
    bitwise: str,
    seed: int,
    max_rows: int,
) -> BatchingReport:
    # Before JAX loads: a jax/jaxlib outside vmapcheck's ranges is refused, named.
    require_supported_jax()
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.contract import output_contract_problem, rows
    from vmapcheck.core.forms import cast_tree, forward_keys, keyed_model, with_keys
    from vmapcheck.core.models import Model

    if not isinstance(model, Model):
        raise ConfigError(
            f"model: expected a vmapcheck.core.models.Model (what a model factory returns, "
            f"docs/own-model.md), got {type(model).__name__}"
        )
    if not isinstance(gradients, bool):
        raise ConfigError(f"gradients: expected True or False, got {gradients!r}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ConfigError(f"max_rows: expected an int >= 1 (rows of examples), got {max_rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(
            f"seed: expected an int >= 0 and <= {MAX_SEED} (the run's key stream; "
            f"vmapcheck.config.fields.MAX_SEED), got {seed!r}"
        )
    config = precision_config(precision, rtol=rtol, atol=atol)
    verdict = verdict_config(fail_on)
    mode = check_mode(bitwise, "bitwise")
    selected = select_paths(model, paths)
    # The run's numerics as the forward stage pins them (configure_jax), but scoped to
    # this call: a test suite's other tests keep their own x64 and matmul settings.
    with (
        jax.enable_x64(config.enable_x64),
        jax.default_matmul_precision(config.matmul_precision),
    ):
        dtype = jnp.dtype(config.dtype)
        check_params(model, params)
        x = checked_examples(model, examples, dtype)
        check_rows(rows(x), max_rows, selected)
        # Shapes only: an output off the contract is named, not a traceback from a path.
        # A stochastic model is traced with row 0's key (forms.keyed_model).
        problem = output_contract_problem(
            keyed_model(model), cast_tree(params, dtype), with_keys(model, x, forward_keys(seed))
        )
        if problem:
            raise ConfigError(f"model {model.name!r}: {problem}")
        # Validated even when gradients=False: a wrong argument is named, not ignored.
        y = checked_targets(model, targets, rows(x), dtype)
        cases = build_cases(model, x, dtype, selected, edge_cases)
        # The forward stage's gradient probe, at the run's numerics: one compile.
        grad_arrays, grad_record = (
            gradient_side(model, params, x, y, dtype, seed) if gradients else (None, None)
        )
        outputs, regrouped, record = forward(
            model, params, cases, dtype, selected, grad_record, mode, seed
        )
    oracle, magnitudes = float64_side(model, params, cases, config, seed)
    details = judge(
        model,
        config,
        verdict,
        cases,
        outputs,
        regrouped,
        record,
        oracle,
        magnitudes,
        grad_arrays,
        mode,
    )
    return build_report(model, config, details, selected, gradients=gradients)


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
    fail_on: Iterable[str] | None = None,
    gradients: bool = True,
    targets: Any = None,
    bitwise: str = "report",
    seed: int = 0,
    max_rows: int = MAX_ROWS,
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
        edge_cases: also run the regression set's edge cases (:data:`EDGE_KINDS`):
            zeros, boundary (the examples' min and max), large-magnitude, subnormal and
            duplicate-row batches, built from the examples as the pipeline builds them
            from its table.
        fail_on: the kinds of finding that fail (``batching``, ``numerical``, ``model``,
            ``contract``: :data:`vmapcheck.check.kinds.FINDING_KINDS`), as the pipeline's
            ``verdict.fail_on``; None: every kind. A kind left out is still reported in
            ``report.findings`` and the summary, as a finding that does not fail.
        gradients: also check the model's loss and gradients as the pipeline's
            ``forward`` and ``check`` stages do (on by default): the loss (mean squared
            error of ``forward_one`` against ``targets``, its mean over the examples)
            and its gradient with respect to the trainable leaves (declared state
            leaves held fixed) finite, the mean of the per-example gradients equal to
            the batch gradient at ``tolerance``, leaf by leaf, and a NaN planted in one
            target not masked. A NaN from the untaken branch of a ``jnp.where`` (or
            ``jnp.select``, ``lax.select``) shows here only: the forward is finite.
            False: left out (the report says so).
        targets: the loss's targets, a float array ``(n, out_features)``, batch axis 0,
            finite; None: zeros. Cast to the precision's dtype.
        bitwise: bitwise batch invariance (docs/checks.md, "Bitwise batch
            invariance"): ``"report"`` measures it on the examples (each row alone,
            permuted and split against the batch, each path against the loop, the first
            operation where the bits part) into :attr:`BatchingReport.bitwise` and the
            summary, never failing; ``"require"`` also fails every batch path that is
            not bitwise; ``"off"`` does not measure it (it runs each row alone on
            every path).
        seed: a stochastic model's (``Model.stochastic``) keys: row ``i`` of every
            batch gets ``jax.random.split(named_keys(seed)["forward"], rows)[i]`` on
            every path (:mod:`vmapcheck.core.forms`); its copies of one row (the
            ``duplicate_rows`` case, always run for it) must not all get one output.
        max_rows: the most rows of ``examples`` run (:data:`MAX_ROWS` by default): each
            loop path runs one forward per row and the float64 oracle every row again,
            so more rows are refused before any work, with the figures; raise it to run
            them all.

    Returns:
        The :class:`BatchingReport`, every check passed: per-pair worst figures, the
        float64 oracle's, the regroupings', the refusals.

    Example (the shipped ``toy`` model, 4 examples ``(4, 3)``, batch axis 0; its eager
    paths, the loss and its gradients):

    >>> import numpy as np
    >>> from vmapcheck.config import ModelConfig
    >>> from vmapcheck.core.models import build_model, toy_params
    >>> from vmapcheck.core.paths import PATHS
    >>> toy = build_model(ModelConfig(name="toy", in_features=3, out_features=2))
    >>> examples = np.random.default_rng(0).normal(size=(4, 3))
    >>> eager = [path.name for path in PATHS.values() if not path.jit]
    >>> report = assert_batching_consistent(toy, toy_params(), examples, paths=eager, bitwise="off")
    >>> report.passed, report.worst_bound_ratio < 1
    (True, True)
    >>> report.paths
    ('loop_eager', 'vmap_eager', 'vmap_of_jit_eager', 'direct_eager', 'one_eager')

    Raises:
        BatchingCheckError: (an ``AssertionError``) a check failed; its ``report`` holds
            every figure and failure, its message is the pipeline's verdict (what it
            says: :class:`BatchingCheckError`).
        ConfigError, ArtifactError, InvalidInputError, ModelCodeError,
            UnsupportedVersionError: an argument, file or installed version refused, or
            the model's own code raising, as :func:`check_batching` raises them.
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
        fail_on=fail_on,
        gradients=gradients,
        targets=targets,
        bitwise=bitwise,
        seed=seed,
        max_rows=max_rows,
    )
    if not report.passed:
        raise BatchingCheckError(report)
    return report
