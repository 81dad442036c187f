"""The magnitude forward (vmapcheck.core.magnitude) and the terms rule it feeds.

The terms' magnitude ``S`` of an output element is what float rounding is relative to
when paths sum the same terms in different orders: the issue's resized MLP
(in_features=3, out_features=1) failed the output rule on plain float32 rounding where
its outputs cancelled; the terms rule passes it, and a real fault still fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from vmapcheck.core.compare import compare
from vmapcheck.core.magnitude import (
    CONTENTION,
    HANDLED,
    case_magnitudes,
    rows_magnitude,
    terms_magnitude,
)
from vmapcheck.core.models import build_model
from vmapcheck.core.oracle import float64_outputs
from vmapcheck.core.paths import build


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _f64(tree):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), tree)


def test_a_dot_product_has_the_sum_of_its_terms_magnitudes(x64):
    w = np.array([1.5, -2.0, 3.0, -0.25])
    x = np.array([0.5, 0.25, -1.0, 8.0])
    scale, fallbacks = terms_magnitude(lambda p, v: v @ p, w, x)
    assert float(scale) == pytest.approx(np.sum(np.abs(w * x)), rel=1e-15)
    assert abs(float(w @ x)) < float(scale)  # the result cancelled: -3.25 of 7.25
    assert fallbacks == []


def test_the_mlp_magnitude_is_relu_bias_and_matmul_on_absolute_values(x64):
    model = build_model(compose_config().model)
    params = model.init(jax.random.key(0))
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, model.in_features)), np.float32)
    scale, fallbacks = rows_magnitude(model.forward_one, params, x)
    assert fallbacks == [] and scale.shape == (5, model.out_features)
    # By hand: the last layer's sum, |h| @ |W| + |b|, on the values h it sums (a matmul
    # does not carry the terms behind its operands). Within a layer, relu passes its
    # input's terms on for a unit in contention (live, or dead by less than CONTENTION of
    # its terms), else 0.
    v, s = x.astype(np.float64), np.abs(x.astype(np.float64))
    layers = params["layers"]
    for i, layer in enumerate(layers):
        w, b = np.asarray(layer["W"], np.float64), np.asarray(layer["b"], np.float64)
        v, s = v @ w + b, np.abs(v) @ np.abs(w) + np.abs(b)
        if i < len(layers) - 1:
            live = (v > 0) | (np.abs(v) <= CONTENTION * s)
            assert not live.all()  # some units are clearly dead: they add nothing
            s, v = np.where(live, s, 0.0), np.maximum(v, 0.0)
    np.testing.assert_allclose(scale, s, rtol=1e-12)
    y = np.asarray(jax.vmap(model.forward_one, in_axes=(None, 0))(_f64(params), _f64(x)))
    assert np.all(scale >= np.abs(y))
    # The hand-batched forward (batch axis 0) is made of the same terms.
    batched, _ = terms_magnitude(model.forward_batch, params, x)
    np.testing.assert_allclose(batched, scale, rtol=1e-12)


def test_elementwise_rules_cover_the_value_and_calls_are_interpreted(x64):
    def f(p, x):
        soft = jax.nn.softmax(x * p)
        branch = jax.lax.cond(x[0] > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        return jnp.tanh(x) + soft + branch + jnp.clip(x, -1.0, 1.0) + jnp.exp(x) / 3.0

    x = np.array([0.5, -2.0, 3.0])
    scale, fallbacks = terms_magnitude(f, 2.0, x)
    y = np.asarray(f(2.0, jnp.asarray(x)))
    assert fallbacks == [] and np.all(np.isfinite(scale)) and np.all(scale >= np.abs(y))
    for name in ("jit", "custom_jvp_call", "cond", "dot_general", "max", "div", "exp"):
        assert name in HANDLED


def test_an_unknown_primitive_falls_back_to_its_value_and_is_recorded(x64):
    def f(p, x):
        carried = jax.lax.scan(lambda c, v: (c + v, c * v), 0.0, x)[1]
        return jnp.sort(x) * p + carried

    x = np.array([3.0, -1.0, 2.0])
    scale, fallbacks = terms_magnitude(f, 2.0, x)
    assert fallbacks == ["scan", "sort"]
    assert np.all(scale >= np.abs(np.asarray(f(2.0, jnp.asarray(x)))))


def test_a_division_by_zero_claims_no_bound(x64):
    scale, _ = terms_magnitude(lambda p, x: p / (x - x), 1.0, np.array([1.0, 2.0]))
    assert np.all(~np.isfinite(scale))  # the comparison never takes it as a scale


def test_it_needs_float64():
    with pytest.raises(RuntimeError, match="jax_enable_x64"):
        terms_magnitude(lambda p, x: x * p, 1.0, np.ones(2))


def test_case_magnitudes_round_inputs_to_the_run_dtype_as_the_oracle_does(x64):
    model = build_model(compose_config().model)
    params = model.init(jax.random.key(0))
    x = np.asarray(jax.random.normal(jax.random.key(2), (3, model.in_features)), np.float32)
    cases = {
        "standard": {"kind": "batch", "x": x},
        "single_vector": {"kind": "vector", "x": x[0]},
        "invalid_nan": {"kind": "invalid", "x": x},
    }
    found = case_magnitudes(model.forward_one, params, cases, jnp.bfloat16)
    assert set(found) == {"standard", "single_vector"}  # valid cases only
    rounded = jax.tree_util.tree_map(lambda a: np.asarray(a).astype(jnp.bfloat16), params)
    want, _ = rows_magnitude(model.forward_one, rounded, x.astype(jnp.bfloat16))
    np.testing.assert_array_equal(found["standard"]["scale"], want)
    np.testing.assert_array_equal(found["single_vector"]["scale"], want[0])
    oracle = float64_outputs(model, params, cases, jnp.bfloat16)
    assert np.all(found["standard"]["scale"] >= np.abs(oracle["standard"]))


def test_a_model_the_magnitude_forward_cannot_run_is_reported_not_fatal(x64):
    def forward_one(params, x):
        if x.dtype == jnp.float64:
            raise TypeError("this model runs in float32 only")
        return x * params

    cases = {"standard": {"kind": "batch", "x": np.ones((2, 3), np.float32)}}
    found = case_magnitudes(forward_one, np.float32(2.0), cases, np.float32)
    assert found == {
        "standard": {
            "scale": None,
            "fallbacks": [],
            "error": "TypeError: this model runs in float32 only",
        }
    }


def _cancelling_rows(model, params, n_pairs: int, stretch: float, target: float) -> np.ndarray:
    """Rows whose float64 output is ``target``, a value small beside its terms: between
    consecutive random rows on either side of ``target / stretch``, bisected in float64,
    then stretched (the MLP's biases are zero at init, so it is positively homogeneous:
    the output scales with the row, to ``target``, and so do its terms)."""
    with jax.enable_x64(True):
        forward = jax.jit(jax.vmap(model.forward_one, in_axes=(None, 0)))
        p64 = _f64(params)
        x = np.asarray(jax.random.normal(jax.random.key(3), (2 * n_pairs, 3)), np.float64) * 4
        aim = target / stretch
        y = np.asarray(forward(p64, x))[:, 0] - aim
        flip = np.flatnonzero(np.sign(y[:-1]) != np.sign(y[1:]))
        x0, x1, sign0 = x[flip], x[flip + 1], np.sign(y[flip])[:, None]
        lo, hi = np.zeros((len(flip), 1)), np.ones((len(flip), 1))
        for _ in range(60):
            mid = (lo + hi) / 2
            same = np.sign(np.asarray(forward(p64, x0 + mid * (x1 - x0))) - aim) == sign0
            lo, hi = np.where(same, mid, lo), np.where(same, hi, mid)
        return ((x0 + lo * (x1 - x0)) * stretch).astype(np.float32)


def test_the_issue_resized_mlp_rounding_passes_by_the_terms_and_fails_by_the_output():
    config = compose_config("model.in_features=3", "model.out_features=1")
    tolerance = config.precision.tolerance
    assert tolerance.scale == "terms"
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    # Outputs near -0.093, as in the issue, out of terms of magnitude ~1e3.
    x = _cancelling_rows(model, params, 32, stretch=10.0, target=-0.093)
    paths = build(model, jnp.float32, "batch")
    loop, vmap = (np.asarray(paths[p](params, x)) for p in ("loop_eager", "vmap_jit"))
    with jax.enable_x64(True):
        terms, fallbacks = rows_magnitude(model.forward_one, params, x)
    assert fallbacks == []

    by_output = compare(loop, vmap, tolerance)
    by_terms = compare(loop, vmap, tolerance, terms)
    assert not by_output["passed"], "no cancellation found: the paths agree bitwise?"
    assert by_terms["passed"], by_terms["reason"]

    at = tuple(by_output["element"])
    error = abs(float(loop[at]) - float(vmap[at]))
    s_output = max(abs(float(loop[at])), abs(float(vmap[at])))
    s_terms = max(float(terms[at]), s_output)
    bound_output = tolerance.atol + tolerance.rtol * s_output
    bound_terms = tolerance.atol + tolerance.rtol * s_terms
    assert error > bound_output and error <= bound_terms
    assert by_output["scale_at_worst"] == pytest.approx(s_output)
    print(
        f"\nissue case (MLP 3->32->32->1, loop_eager vs vmap_jit, float32) element {at}: "
        f"output {float(loop[at]):.7g} vs {float(vmap[at]):.7g}, |a-b|={error:.3g}; "
        f"rule output: S={s_output:.3g}, bound={bound_output:.3g} -> FAIL; "
        f"rule terms: S={s_terms:.4g}, bound={bound_terms:.3g} -> pass "
        f"(worst bound ratio over the batch {by_terms['bound_ratio']:.3g})"
    )


def test_a_planted_fault_still_fails_under_the_terms_rule():
    config = compose_config("model.in_features=3", "model.out_features=1")
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    x = _cancelling_rows(model, params, 32, stretch=10.0, target=-0.093)
    *inner, last = params["layers"]

    def faulty(params, batch, fault):
        hidden = batch
        for i, layer in enumerate(inner):
            w = layer["W"]
            if fault == "transposed_weight" and i == 1:
                w = w.T
            pre = hidden @ w
            if fault == "bf16_layer" and i == 1:
                pre = (hidden.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(hidden.dtype)
            hidden = jax.nn.relu(pre + layer["b"][None, :])
        return hidden @ last["W"] + last["b"][None, :]

    good = np.asarray(jax.vmap(model.forward_one, in_axes=(None, 0))(params, x))
    with jax.enable_x64(True):
        terms, _ = rows_magnitude(model.forward_one, params, x)
    for fault in ("transposed_weight", "bf16_layer"):
        bad = np.asarray(faulty(params, jnp.asarray(x), fault))
        result = compare(good, bad, config.precision.tolerance, terms)
        assert not result["passed"], fault
        assert "rule 'terms'" in result["reason"]
