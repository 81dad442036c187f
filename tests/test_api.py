"""The Python API (vmapcheck.testing) and its pytest plugin: the pipeline's checks from a
user's own test suite, on models written here in plain JAX (not a shipped example).

Each full check compiles every jit path for three or four batch shapes (~3 s on 2
cores), so a report is computed once per model (module-scoped fixtures) and several
tests read it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vmapcheck
from tests.helpers.registries import edge_kinds, forms_text
from vmapcheck.config import precision_dtype
from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model
from vmapcheck.core.paths import PATHS
from vmapcheck.errors import ArtifactError, ConfigError, InvalidInputError
from vmapcheck.testing import (
    EDGE_KINDS,
    BatchingCheckError,
    assert_batching_consistent,
    check_batching,
    first_diverging_pair,
    precision_config,
    precision_names,
)

pytest_plugins = ("pytester",)

IN, HIDDEN, OUT = 4, 16, 3
ROWS = 8  # even: the split halves share one shape, so each jit path compiles once for them


# --- a small plain-JAX model, and the classic batching mistakes planted in it -----------


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "W1": jax.random.normal(k1, (IN, HIDDEN), jnp.float32) * 0.5,
        "b1": jnp.full((HIDDEN,), 0.1, jnp.float32),
        "W2": jax.random.normal(k2, (HIDDEN, OUT), jnp.float32) * 0.25,
        "b2": jnp.zeros((OUT,), jnp.float32),
    }


def forward_one(params, x):
    """x (IN,) -> class probabilities (OUT,): tanh layer centred over its units, softmax."""
    h = jnp.tanh(x @ params["W1"] + params["b1"])
    h = h - jnp.mean(h)
    return jax.nn.softmax(h @ params["W2"] + params["b2"])


def batched(softmax_axis: int = -1, center_axis: int = -1, shift: int = 0):
    """The same network written for a batch X (n, IN) -> (n, OUT), batch axis 0; the
    arguments plant a mistake: a softmax or a centring over the batch axis (0), or the
    output rows shifted by one (an index off by one)."""

    def forward_batch(params, X):
        h = jnp.tanh(X @ params["W1"] + params["b1"][None, :])
        h = h - jnp.mean(h, axis=center_axis, keepdims=True)
        out = jax.nn.softmax(h @ params["W2"] + params["b2"][None, :], axis=softmax_axis)
        return jnp.roll(out, shift, axis=0) if shift else out

    return forward_batch


MODEL = Model(
    name="tiny_classifier",
    in_features=IN,
    out_features=OUT,
    forward_one=forward_one,
    forward_batch=batched(),
    init=init,
)
PARAMS = init(jax.random.key(0))
# float64 from numpy, as a user has them: cast to the precision's dtype like the cases.
EXAMPLES = np.random.default_rng(0).normal(size=(ROWS, IN))


def planted(**mistake) -> Model:
    return dataclasses.replace(MODEL, forward_batch=batched(**mistake))


@pytest.fixture(scope="module")
def good():
    return assert_batching_consistent(MODEL, PARAMS, EXAMPLES)


# --- a correct model passes, with figures ------------------------------------------------


def test_a_correct_model_passes_and_returns_the_figures(good):
    assert good.passed and good.failures == ()
    # Every registered path ran: the model provides them all.
    assert good.paths == tuple(PATHS) and dict(good.not_run) == {}
    assert good.precision == "f32" and good.dtype == "float32"
    # The tolerance is the shipped file's, as the pipeline reads it.
    assert good.tolerance == precision_config("f32").tolerance.model_dump()
    pair = good.pairs["loop_eager-vs-direct_jit"]
    assert pair.passed and pair.case is not None
    assert 0 <= pair.max_rel < 1e-5 and 0 <= pair.bound_ratio < 1
    # forward_one on one example against row 0 of each batch path on the batch of one.
    assert good.pairs["one_jit-vs-single.vmap_jit"].passed
    assert all(p.passed and p.bound_ratio < 1 for p in good.pairs.values())
    assert good.worst is not None and good.worst_bound_ratio == good.worst.bound_ratio < 1
    # Every path against the float64 oracle, within the cross-run rtol.
    assert set(good.oracle) == set(PATHS)
    assert max(good.oracle.values()) < good.cross_run_tolerance["rtol"]
    # Each batch path against itself on the rows reversed and split in halves.
    batch_paths = {name for name, p in PATHS.items() if p.takes == "batch"}
    assert set(good.composition) == batch_paths
    assert set(good.composition["direct_jit"]) == {"permuted", "split"}
    assert good.composition["direct_jit"]["split"] < 1e-6
    # The flat-vector contract's 7 invalid inputs, each refused by every path.
    assert (good.refused, good.invalid_total) == (7, 7)
    assert good.summary.startswith("verdict: PASSED - ")


def test_the_invalid_inputs_are_refused_by_every_path_naming_the_problem(good):
    negative = good.details["negative"]
    assert set(negative) == {
        "invalid_features",
        "invalid_rank",
        "invalid_dtype",
        "invalid_nan",
        "invalid_inf",
        "invalid_empty",
        "invalid_vector",
    }
    features = negative["invalid_features"]["paths"]
    assert set(features) == {n for n, p in PATHS.items() if p.takes == "batch"}
    for path, result in features.items():
        assert result["refused"] and result["error"] == "InvalidInputError", path
        assert "expected 4 features, got 5" in result["message"], path
    nan = negative["invalid_nan"]["paths"]["direct_jit"]["message"]
    assert "expected finite values, got NaN" in nan and "first at index (1, 0)" in nan
    assert set(negative["invalid_vector"]["paths"]) == {"one_eager", "one_jit"}


def test_the_verdict_lines_are_the_pipelines(good, tmp_path):
    """The summary's case and refusal lines are those `vmapcheck summary` prints for the
    same check details (a drift in either wording fails here)."""
    from vmapcheck.io import atomic_write_json
    from vmapcheck.layout import Layout
    from vmapcheck.report.summary import summarize
    from vmapcheck.tracking.review import tracked_lines

    layout = Layout(tmp_path)
    layout.check_details.parent.mkdir(parents=True)
    # What the check stage adds for `make reference` (no reference here).
    stamped = {**good.details, "config_digest": "", "forward_outputs_sha256": ""}
    atomic_write_json(layout.check_details, stamped)
    pipeline = summarize(layout, tracked_lines(layout)).splitlines()
    ours = good.summary.splitlines()
    assert ours[0].startswith(pipeline[0])
    for name in good.details["cases"]:
        line = next(line for line in pipeline if line.startswith(f"  ok   {name} "))
        assert line in ours
    assert "  ok   invalid inputs   7/7 refused by every path, the problem named" in pipeline
    assert "  ok   invalid inputs   7/7 refused by every path, the problem named" in ours


# --- planted batching mistakes fail, naming the paths ------------------------------------


# One mistake through every path, as a user's test runs it; the other two through the
# paths that tell the forms apart (fewer jit compiles: this file stays fast).
FEW = ["loop_eager", "vmap_jit", "direct_eager", "direct_jit"]


@pytest.mark.parametrize(
    ("mistake", "regrouping", "paths"),
    [
        ({"softmax_axis": 0}, "split", None),  # softmax normalised over the batch
        ({"center_axis": 0}, "split", FEW),  # a mean over the batch axis (batch statistics)
        ({"shift": 1}, "permuted", FEW),  # rows off by one
    ],
    ids=["softmax_over_batch", "mean_over_batch", "rows_off_by_one"],
)
def test_a_planted_batching_mistake_fails_naming_the_paths(mistake, regrouping, paths):
    with pytest.raises(AssertionError) as caught:
        assert_batching_consistent(planted(**mistake), PARAMS, EXAMPLES, paths=paths)
    message = str(caught.value)
    # Every one-device form of PATHS, or the forms of the paths given.
    forms = forms_text() if paths is None else "loop, vmap and direct"
    # A batching fault, and nothing else: the model's other checks hold.
    assert re.match(
        rf"verdict: FAILED \(\d+ batching faults\) - {forms} forwards \(eager and jit\)", message
    )
    assert set(caught.value.report.kinds) == {"batching"}
    assert "  first diverging pair: examples/loop_eager-vs-direct_eager\n" in message
    assert "disagree with loop_eager (the plain per-example loop): direct_eager, direct_jit\n" in (
        message
    )
    assert "  FAIL examples         [8x4] worst pair: bound_ratio=" in message
    assert "  FAIL composition      examples: outputs depend on batch composition in " in (message)
    # The check's own failure lines, the first ten of them.
    failures = [line for line in message.splitlines() if line.startswith("  failure: ")]
    assert len(failures) == 10
    assert failures[0].startswith(
        "  failure: [batching] examples/loop_eager-vs-direct_eager: element ("
    )
    assert "> atol + rtol*S = " in failures[0]
    # Only the hand-batched paths are blamed: the loop and vmap forms agree.
    report = caught.value.report
    assert not report.passed and len(report.failures) >= 10
    if len(report.failures) > 10:  # every pair with a direct path, on two cases
        assert f"and {len(report.findings) - 10} more finding(s)" in message
    assert report.pairs["loop_eager-vs-vmap_jit"].passed
    assert not report.pairs["vmap_jit-vs-direct_jit"].passed
    assert (
        f"examples/direct_jit: outputs depend on batch composition ({regrouping}: element"
        in "\n".join(report.failures)
    )


def test_a_mistake_every_path_shares_is_caught_by_the_float64_oracle():
    """Agreement cannot tell "all right" from "all wrong the same way": a cancellation
    that float32 loses in every path alike is caught against float64."""

    def shifted(params, x):
        # ~1e5, a value at run time (a constant would let XLA fold (x + c) - c to x under
        # jit): float32 keeps x only to ~4e-3 here.
        big = jnp.sum(jnp.abs(params["W1"])) * 1.0e4
        return (x + big) - big

    def forward_one(params, x):
        return shifted(params, x) @ params["W1"][:, :OUT]

    def forward_batch(params, X):
        return shifted(params, X) @ params["W1"][:, :OUT]

    model = dataclasses.replace(MODEL, forward_one=forward_one, forward_batch=forward_batch)
    report = check_batching(model, PARAMS, EXAMPLES, paths=FEW)
    assert not report.passed
    assert all(pair.passed for pair in report.pairs.values())  # they agree with each other
    assert first_diverging_pair(report.details) is None
    # One numerical finding a case, not a batching fault: the paths agree.
    assert report.kinds == {"numerical": 2}
    assert [f.split(":")[0] for f in report.failures] == ["examples", "single"]
    assert all("far from the float64 oracle (the paths agree" in f for f in report.failures)
    assert all(rel > report.cross_run_tolerance["rtol"] for rel in report.oracle.values())
    assert f"  failure: [numerical] examples: all {len(FEW)} paths far from the float64 " in (
        report.summary
    )


# --- a dict-of-leaves (pytree) input -----------------------------------------------------

POSITIONS, EMBED, VOCAB = 5, 4, 7
TOKENS = InputSpec(
    (
        Leaf("feats", (3,), "float", meaning="three measurements"),
        Leaf("ids", (POSITIONS,), "int32", vocab=VOCAB, meaning="token ids"),
    )
)


def tokens_init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "emb": jax.random.normal(k1, (VOCAB, EMBED), jnp.float32),
        "q": jax.random.normal(k2, (EMBED,), jnp.float32),
        "W": jax.random.normal(k3, (3 + EMBED, OUT), jnp.float32) * 0.5,
        "b": jnp.zeros((OUT,), jnp.float32),
    }


def tokens_one(params, x):
    """{"feats": (3,), "ids": (5,)} -> (OUT,): attention pooling over the positions."""
    e = params["emb"][x["ids"]]  # (5, EMBED)
    weights = jax.nn.softmax(e @ params["q"])  # over the positions
    return jnp.concatenate([x["feats"], weights @ e]) @ params["W"] + params["b"]


def tokens_batch(pool_axis: int = -1):
    """Every leaf with batch axis 0; ``pool_axis=0`` plants the attention softmax over
    the batch instead of the positions (a wrong axis that keeps every shape)."""

    def forward_batch(params, X):
        e = params["emb"][X["ids"]]  # (n, 5, EMBED)
        weights = jax.nn.softmax(e @ params["q"], axis=pool_axis)  # (n, 5)
        pooled = jnp.einsum("np,npd->nd", weights, e)
        return jnp.concatenate([X["feats"], pooled], axis=1) @ params["W"] + params["b"][None, :]

    return forward_batch


TOKENS_MODEL = Model(
    name="tokens",
    in_features=TOKENS.size,
    out_features=OUT,
    forward_one=tokens_one,
    forward_batch=tokens_batch(),
    init=tokens_init,
    inputs=TOKENS,
)
TOKENS_PARAMS = tokens_init(jax.random.key(1))
_rng = np.random.default_rng(1)
TOKENS_EXAMPLES = {
    "feats": _rng.normal(size=(6, 3)).astype(np.float32),
    "ids": _rng.integers(0, VOCAB, size=(6, POSITIONS)).astype(np.int32),
}


def test_a_pytree_input_model_passes():
    report = assert_batching_consistent(TOKENS_MODEL, TOKENS_PARAMS, TOKENS_EXAMPLES)
    assert report.passed and report.worst_bound_ratio < 1
    assert report.paths == tuple(PATHS)
    cases = report.details["cases"]
    assert set(cases) == {"examples", "single", "single_vector"}
    assert cases["examples"]["shape"] == {"feats": [6, 3], "ids": [6, POSITIONS]}
    assert "  inputs: feats (3,) float (three measurements); ids (5,) int32 ids 0..6" in (
        report.summary
    )
    # The dict contract's invalid inputs: per leaf, and per dict.
    negative = report.details["negative"]
    assert report.refused == report.invalid_total == len(negative) >= 12
    message = negative["invalid_ids_range"]["paths"]["direct_jit"]["message"]
    assert "leaf 'ids'" in message and "expected ids in [0, 7)" in message
    message = negative["invalid_missing_leaf"]["paths"]["vmap_eager"]["message"]
    assert "leaf 'ids' is missing" in message


def test_a_pytree_model_passes_at_float64_every_wrong_dtype_refused_by_its_leaf():
    """At f64 the valid float leaves of a wrong-dtype case are float64 too, so the leaf
    under test is the one refused (the pipeline's stored case keeps them float32)."""
    report = assert_batching_consistent(
        TOKENS_MODEL,
        TOKENS_PARAMS,
        TOKENS_EXAMPLES,
        precision="f64",
        paths=["loop_eager", "vmap_eager"],
    )
    assert report.dtype == "float64" and report.oracle == {}
    negative = report.details["negative"]
    message = negative["invalid_ids_dtype"]["paths"]["loop_eager"]["message"]
    assert message == "leaf 'ids': expected dtype int32, got float32"
    message = negative["invalid_feats_dtype"]["paths"]["loop_eager"]["message"]
    assert message == "leaf 'feats': expected dtype float64, got int32"


def test_a_pytree_model_pooling_over_the_batch_axis_fails():
    model = dataclasses.replace(TOKENS_MODEL, forward_batch=tokens_batch(pool_axis=0))
    with pytest.raises(AssertionError) as caught:
        assert_batching_consistent(model, TOKENS_PARAMS, TOKENS_EXAMPLES, paths=FEW)
    message = str(caught.value)
    assert "  first diverging pair: examples/loop_eager-vs-direct_eager\n" in message
    assert "  FAIL examples         [feats 6x3, ids 6x5] worst pair: " in message
    assert "outputs depend on batch composition in direct_eager, direct_jit" in message


def test_the_edge_cases_run_when_asked():
    """The regression set's edge batches, built from the examples (zeros, their min and
    max, +/-1.8e19, subnormals), as prepare builds them from its table."""
    report = assert_batching_consistent(
        MODEL, PARAMS, EXAMPLES, paths=["loop_eager", "vmap_jit"], edge_cases=True
    )
    cases = report.details["cases"]
    # The examples as given, and a case of every edge kind of CASE_KINDS (the regression
    # set's, built as prepare builds them).
    assert {"examples", "single", "zeros", "boundary", "large_magnitude"} <= set(cases)
    assert {case["kind"] for case in cases.values()} == {"batch"} | edge_kinds()
    assert cases["boundary"]["shape"] == [2, IN] and cases["denormal"]["kind"] == "denormal"
    assert all(case["passed"] for case in cases.values())


def _reversed_sum_model() -> Model:
    """A linear model whose batch path sums the same terms in the reverse order: the same
    maths, other roundings, so that the paths differ by float32's rounding everywhere:
    about 1e-7 on the examples, about 1e12 on the large_magnitude case (+/-1.8e19)."""

    def init_linear(key: jax.Array) -> dict[str, jax.Array]:
        return {"W": jax.random.normal(key, (IN, OUT), jnp.float32)}

    return Model(
        name="reversed_sum",
        in_features=IN,
        out_features=OUT,
        forward_one=lambda params, x: x @ params["W"],
        forward_batch=lambda params, X: X[:, ::-1] @ params["W"][::-1],
        init=init_linear,
    )


def test_the_examples_figures_are_the_examples_own_and_the_edge_cases_apart():
    """Issue 35 (5): ``report.pairs`` and ``report.worst`` showed max_abs=2.2e12 with
    case 'examples': that figure was the large_magnitude case's. The examples' figures
    are reported apart from the edge cases', each figure naming its case."""
    model = _reversed_sum_model()
    params = model.init(jax.random.key(0))
    report = assert_batching_consistent(
        model, params, EXAMPLES, paths=["loop_eager", "direct_jit"], edge_cases=True
    )
    large = report.details["cases"]["large_magnitude"]["pairs"]["loop_eager-vs-direct_jit"]
    assert large["max_abs"] > 1e9  # huge in absolute terms, within its bound
    own = report.details["cases"]["examples"]["pairs"]["loop_eager-vs-direct_jit"]
    pair = report.pairs["loop_eager-vs-direct_jit"]
    # The examples' own figure, named as the examples'.
    assert pair.max_abs == own["max_abs"] < 1e-5 and pair.max_abs_case == "examples"
    assert pair.max_rel_case in ("examples", "single") and pair.case in ("examples", "single")
    # The edge cases' figures apart, each named by its case.
    edge = report.edge_pairs["loop_eager-vs-direct_jit"]
    assert edge.max_abs == large["max_abs"] and edge.max_abs_case == "large_magnitude"
    kinds = {name: case["kind"] for name, case in report.details["cases"].items()}
    assert kinds[edge.case] in EDGE_KINDS and kinds[edge.max_rel_case] in EDGE_KINDS
    # The worst pair over both groups says where its figures come from.
    worst = report.worst
    assert worst is not None and worst.bound_ratio == report.worst_bound_ratio
    assert f"max_abs={worst.max_abs:.3g} ({worst.max_abs_case})" in str(worst)
    assert str(pair).startswith(f"bound_ratio={pair.bound_ratio:.3g} ({pair.case}) ")
    # The summary: the examples' lines, then the edge cases under their own heading.
    lines = report.summary.splitlines()
    heading = lines.index("  edge cases (edge_cases=True), built from the examples:")
    assert any(line.startswith("  ok   examples ") for line in lines[:heading])
    assert any(line.startswith("  ok   large_magnitude ") for line in lines[heading:])
    assert "e+12" not in "\n".join(lines[:heading])  # no 1e12 among the examples' lines
    assert set(report.oracle) == set(report.edge_oracle) == {"loop_eager", "direct_jit"}


# --- invalid input: vmapcheck validates what the model would silently take ---------------


def test_a_model_that_silently_accepts_bad_input_is_still_refused_and_non_finite_is_found():
    def forward_one(params, x):
        return jnp.log(x[:IN] @ params["W1"][:, :OUT])  # log of negatives: NaN

    def forward_batch(params, X):
        return jnp.log(X[:, :IN] @ params["W1"][:, :OUT])  # reads only the first IN columns

    model = dataclasses.replace(MODEL, forward_one=forward_one, forward_batch=forward_batch)
    wider = np.ones((4, IN + 1), np.float32)
    # Called directly, the model takes one feature too many without a word.
    assert model.forward_batch(PARAMS, wider).shape == (4, OUT)
    paths = ["loop_eager", "direct_eager", "direct_jit", "one_eager"]
    with pytest.raises(AssertionError) as caught:
        assert_batching_consistent(model, PARAMS, EXAMPLES, paths=paths)
    report = caught.value.report
    # Run through vmapcheck's paths, it is refused, the problem named...
    assert (report.refused, report.invalid_total) == (7, 7)
    refused = report.details["negative"]["invalid_features"]["paths"]["direct_jit"]
    assert refused["refused"] and "expected 4 features, got 5" in refused["message"]
    # ... and the NaN it computes on valid examples is found on every path run.
    # On every path alike, row by row: a model fault, named once, with its rows.
    assert "on every path: the model computes it, not the batching" in str(caught.value)
    # examples, single, single_vector; and the loss and gradients the NaN reaches.
    assert set(report.kinds) == {"model"}
    assert report.failures[0].startswith("examples: non-finite output on row")
    assert "direct_eager-vs-direct_jit" in str(report.pairs)
    assert report.not_run["vmap_jit"].startswith("not run: left out by paths=")


# --- bad arguments: clear errors ---------------------------------------------------------


def test_bad_arguments_are_named():
    with pytest.raises(ConfigError, match=r"model: expected a vmapcheck.core.models.Model .* dict"):
        assert_batching_consistent({"forward_one": forward_one}, PARAMS, EXAMPLES)
    with pytest.raises(
        ConfigError, match=rf"precision='f16': expected one of {', '.join(precision_names())}"
    ):
        assert_batching_consistent(MODEL, PARAMS, EXAMPLES, precision="f16")
    with pytest.raises(ConfigError, match=r"precision\.tolerance\.rtol: .*greater than or equal"):
        assert_batching_consistent(MODEL, PARAMS, EXAMPLES, rtol=-1.0)
    with pytest.raises(
        ConfigError, match=r"unknown forward path 'vmap'; expected names .*vmap_jit"
    ):
        assert_batching_consistent(MODEL, PARAMS, EXAMPLES, paths=["vmap"])
    # One path compares nothing: refused before any work, a bare string taken as one name.
    for one in (["vmap_jit"], "vmap_jit", ("vmap_jit", "vmap_jit")):
        with pytest.raises(ConfigError, match=r"paths: expected at least 2 forward paths"):
            check_batching(MODEL, PARAMS, EXAMPLES, paths=one)
    no_direct = dataclasses.replace(MODEL, forward_batch=None)
    with pytest.raises(ConfigError, match=r"direct_jit cannot run: .*no hand-batched forward"):
        assert_batching_consistent(no_direct, PARAMS, EXAMPLES, paths=["direct_jit"])
    # Examples against the input contract: the problem named, expected and found.
    with pytest.raises(InvalidInputError, match=r"^examples: expected 4 features, got 5$"):
        assert_batching_consistent(MODEL, PARAMS, np.ones((3, IN + 1)))
    with pytest.raises(InvalidInputError, match=r"examples: expected dtype float32, got int64"):
        assert_batching_consistent(MODEL, PARAMS, np.ones((3, IN), np.int64))
    with pytest.raises(InvalidInputError, match=r"examples: .*got a list, not an array"):
        assert_batching_consistent(MODEL, PARAMS, EXAMPLES.tolist())
    with pytest.raises(InvalidInputError, match=r"examples: leaf 'ids' is missing"):
        assert_batching_consistent(TOKENS_MODEL, TOKENS_PARAMS, {"feats": TOKENS_EXAMPLES["feats"]})
    ids_as_float = {**TOKENS_EXAMPLES, "ids": TOKENS_EXAMPLES["ids"].astype(np.float32)}
    with pytest.raises(InvalidInputError, match=r"leaf 'ids': expected dtype int32, got float"):
        assert_batching_consistent(TOKENS_MODEL, TOKENS_PARAMS, ids_as_float)
    # Params against the model's own: the leaf named.
    wrong = {**PARAMS, "W1": jnp.ones((IN + 1, HIDDEN), jnp.float32)}
    with pytest.raises(ArtifactError, match=r"leaf W1: expected shape \[4, 16\]"):
        assert_batching_consistent(MODEL, wrong, EXAMPLES)
    with pytest.raises(ArtifactError, match=r"leaf b2: expected finite values, found NaN"):
        assert_batching_consistent(MODEL, {**PARAMS, "b2": jnp.full((OUT,), jnp.nan)}, EXAMPLES)


def test_the_precision_options_are_the_packaged_files():
    # The conf folder is the one list: every file an option, named as its file, with the
    # dtype the registry's target shows (vmapcheck.config.precision_dtype).
    folder = Path(vmapcheck.__file__).parent / "conf" / "precision"
    assert precision_names() == tuple(sorted(p.stem for p in folder.glob("*.yaml")))
    for name in precision_names():
        assert precision_config(name).name == name
        assert precision_config(name).dtype == precision_dtype(name)
    assert precision_config("bf16").dtype == "bfloat16"
    overridden = precision_config("f32", rtol=2e-5)
    assert overridden.tolerance.rtol == 2e-5
    assert overridden.tolerance.atol == precision_config("f32").tolerance.atol


def test_the_api_is_exported_lazily():
    assert vmapcheck.assert_batching_consistent is assert_batching_consistent
    assert issubclass(BatchingCheckError, AssertionError)


# --- the pytest plugin -------------------------------------------------------------------

_USER_TESTS = """
import jax, jax.numpy as jnp, numpy as np
from vmapcheck.core.models import Model

def init(key):
    return {"W": jax.random.normal(key, (3, 2), jnp.float32), "b": jnp.zeros((2,), jnp.float32)}

def one(params, x):
    return jnp.tanh(x @ params["W"] + params["b"])

def batch(params, X):
    return jnp.tanh(X @ params["W"] + params["b"][None, :])

def batch_mean_over_rows(params, X):
    h = X @ params["W"] + params["b"][None, :]
    return jnp.tanh(h - jnp.mean(h, axis=0, keepdims=True))

X = np.random.default_rng(0).normal(size=(4, 3))

def model(forward_batch):
    return Model(name="user", in_features=3, out_features=2, forward_one=one,
                 forward_batch=forward_batch, init=init)

def test_passes_at_the_command_line_precision(batching_check, vmapcheck_precision):
    report = batching_check(model(batch), init(jax.random.key(0)), X,
                            paths=["loop_eager", "vmap_jit", "direct_jit"])
    assert report.precision == vmapcheck_precision == "f64"
    assert report.dtype == "float64" and report.oracle == {}

def test_planted_mistake(batching_check):
    batching_check(model(batch_mean_over_rows), init(jax.random.key(0)), X,
                   paths=["loop_eager", "direct_eager"])
"""


def _run_plugin(pytester: pytest.Pytester, *args: str):
    # -p no:vmapcheck: the entry point (once registered) must not load the plugin a
    # second time under another name.
    return pytester.runpytest(
        "-p", "no:vmapcheck", "-p", "vmapcheck.pytest_plugin", "-p", "no:cacheprovider", *args
    )


def test_the_fixture_runs_the_check_at_the_command_line_precision(pytester: pytest.Pytester):
    pytester.makepyfile(test_user=_USER_TESTS)
    result = _run_plugin(pytester, "--vmapcheck-precision=f64")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "vmapcheck: batching_check precision f64",
            "*verdict: FAILED (* batching faults) - loop and direct forwards (eager) on cpu "
            "(cpu), float64, rtol=1e-12 atol=1e-14*",
            "*first diverging pair: examples/loop_eager-vs-direct_eager",
            "*disagree with loop_eager (the plain per-example loop): direct_eager",
            # fnmatch reads [...] as a class: [[] is a literal "[".
            "*failure: [[]batching] examples/loop_eager-vs-direct_eager: element *",
        ]
    )


def test_an_unknown_command_line_precision_stops_the_session(pytester: pytest.Pytester):
    pytester.makepyfile(test_user="def test_nothing(batching_check):\n    pass\n")
    result = _run_plugin(pytester, "--vmapcheck-precision=f16")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--vmapcheck-precision=f16: precision='f16': expected one of*"])


# A user's test that reports how many of its programs JAX's persistent cache served
# (JAX's own monitoring events) and where the cache is.
_CACHED_TEST = """
import jax, jax.numpy as jnp, numpy as np
from jax._src import monitoring
from vmapcheck.core.models import Model

HITS = []
monitoring.register_event_listener(
    lambda event, **kw: HITS.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)

def init(key):
    return {"W": jax.random.normal(key, (3, 2), jnp.float32)}

def one(params, x):
    return jnp.tanh(x @ params["W"])

def test_check(batching_check):
    model = Model(name="user", in_features=3, out_features=2, forward_one=one, init=init)
    batching_check(model, init(jax.random.key(0)), np.ones((4, 3), np.float32),
                   paths=["loop_eager", "vmap_jit"], bitwise="off")
    print("cache dir", jax.config.jax_compilation_cache_dir, "hits", len(HITS))
"""


def test_the_compile_cache_option_serves_a_later_session_from_pytests_cache_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """--vmapcheck-compile-cache keeps the session's programs under .pytest_cache, and the
    next session loads them from there (fresh processes: JAX's cache is per process)."""
    pytester.makepyfile(test_user=_CACHED_TEST)
    args = (
        "-p",
        "no:vmapcheck",
        "-p",
        "vmapcheck.pytest_plugin",
        "-s",
        "--vmapcheck-compile-cache",
    )
    # Neither the user's folder nor the one this suite shares with its pipelines.
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("VMAPCHECK_COMPILE_CACHE", raising=False)
    folder = pytester.path / ".pytest_cache" / "d" / "vmapcheck-jax" / "main"
    first = pytester.runpytest_subprocess(*args)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(
        [f"vmapcheck: JAX compile cache {folder}", f"*cache dir {folder} hits *"]
    )
    assert any(folder.glob("*-cache")), "the first session kept no program"
    second = pytester.runpytest_subprocess(*args)
    second.assert_outcomes(passed=1)

    def hits(result: pytest.RunResult) -> int:
        # A session reuses a few programs of its own; the next one, those of the first.
        return int(result.stdout.str().split(" hits ")[1].split()[0])

    assert hits(second) > hits(first), (first.stdout.str(), second.stdout.str())
    # Without pytest's cache folder there is nowhere to keep them: said before any test.
    refused = pytester.runpytest(*args, "-p", "no:cacheprovider")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        ["*--vmapcheck-compile-cache (vmapcheck_compile_cache): expected*"]
    )


def test_the_plugin_imports_no_jax():
    import subprocess
    import sys

    code = "import sys, vmapcheck.pytest_plugin; print('jax' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "False"


def test_the_api_records_the_runtime_as_the_forward_stage_does(good):
    """One run core: the API's forward record is built like the pipeline's
    (vmapcheck.core.record.forward_record, vmapcheck.core.runtime.runtime_info)."""
    from vmapcheck.core.runtime import RuntimeInfo

    runtime = good.details["runtime"]
    assert set(runtime) == {f.name for f in dataclasses.fields(RuntimeInfo)}
    assert runtime["backend"] == "cpu" and runtime["device_count"] >= 1


def test_an_oracle_whose_output_is_not_float64_judges_nothing_and_says_so():
    """A wrapper that computes in float32 whatever x64 says (Keras 3 on JAX) gives the
    oracle float32 again: no 'vs float64' figure, which would be float32 against float32."""

    def forward_one(params, x):
        return x.astype(jnp.float32) @ params["W1"][:, :OUT].astype(jnp.float32)

    model = dataclasses.replace(MODEL, forward_one=forward_one, forward_batch=None)
    report = check_batching(model, PARAMS, EXAMPLES, paths=["loop_eager", "vmap_jit"])
    assert report.passed, report.summary
    assert report.oracle == {}
    case = report.details["cases"]["examples"]
    assert "oracle" not in case
    assert case["oracle_not_judged"].startswith(
        "not judged: the model's output under x64 is float32"
    )
    assert "vs float64: not judged (the output under x64 is not float64)" in report.summary
    assert "vs float64: max_rel" not in report.summary


# --- issue 45: bounded before work, one line for the model's own faults ------------------


def test_more_rows_than_max_rows_are_refused_before_any_work_with_the_figures():
    many = np.zeros((20_000, IN), np.float32)
    with pytest.raises(
        InvalidInputError, match=r"expected at most max_rows=10,000 rows, found 20,000"
    ) as refused:
        check_batching(MODEL, PARAMS, many)
    assert refused.value.reason == "batch_too_large"
    assert "max_rows=20000 to run them all" in str(refused.value)
    with pytest.raises(InvalidInputError, match=r"max_rows=5 rows, found 8"):
        check_batching(MODEL, PARAMS, EXAMPLES[:8], max_rows=5)
    with pytest.raises(ConfigError, match=r"max_rows: expected an int >= 1"):
        check_batching(MODEL, PARAMS, EXAMPLES, max_rows=0)
    # A seed past 32 bits would make a smaller seed's keys (jax.random.key wraps it).
    with pytest.raises(ConfigError, match=r"seed: expected an int >= 0 and <= 4294967295"):
        check_batching(MODEL, PARAMS, EXAMPLES, seed=2**32)


def _raising_init(key):
    raise ValueError("this init is broken")


def test_an_init_that_raises_is_one_line_naming_the_model_and_where():
    from vmapcheck.errors import ModelCodeError

    broken = dataclasses.replace(MODEL, name="broken", init=_raising_init)
    with pytest.raises(ModelCodeError) as refused:
        check_batching(broken, PARAMS, EXAMPLES)
    message = str(refused.value)
    assert message.startswith("model 'broken': its code raised ValueError: this init is broken")
    assert "test_api.py" in message and "in _raising_init" in message
    assert isinstance(refused.value.__cause__, ValueError)  # the original, chained


def _callback_one(params, x):
    return jax.pure_callback(
        lambda a: np.asarray(a)[:OUT], jax.ShapeDtypeStruct((OUT,), x.dtype), x
    )


def test_a_pure_callback_without_vmap_method_is_named_with_its_fix():
    model = dataclasses.replace(MODEL, name="cb", forward_one=_callback_one, forward_batch=None)
    report = check_batching(model, PARAMS, EXAMPLES[:4], gradients=False)
    assert not report.passed
    vmap = [f for f in report.failures if f.startswith("examples/vmap_jit")]
    assert vmap and "model 'cb': its forward calls jax.pure_callback without vmap_method" in vmap[0]
    assert "pass vmap_method='sequential'" in vmap[0]
