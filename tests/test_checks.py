"""The check report fails honestly: planted disagreement, contract breach, no refusal."""

import numpy as np
import pytest

from tests.conftest import compose_config
from vmapcheck.checks import metrics_summary, run_checks
from vmapcheck.names import PATH_NAMES


@pytest.fixture
def inputs():
    config = compose_config("model=toy")
    manifest = {
        "cases": {
            "standard": {"shape": [2, 3], "valid": True},
            "invalid_shape": {
                "shape": [2, 4],
                "valid": False,
                "expect": "expected 3 features, got 4",
            },
        }
    }
    out = np.array([[0.1, 0.0], [0.3, 0.1]], dtype=np.float32)
    outputs = {f"standard.{p}": out.copy() for p in PATH_NAMES}
    record = {
        "runtime": {"backend": "cpu"},
        "cases": {
            "standard": {
                p: {"refused": False, "shape": [2, 2], "dtype": "float32"} for p in PATH_NAMES
            },
            "invalid_shape": {
                p: {
                    "refused": True,
                    "error": "InvalidInputError",
                    "message": "expected 3 features, got 4",
                }
                for p in PATH_NAMES
            },
        },
    }
    return config, manifest, outputs, record


def test_agreeing_outputs_pass(inputs):
    report = run_checks(*inputs)
    assert report["passed"], report["failures"]
    summary = metrics_summary(report)
    assert summary["n_pairs"] == 15 and summary["negative"]["invalid_shape"]["refused_paths"] == 6


def test_one_path_off_by_more_than_the_tolerance_fails_the_check(inputs):
    config, manifest, outputs, record = inputs
    outputs["standard.vmap_jit"] = outputs["standard.vmap_jit"] + np.float32(1e-3)
    report = run_checks(config, manifest, outputs, record)
    assert not report["passed"]
    failing = {f.split(":")[0] for f in report["failures"]}
    assert failing == {f"standard/{p}-vs-vmap_jit" for p in PATH_NAMES[:3]} | {
        f"standard/vmap_jit-vs-{p}" for p in PATH_NAMES[4:]
    }


def test_nan_output_fails(inputs):
    config, manifest, outputs, record = inputs
    outputs["standard.direct_eager"][0, 0] = np.nan
    report = run_checks(config, manifest, outputs, record)
    assert "standard/direct_eager: non-finite output" in report["failures"]


def test_wrong_output_shape_breaks_the_contract(inputs):
    config, manifest, outputs, record = inputs
    record["cases"]["standard"]["loop_jit"]["shape"] = [2, 3]
    report = run_checks(config, manifest, outputs, record)
    assert "standard/loop_jit: expected shape [2, 2], got [2, 3]" in report["failures"]


def test_invalid_input_that_produces_an_output_fails(inputs):
    config, manifest, outputs, record = inputs
    record["cases"]["invalid_shape"]["direct_jit"] = {
        "refused": False,
        "shape": [2, 2],
        "dtype": "float32",
    }
    report = run_checks(config, manifest, outputs, record)
    assert not report["passed"]
    assert report["negative"]["invalid_shape"]["paths"]["direct_jit"]["passed"] is False
    assert any("direct_jit: expected a refusal" in f for f in report["failures"])
