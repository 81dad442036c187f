"""Case rules (vmapcheck.check.rules): a case kind names the rules that judge it besides
agreement, and the summary, the HTML report and MLflow show each rule's result alike.
The duplicate_rows kind and its copies_agree rule, on real JAX models."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_api import EXAMPLES, MODEL, PARAMS
from vmapcheck.check.rules import (
    CASE_RULES,
    RuleResult,
    every_case,
    metrics,
    rule,
    summary_lines,
)
from vmapcheck.core.cases import CASE_KINDS
from vmapcheck.data.regression import DUPLICATE_ROWS, regression_cases
from vmapcheck.errors import ArtifactError
from vmapcheck.report.check_sections import agreement
from vmapcheck.testing import check_batching, precision_config

PATHS = ["loop_eager", "vmap_jit", "direct_eager", "direct_jit"]


def positional(params, X):
    """MODEL's forward_batch with a mistake a copy of one row exposes: a term growing with
    the row's position in the batch (a positional offset added along axis 0)."""
    rows = jnp.arange(X.shape[0], dtype=X.dtype)[:, None]
    return MODEL.forward_batch(params, X) + 1e-3 * rows


def test_every_rule_a_kind_names_is_registered():
    for kind in CASE_KINDS.values():
        for name in kind.rules:
            assert rule(name) is CASE_RULES[name]


def test_the_regression_set_holds_copies_of_one_test_row():
    rng = np.random.default_rng(0)
    test_x = rng.normal(size=(20, 3))
    cases = regression_cases(rng.normal(size=(50, 3)), test_x, rng.normal(size=(20, 2)), 8)
    duplicate = cases["duplicate_rows"]
    assert duplicate["kind"] == "duplicate_rows" and duplicate["x"].shape == (DUPLICATE_ROWS, 3)
    copies = np.repeat(test_x[:1], DUPLICATE_ROWS, axis=0).astype(np.float32)  # stored f32
    np.testing.assert_array_equal(duplicate["x"], copies)


def test_a_correct_model_gets_the_same_output_for_every_copy():
    report = check_batching(MODEL, PARAMS, EXAMPLES, paths=PATHS, edge_cases=True)
    assert report.passed, report.summary
    case = report.details["cases"]["duplicate_rows"]
    result = RuleResult.from_json(case["rules"]["copies_agree"], "copies_agree")
    assert result.passed and result.failures == []
    assert result.figures["bound_ratio"] is not None and result.figures["bound_ratio"] <= 1
    assert f"{DUPLICATE_ROWS} copies of one row, the same output on each of 4 paths" in result.text
    # The API's verdict lists it among the edge cases, as the pipeline's summary does.
    assert "  ok   duplicate_rows   copies_agree: 8 copies of one row" in report.summary
    # The built-in rules judged every valid case, in the case's own fields, not `rules`.
    for name, judged in report.details["cases"].items():
        assert set(judged["finite"]) == set(PATHS) and all(judged["finite"].values()), name
        assert not set(every_case()) & set(judged.get("rules", {})), name


def test_the_finite_rule_tells_the_models_rows_from_the_batchings():
    """Row 1 NaN on both paths: the model's, named once; row 0 Inf on one path only: a
    batching fault there. The rule records the case's finite and non_finite_rows."""
    finite = rule("finite")
    assert finite.every_case and "finite" in every_case()
    a = np.ones((3, 2), np.float32)
    a[1, 0] = np.nan
    b = a.copy()
    b[0, 1] = np.inf
    result = finite.judge("c", {"a": a, "b": b}, precision_config("f32").tolerance)
    assert not result.passed
    assert result.findings() == [
        ("model", "c: non-finite output on row 1 on every path: the model computes it, not "
         "the batching (the other rows are compared)"),
        ("batching", "c/b: non-finite output on row 0, where other paths are finite"),
    ]  # fmt: skip
    assert result.fields == {
        "finite": {"a": False, "b": False},
        "non_finite_rows": {"a": [1], "b": [0, 1]},
    }
    clean = finite.judge("c", {"a": np.ones((3, 2))}, precision_config("f32").tolerance)
    assert clean.passed and clean.findings() == [] and clean.fields == {"finite": {"a": True}}


def test_a_row_whose_output_depends_on_its_position_fails_on_the_batched_paths_only():
    planted = dataclasses.replace(MODEL, forward_batch=positional)
    report = check_batching(planted, PARAMS, EXAMPLES, paths=PATHS, edge_cases=True)
    assert not report.passed
    failing = [f for f in report.failures if "copies of one row get different outputs" in f]
    assert {f.split(":")[0] for f in failing} == {
        "duplicate_rows/direct_eager",
        "duplicate_rows/direct_jit",
    }
    cases = report.details["cases"]
    result = cases["duplicate_rows"]["rules"]["copies_agree"]
    assert not result["passed"] and result["figures"]["max_abs"] == pytest.approx(7e-3, rel=1e-3)
    # The summary's line, MLflow's metrics and the HTML table all come from the entry.
    assert (
        "  FAIL duplicate_rows   copies_agree: 8 copies of one row get different outputs on "
        "direct_eager, direct_jit" in summary_lines(cases)
    )
    logged = metrics(cases)
    assert logged["rule/duplicate_rows/copies_agree/passed"] == 0.0
    assert logged["rule/duplicate_rows/copies_agree/max_abs"] == pytest.approx(7e-3, rel=1e-3)
    shown = next(c for c in agreement(report.details)["cases"] if c["name"] == "duplicate_rows")
    assert shown["rules"] is not None and "copies_agree" in str(shown["rules"])


def test_a_result_read_back_without_its_keys_or_for_an_unknown_rule_is_named():
    with pytest.raises(ArtifactError, match=r"cases.x.rules.r: expected keys \['figures'"):
        RuleResult.from_json({"passed": True, "text": ""}, "cases.x.rules.r")
    with pytest.raises(ArtifactError, match="case rule 'no_such' is not registered"):
        summary_lines({"x": {"rules": {"no_such": {"passed": True, "figures": {}, "text": ""}}}})
