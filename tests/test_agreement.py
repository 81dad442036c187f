"""Agreement semantics: symmetric tolerance, shape and finiteness are never waived."""

import numpy as np

from vmapcheck.config import ToleranceConfig
from vmapcheck.core.compare import all_pairs, compare

TOL = ToleranceConfig(rtol=1e-5, atol=1e-6)


def test_identical_outputs_agree_with_zero_error():
    a = np.array([[1.0, 2.0]], dtype=np.float32)
    result = compare(a, a.copy(), TOL)
    assert result == {"max_abs": 0.0, "max_rel": 0.0, "passed": True, "reason": ""}


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


def test_nan_is_a_failure_not_a_pass():
    a = np.array([np.nan, 1.0])
    result = compare(a, a.copy(), TOL)
    assert not result["passed"] and result["reason"] == "non-finite output"


def test_all_pairs_covers_every_pair_once():
    outputs = {name: np.ones(3) for name in ("loop", "vmap", "direct")}
    assert set(all_pairs(outputs, TOL)) == {"loop-vs-vmap", "loop-vs-direct", "vmap-vs-direct"}
