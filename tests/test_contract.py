"""The model's contract, and params verified before any use (sha256, format, leaves)."""

import pickle

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.helpers.config import compose_config
from vmapcheck.config import validate_config
from vmapcheck.core.models import build_model
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import sha256_file
from vmapcheck.params_io import (
    check_features,
    leaf_paths,
    model_contract,
    read_params_file,
)

FEATURES = [f"x{i}" for i in range(8)]


@pytest.fixture
def model_and_file(tmp_path):
    model = build_model(compose_config().model)
    params = jax.device_get(model.init(jax.random.key(0)))
    path = tmp_path / "mine.safetensors"
    save_file({k: np.asarray(v) for k, v in leaf_paths(params).items()}, str(path))
    template = jax.eval_shape(model.init, jax.random.key(0))
    return model, params, path, template


def test_the_contract_states_params_inputs_and_outputs(model_and_file):
    model, params, _, _ = model_and_file
    contract = model_contract(model, params, FEATURES)
    assert contract["params"]["layers[1].W"] == {"shape": [32, 32], "dtype": "float32"}
    assert contract["inputs"]["features"] == FEATURES and contract["inputs"]["batch_axis"] == 0
    assert contract["outputs"]["names"] == ["y0", "y1"]
    assert contract["batched_forward"] is True


def test_a_users_params_file_is_verified_then_used(model_and_file):
    _, params, path, template = model_and_file
    loaded = read_params_file(path, template, sha256_file(path))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_flipped_byte_fails_the_checksum(model_and_file):
    _, _, path, template = model_and_file
    expected = sha256_file(path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=f"sha256 check failed: expected {expected}"):
        read_params_file(path, template, expected)


def test_a_pickle_is_refused_not_loaded(model_and_file, tmp_path):
    _, params, _, template = model_and_file
    path = tmp_path / "params.pkl"
    path.write_bytes(pickle.dumps(params))
    with pytest.raises(ArtifactError, match=r"not a safetensors file.*never unpickled"):
        read_params_file(path, template, sha256_file(path))


def test_one_leaf_of_the_wrong_shape_is_named(model_and_file, tmp_path):
    _, params, _, template = model_and_file
    arrays = {k: np.asarray(v) for k, v in leaf_paths(params).items()}
    arrays["layers[1].W"] = arrays["layers[1].W"][:, :31].copy()
    path = tmp_path / "wrong.safetensors"
    save_file(arrays, str(path))
    with pytest.raises(ArtifactError, match=r"leaf layers\[1\]\.W: expected shape \[32, 32\]"):
        read_params_file(path, template, sha256_file(path))


def test_features_in_another_order_are_refused(model_and_file):
    model, params, _, _ = model_and_file
    contract = model_contract(model, params, FEATURES)
    check_features(FEATURES, contract, "data/cases")
    swapped = [FEATURES[1], FEATURES[0], *FEATURES[2:]]
    with pytest.raises(ArtifactError, match="feature 0 is 'x1', the params contract expects 'x0'"):
        check_features(swapped, contract, "data/cases")
    with pytest.raises(ArtifactError, match="expected 8 features"):
        check_features(FEATURES[:7], contract, "data/cases")


def test_params_file_and_digest_go_together():
    raw = compose_config().model_dump()
    raw["train"]["params_file"] = "data/raw/mine.safetensors"
    with pytest.raises(ConfigError, match=r"params_file and train\.params_sha256 go together"):
        validate_config(raw)
    raw["train"]["params_sha256"] = "not-a-digest"
    with pytest.raises(ConfigError, match=r"train\.params_sha256"):
        validate_config(raw)
