"""Agreement semantics: symmetric tolerance, shape and finiteness are never waived."""

import numpy as np
import pytest

from vmapcheck.config import ToleranceConfig
from vmapcheck.core.compare import all_pairs, compare, looser, measure, scale_of

TOL = ToleranceConfig(rtol=1e-5, atol=1e-6)


def test_identical_outputs_agree_with_zero_error():
    a = np.array([[1.0, 2.0]], dtype=np.float32)
    result = compare(a, a.copy(), TOL)
    assert result == {
        "max_abs": 0.0,
        "max_rel": 0.0,
        "passed": True,
        "reason": "",
        "bound_ratio": 0.0,
        "rule": "output",
        "element": [0, 0],
        "scale_at_worst": 1.0,
    }


def test_difference_within_and_beyond_tolerance():
    a = np.array([100.0], dtype=np.float64)
    inside = compare(a, a + 100.0 * 0.9e-5, TOL)
    outside = compare(a, a + 100.0 * 2e-5, TOL)
    assert inside["passed"] and not outside["passed"]
    assert np.isclose(outside["max_abs"], 2e-3)
    assert np.isclose(outside["max_rel"], 2e-3 / 100.002, rtol=1e-6)
    assert "element (0,)" in outside["reason"]


def test_comparison_is_symmetric():
    a = np.array([1.0, 0.0, -3.0])
    b = np.array([1.00001, 1e-7, -3.00002])
    assert compare(a, b, TOL) == compare(b, a, TOL)


def test_shape_mismatch_fails():
    result = compare(np.zeros((2, 2)), np.zeros((2, 3)), TOL)
    assert not result["passed"] and "shape" in result["reason"]


def test_nan_against_a_number_is_a_failure_not_a_pass():
    result = compare(np.array([np.nan, 1.0]), np.array([0.5, 1.0]), TOL)
    assert not result["passed"] and result["max_abs"] is None
    assert result["reason"].startswith("non-finite output apart: element (0,) is nan in one")
    assert compare(np.array([np.inf]), np.array([-np.inf]), TOL)["passed"] is False


def test_the_same_nan_in_both_is_agreement_the_other_rows_measured():
    a = np.array([[np.nan, 1.0], [2.0, 3.0], [np.inf, 0.0]])
    b = a.copy()
    b[1, 0] += 1e-3
    result = compare(a, b, TOL)
    # Rows 0 and 2 hold the same NaN / Inf in both: not measured, named; row 1 measured.
    assert result["same_non_finite_rows"] == [0, 2]
    assert not result["passed"] and result["element"] == [1, 0]
    assert result["max_abs"] == pytest.approx(1e-3)
    assert compare(a[:1], a[:1].copy(), TOL)["passed"]  # nothing else to measure


def test_all_pairs_covers_every_pair_once():
    outputs = {name: np.ones(3) for name in ("loop", "vmap", "direct")}
    assert set(all_pairs(outputs, TOL)) == {"loop-vs-vmap", "loop-vs-direct", "vmap-vs-direct"}


def test_the_terms_rule_scales_by_the_terms_magnitude():
    # -0.093 out of terms of magnitude 104: 4.8e-6 is float32 rounding of such a sum.
    a = np.array([-0.093, 1.0])
    b = a + np.array([4.8e-6, 0.0])
    terms = np.array([104.0, 1.0])
    by_output = compare(a, b, TOL)
    by_terms = compare(a, b, TOL, terms)
    assert not by_output["passed"] and by_output["rule"] == "output"
    assert "element (0,)" in by_output["reason"] and "rule 'output'" in by_output["reason"]
    assert by_output["bound_ratio"] == pytest.approx(4.8e-6 / (1e-6 + 1e-5 * 0.093), rel=1e-6)
    assert by_terms["passed"] and by_terms["rule"] == "terms"
    assert by_terms["bound_ratio"] == pytest.approx(4.8e-6 / (1e-6 + 1e-5 * 104.0), rel=1e-6)
    assert by_terms["scale_at_worst"] == 104.0 and by_terms["element"] == [0]
    # max_rel stays relative to the outputs, whatever the rule.
    assert by_terms["max_rel"] == by_output["max_rel"]


def test_the_terms_scale_is_never_below_the_outputs_and_never_infinite():
    a, b = np.array([5.0, 1.0, 2.0]), np.array([5.0, 1.0, 2.0])
    s, rule = scale_of(a, b, np.array([1.0, np.inf, np.nan]))
    assert rule == "terms" and s.tolist() == [5.0, 1.0, 2.0]
    # A non-finite terms magnitude is no licence: the output's own magnitude decides.
    off = compare(np.array([1.0]), np.array([1.5]), TOL, np.array([np.inf]))
    assert not off["passed"] and off["scale_at_worst"] == 1.5


def test_a_terms_magnitude_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="must describe these very outputs"):
        compare(np.zeros(2), np.zeros(2), TOL, np.ones(3))


def test_the_terms_rule_still_fails_a_real_difference():
    a = np.array([0.5, -0.25])
    terms = np.array([3.0, 2.0])
    assert not compare(a, a * 1.001, TOL, terms)["passed"]
    result = compare(a, a + np.array([0.0, 1e-3]), TOL, terms)
    assert not result["passed"] and "rule 'terms'" in result["reason"]
    assert "S = max(S_terms, |a|, |b|) = 2" in result["reason"]


def test_measure_takes_the_terms_magnitude_too():
    a = np.array([[-0.093, 1.0]], np.float32)
    b = a + np.array([[4.8e-6, 0.0]], np.float32)
    assert not measure(a, b, TOL, "precision.tolerance")["passed"]
    result = measure(a, b, TOL, "precision.tolerance", scale=np.array([[104.0, 1.0]]))
    assert result["passed"] and result["rule"] == "terms" and result["bound_ratio"] < 0.01


def test_the_looser_tolerance_keeps_the_judging_runs_rule():
    judged = looser({"rtol": 1e-3, "atol": 0.0}, {"rtol": 1e-4, "atol": 1e-5, "scale": "output"})
    assert judged == ToleranceConfig(rtol=1e-3, atol=1e-5, scale="output")
    assert looser({"rtol": 1e-3, "atol": 0.0}, {"rtol": 1e-4, "atol": 1e-5}).scale == "terms"
