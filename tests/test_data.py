"""Splits are disjoint and deterministic; regression cases are what they claim."""

import numpy as np
import pytest

from tests.conftest import compose_config
from vmapcheck.data import load_cases, regression_cases, split_indices, synthetic_table, write_cases
from vmapcheck.errors import ArtifactError
from vmapcheck.keys import named_keys


@pytest.fixture(scope="module")
def config():
    return compose_config("data.n_rows=300")


def test_splits_are_disjoint_cover_every_row_and_are_deterministic(config):
    keys = named_keys(config.seed)
    parts = split_indices(keys["split"], config.data.n_rows, config.data)
    seen = np.concatenate(list(parts.values()))
    assert len(seen) == len(set(seen.tolist())) == config.data.n_rows
    for a in parts:
        for b in parts:
            if a != b:
                assert not set(parts[a].tolist()) & set(parts[b].tolist())
    again = split_indices(named_keys(config.seed)["split"], config.data.n_rows, config.data)
    for name in parts:
        np.testing.assert_array_equal(parts[name], again[name])
    assert {k: v.size for k, v in parts.items()} == {"train": 210, "val": 45, "test": 45}


def test_table_is_deterministic_from_the_seed(config):
    a = synthetic_table(named_keys(0)["data"], config.data)
    b = synthetic_table(named_keys(0)["data"], config.data)
    c = synthetic_table(named_keys(1)["data"], config.data)
    np.testing.assert_array_equal(a.features, b.features)
    assert not np.array_equal(a.features, c.features)
    assert a.features.shape == (300, config.data.n_features)
    assert a.targets.shape == (300, config.data.n_targets)


def test_regression_cases(tmp_path):
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(50, 3)), rng.normal(size=(20, 3))
    cases = regression_cases(train, test, standard_batch=8)
    assert set(cases) == {"standard", "single", "zeros", "boundary", "invalid_shape"}
    assert cases["standard"]["x"].shape == (8, 3)
    assert cases["single"]["x"].shape == (1, 3)
    assert not cases["zeros"]["x"].any()
    np.testing.assert_array_equal(cases["boundary"]["x"][0], train.min(axis=0).astype(np.float32))
    assert cases["invalid_shape"]["x"].shape == (4, 4) and not cases["invalid_shape"]["valid"]
    assert cases["invalid_shape"]["expect"] == "expected 3 features, got 4"
    write_cases(tmp_path, cases)
    loaded = load_cases(tmp_path)
    np.testing.assert_array_equal(loaded["standard"]["x"], cases["standard"]["x"])


def test_a_modified_case_file_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    write_cases(tmp_path, regression_cases(rng.normal(size=(9, 2)), rng.normal(size=(9, 2)), 4))
    np.savez(tmp_path / "zeros.npz", x=np.ones((4, 2), np.float32))
    with pytest.raises(ArtifactError, match=r"zeros\.npz: sha256 check failed"):
        load_cases(tmp_path)


def test_standard_batch_larger_than_the_test_split_is_an_error():
    with pytest.raises(ArtifactError, match=r"data\.standard_batch=10"):
        regression_cases(np.zeros((5, 2)), np.zeros((3, 2)), standard_batch=10)
