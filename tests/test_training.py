"""Pure loss/update, and the test split never influences what is chosen."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers.config import compose_config
from vmapcheck.core.models import build_model
from vmapcheck.core.state import partition
from vmapcheck.core.training import fit, make_loss, make_optimizer, make_update


def _splits(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(120, 8)).astype(np.float32)
    y = np.tanh(x[:, :2]).astype(np.float32)
    return {"train": (x[:80], y[:80]), "val": (x[80:100], y[80:100]), "test": (x[100:], y[100:])}


def test_training_reduces_the_validation_loss():
    config = compose_config("train.steps=60", "train.eval_every=10")
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    splits = _splits()
    before = float(make_loss(model)(params, *splits["val"]))
    _, metrics = fit(model, params, splits, config.train, jax.random.key(1))
    assert metrics["trained"] and metrics["val_loss"] < before
    assert np.isfinite(metrics["test_loss"])


def test_the_test_split_does_not_influence_the_chosen_params():
    config = compose_config("train.steps=40", "train.eval_every=10")
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    splits = _splits()
    poisoned = dict(splits, test=(np.full_like(splits["test"][0], 1e6), splits["test"][1]))
    chosen, metrics = fit(model, params, splits, config.train, jax.random.key(1))
    chosen_p, metrics_p = fit(model, params, poisoned, config.train, jax.random.key(1))
    for a, b in zip(jax.tree.leaves(chosen), jax.tree.leaves(chosen_p), strict=True):
        np.testing.assert_array_equal(a, b)
    assert metrics["best_step"] == metrics_p["best_step"]
    assert metrics["test_loss"] != metrics_p["test_loss"]  # it was read, once, at the end


def test_update_is_pure_and_jit_compatible():
    config = compose_config()
    model = build_model(config.model)
    params = model.init(jax.random.key(0))
    optimizer = make_optimizer(config.train)
    leaves = partition(model, params)
    update = jax.jit(make_update(model, optimizer, leaves))
    x, y = _splits()["train"]
    state = optimizer.init(leaves.trainable(params))
    first = update(params, state, x, y)
    second = update(params, state, x, y)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jnp.isfinite(first[2])
