"""The Python API checks gradients as the pipeline does (issue 42, item 4).

A model whose forward is finite but whose gradient is NaN (the untaken branch of a
``jnp.where``: tests/helpers/untaken_branch.py) used to
PASS ``check_batching``: the API checked no gradients. It now FAILS with the pipeline's
failure lines (``vmapcheck.check.probes.judge_gradients``), naming the leaf; the published fix
(the double where) passes; ``gradients=False`` leaves the check out and says so; the
loss's targets are validated by name.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.untaken_branch import make_model
from vmapcheck.errors import ConfigError, InvalidInputError
from vmapcheck.testing import BatchingCheckError, assert_batching_consistent, check_batching
from vmapcheck.testing.report import GRADIENTS_NOT_CHECKED

# Rows with negative values: some hidden pre-activations are negative, where the bug's
# untaken branch is NaN. Two paths keep each check to a few compiles (the gradient check
# does not depend on them).
EXAMPLES = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
PATHS = ["loop_eager", "vmap_jit"]


def _check(form: str, **options):
    model = make_model(form=form)
    return check_batching(model, model.init(jax.random.key(0)), EXAMPLES, paths=PATHS, **options)


def test_a_nan_from_the_untaken_branch_fails_in_the_gradients_naming_the_leaf():
    form = "where"
    report = _check(form)
    assert not report.passed
    # The forward is finite and every path agrees: only the gradient check fails.
    assert all(pair.passed for pair in report.pairs.values())
    assert all(f.startswith("gradients/") for f in report.failures), report.failures
    assert report.failures[0] == (
        "gradients/examples: the gradients are not finite on real data "
        "(leaves: layers[0].W, layers[0].b)"
    )
    # A model fault, not a batching one: the per-example mean and the batch gradient
    # hold the same NaN at the same elements (both computed it), so that comparison
    # agrees; the non-finite gradients are the finding.
    assert {f.kind for f in report.findings} == {"model"}
    assert not any("mean of per-example" in f for f in report.failures)
    grads = report.gradients
    assert grads.checked and not grads.passed
    assert grads.loss_finite and not grads.grads_finite and not grads.per_example_finite
    assert grads.nonfinite_leaves == ("layers[0].W", "layers[0].b")
    # The output layer's gradient does not pass through the sqrt: finite, and judged.
    assert grads.leaves["layers[1].W"]["passed"]
    assert grads.leaves["layers[0].W"]["bound_ratio"] is None
    line = next(x for x in report.summary.splitlines() if "gradients   " in x)
    assert line.startswith("  FAIL gradients        mean per-example vs batch gradient")
    assert "gradients not finite (leaves: layers[0].W, layers[0].b)" in line
    assert "  failure: [model] gradients/examples: the gradients are not finite" in report.summary
    with pytest.raises(BatchingCheckError, match="gradients/examples: the gradients"):
        model = make_model(form=form)
        assert_batching_consistent(model, model.init(jax.random.key(0)), EXAMPLES, paths=PATHS)


@pytest.mark.parametrize("form", ["where_fixed", "cond"])
def test_the_double_where_fix_passes_with_its_figures(form):
    """The fix passes; so does the activation written with lax.cond under vmap, whose
    batching rule masks each branch's operand in JAX 0.11.2 (no false alarm)."""
    report = _check(form)
    assert report.passed, report.summary
    grads = report.gradients
    assert grads.checked and grads.passed and grads.loss_finite and grads.grads_finite
    assert grads.nonfinite_leaves == ()
    assert set(grads.leaves) == {"layers[0].W", "layers[0].b", "layers[1].W", "layers[1].b"}
    assert grads.worst_leaf in grads.leaves
    assert grads.bound_ratio is not None and grads.bound_ratio <= 1
    assert grads.loss is not None and np.isfinite(grads.loss)
    assert any(
        line.startswith("  ok   gradients        mean per-example vs batch gradient")
        and line.endswith("NaN target detected")
        for line in report.summary.splitlines()
    ), report.summary


def test_gradients_false_leaves_them_out_and_says_so():
    report = _check("where", gradients=False)
    assert report.passed, report.summary  # the forward itself is right
    assert not report.gradients.checked
    assert GRADIENTS_NOT_CHECKED in report.summary.splitlines()
    assert "gradients: not checked (gradients=False)" in report.summary
    assert report.details["gradients"]["status"] == "not run"


def test_the_targets_enter_the_loss():
    """The loss is the pipeline's: mean squared error of forward_one against the
    targets, over the examples."""
    model = make_model(form="where_fixed")
    params = model.init(jax.random.key(0))
    targets = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float64)
    report = _check("where_fixed", targets=targets)
    predictions = np.asarray(jax.vmap(model.forward_one, in_axes=(None, 0))(params, EXAMPLES))
    expected = float(np.mean((predictions - targets.astype(np.float32)) ** 2))
    assert report.gradients.loss == pytest.approx(expected, rel=1e-5)
    zeros = _check("where_fixed")
    assert zeros.gradients.loss == pytest.approx(float(np.mean(predictions**2)), rel=1e-5)


@pytest.mark.parametrize(
    "targets,expected",
    [
        (np.zeros((8, 2), np.float32), r"targets: expected shape \(8, 3\) .* got \(8, 2\)"),
        (np.zeros((3,), np.float32), r"targets: expected shape \(8, 3\) .* got \(3,\)"),
        (np.zeros((8, 3), np.int32), r"targets: expected a float dtype .* got int32"),
        (
            np.where(np.arange(24).reshape(8, 3) == 7, np.nan, 0.0),
            r"targets: expected finite values, got nan at row 2, column 1",
        ),
        ([[0.0] * 3] * 8, r"targets: expected an array \(8, 3\) .* got list"),
    ],
    ids=["width", "rank", "dtype", "nan", "list"],
)
def test_bad_targets_are_refused_by_name(targets, expected):
    with pytest.raises(InvalidInputError, match=expected):
        _check("where_fixed", targets=targets)


def test_gradients_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"gradients: expected True or False, got 'no'"):
        _check("where_fixed", gradients="no")


def test_the_state_leaves_are_held_fixed_as_in_training():
    """A declared state leaf (an int counter, docs/state-leaves.md) gets no gradient:
    the check runs on the trainable leaves only, as train and the forward stage do."""
    from dataclasses import replace

    model = make_model(form="where_fixed")
    model = replace(model, state_leaves=("count",))
    params = {**model.init(jax.random.key(0)), "count": jnp.zeros((), jnp.int32)}
    base = model.forward_one

    def counted(p, x):
        return base({"layers": p["layers"]}, x)

    model = replace(model, forward_one=counted, forward_batch=counted, init=lambda key: params)
    report = check_batching(model, params, EXAMPLES, paths=PATHS)
    assert report.passed, report.summary
    assert "count" not in report.gradients.leaves


@pytest.mark.stages
def test_the_pipeline_fails_the_same_model_on_the_same_lines(tmp_path):
    """train.steps=0 (the initial params, as train's refusal suggests): forward's probe
    and check's rule find what the API finds, in the same words, the case named
    ``standard`` where the API's is ``examples``."""
    from tests.helpers.inprocess import judge_planted
    from vmapcheck.io import read_json

    layout = judge_planted(
        tmp_path / "p",
        "model.name=sqrt_where",
        "model.in_features=4",
        "model.hidden=[16]",
        "model.out_features=3",
        "data.n_rows=120",
        "+model.factory._target_=tests.helpers.untaken_branch.make_model",
        "+model.factory.form=where",
        "+model.factory.in_features=${model.in_features}",
        "+model.factory.hidden=${model.hidden}",
        "+model.factory.out_features=${model.out_features}",
    )
    check = read_json(layout.check_details)
    pipeline = [f for f in check["failures"] if f.startswith("gradients/")]
    api = [f.replace("/examples:", "/standard:") for f in _check("where").failures]
    assert pipeline == api, (pipeline, api)
    assert not check["passed"] and check["gradients"]["nonfinite_leaves"] == [
        "layers[0].W",
        "layers[0].b",
    ]


def test_a_model_jax_cannot_differentiate_is_a_model_finding_not_a_traceback():
    """``.at[].apply`` has no JVP rule: the loss cannot be differentiated. The check says
    so as one model finding, and still judges the forward paths."""

    def forward_one(params, x):
        hidden = jnp.tanh(x @ params["layers"][0]["W"] + params["layers"][0]["b"])
        hidden = hidden.at[0].apply(lambda v: v - 1.0)
        return hidden @ params["layers"][1]["W"] + params["layers"][1]["b"]

    base = make_model(form="where_fixed")
    model = dataclasses.replace(base, forward_one=forward_one, forward_batch=None)
    params = model.init(jax.random.key(0))
    report = check_batching(model, params, EXAMPLES, paths=PATHS)
    assert [(f.kind, f.line.split(":")[0]) for f in report.findings] == [
        ("model", "gradients/examples")
    ]
    assert "the loss cannot be differentiated: NotImplementedError" in report.failures[0]
    assert all(pair.passed for pair in report.pairs.values())
    assert check_batching(model, params, EXAMPLES, paths=PATHS, gradients=False).passed
