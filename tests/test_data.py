"""Splits are disjoint and deterministic; regression cases are what they claim."""

import json

import numpy as np
import pytest

from tests.helpers.config import compose_config
from vmapcheck.core.keys import named_keys
from vmapcheck.data.regression import (
    load_cases,
    read_cases_manifest,
    regression_cases,
    write_cases,
)
from vmapcheck.data.splits import split_indices
from vmapcheck.errors import ArtifactError


@pytest.fixture(scope="module")
def config():
    return compose_config("data.n_rows=300")


def _assert_disjoint_and_complete(parts, n_rows):
    seen = np.concatenate(list(parts.values()))
    assert len(seen) == len(set(seen.tolist())) == n_rows
    for a in parts:
        for b in parts:
            if a != b:
                assert not set(parts[a].tolist()) & set(parts[b].tolist())


def test_splits_are_disjoint_cover_every_row_and_are_deterministic(config):
    groups = np.arange(300)
    parts = split_indices(named_keys(config.seed)["split"], groups, config.data)
    _assert_disjoint_and_complete(parts, 300)
    again = split_indices(named_keys(config.seed)["split"], groups, config.data)
    for name in parts:
        np.testing.assert_array_equal(parts[name], again[name])
    other = split_indices(named_keys(config.seed + 1)["split"], groups, config.data)
    assert not np.array_equal(parts["test"], other["test"])
    assert {k: v.size for k, v in parts.items()} == {"train": 210, "val": 45, "test": 45}


def test_no_record_lands_in_two_splits(config):
    # 100 records of 1 to 5 rows each, interleaved as a real table would have them.
    rng = np.random.default_rng(0)
    groups = rng.permutation(np.repeat(np.arange(100), rng.integers(1, 6, size=100)))
    parts = split_indices(named_keys(config.seed)["split"], groups, config.data)
    _assert_disjoint_and_complete(parts, groups.size)
    records = {name: set(groups[idx].tolist()) for name, idx in parts.items()}
    assert not records["train"] & records["val"]
    assert not records["train"] & records["test"]
    assert not records["val"] & records["test"]
    assert abs(parts["train"].size / groups.size - 0.7) < 0.05


def test_an_empty_split_is_an_error(config):
    with pytest.raises(ArtifactError, match=r"split 'val' is empty"):
        split_indices(named_keys(0)["split"], np.zeros(50, dtype=np.int64), config.data)


def test_regression_cases(tmp_path):
    rng = np.random.default_rng(0)
    train, test, test_y = (
        rng.normal(size=(50, 3)),
        rng.normal(size=(20, 3)),
        rng.normal(size=(20, 2)),
    )
    cases = regression_cases(train, test, test_y, standard_batch=8)
    kinds = {name: case["kind"] for name, case in cases.items()}
    assert [n for n, k in kinds.items() if k == "batch"] == ["standard", "single"]
    assert [n for n, k in kinds.items() if k == "edge"] == ["zeros", "boundary", "large_magnitude"]
    assert [n for n, k in kinds.items() if k == "vector"] == ["single_vector"]
    assert sorted(n for n, k in kinds.items() if k == "invalid") == sorted(
        [
            "invalid_features",
            "invalid_rank",
            "invalid_dtype",
            "invalid_nan",
            "invalid_inf",
            "invalid_empty",
            "invalid_vector",
        ]
    )
    assert cases["standard"]["x"].shape == (8, 3) and cases["standard"]["y"].shape == (8, 2)
    assert cases["single"]["x"].shape == (1, 3)
    np.testing.assert_array_equal(cases["single_vector"]["x"], cases["single"]["x"][0])
    assert not cases["zeros"]["x"].any()
    np.testing.assert_array_equal(cases["boundary"]["x"][0], train.min(axis=0).astype(np.float32))
    assert np.abs(cases["large_magnitude"]["x"]).min() == pytest.approx(1.84e19, rel=1e-2)
    assert cases["invalid_features"]["x"].shape == (4, 4)
    assert cases["invalid_features"]["expect"] == ["expected 3 features, got 4"]
    assert cases["invalid_dtype"]["x"].dtype == np.int32 and cases["invalid_dtype"]["cast"] is False
    assert cases["invalid_empty"]["x"].shape == (0, 3)
    assert cases["invalid_vector"]["runs_on"] == "vector"
    manifest = write_cases(tmp_path, cases)
    assert manifest["cases"]["invalid_nan"]["expect"][0].startswith("expected finite values")
    loaded = load_cases(tmp_path)
    np.testing.assert_array_equal(loaded["standard"]["x"], cases["standard"]["x"])
    np.testing.assert_array_equal(loaded["standard"]["y"], cases["standard"]["y"])
    assert "y" not in loaded["zeros"]


def test_a_modified_case_file_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(9, 2)), rng.normal(size=(9, 2))
    write_cases(tmp_path, regression_cases(train, test, test, 4))
    np.savez(tmp_path / "zeros.npz", x=np.ones((4, 2), np.float32))
    with pytest.raises(ArtifactError, match=r"zeros\.npz: sha256 check failed"):
        load_cases(tmp_path)


def test_a_manifest_missing_a_key_is_refused_naming_the_file_and_the_key(tmp_path):
    """The cases manifest is read back typed (read_cases_manifest): a case's entry
    without its kind, or one without its file, is refused with the file and the key's
    path, not a KeyError in the stage that reads it."""
    rng = np.random.default_rng(0)
    train, test = rng.normal(size=(9, 2)), rng.normal(size=(9, 2))
    manifest = write_cases(tmp_path, regression_cases(train, test, test, 4))
    path = tmp_path / "manifest.json"
    assert read_cases_manifest(path) == json.loads(path.read_text())  # the shape written
    assert set(manifest["cases"]["standard"]) == {
        "file",
        "sha256",
        "kind",
        "shape",
        "dtype",
        "has_targets",
        "about",
    }
    broken = json.loads(path.read_text())
    del broken["cases"]["zeros"]["kind"]
    path.write_text(json.dumps(broken))
    with pytest.raises(ArtifactError, match=r"manifest\.json: .* missing cases\.zeros\.kind"):
        load_cases(tmp_path)
    broken["cases"]["zeros"]["kind"] = "edge"
    del broken["cases"]["zeros"]["file"]
    path.write_text(json.dumps(broken))
    with pytest.raises(ArtifactError, match=r"case 'zeros' has no stored file: .*file and sha256"):
        load_cases(tmp_path)


def test_standard_batch_larger_than_the_test_split_is_an_error():
    with pytest.raises(ArtifactError, match=r"data\.standard_batch=10"):
        regression_cases(np.zeros((5, 2)), np.zeros((3, 2)), np.zeros((3, 1)), standard_batch=10)
