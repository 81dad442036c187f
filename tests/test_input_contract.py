"""The input contract as a pytree of leaves (vmapcheck.core.contract): validation naming
the leaf, cases built per leaf kind, every path and the guard on a dict-input model.

The dict-input model is docs/own-model.md's two-tower example (vmapcheck/examples/two_tower.py), the
token leaf a contract of ids and a mask; everything runs real JAX.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from tests.helpers.config import ROOT, compose_config
from vmapcheck.compose import compose_yaml
from vmapcheck.config import GuardConfig, validate_config
from vmapcheck.core import contract
from vmapcheck.core.cases import case_input, kind_of
from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.forward import run_forward
from vmapcheck.core.models import build_model
from vmapcheck.data.regression import load_cases, regression_cases, write_cases
from vmapcheck.errors import ArtifactError, ConfigError, InvalidInputError
from vmapcheck.examples.two_tower import make_model as make_two_tower

TOKENS = InputSpec((Leaf("tokens", (6,), "int32", vocab=5), Leaf("mask", (6,), "bool")))
RNG = np.random.default_rng(0)


def token_table(rows: int) -> np.ndarray:
    """``rows`` table rows of TOKENS: 6 id columns in [0, 5), then 6 mask columns."""
    ids = RNG.integers(0, 5, (rows, 6))
    mask = (np.arange(6)[None, :] < RNG.integers(1, 7, (rows, 1))).astype(float)
    return np.concatenate([ids, mask], axis=1).astype(np.float64)


def test_from_table_builds_each_leaf_with_its_dtype_and_shape():
    batch = TOKENS.from_table(token_table(3))
    assert set(batch) == {"tokens", "mask"}
    assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape == (3, 6)
    assert batch["mask"].dtype == np.bool_ and batch["mask"].shape == (3, 6)
    TOKENS.validate_batch(batch, jnp.float32)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [(2, 5.0, "whole ids in [0, 5)"), (2, 1.5, "whole ids"), (8, 0.5, "0 or 1")],
)
def test_from_table_refuses_a_column_its_leaf_cannot_hold(column, value, message):
    table = token_table(4)
    table[1, column] = value
    names = [f"t{i}" for i in range(6)] + [f"m{i}" for i in range(6)]
    with pytest.raises(ArtifactError, match=re.escape(message)) as info:
        TOKENS.from_table(table, names)
    assert f"column {names[column]}" in str(info.value)
    assert str(value) not in str(info.value)  # never a value from the data


def _valid() -> dict[str, np.ndarray]:
    return TOKENS.from_table(token_table(4))


@pytest.mark.parametrize(
    ("mutate", "reason", "where"),
    [
        (lambda b: {"tokens": b["tokens"]}, "missing_leaf", "leaf 'mask' is missing"),
        (lambda b: {**b, "extra": b["mask"]}, "extra_leaf", "leaf 'extra' is not in"),
        (lambda b: {**b, "tokens": b["tokens"][None]}, "rank", "leaf 'tokens': expected a batch"),
        (lambda b: {**b, "mask": b["mask"][:, :5]}, "shape", "leaf 'mask': expected per-example"),
        (lambda b: {**b, "tokens": b["tokens"][:3]}, "batch_sizes", "tokens: 3, mask: 4"),
        (lambda b: {k: v[:0] for k, v in b.items()}, "empty", "at least one row"),
        (
            lambda b: {**b, "tokens": b["tokens"].astype(np.float32)},
            "dtype",
            "leaf 'tokens': expected dtype int32, got float32",
        ),
        (lambda b: {**b, "mask": b["mask"].astype(np.int32)}, "dtype", "leaf 'mask'"),
        (
            lambda b: {**b, "tokens": np.where(np.eye(4, 6) > 0, 5, b["tokens"]).astype(np.int32)},
            "id_range",
            "leaf 'tokens': expected ids in [0, 5), got 4 id(s) out of range",
        ),
        (lambda b: b["tokens"], "type", "expected a batch as a dict of leaves"),
    ],
)
def test_each_violation_is_refused_naming_the_leaf(mutate, reason, where):
    with pytest.raises(InvalidInputError) as info:
        TOKENS.validate_batch(mutate(_valid()), jnp.float32)
    assert info.value.reason == reason
    assert where in str(info.value)


def test_a_float_leaf_refuses_nan_and_names_the_leaf_and_position():
    spec = InputSpec((Leaf("image", (2, 2, 1), "float"), Leaf("ids", (3,), "int32", vocab=4)))
    batch = {"image": np.ones((2, 2, 2, 1), np.float32), "ids": np.zeros((2, 3), np.int32)}
    batch["image"][1, 0, 1, 0] = np.inf
    with pytest.raises(InvalidInputError, match=r"leaf 'image': .*Inf .*\(1, 0, 1, 0\)") as info:
        spec.validate_batch(batch, jnp.float32)
    assert info.value.reason == "non_finite_input"


def test_the_flat_vector_keeps_its_messages():
    flat = InputSpec.vector(3)
    with pytest.raises(InvalidInputError, match=r"^expected 3 features, got 4$"):
        flat.validate_batch(np.ones((2, 4), np.float32), jnp.float32)
    with pytest.raises(InvalidInputError, match=r"expected a batch of rank 2 \(batch, 3\)"):
        flat.validate_batch(np.ones((3,), np.float32), jnp.float32)


def test_cases_per_leaf_kind_and_their_round_trip(tmp_path):
    train, test = token_table(40), token_table(12)
    cases = regression_cases(train, test, np.zeros((12, 1)), 8, TOKENS)
    boundary = cases["boundary"]["x"]
    # ids: 0 then vocab-1 everywhere; the mask: all padding then no padding.
    assert (boundary["tokens"][0] == 0).all() and (boundary["tokens"][1] == 4).all()
    assert not boundary["mask"][0].any() and boundary["mask"][1].all()
    # No float leaf: no large-magnitude or subnormal case.
    assert "large_magnitude" not in cases and "denormal" not in cases
    for name in ("invalid_tokens_range", "invalid_tokens_dtype", "invalid_mask_shape"):
        assert cases[name]["kind"] == "invalid"
    for name in ("invalid_missing_leaf", "invalid_extra_leaf", "invalid_batch_sizes"):
        assert name in cases
    # Every invalid case is refused with every substring it expects.
    for name, case in cases.items():
        if kind_of(case, name).valid:
            check = TOKENS.validate_batch if kind_of(case, name).takes == "batch" else None
            if check:
                check(case_input(case, jnp.float32), jnp.float32)
            continue
        validate = TOKENS.validate_example if case["runs_on"] == "vector" else TOKENS.validate_batch
        with pytest.raises(InvalidInputError) as info:
            validate(case_input(case, jnp.float32), jnp.float32)
        for expected in case["expect"]:
            assert expected in str(info.value), (name, expected, str(info.value))
    write_cases(tmp_path, cases)
    loaded = load_cases(tmp_path)
    assert loaded["standard"]["shape"] == {"tokens": [8, 6], "mask": [8, 6]}
    for name, case in cases.items():
        jax.tree.map(np.testing.assert_array_equal, loaded[name]["x"], case["x"])


def test_float_leaves_get_large_and_subnormal_cases_the_others_real_rows():
    spec = InputSpec((Leaf("image", (2, 2), "float"), Leaf("ids", (2,), "int32", vocab=3)))
    table = np.concatenate([RNG.normal(size=(20, 4)), RNG.integers(0, 3, (20, 2))], axis=1)
    cases = regression_cases(table, table[:10], np.zeros((10, 1)), 4, spec)
    large, test_ids = cases["large_magnitude"]["x"], spec.from_table(table[:3])["ids"]
    assert np.abs(large["image"]).min() > 1e18
    np.testing.assert_array_equal(large["ids"], test_ids)
    assert (np.abs(cases["denormal"]["x"]["image"]) < np.finfo(np.float32).smallest_normal).all()


@pytest.fixture(scope="module")
def two_tower():
    model = make_two_tower(2, 6, 8, 1)
    return model, model.init(jax.random.key(0))


def test_every_path_agrees_on_a_dict_input_model(two_tower):
    model, params = two_tower
    table = RNG.normal(size=(30, 8))
    cases = regression_cases(table, table[:12], np.zeros((12, 1)), 8, model.contract)
    outputs, record = run_forward(model, params, cases, jnp.float32)
    standard = {k: v for k, v in outputs.items() if k.startswith("standard.")}
    assert len(standard) >= 6  # loop, vmap, vmap_of_jit, direct (eager and jit), sharded
    first = next(iter(standard.values()))
    for value in standard.values():
        np.testing.assert_allclose(value, first, rtol=1e-5, atol=1e-6)
    # Invalid inputs are refused by every path, naming the leaf.
    refused = record["invalid_body_dtype"]
    assert refused and all(r["refused"] for r in refused.values())
    assert all("leaf 'body'" in r["message"] for r in refused.values())


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.bfloat16])
def test_a_wrong_dtype_leaf_is_the_one_refused_at_every_precision(two_tower, dtype):
    """The other float leaves of a wrong-dtype case are cast to the run's dtype like any
    case (its ``keep`` names the leaf under test): at f64 and bf16 the refusal names the
    leaf under test, not a valid float32 leaf beside it."""
    model, params = two_tower
    table = RNG.normal(size=(30, 8))
    cases = regression_cases(table, table[:12], np.zeros((12, 1)), 8, model.contract)
    with jax.enable_x64(dtype == jnp.float64):
        _, record = run_forward(model, params, cases, dtype)
    for leaf, other in (("serum", "body"), ("body", "serum")):
        refused = record[f"invalid_{leaf}_dtype"]
        assert refused and all(r["refused"] for r in refused.values())
        for result in refused.values():
            assert f"leaf '{leaf}'" in result["message"], result["message"]
            assert f"leaf '{other}'" not in result["message"], result["message"]


def test_the_guard_serves_and_refuses_a_dict_input_model(two_tower):
    from vmapcheck.guard.predictor import Guard, invalid_kinds
    from vmapcheck.guard.replay import replay, request_stream

    model, params = two_tower
    config = GuardConfig.model_validate(
        {
            "buckets": [1, 8, 32],
            "max_batch": 32,
            "max_request_bytes": 1 << 20,
            "precompile": True,
            "latency_edges_ms": [1.0, 10.0],
            "latency_window": 100,
            "replay": {
                "n_requests": 120,
                "seed": 3,
                "invalid_share": 0.5,
                "noise_std": 0.1,
                "plant_canary": False,
                "unbucketed_requests": 0,
            },
        }
    )
    guard = Guard(model, params, jnp.float32, config)
    template = model.contract.from_table(RNG.normal(size=(16, 8)))
    out = guard.predict(contract.take(template, slice(0, 5)))
    want = jax.vmap(model.forward_one, in_axes=(None, 0))(
        params, contract.take(template, slice(0, 5))
    )
    np.testing.assert_allclose(out, np.asarray(want), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidInputError, match="leaf 'serum'") as info:
        guard.predict({**template, "serum": template["serum"][:, :5]})
    assert info.value.reason == "shape"
    report = replay(guard, request_stream(template, jnp.float32, config, model.contract))
    assert report["mismatched"] == {}
    assert set(report["outcomes"]) - {"served"} <= set(invalid_kinds(model.contract))
    assert len(report["outcomes"]) >= 6


def test_a_factory_whose_leaves_differ_from_the_config_is_refused():
    config = compose_config(
        "model=two_tower", "data=diabetes", "model.factory.n_body=3", "model.factory.n_serum=5"
    )
    with pytest.raises(ConfigError, match=r"model\.inputs declares body \(2,\) float"):
        build_model(config.model)


def test_inputs_that_do_not_take_in_features_are_refused_naming_the_key():
    raw = yaml.safe_load(
        compose_yaml(
            ROOT / "conf", ["model=two_tower", "data=diabetes", "model.inputs.serum.shape=[5]"]
        )
    )
    with pytest.raises(ConfigError, match=r"model\.inputs take 7 table columns"):
        validate_config(raw)


def test_a_one_leaf_dict_gets_its_leaf_under_another_name_as_the_missing_leaf(tmp_path):
    spec = InputSpec((Leaf("image", (2, 2, 1), "float"),))
    table = RNG.normal(size=(12, 4))
    cases = regression_cases(table, table, np.zeros((12, 1)), 4, spec)
    missing = cases["invalid_missing_leaf"]
    assert set(missing["x"]) == {"image_renamed"}
    with pytest.raises(InvalidInputError, match="leaf 'image' is missing"):
        spec.validate_batch(missing["x"], jnp.float32)
    assert "invalid_batch_sizes" not in cases  # one leaf: nothing to disagree with
    write_cases(tmp_path, cases)
    assert set(load_cases(tmp_path)["invalid_missing_leaf"]["x"]) == {"image_renamed"}
