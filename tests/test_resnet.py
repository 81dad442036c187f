"""The shipped real-size model (vmapcheck/examples/resnet.py, conf/model/resnet.yaml).

Shapes, the row independence the check relies on and the agreement of every path run
on a small configuration of it (8x8 images, a few channels: seconds); the parameter
count of the shipped one from its config, without allocating it (``jax.eval_shape``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import build, path_names, plain_path
from vmapcheck.examples.resnet import LAYERS, OUTPUT_LAYER, make_model, parameter_count

SMALL = make_model(side=8, channels_in=3, widths=[4, 4, 8], hidden=16, out_features=3)


@pytest.fixture(scope="module")
def params():
    """SMALL's params, made by the tests that use them, not at collection: its eager
    init compiles each op (3.4 s), and every pytest-xdist worker collects this file."""
    return SMALL.init(jax.random.key(0))


def _images(n: int, seed: int = 1) -> dict[str, jax.Array]:
    return {"image": jax.random.normal(jax.random.key(seed), (n, 8, 8, 3), jnp.float32)}


def test_the_shipped_config_builds_a_model_of_a_few_million_float32_parameters():
    config = compose_config("model=resnet", "data=images32", "guard=images", "bench=big")
    model = build_model(config.model)
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    assert parameter_count(shapes) >= 3_000_000
    assert {leaf.dtype for leaf in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
    assert model.in_features == 32 * 32 * 3 == config.data.n_features
    assert model.contract.describe()[0]["shape"] == [32, 32, 3]
    assert not model.trainable  # fixed init
    # The standard case is 4,096 rows, and the test split holds them.
    assert config.data.standard_batch == 4096
    assert config.data.n_rows * config.data.split.test >= 4096


def test_shapes_of_one_example_and_of_a_batch(params):
    x = _images(5)
    assert SMALL.forward_batch(params, x).shape == (5, 3)
    assert SMALL.forward_one(params, {"image": x["image"][0]}).shape == (3,)
    layers = SMALL.activations_batch(params, x)
    assert [name for name, _ in layers] == [name for name, _ in LAYERS]
    assert layers[-1][0] == OUTPUT_LAYER
    shapes = dict((name, value.shape) for name, value in layers)
    assert shapes["stem"] == (5, 4, 4, 4) and shapes["block3"] == (5, 1, 1, 8)
    assert shapes["hidden"] == (5, 16)
    one = SMALL.activations_one(params, {"image": x["image"][0]})
    assert [(n, v.shape) for n, v in one] == [(n, s[1:]) for n, s in shapes.items()]


def test_a_rows_output_depends_on_that_row_alone(params):
    x = _images(6)
    other = {"image": x["image"].at[1:].set(_images(5, seed=7)["image"] * 100.0)}
    together = np.asarray(SMALL.forward_batch(params, x))
    np.testing.assert_array_equal(np.asarray(SMALL.forward_batch(params, other))[0], together[0])
    alone = np.asarray(SMALL.forward_batch(params, {"image": x["image"][:1]}))
    np.testing.assert_allclose(alone[0], together[0], rtol=1e-5, atol=1e-6)
    one = np.asarray(SMALL.forward_one(params, {"image": x["image"][0]}))
    np.testing.assert_allclose(one, together[0], rtol=1e-5, atol=1e-6)


def test_every_batched_path_agrees_with_the_plain_path(params):
    x = _images(4)
    built = build(SMALL, jnp.float32, "batch")
    assert set(built) == set(path_names("batch"))  # direct included: forward_batch exists
    want = np.asarray(built[plain_path()](params, x))
    for name, fn in built.items():
        np.testing.assert_allclose(np.asarray(fn(params, x)), want, 1e-5, 1e-6, err_msg=name)


@pytest.mark.parametrize("value", [0.0, float(np.sqrt(np.finfo(np.float32).max))])
def test_zero_and_large_magnitude_images_give_finite_outputs(params, value):
    # The normalization divides by a mean absolute deviation (no square to overflow) plus
    # an epsilon (a constant image has none).
    x = {"image": jnp.full((2, 8, 8, 3), value, jnp.float32).at[1].multiply(-1.0)}
    assert bool(jnp.all(jnp.isfinite(SMALL.forward_batch(params, x))))


def test_init_is_a_function_of_the_key(params):
    again = SMALL.init(jax.random.key(0))
    other = SMALL.init(jax.random.key(1))
    leaves, again_leaves = jax.tree.leaves(params), jax.tree.leaves(again)
    assert all(np.array_equal(a, b) for a, b in zip(leaves, again_leaves, strict=True))
    assert not np.array_equal(params["hidden"]["W"], other["hidden"]["W"])


def test_a_side_that_three_halvings_do_not_divide_is_refused():
    with pytest.raises(ValueError, match="side=12: expected a multiple of 8"):
        make_model(side=12, channels_in=3, widths=[4, 4, 8], hidden=16, out_features=3)
    with pytest.raises(ValueError, match="three channel counts"):
        make_model(side=8, channels_in=3, widths=[4, 8], hidden=16, out_features=3)
