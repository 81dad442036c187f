"""Input validation shared by every path, and the paths' agreement on a real MLP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.config import ModelConfig, ToleranceConfig
from vmapcheck.core.compare import all_pairs
from vmapcheck.core.contract import InputSpec
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import build_paths, path_names
from vmapcheck.errors import InvalidInputError


@pytest.fixture(scope="module")
def mlp():
    model = build_model(ModelConfig(name="mlp", in_features=5, hidden=[16, 8], out_features=3))
    return model, model.init(jax.random.key(1))


@pytest.mark.parametrize(
    "x,message",
    [
        (np.ones((2, 6), np.float32), "expected 5 features, got 6"),
        (np.ones((5,), np.float32), "expected a batch of rank 2"),
        (np.ones((1, 2, 5), np.float32), "got rank 3"),
        (np.ones((0, 5), np.float32), "empty batch"),
        (np.ones((2, 5), np.int32), "expected dtype float32, got int32"),
        (
            np.array([[1, 2, np.nan, 4, 5]], np.float32),
            r"got NaN in 1 element\(s\) \(first at "
            r"index \(0, 2\)\)",
        ),
        (np.array([[1, 2, np.inf, 4, -np.inf]] * 2, np.float32), r"got Inf in 4 element\(s\)"),
    ],
)
def test_invalid_batches_are_refused_with_the_problem_named(x, message):
    with pytest.raises(InvalidInputError, match=message):
        InputSpec.vector(5).validate_batch(x, jnp.float32)


def test_every_path_refuses_invalid_input_before_computing(mlp):
    model, params = mlp
    paths = build_paths(model, jnp.float32)
    assert set(paths) == set(path_names("batch"))
    for path in paths.values():
        with pytest.raises(InvalidInputError, match="expected 5 features, got 4"):
            path(params, jnp.ones((3, 4), jnp.float32))


def test_paths_agree_on_an_mlp_and_have_the_contract_shape(mlp):
    model, params = mlp
    x = jax.random.normal(jax.random.key(2), (7, 5), jnp.float32)
    outputs = {
        name: np.asarray(p(params, x)) for name, p in build_paths(model, jnp.float32).items()
    }
    for name, out in outputs.items():
        assert out.shape == (7, 3) and out.dtype == np.float32, name
    assert set(outputs) == set(path_names("batch"))
    results = all_pairs(outputs, ToleranceConfig(rtol=1e-5, atol=1e-6))
    n = len(path_names("batch"))
    assert len(results) == n * (n - 1) // 2
    assert all(r["passed"] for r in results.values()), results


def test_jit_path_does_not_retrace_for_the_same_shape(mlp):
    model, params = mlp
    traces = []

    def counting_forward_one(p, x):
        traces.append(1)
        return model.forward_one(p, x)

    fn = jax.jit(jax.vmap(counting_forward_one, in_axes=(None, 0)))
    x = jnp.ones((4, 5), jnp.float32)
    fn(params, x)
    fn(params, x + 1)
    assert len(traces) == 1


@pytest.mark.parametrize(
    "x,found",
    [
        ([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0]], "a ragged list (nested sequences of different"),
        (np.ones((2, 5), object), "an array of dtype object (Python objects, not numbers)"),
        (np.ma.masked_all((2, 5), np.float32), "a numpy masked array (np.ma), whose mask"),
        (np.ma.masked_array(np.ones((2, 5), np.float32)), "a numpy masked array (np.ma)"),
    ],
    ids=["ragged", "object", "fully_masked", "masked"],
)
def test_what_is_no_plain_array_is_refused_for_its_type(mlp, x, found):
    # A ragged list used to raise numpy's own ValueError; a masked array lost its mask.
    with pytest.raises(InvalidInputError) as info:
        InputSpec.vector(5).validate_batch(x, jnp.float32)
    assert info.value.reason == "type"
    assert str(info.value).startswith(f"expected a batch as a plain numeric array, got {found}")
    model, params = mlp
    for path in build_paths(model, jnp.float32).values():
        with pytest.raises(InvalidInputError, match="plain numeric array"):
            path(params, x)


def test_a_leaf_that_is_no_plain_array_is_named():
    from vmapcheck.core.contract import Leaf

    spec = InputSpec((Leaf("tokens", (3,), "int32", vocab=5), Leaf("mask", (3,), "bool")))
    batch = {"tokens": [[1, 2, 3], [1]], "mask": np.ones((2, 3), bool)}
    with pytest.raises(InvalidInputError, match=r"^leaf 'tokens': expected a plain array, got a"):
        spec.validate_batch(batch, jnp.float32)
    batch = {"tokens": np.ones((2, 3), np.int32), "mask": np.ma.masked_all((2, 3), bool)}
    with pytest.raises(InvalidInputError, match=r"^leaf 'mask': .* masked array") as info:
        spec.validate_example({k: v[0] for k, v in batch.items()}, jnp.float32)
    assert info.value.reason == "type"


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.float64])
def test_paths_are_built_only_at_a_float_a_run_can_have(mlp, dtype):
    from vmapcheck.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^dtype \(the run's precision\): "):
        build_paths(mlp[0], dtype)
