"""The shipped "bring your own model" examples (Flax NNX, Equinox) and the factory contract.

Each example is built exactly as the pipeline builds it: compose ``model=<name>``, then
``vmapcheck.core.models.build_model``. The examples' tests skip when their framework is not
installed (``pip install -e '.[flax]'`` / ``'.[equinox]'``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from vmapcheck.config import ModelConfig, ToleranceConfig
from vmapcheck.core.compare import all_pairs
from vmapcheck.core.models import Model, build_model
from vmapcheck.core.paths import build_paths, not_provided, path_names
from vmapcheck.core.training import fit, make_loss
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.params_io import leaf_paths, load_model_params, save_params

# example -> (the framework it needs, the pip extra that installs it)
FRAMEWORKS = {"flax_mlp": ("flax", "flax"), "equinox_mlp": ("equinox", "equinox")}
EXAMPLES = sorted(FRAMEWORKS)
F32_PATHS = ToleranceConfig(rtol=1e-5, atol=1e-6)
ALL_PATHS = set(path_names("batch"))


def _require(example: str) -> None:
    module, extra = FRAMEWORKS[example]
    pytest.importorskip(
        module,
        reason=f"{module} is not installed: pip install -e '.[{extra}]' to test {example}",
    )


def _model(example: str) -> Model:
    _require(example)
    return build_model(compose_config(f"model={example}").model)


@pytest.fixture(params=EXAMPLES)
def example(request) -> str:
    return request.param


@pytest.fixture
def model(example) -> Model:
    return _model(example)


def _batch(model: Model, rows: int = 7, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(rows, model.in_features)), dtype=jnp.float32)


def _assert_trees_equal(a, b) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    named_a, named_b = leaf_paths(a), leaf_paths(b)
    assert list(named_a) == list(named_b)
    for name in named_a:
        np.testing.assert_array_equal(np.asarray(named_a[name]), np.asarray(named_b[name]))


# --- the examples ----------------------------------------------------------------------


def test_builds_with_the_configured_name_and_widths(example, model):
    assert model.name == example
    assert (model.in_features, model.out_features) == (8, 2)
    assert model.outputs() == ("y0", "y1")
    assert model.trainable and model.description


def test_init_is_deterministic_from_the_key_and_differs_across_keys(model):
    first = model.init(jax.random.key(0))
    _assert_trees_equal(first, model.init(jax.random.key(0)))
    other = model.init(jax.random.key(1))
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(first)
    differ = [
        name
        for name, leaf in leaf_paths(first).items()
        if not np.array_equal(leaf, leaf_paths(other)[name])
    ]
    assert differ, "params from key 0 and key 1 are identical"


def test_params_are_float32_arrays_with_readable_unique_leaf_names(example, model):
    params = model.init(jax.random.key(0))
    named = leaf_paths(params)
    weight = {"flax_mlp": "kernel", "equinox_mlp": "weight"}[example]
    assert sorted(named) == sorted(
        f"layers[{i}].{leaf}" for i in range(3) for leaf in (weight, "bias")
    )
    assert all(leaf.dtype == jnp.float32 for leaf in named.values())
    # The loader's template: same structure, shapes and dtypes, computed abstractly.
    template = jax.eval_shape(model.init, jax.random.key(0))
    assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(params)
    for name, leaf in leaf_paths(template).items():
        assert (leaf.shape, leaf.dtype) == (named[name].shape, named[name].dtype), name


def test_forward_one_gives_one_float32_output_vector(model):
    params = model.init(jax.random.key(0))
    out = model.forward_one(params, _batch(model)[0])
    assert out.shape == (model.out_features,)
    assert out.dtype == jnp.float32


def test_every_harness_path_agrees(example, model):
    params = model.init(jax.random.key(0))
    batch = _batch(model)
    paths = build_paths(model, jnp.float32)
    outputs = {name: np.asarray(path(params, batch)) for name, path in paths.items()}
    for name, out in outputs.items():
        assert out.shape == (7, model.out_features) and out.dtype == np.float32, name
    failed = {
        pair: r["reason"] for pair, r in all_pairs(outputs, F32_PATHS).items() if not r["passed"]
    }
    assert not failed, failed
    if example == "flax_mlp":
        assert set(paths) == ALL_PATHS
        assert not_provided(model) == {}
    else:  # Equinox modules take one vector: no hand-batched forward, never faked
        assert model.forward_batch is None
        assert set(paths) == ALL_PATHS - {"direct_eager", "direct_jit"}
        missing = not_provided(model)
        assert set(missing) == {"direct_eager", "direct_jit"}
        assert all("forward_batch" in reason for reason in missing.values())


def test_params_round_trip_through_safetensors(model, tmp_path):
    params = model.init(jax.random.key(3))
    manifest = save_params(tmp_path, jax.device_get(params), {})
    assert set(manifest["contract"]) == set(leaf_paths(params))
    loaded, _ = load_model_params(model, tmp_path)
    _assert_trees_equal(loaded, params)
    batch = _batch(model)
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(model.forward_one, in_axes=(None, 0))(loaded, batch)),
        np.asarray(jax.vmap(model.forward_one, in_axes=(None, 0))(params, batch)),
    )


def test_flax_params_are_refused_for_the_equinox_model(tmp_path):
    flax_model, equinox_model = _model("flax_mlp"), _model("equinox_mlp")
    save_params(tmp_path, jax.device_get(flax_model.init(jax.random.key(0))), {})
    with pytest.raises(ArtifactError, match=r"leaf layers\[0\]\.(weight|kernel)"):
        load_model_params(equinox_model, tmp_path)


def _splits(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(120, 8)).astype(np.float32)
    y = np.tanh(x[:, :2]).astype(np.float32)
    return {"train": (x[:80], y[:80]), "val": (x[80:100], y[80:100]), "test": (x[100:], y[100:])}


def test_training_lowers_the_validation_loss(example, model):
    config = compose_config(f"model={example}", "train.steps=20", "train.eval_every=10")
    params = model.init(jax.random.key(0))
    splits = _splits()
    before = float(make_loss(model)(params, *splits["val"]))
    chosen, metrics = fit(model, params, splits, config.train, jax.random.key(1))
    assert metrics["trained"] and metrics["best_step"] > 0
    assert metrics["val_loss"] < before
    assert np.isfinite(metrics["test_loss"])
    assert jax.tree_util.tree_structure(chosen) == jax.tree_util.tree_structure(params)


def test_jit_of_vmap_traces_once_for_two_calls_of_one_shape(model):
    params = model.init(jax.random.key(0))
    traces = []

    def counted(p, x):
        traces.append(x.shape)  # runs only while tracing
        return model.forward_one(p, x)

    batched = jax.jit(jax.vmap(counted, in_axes=(None, 0)))
    first = batched(params, _batch(model, seed=1))
    second = batched(params, _batch(model, seed=2))
    assert len(traces) == 1
    assert first.shape == second.shape == (7, model.out_features)
    assert not np.array_equal(np.asarray(first), np.asarray(second))


@pytest.mark.parametrize("hidden", [[], [16, 4]], ids=["no-hidden", "unequal-widths"])
def test_other_widths_build_and_agree(example, hidden, tmp_path):
    _require(example)
    config = ModelConfig(
        name=example,
        in_features=5,
        hidden=hidden,
        out_features=3,
        factory={
            "_target_": f"vmapcheck.examples.{example}.make_model",
            "in_features": 5,
            "hidden": hidden,
            "out_features": 3,
        },
    )
    model = build_model(config)
    params = model.init(jax.random.key(0))
    assert len(leaf_paths(params)) == 2 * (len(hidden) + 1)
    rows = _batch(model)
    outputs = {n: np.asarray(p(params, rows)) for n, p in build_paths(model, jnp.float32).items()}
    assert all(out.shape == (7, 3) for out in outputs.values())
    assert all(r["passed"] for r in all_pairs(outputs, F32_PATHS).values())
    save_params(tmp_path, jax.device_get(params), {})
    _assert_trees_equal(load_model_params(model, tmp_path)[0], params)


# --- the factory contract --------------------------------------------------------------


def wrong_type_factory(in_features: int, out_features: int) -> dict:
    """Returns a dict, not a Model."""
    return {"in_features": in_features, "out_features": out_features}


def wrong_widths_factory(in_features: int, out_features: int) -> Model:
    """Returns a Model one feature wider than configured."""
    return Model(
        name="bad",
        in_features=in_features + 1,
        out_features=out_features,
        forward_one=lambda params, x: x,
        init=lambda key: {},
    )


def _bad_config(target: str) -> ModelConfig:
    return ModelConfig(
        name="bad",
        in_features=3,
        hidden=[],
        out_features=2,
        factory={"_target_": f"tests.test_plugins.{target}", "in_features": 3, "out_features": 2},
    )


def test_a_factory_returning_something_else_is_refused():
    with pytest.raises(ConfigError, match=r"model\.factory\._target_=.*wrong_type_factory.*dict"):
        build_model(_bad_config("wrong_type_factory"))


def test_a_factory_building_other_widths_is_refused():
    with pytest.raises(ConfigError, match=r"model\.in_features=3 .*in_features=4"):
        build_model(_bad_config("wrong_widths_factory"))
