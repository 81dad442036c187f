"""The seed guide's example, reproduced exactly: three forms agree on the literal output."""

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.core.models import toy_forward_batch, toy_forward_one, toy_params
from vmapcheck.core.paths import build_paths

SEED_BATCH = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=np.float32)
SEED_OUTPUT = np.array([[0.1, 0.0], [0.3, 0.1], [0.5, 0.3], [0.7, 0.7]], dtype=np.float32)


def test_toy_params_are_the_seeds():
    params = toy_params()
    np.testing.assert_array_equal(params["W"], np.arange(6, dtype=np.float32).reshape(3, 2) / 10)
    np.testing.assert_array_equal(params["b"], np.array([0.1, -0.2], dtype=np.float32))
    assert params["W"].dtype == jnp.float32


def test_three_forms_give_the_literal_output():
    params = toy_params()
    batch = jnp.asarray(SEED_BATCH)
    batched = jax.vmap(toy_forward_one, in_axes=(None, 0))(params, batch)
    loop = jnp.stack([toy_forward_one(params, x) for x in batch])
    direct = toy_forward_batch(params, batch)
    assert batched.shape == (4, 2)
    for result in (batched, loop, direct):
        np.testing.assert_allclose(result, SEED_OUTPUT, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(batched, loop, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(batched, direct, rtol=1e-6, atol=1e-7)


def test_every_harness_path_reproduces_the_seed():
    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model
    from vmapcheck.core.paths import path_names

    model = build_model(ModelConfig(name="toy", in_features=3, hidden=[], out_features=2))
    paths = build_paths(model, jnp.float32)
    # Every batch path of the registry: the toy model provides them all.
    assert set(paths) == set(path_names("batch"))
    for name, path in paths.items():
        out = np.asarray(path(model.init(None), jnp.asarray(SEED_BATCH)))
        np.testing.assert_allclose(out, SEED_OUTPUT, rtol=1e-6, atol=1e-7, err_msg=name)
