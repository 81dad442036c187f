"""The seed's listed mistakes, refused: params mapped over axis 0, a reused PRNG key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.errors import KeyReuseError

from tests.helpers.config import compose_config
from vmapcheck.config import ModelConfig
from vmapcheck.core.forms import batched_forward
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import build_model
from vmapcheck.core.training import fit
from vmapcheck.data.builtin import synthetic_raw_table
from vmapcheck.data.splits import split_indices
from vmapcheck.errors import InvalidInputError


@pytest.fixture(scope="module")
def mlp():
    # Hidden width 8 = in_features: the first weight is (8, 8), so a batch of 8 rows
    # lets a wrong in_axes run silently in plain JAX.
    model = build_model(ModelConfig(name="mlp", in_features=8, hidden=[8], out_features=2))
    return model, model.init(jax.random.key(0))


def test_params_mapped_over_axis_0_are_refused_with_the_fix(mlp):
    model, params = mlp
    with pytest.raises(InvalidInputError) as info:
        batched_forward(model, params, in_axes=(0, 0))
    message = str(info.value)
    assert "params have no batch copies" in message
    assert "leaf layers[0].W has shape (8, 8)" in message
    assert "in_axes=(None, 0)" in message


def test_per_example_params_with_a_batch_axis_may_be_mapped(mlp):
    model, params = mlp
    copies = jax.tree.map(lambda leaf: jnp.stack([leaf] * 3), params)
    x = jnp.ones((3, 8))
    out = batched_forward(model, copies, in_axes=(0, 0))(copies, x)
    np.testing.assert_allclose(out, batched_forward(model, params)(params, x), rtol=1e-6)


def test_a_reused_key_is_caught():
    with jax.debug_key_reuse(True):
        key = named_keys(0)["data"]
        jax.random.normal(key, (2,))
        with pytest.raises(KeyReuseError, match="Previously-consumed key"):
            jax.random.uniform(key, (2,))


def test_the_pipelines_random_work_uses_every_key_once():
    config = compose_config("data.n_rows=100", "train.steps=10", "train.eval_every=5")
    with jax.debug_key_reuse(True):
        keys = named_keys(config.seed)
        raw = synthetic_raw_table(
            keys["data"], 100, 8, 2, 0.1, {"birth_date": "year", "postcode": "prefix2"}
        )
        parts = split_indices(keys["split"], np.arange(100), config.data)
        model = build_model(config.model)
        splits = {n: (raw.features[i], raw.targets[i]) for n, i in parts.items()}
        fit(model, model.init(keys["init"]), splits, config.train, keys["batches"])


@pytest.mark.parametrize(
    "in_axes,found", [(0, "int 0"), ((None, 0, 0), "tuple (None, 0, 0)"), ("0", "str '0'")]
)
def test_in_axes_that_is_not_a_pair_is_refused(mlp, in_axes, found):
    # in_axes=0 used to fail inside batched_forward with "'int' object is not subscriptable".
    model, params = mlp
    with pytest.raises(InvalidInputError) as info:
        batched_forward(model, params, in_axes=in_axes)
    assert str(info.value).startswith("in_axes: expected a pair (params axis, input axis)")
    assert str(info.value).endswith(f"got {found}") and info.value.reason == "in_axes"
    with pytest.raises(InvalidInputError, match=r"^in_axes\[0\]: expected None .* got str"):
        batched_forward(model, params, in_axes=("0", 0))
    assert batched_forward(model, params, in_axes=[None, 0])(params, jnp.ones((2, 8))).shape == (
        2,
        2,
    )


def _init_reusing_one_key(key):
    """A plug-in's init that feeds one key object to two draws (the reuse checker sees it)."""
    w0 = jax.random.normal(key, (8, 8), dtype=jnp.float32)
    w1 = jax.random.normal(key, (8, 2), dtype=jnp.float32)
    return {
        "layers": [
            {"W": w0, "b": jnp.zeros((8,), jnp.float32)},
            {"W": w1, "b": jnp.zeros((2,), jnp.float32)},
        ]
    }


def test_a_key_reused_by_object_in_init_is_refused_naming_the_leaves(mlp, tmp_path, capsys):
    from dataclasses import replace

    from tests.helpers.inprocess import write_params
    from vmapcheck.pipeline.stage import run_stage
    from vmapcheck.pipeline.train import _init

    model = replace(mlp[0], init=_init_reusing_one_key)
    with jax.debug_key_reuse(True), pytest.raises(KeyReuseError) as info:
        _init(model, named_keys(0)["init"], 0)
    assert info.value.shared_by == (
        "model 'mlp': init draws params leaf layers[1].W with the key already used for leaf "
        "layers[0].W"
    )

    def body(config, layout):
        with jax.debug_key_reuse(True):
            _init(model, named_keys(config.seed)["init"], config.seed)

    write_params(tmp_path)
    assert run_stage("train", body, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith("train: error: a PRNG key was used twice (")
    assert "; model 'mlp': init draws params leaf layers[1].W with the key already used" in err


@pytest.mark.parametrize(
    "input_axis,found", [(2, "int 2"), (-3, "int -3"), (None, "NoneType None"), ("0", "str '0'")]
)
def test_an_input_axis_that_no_batch_has_is_refused_when_batched_forward_is_built(
    mlp, input_axis, found
):
    # It used to be handed to jax.vmap, which failed only at the call (or at once with its
    # own ValueError), naming no argument.
    model, params = mlp
    with pytest.raises(InvalidInputError) as info:
        batched_forward(model, params, in_axes=(None, input_axis))
    assert str(info.value) == (
        "in_axes[1]: expected the batch axis of the input, an int in [-2, 1] (0: the batch "
        f"on axis 0), got {found}"
    )
    x = jnp.arange(16.0, dtype=jnp.float32).reshape(2, 8)
    np.testing.assert_allclose(
        batched_forward(model, params, in_axes=(None, 1))(params, x.T),
        batched_forward(model, params)(params, x),
        rtol=1e-6,
    )


def test_a_leaf_given_as_a_python_list_is_refused_for_its_type():
    # A list of bools passed the bool leaf's dtype check, then vmap mapped it as a pytree
    # of Python scalars and failed inside JAX (found by tests/test_properties.py).
    from vmapcheck.core.contract import InputSpec, Leaf

    spec = InputSpec((Leaf("ids", (2,), "int32", vocab=3), Leaf("mask", (2,), "bool")))
    batch = {"ids": np.zeros((1, 2), np.int32), "mask": [[True, False]]}
    with pytest.raises(InvalidInputError) as info:
        spec.validate_batch(batch, jnp.float32)
    assert info.value.reason == "type"
    assert str(info.value) == (
        "leaf 'mask': expected a plain array, got a list, not an array: pass np.asarray(...) "
        "with the contract's dtype"
    )


def test_leaves_committed_to_different_devices_are_refused_naming_them():
    # JAX refused to compute with them together ("incompatible devices"), naming no leaf
    # (found by tests/test_properties.py).
    from vmapcheck.core.contract import InputSpec, Leaf

    first, second = jax.devices()[:2]
    spec = InputSpec((Leaf("x", (2,), "float"), Leaf("mask", (2,), "bool")))
    batch = {
        "x": jax.device_put(np.zeros((1, 2), np.float32), first),
        "mask": jax.device_put(np.ones((1, 2), bool), second),
    }
    with pytest.raises(InvalidInputError) as info:
        spec.validate_batch(batch, jnp.float32)
    assert info.value.reason == "devices"
    assert (
        str(info.value)
        == f"expected every leaf on the same device(s), got x: {first}, mask: {second}"
    )
    # A numpy leaf (uncommitted) goes wherever the committed ones are.
    spec.validate_batch({**batch, "x": np.zeros((1, 2), np.float32)}, jnp.float32)


def test_ctrl_c_in_a_stage_is_one_line_and_the_shells_exit_code(tmp_path, capsys):
    from tests.helpers.inprocess import write_params
    from vmapcheck.errors import INTERRUPTED
    from vmapcheck.io import read_json
    from vmapcheck.layout import Layout
    from vmapcheck.pipeline.stage import run_stage

    def body(config, layout):
        raise KeyboardInterrupt

    write_params(tmp_path)
    assert run_stage("bench", body, tmp_path) == INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "bench: interrupted (Ctrl-C); no output of this stage is half-written, and "
        "`dvc repro` runs it again"
    ]
    # The stage's time record says how it ended.
    record = read_json(Layout(tmp_path).stage_time("bench"))
    assert record["exit_code"] == INTERRUPTED
    assert record["error"].startswith("Interrupted: interrupted (Ctrl-C)")
