"""The Python API's run (:mod:`vmapcheck.testing`): the paths it runs, the inputs it
checks, the cases built from the caller's examples, and the forward, float64 and check
steps, each the pipeline's own function (:mod:`vmapcheck.core.forward`,
:mod:`vmapcheck.core.oracle`, :func:`vmapcheck.check.checks.run_checks`) called on them.

JAX is imported where a step runs (the pytest plugin imports the API in every session).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vmapcheck.config import PrecisionConfig, VerdictConfig
from vmapcheck.core.cases import CASE_KINDS, Case, CaseEntry, CasesManifest, kind_of
from vmapcheck.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from vmapcheck.check.schema import CheckDetails
    from vmapcheck.core.magnitude import CaseMagnitude
    from vmapcheck.core.models import Model, Params
    from vmapcheck.core.record import ForwardRecord, GradientProbe, GradientProbeError

# The case names: the user's batch, its first row as a batch of one and unbatched. The
# last two are the names the check compares a vector case with
# (vmapcheck.data.regression.SINGLE_CASE).
EXAMPLES_CASE = "examples"
SINGLE_VECTOR_CASE = "single_vector"
# The case kinds whose regression cases run with edge_cases=True (built from the
# examples, as prepare builds them from the table); invalid cases always.
EDGE_KINDS = tuple(kind.name for kind in CASE_KINDS.values() if kind.edge)


# The fewest paths a check compares: agreement is between two of them at least.
MIN_PATHS = 2


def select_paths(model: Model, paths: Iterable[str] | None) -> tuple[str, ...]:
    """The registry's paths to run, in registry order: those named, else every one the
    model provides (a missing one is reported as not provided, as in the pipeline).
    ``paths`` a bare string is one path's name.

    Raises:
        ConfigError: a name unknown or not provided by the model, or fewer than
            :data:`MIN_PATHS` paths (nothing would be compared)."""
    from vmapcheck.core.paths import PATHS, not_provided

    lacking = not_provided(model)
    if paths is None:
        return tuple(name for name in PATHS if name not in lacking)
    if isinstance(paths, str):  # one name would be iterated letter by letter
        paths = [paths]
    wanted = list(dict.fromkeys(paths))  # a name given twice is one path
    unknown = [name for name in wanted if name not in PATHS]
    if unknown:
        raise ConfigError(
            f"paths: unknown forward path {unknown[0]!r}; expected names from "
            f"vmapcheck.core.paths.PATHS: {', '.join(PATHS)}"
        )
    absent = [name for name in wanted if name in lacking]
    if absent:
        raise ConfigError(f"paths: {absent[0]} cannot run: {lacking[absent[0]]}")
    if len(wanted) < MIN_PATHS:
        # One path alone agrees with nothing: its check would pass having compared nothing.
        raise ConfigError(
            f"paths: expected at least {MIN_PATHS} forward paths (the check compares paths "
            f"with each other), got {wanted}; add one, e.g. 'loop_eager'"
        )
    return tuple(name for name in PATHS if name in wanted)


def check_rows(n: int, max_rows: int, selected: tuple[str, ...]) -> None:
    """Refuse ``n`` rows of examples above ``max_rows`` before any work, with the figures:
    the forward calls the loop paths of ``selected`` and the float64 oracle would make."""
    from vmapcheck.core.paths import PATHS
    from vmapcheck.errors import InvalidInputError

    if n <= max_rows:
        return
    # The paths whose cost grows row by row are those the pipeline's budget caps.
    loops = sum(PATHS[name].forward_cap is not None for name in selected)
    raise InvalidInputError(
        f"examples: expected at most max_rows={max_rows:,} rows, found {n:,}: the {loops} "
        f"loop path(s) and the float64 oracle would make about {(loops + 1) * n:,} forward "
        f"calls of one row; pass a sample of the rows, or max_rows={n} to run them all",
        reason="batch_too_large",
    )


def check_params(model: Model, params: Params) -> None:
    """The train stage's verification of given params: the model's leaves, shapes and
    (any float) dtypes, every value finite."""
    import jax

    from vmapcheck.params_io import check_finite, check_params_like, leaf_paths

    template = jax.eval_shape(model.init, jax.random.key(0))
    check_params_like(params, template, where="params")
    check_finite(leaf_paths(params), "params")


def checked_examples(model: Model, examples: Any, dtype: Any) -> Any:
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


def checked_targets(model: Model, targets: Any, n: int, dtype: Any) -> Any:
    """The loss's targets at the run's dtype: ``targets`` validated, or zeros.

    ``targets``: None (zeros: the loss is then the mean square of the outputs, whose
    gradient reaches every leaf the output depends on), or a float array ``(n,
    out_features)``, batch axis 0, every value finite; cast to ``dtype`` as the examples
    are.

    Raises:
        InvalidInputError: ``targets`` is no float array of that shape, or holds NaN or
            Inf (named: ``targets``, what was expected and what was found).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from vmapcheck.errors import InvalidInputError

    expected = (n, model.out_features)
    if targets is None:
        return jnp.zeros(expected, dtype)
    if not isinstance(targets, np.ndarray | jax.Array):
        raise InvalidInputError(
            f"targets: expected an array {expected} (numpy or JAX, batch axis 0: one row "
            f"of out_features={model.out_features} per example), got {type(targets).__name__}",
            reason="type",
        )
    if tuple(targets.shape) != expected:
        raise InvalidInputError(
            f"targets: expected shape {expected} (one row per example, out_features="
            f"{model.out_features}), got {tuple(targets.shape)}",
            reason="shape",
        )
    if not jnp.issubdtype(targets.dtype, jnp.floating):
        raise InvalidInputError(
            f"targets: expected a float dtype (cast to {jnp.dtype(dtype).name}), got "
            f"{targets.dtype}",
            reason="dtype",
        )
    host = np.asarray(targets, dtype=np.float64)  # exact for every float dtype
    if not np.all(np.isfinite(host)):
        row, col = (int(i) for i in np.argwhere(~np.isfinite(host))[0])
        raise InvalidInputError(
            f"targets: expected finite values, got {host[row, col]} at row {row}, column {col}",
            reason="non_finite_input",
        )
    return jnp.asarray(targets, dtype=dtype)


def gradient_side(
    model: Model, params: Params, x: Any, targets: Any, dtype: Any, seed: int = 0
) -> tuple[dict[str, np.ndarray] | None, GradientProbe | GradientProbeError]:
    """The forward stage's gradient probe (:func:`vmapcheck.core.gradients.gradient_probe`)
    on the examples: the model's loss (the mean squared error of ``forward_one`` against
    ``targets``), its gradient with respect to the trainable leaves (the declared state
    leaves held fixed, as ``train`` holds them), the per-example gradients under vmap and
    a NaN planted in one target. ``x``: the checked examples, batch axis 0; ``targets``:
    ``(n, out_features)`` at ``dtype``. Returns (arrays, record) as the forward stage
    stores them, the record naming its case (``examples``). A model JAX cannot
    differentiate (a primitive with no JVP rule) gives no arrays and a record of the
    error, which the check says as a model finding: the forward paths are still
    checked, and ``gradients=False`` leaves the gradient check out. A stochastic model's
    rows get the keys the paths give them (from ``seed``)."""
    from vmapcheck.core.contract import rows
    from vmapcheck.core.forms import cast_tree, forward_keys
    from vmapcheck.core.gradients import gradient_probe

    key = forward_keys(seed) if model.stochastic else None
    try:
        arrays, record = gradient_probe(model, cast_tree(params, dtype), x, targets, key)
    except Exception as exc:  # any error the model's differentiation raises, said by name
        first = f"{type(exc).__name__}: {exc}".split("\n")[0]
        return None, {"error": first, "case": EXAMPLES_CASE}
    record["rows"] = rows(x)
    record["case"] = EXAMPLES_CASE
    return arrays, record


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


def build_cases(
    model: Model, x: Any, dtype: Any, selected: Sequence[str], edge_cases: bool
) -> dict[str, Case]:
    """The cases run: the examples as a batch, their first row as a batch of one and
    unbatched (when a vector path runs), the regression set's invalid inputs for the
    model's contract and, with ``edge_cases``, its edge batches; each with the manifest
    keys the check reads (kind, shape, about; expect and runs_on for a refusal)."""
    import numpy as np

    from vmapcheck.check.rules import rules_for
    from vmapcheck.core.contract import rows, take
    from vmapcheck.core.paths import PATHS
    from vmapcheck.data.regression import SINGLE_CASE, regression_cases

    vector_paths = any(PATHS[name].takes == "vector" for name in selected)
    batch_paths = any(PATHS[name].takes == "batch" for name in selected)
    cases: dict[str, Case] = {}
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
        # A kind whose rules flip for a sampling model (copies with their own keys must
        # differ) is what catches a key shared by the rows: always run for one.
        sampling = model.stochastic and rules_for(kind.rules, True) != kind.rules
        if kind.valid and not ((edge_cases and kind.edge) or sampling):
            continue
        if not any(p in selected for p in kind.paths(case)):
            continue  # no path selected takes it
        cases[name] = case
    return {name: {**case, "shape": _shape_of(case["x"])} for name, case in cases.items()}


def forward(
    model: Model,
    params: Params,
    cases: dict[str, Case],
    dtype: Any,
    selected: Sequence[str],
    gradients: GradientProbe | GradientProbeError | None = None,
    bitwise: str = "report",
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], ForwardRecord]:
    """The forward stage on ``cases``: (outputs, regrouped outputs, forward record).
    ``gradients``: the gradient probe's record (:func:`gradient_side`), or None: not run
    (``gradients=False``); with ``bitwise`` other than "off", the bitwise batch invariance
    of the examples (:mod:`vmapcheck.core.bitwise`, every row alone: no budget) in the
    record; not for a stochastic model, whose row alone would draw row 0's key. A
    stochastic model's row keys are split from the ``forward`` key of ``seed``'s stream
    (:func:`vmapcheck.core.forms.forward_keys`), as the pipeline splits them."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.bitwise import measure_case
    from vmapcheck.core.bitwise_verdict import check_mode
    from vmapcheck.core.forms import FORWARD_KEYS, data_mesh, forward_keys
    from vmapcheck.core.forward import build_all, run_composition, run_forward
    from vmapcheck.core.jit_cache import cached, key_bytes
    from vmapcheck.core.paths import PATHS, describe_distributed, describe_meshes, not_provided
    from vmapcheck.core.record import forward_record, keys_record
    from vmapcheck.core.runtime import runtime_info

    mesh = data_mesh()  # every device present (one on a plain CPU process)
    key = forward_keys(seed)
    # Built once per model, dtype, mesh, key and numerics in this process: the same
    # jitted objects again, so a repeat check compiles nothing (vmapcheck.core.jit_cache).
    every = cached(
        model,
        "paths",
        (jnp.dtype(dtype).name, mesh, key_bytes(key)),
        lambda: build_all(model, dtype, mesh, key),
    )
    built = {
        takes: {name: fn for name, fn in by_name.items() if name in selected}
        for takes, by_name in every.items()
    }
    outputs, per_case = run_forward(model, params, cases, dtype, mesh, built=built, key=key)
    regrouped, composition = run_composition(
        model, params, cases, dtype, outputs, mesh, built=built, key=key
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
    runtime = runtime_info(jax.default_backend()).as_dict()
    record = forward_record(
        runtime=runtime,
        dtype=str(dtype),
        not_provided=skipped,
        sharded=describe_distributed(model, mesh) if distributed else None,
        meshes=describe_meshes(model, mesh, selected) if distributed else None,
        reference={"status": "missing", "message": "the Python API compares no reference"},
        gradients=gradients,
        cases=per_case,
        composition=composition,
        bitwise=None
        if check_mode(bitwise) == "off" or model.stochastic
        else measure_case(
            model,
            params,
            cases,
            EXAMPLES_CASE,
            dtype,
            built["batch"],
            outputs,
            regrouped,
            runtime=runtime,
        ),
        keys=keys_record(seed, FORWARD_KEYS) if model.stochastic else None,
    )
    return outputs, regrouped, record


def float64_side(
    model: Model,
    params: Params,
    cases: dict[str, Case],
    config: PrecisionConfig,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray] | None, dict[str, CaseMagnitude] | None]:
    """(float64 oracle outputs, terms' magnitudes), as the check stage computes them: on
    CPU with x64 (scoped to this call), params and inputs first rounded to the run's
    dtype. No oracle for a float64 run, nor for a stochastic model whose draws float64
    cannot repeat (``seed``: its rows' keys); no magnitudes unless a tolerance scales by
    the terms."""
    import jax
    import jax.numpy as jnp

    from vmapcheck.core.forms import forward_keys
    from vmapcheck.core.jit_cache import cached
    from vmapcheck.core.magnitude import case_magnitudes
    from vmapcheck.core.oracle import float64_outputs

    run_dtype = jnp.dtype(config.dtype)
    # Both skip the invalid cases themselves (by their kind's entry in CASE_KINDS).
    with (
        jax.enable_x64(True),
        jax.default_device(_cpu_device()),
        jax.default_matmul_precision("highest"),
    ):
        oracle = None
        if run_dtype != jnp.float64:  # a stochastic model: its rows' keys (or None)
            oracle = float64_outputs(model, params, cases, run_dtype, key=forward_keys(seed))
        magnitudes = None
        if config.uses_terms:
            # The magnitude programs traced for this model (by params structure and
            # run dtype) are kept for the next call: each is a compile.
            programs: dict[Any, Any] = cached(
                model, "magnitude", (run_dtype.name, _structure(params)), dict
            )
            magnitudes = case_magnitudes(
                model.forward_one,
                params,
                cases,
                run_dtype,
                stochastic=model.stochastic,
                programs=programs,
            )
    return oracle, magnitudes


def _structure(tree: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]:
    """A pytree's structure, and each leaf's shape and dtype: hashable, for a cache key
    (:mod:`vmapcheck.core.jit_cache`)."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(np.shape(v)), str(getattr(v, "dtype", type(v)))) for v in leaves)


def _cpu_device() -> Any:
    """The CPU device the check stage computes the oracle on; the default device when
    this process runs without JAX's CPU backend (``JAX_PLATFORMS`` naming only an
    accelerator): float64 is computed there instead."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return jax.devices()[0]


def judge(
    model: Model,
    precision: PrecisionConfig,
    verdict: VerdictConfig,
    cases: dict[str, Case],
    outputs: dict[str, np.ndarray],
    regrouped: dict[str, np.ndarray],
    record: ForwardRecord,
    oracle: dict[str, np.ndarray] | None,
    magnitudes: dict[str, CaseMagnitude] | None,
    gradients: dict[str, np.ndarray] | None = None,
    bitwise: str = "report",
) -> CheckDetails:
    """The check stage's verdict (:func:`vmapcheck.check.checks.run_checks`).
    ``gradients``: the gradient probe's arrays (judged with ``record["gradients"]``), or
    None: not judged; ``bitwise``: its mode for bitwise batch invariance."""
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
        verdict=verdict,
    )
    # The manifest the check reads: each case's entry without its arrays; no features
    # (the examples are no table's columns).
    manifest: CasesManifest = {"features": [], "cases": {}}
    for name, case in cases.items():
        entry: CaseEntry = {"kind": case["kind"], "shape": case["shape"], "about": case["about"]}
        for key in ("expect", "runs_on", "cast", "keep"):  # an input to refuse
            if key in case:
                entry[key] = case[key]
        manifest["cases"][name] = entry
    return run_checks(
        config,
        manifest,
        outputs,
        record,
        oracle=oracle,
        magnitudes=magnitudes,
        composition=regrouped,
        gradients=gradients,
        bitwise=bitwise,
    )
