"""The budgets (conf/budget/default.yaml, vmapcheck.config.BudgetConfig): validated like
every key, and each one that caps a case is reported with the rows it covered and
compared on those rows, never padded or faked (docs/checks.md, "Budgets").

Forward and check run in this process on the MLP and a batch of 7 rows, with budgets
below it: the loop paths run 3 rows, the oracle 2, the terms' magnitude 4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from tests.helpers.config import PACKAGE_CONF, ROOT, compose_config
from vmapcheck.check.checks import _compare_rows, run_checks
from vmapcheck.compose import compose_yaml
from vmapcheck.config import ToleranceConfig, validate_config
from vmapcheck.core.forward import build_all, run_composition, run_forward
from vmapcheck.core.magnitude import case_magnitudes
from vmapcheck.core.models import build_model
from vmapcheck.core.oracle import float64_outputs
from vmapcheck.core.paths import PATHS
from vmapcheck.errors import ConfigError

BUDGET = (
    "budget.loop_max_rows=3",
    "budget.oracle_max_rows=2",
    "budget.magnitude_max_rows=4",
)
CONFIG = compose_config("reference.required=false", *BUDGET)
MLP = build_model(CONFIG.model)
PARAMS = MLP.init(jax.random.key(0))
RUNTIME = {"backend": "cpu", "device_kind": "cpu", "jax_version": "0", "jaxlib_version": "0"}
CAPPED = {p.name for p in PATHS.values() if p.forward_cap}  # the loop paths
ROWS = 7


def _cases() -> dict[str, dict]:
    rows = np.random.default_rng(0).normal(size=(ROWS, MLP.in_features)).astype(np.float32)
    return {
        "standard": {
            "kind": "batch",
            "x": rows,
            "y": np.ones((ROWS, MLP.out_features), np.float32),
            "shape": list(rows.shape),
        },
        "single": {"kind": "batch", "x": rows[:1], "shape": [1, MLP.in_features]},
        "single_vector": {"kind": "vector", "x": rows[0], "shape": [MLP.in_features]},
    }


def _forward(cases: dict[str, dict]) -> tuple[dict, dict, dict, dict]:
    built = build_all(MLP, jnp.float32)
    outputs, record = run_forward(
        MLP, PARAMS, cases, jnp.float32, built=built, budget=CONFIG.budget
    )
    regrouped, composition = run_composition(
        MLP, PARAMS, cases, jnp.float32, outputs, built=built, budget=CONFIG.budget
    )
    with jax.enable_x64(True):
        oracle = float64_outputs(
            MLP, PARAMS, cases, jnp.float32, max_rows=CONFIG.budget.oracle_max_rows
        )
        magnitudes = case_magnitudes(
            MLP.forward_one,
            PARAMS,
            cases,
            jnp.float32,
            max_rows=CONFIG.budget.magnitude_max_rows,
        )
    forward_record = {
        "runtime": RUNTIME,
        "reference": {"status": "missing", "message": "none"},
        "cases": record,
        "composition": composition,
    }
    return outputs, forward_record, regrouped, {"oracle": oracle, "magnitudes": magnitudes}


def _check(cases, outputs, forward_record, regrouped, judged) -> dict:
    manifest = {"cases": {name: {k: c[k] for k in ("kind", "shape")} for name, c in cases.items()}}
    targets = {name: c["y"] for name, c in cases.items() if "y" in c}
    return run_checks(
        CONFIG, manifest, outputs, forward_record, composition=regrouped, targets=targets, **judged
    )


@pytest.fixture(scope="module")
def judged():
    cases = _cases()
    return cases, *_forward(cases)


# --- validation ---------------------------------------------------------------------------


def _raw():
    return yaml.safe_load(compose_yaml(ROOT / "conf"))


@pytest.mark.parametrize("key", ["oracle_max_rows", "magnitude_max_rows", "loop_max_rows"])
@pytest.mark.parametrize("value", [0, -1, "64", 2.5, None])
def test_each_budget_must_be_a_positive_row_count(key, value):
    raw = _raw()
    raw["budget"][key] = value
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    assert f"budget.{key}" in str(info.value) and repr(value) in str(info.value)


def test_an_unknown_or_missing_budget_key_is_named():
    raw = _raw()
    raw["budget"]["oracle_rows"] = 64  # a typo of oracle_max_rows
    del raw["budget"]["gradient_max_rows"]
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    assert "budget.oracle_rows: unknown key" in str(info.value)
    assert "budget.gradient_max_rows: required key is missing" in str(info.value)


def test_the_default_budget_caps_no_shipped_data_option_but_the_real_size_one():
    budget = compose_config().budget.model_dump()
    for option in sorted((PACKAGE_CONF / "data").glob("*.yaml")):
        rows = yaml.safe_load(option.read_text())["standard_batch"]
        if option.stem == "images32":
            # Every budget but the magnitude's: past it the output rule would judge.
            assert {k for k, limit in budget.items() if rows > limit} == {
                "oracle_max_rows",
                "loop_max_rows",
                "gradient_max_rows",
            }
        else:
            assert all(rows <= limit for limit in budget.values()), option.stem


# --- the capped parts, reported and compared on their rows --------------------------------


def test_the_oracle_and_the_magnitude_compute_the_rows_their_budget_allows(judged):
    _, _, _, _, parts = judged
    assert parts["oracle"]["standard"].shape == (2, MLP.out_features)
    assert parts["oracle"]["single"].shape == (1, MLP.out_features)  # under the budget
    assert parts["magnitudes"]["standard"]["scale"].shape == (4, MLP.out_features)


def test_a_capped_loop_runs_its_rows_and_the_record_says_so(judged):
    _, outputs, forward_record, _, _ = judged
    assert {"loop_eager", "loop_jit"} == CAPPED
    for path in PATHS.values():
        if path.takes != "batch":
            continue
        entry = forward_record["cases"]["standard"][path.name]
        if path.name in CAPPED:
            assert outputs[f"standard.{path.name}"].shape == (3, MLP.out_features)
            assert entry["rows_run"] == 3 and entry["rows_of"] == ROWS
            assert entry["capped_by"] == "budget.loop_max_rows"
        else:
            assert outputs[f"standard.{path.name}"].shape == (ROWS, MLP.out_features)
            assert "rows_run" not in entry
    capped = forward_record["composition"]["cases"]["standard"]["capped"]
    assert set(capped) == CAPPED and capped["loop_jit"]["split"] == {"halves": [[0, 1], [1, 3]]}


def test_every_cap_is_reported_and_each_capped_part_compared_on_its_rows(judged):
    cases, outputs = judged[0], judged[1]
    report = _check(*judged)
    assert report["passed"], report["failures"]
    standard = report["cases"]["standard"]
    assert standard["capped"] == {
        "loop_eager": {"rows_run": 3, "rows_of": ROWS, "capped_by": "budget.loop_max_rows"},
        "loop_jit": {"rows_run": 3, "rows_of": ROWS, "capped_by": "budget.loop_max_rows"},
        "oracle": {"rows_run": 2, "rows_of": ROWS, "capped_by": "budget.oracle_max_rows"},
        "magnitude": {
            "rows_run": 4,
            "rows_of": ROWS,
            "capped_by": "budget.magnitude_max_rows",
            "beyond": "judged by the output rule, max(|a|, |b|)",
        },
    }
    assert "capped" not in report["cases"]["single"]
    for pair, result in standard["pairs"].items():
        with_loop = any(p in pair.split("-vs-") for p in CAPPED)
        assert result.get("rows") == (3 if with_loop else None), pair
    assert {r["rows"] for r in standard["oracle"].values()} == {2}
    # A capped path's loss is over its rows.
    y = cases["standard"]["y"]
    loop = np.mean((outputs["standard.loop_jit"].astype(np.float64) - y[:3]) ** 2)
    assert standard["loss"]["loop_jit"] == pytest.approx(loop)
    assert report["composition"]["standard"]["loop_jit"]["rows"] == 3
    assert "rows" not in report["composition"]["standard"]["vmap_jit"]
    assert report["budget"]["limits"]["loop_max_rows"] == 3
    assert report["budget"]["cases"] == {"standard": standard["capped"]}


def test_a_capped_loop_that_is_wrong_on_one_of_its_rows_still_fails(judged):
    cases, outputs, forward_record, regrouped, parts = judged
    wrong = {**outputs, "standard.loop_jit": outputs["standard.loop_jit"].copy()}
    wrong["standard.loop_jit"][2, 0] += 1.0
    report = _check(cases, wrong, forward_record, regrouped, parts)
    assert not report["passed"]
    assert any(f.startswith("standard/loop_jit-vs-vmap_jit") for f in report["failures"])


def test_a_forward_that_ran_other_rows_than_the_budget_allows_fails_the_contract(judged):
    cases, outputs, forward_record, regrouped, parts = judged
    # As if the forward stage had ignored the budget: every row, where the config says 3.
    full = {**outputs, "standard.loop_jit": outputs["standard.vmap_jit"].copy()}
    record = {
        **forward_record,
        "cases": {
            **forward_record["cases"],
            "standard": {
                **forward_record["cases"]["standard"],
                "loop_jit": {"refused": False, "shape": [ROWS, 2], "dtype": "float32"},
            },
        },
    }
    report = _check(cases, full, record, regrouped, parts)
    assert f"standard/loop_jit: expected shape [3, 2], got [{ROWS}, 2]" in report["failures"]


def test_rows_beyond_the_magnitude_budget_are_judged_by_the_output_rule():
    # Row 1 differs by 1e-4 on an output of 1: within rtol * S for terms of magnitude 100,
    # beyond it for the output's own magnitude.
    a = np.ones((2, 1))
    b = a.copy()
    b[1, 0] += 1e-4
    tolerance = ToleranceConfig(rtol=1e-5, atol=0.0)
    terms = np.full((2, 1), 100.0)
    assert _compare_rows(a, b, tolerance, terms)["passed"]
    capped = _compare_rows(a, b, tolerance, terms[:1])  # S of row 0 only
    assert not capped["passed"] and capped["element"] == [1, 0] and capped["terms_rows"] == 1
    assert (
        "row 1 is past the 1 rows of the terms' magnitude (budget.magnitude_max_rows)"
        in (capped["reason"])
    )
