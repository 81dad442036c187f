"""State leaves in the params contract (docs/state-leaves.md): a model declares the params
leaves that are state (``Model.state_leaves``: running statistics, int32 counters); training
differentiates and steps only the other, float, leaves; the params file keeps every leaf.

Real JAX, no mocks: a plain-JAX model with a normalization layer's running statistics and
an int32 counter, and the shipped Haiku ConvNet (skipped without ``pip install -e
'.[haiku]'``), whose Haiku state holds the int32 ``counter`` leaves that crashed ``jax.grad``
before they could be declared.
"""

from __future__ import annotations

import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.inprocess import run_stage, write_params
from vmapcheck.core.forms import cast_tree
from vmapcheck.core.gradients import gradient_probe
from vmapcheck.core.models import Model
from vmapcheck.core.state import covers, partition
from vmapcheck.core.training import fit
from vmapcheck.errors import ConfigError
from vmapcheck.layout import Layout
from vmapcheck.params_io import leaf_paths, load_params, save_params

IN, OUT = 4, 2
# The plain model's state: both running statistics and the counter of their updates.
STATE = ("norm.mean", "norm.var", "norm.count")


def _init(key: jax.Array) -> dict:
    w_key, mean_key = jax.random.split(key)
    return {
        "dense": {
            "W": jax.random.normal(w_key, (IN, OUT), jnp.float32) * 0.5,
            "b": jnp.zeros((OUT,), jnp.float32),
        },
        "norm": {
            "mean": jax.random.normal(mean_key, (IN,), jnp.float32),
            "var": jnp.full((IN,), 2.0, jnp.float32),
            "count": jnp.array(7, jnp.int32),
        },
    }


def _forward_one(params: dict, x: jax.Array) -> jax.Array:
    """x (IN,) -> (OUT,): normalized with the running statistics, then affine."""
    norm = params["norm"]
    h = (x - norm["mean"]) / jnp.sqrt(norm["var"] + jnp.float32(1e-5))
    return h @ params["dense"]["W"] + params["dense"]["b"]


def _model(state_leaves: tuple[str, ...] = STATE) -> Model:
    return Model(
        name="normed",
        in_features=IN,
        out_features=OUT,
        forward_one=_forward_one,
        init=_init,
        state_leaves=state_leaves,
    )


def _splits(rows: int = 96) -> dict:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, IN)).astype(np.float32)
    y = np.tanh(x[:, :OUT]).astype(np.float32)
    third = rows // 3
    return {
        "train": (x[:third], y[:third]),
        "val": (x[third : 2 * third], y[third : 2 * third]),
        "test": (x[2 * third :], y[2 * third :]),
    }


TRAIN = compose_config("train.steps=20", "train.eval_every=5").train


def test_an_undeclared_int_leaf_is_refused_before_training_naming_the_leaf_and_its_dtype():
    model = _model(state_leaves=("norm.mean", "norm.var"))
    with pytest.raises(ConfigError) as refused:
        fit(model, _init(jax.random.key(0)), _splits(), TRAIN, jax.random.key(1))
    message = str(refused.value)
    assert "params leaf 'norm.count' has dtype int32" in message
    assert "state_leaves=('norm.count',)" in message and "docs/state-leaves.md" in message


def test_a_state_leaves_entry_that_covers_no_leaf_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"state_leaves entry 'norm\.mea' covers no params leaf"):
        partition(_model(state_leaves=("norm.mea", "norm.count")), _init(jax.random.key(0)))


def test_state_leaves_must_be_a_tuple_of_paths_not_one_string():
    with pytest.raises(ConfigError, match="state_leaves: expected a tuple of leaf paths"):
        _model(state_leaves="norm")  # type: ignore[arg-type]


def test_an_entry_covers_its_leaf_and_the_leaves_under_it_only():
    assert covers("norm", "norm.mean") and covers("norm.mean", "norm.mean")
    assert covers("layers", "layers[0].W") and not covers("norm", "normal.W")
    # A subtree's path declares every leaf under it.
    leaves = partition(_model(state_leaves=("norm",)), _init(jax.random.key(0)))
    assert set(leaves.state_names) == set(STATE)
    assert set(leaves.trainable_names) == {"dense.W", "dense.b"}


def test_training_keeps_state_leaves_bit_identical_and_changes_the_trainable_ones():
    model = _model()
    params = _init(jax.random.key(0))
    trained, metrics = fit(model, params, _splits(), TRAIN, jax.random.key(1))
    assert metrics["trained"] and metrics["best_step"] > 0
    before, after = leaf_paths(params), leaf_paths(trained)
    for name in STATE:
        assert after[name].dtype == before[name].dtype, name
        np.testing.assert_array_equal(np.asarray(after[name]), np.asarray(before[name]), name)
    for name in ("dense.W", "dense.b"):
        assert not np.array_equal(np.asarray(after[name]), np.asarray(before[name])), name


def test_gradients_are_probed_for_the_trainable_leaves_only():
    model = _model()
    params = _init(jax.random.key(0))
    x, y = _splits()["train"]
    arrays, record = gradient_probe(model, params, jnp.asarray(x), jnp.asarray(y))
    assert record["grads_finite"] and record["per_example_finite"]
    assert sorted(arrays) == sorted(
        f"{kind}.{name}"
        for kind in ("batch_grad", "per_example_mean")
        for name in ("dense.W", "dense.b")
    )


def test_casting_to_the_run_precision_keeps_int_state_leaves_int(tmp_path):
    params = _init(jax.random.key(0))
    cast = leaf_paths(cast_tree(params, jnp.bfloat16))
    assert cast["norm.count"].dtype == jnp.int32 and cast["dense.W"].dtype == jnp.bfloat16
    # The params file keeps every leaf, state included, with its dtype.
    save_params(tmp_path, params, {})
    template = jax.eval_shape(_init, jax.random.key(0))
    loaded, manifest = load_params(tmp_path, template)
    assert manifest["contract"]["norm.count"] == {"shape": [], "dtype": "int32"}
    for name, leaf in leaf_paths(params).items():
        np.testing.assert_array_equal(np.asarray(leaf_paths(loaded)[name]), np.asarray(leaf))


# --- the shipped Haiku ConvNet ----------------------------------------------------------


@pytest.fixture(scope="module")
def haiku_model() -> Model:
    pytest.importorskip("haiku")
    from vmapcheck.examples.haiku_cnn import make_model

    return make_model(in_features=64, out_features=3, channels=2)


def _image_splits(rows: int = 48) -> dict:
    rng = np.random.default_rng(1)
    images = rng.uniform(0.0, 16.0, size=(rows, 8, 8, 1)).astype(np.float32)
    targets = np.eye(3, dtype=np.float32)[rng.integers(0, 3, rows)]
    third = rows // 3
    return {
        name: ({"image": images[i * third : (i + 1) * third]}, targets[i * third : (i + 1) * third])
        for i, name in enumerate(("train", "val", "test"))
    }


def test_haiku_state_folded_into_the_params_without_its_declaration_is_refused(haiku_model):
    undeclared = replace(haiku_model, state_leaves=())
    params = haiku_model.init(jax.random.key(0))
    with pytest.raises(ConfigError) as refused:
        fit(undeclared, params, _image_splits(), TRAIN, jax.random.key(1))
    message = str(refused.value)
    assert re.search(r"params leaf 'state\.bn1/~/mean_ema\.counter' has dtype int32", message)
    assert "state_leaves=(" in message


def test_haiku_training_steps_params_and_keeps_the_state_bit_identical(haiku_model):
    params = haiku_model.init(jax.random.key(0))
    before = leaf_paths(params)
    counters = [name for name in before if name.endswith(".counter")]
    assert len(counters) == 4 and all(before[n].dtype == jnp.int32 for n in counters)
    assert all(int(before[n]) > 0 for n in counters)  # the calibration step counted
    trained, metrics = fit(haiku_model, params, _image_splits(), TRAIN, jax.random.key(1))
    assert metrics["trained"] and metrics["best_step"] > 0
    after = leaf_paths(trained)
    for name, leaf in before.items():
        if name.startswith("state."):
            assert after[name].dtype == leaf.dtype, name
            np.testing.assert_array_equal(np.asarray(after[name]), np.asarray(leaf), name)
    assert not np.array_equal(
        np.asarray(after["params.conv1.w"]), np.asarray(before["params.conv1.w"])
    )


def test_haiku_forms_agree_row_by_row(haiku_model):
    params = haiku_model.init(jax.random.key(0))
    images = _image_splits()["train"][0]
    batched = np.asarray(haiku_model.forward_batch(params, images))
    looped = np.stack(
        [np.asarray(haiku_model.forward_one(params, {"image": row})) for row in images["image"]]
    )
    np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-6)


def test_the_key_stream_check_does_not_take_statistics_of_one_calibration_for_one_key(
    haiku_model,  # skips without haiku
):
    # A moving average's `average` and `hidden` are both computed from one calibration
    # batch: they correlate by design. Declared state is not a random draw.
    from vmapcheck.check.diagnosis.inputs import key_stream_stage
    from vmapcheck.examples.haiku_cnn import make_model

    # Eight channels: the statistics have as many values as the check needs to compare.
    stage = key_stream_stage(make_model(in_features=64, out_features=3, channels=8), 0)
    assert stage["status"] == "ruled_out", stage["summary"]


@pytest.mark.stages
def test_the_train_stage_refuses_undeclared_haiku_state_naming_the_leaf(
    haiku_model, tmp_path, capsys
):
    # The user's report: Haiku's state folded into the params, nothing declared. The real
    # train stage stops before training with the leaf named, not a traceback from grad.
    write_params(
        tmp_path,
        "data=digits",
        "model=haiku_cnn",
        "model.factory._target_=tests.helpers.state_faults.make_model",
        "data.standard_batch=8",
        "train.steps=2",
    )
    assert run_stage(tmp_path, "prepare") == 0
    capsys.readouterr()
    assert run_stage(tmp_path, "train") == 2
    err = capsys.readouterr().err
    assert "train: error: model 'haiku_cnn': params leaf 'state.bn1/~/mean_ema.counter' " in err
    assert "has dtype int32" in err and "state_leaves=('state',)" in err
    assert "Traceback" not in err
    assert not Layout(tmp_path).params_manifest.exists()
