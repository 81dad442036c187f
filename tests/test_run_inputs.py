"""What a run was made from: full-array digests, datasets in a real MLflow store,
provenance tags and the environment folder."""

from __future__ import annotations

import json

import mlflow.data
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from vmapcheck.data.regression import SPLITS, regression_cases, write_cases
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_save_npz, sha256_file
from vmapcheck.layout import Layout
from vmapcheck.tracking.run_inputs import (
    DIGEST_FIELD_CHARS,
    array_digest,
    gather_run_inputs,
    local_source,
    lock_check,
    provenance_tags,
    write_environment,
)


def test_our_digest_sees_a_change_after_element_10000_where_mlflows_does_not():
    a = np.zeros((3000, 5), dtype=np.float32)  # 15,000 values
    b = a.copy()
    b[2500, 3] = 1.0  # flat index 12,503: past MLflow's first 10,000 values
    assert array_digest({"features": a}) != array_digest({"features": b})
    ours = mlflow.data.from_numpy(a, source=local_source("a.npz")).digest
    theirs = mlflow.data.from_numpy(b, source=local_source("b.npz")).digest
    assert ours == theirs  # MLflow's own digest cannot tell them apart
    c = a.copy()
    c[0, 1] = 1.0  # within the first 10,000: both notice
    assert mlflow.data.from_numpy(c, source=local_source("c.npz")).digest != ours


def test_our_digest_covers_dtype_shape_and_names():
    x = np.arange(12, dtype=np.float32)
    base = array_digest({"features": x})
    assert array_digest({"features": x.copy()}) == base
    assert array_digest({"features": x.reshape(3, 4)}) != base  # same bytes, other shape
    assert array_digest({"features": x.view(np.int32)}) != base  # same bytes, other dtype
    assert array_digest({"targets": x}) != base
    assert array_digest({"features": x, "targets": x[:2]}) != base
    assert len(base) == 64 and int(base, 16) >= 0
    with pytest.raises(ArtifactError, match="array 'x': expected a numeric dtype, got object"):
        array_digest({"x": np.array([{"a": 1}], dtype=object)})


def _project(root):
    """A project folder as prepare leaves it: data/cases and data/prepared/<split>.npz."""
    rng = np.random.default_rng(0)
    splits = {
        name: (
            rng.normal(size=(rows, 3)).astype(np.float32),
            rng.normal(size=(rows, 2)).astype(np.float32),
        )
        for name, rows in zip(SPLITS, (40, 10, 12), strict=True)
    }
    for name, (x, y) in splits.items():
        # The row index and kept columns are in the file too: never logged as a dataset.
        atomic_save_npz(
            root / "data" / "prepared" / f"{name}.npz",
            {"features": x, "targets": y, "row": np.arange(len(x))},
        )
    cases = regression_cases(splits["train"][0], *splits["test"], standard_batch=8)
    write_cases(root / "data" / "cases", cases, ["a", "b", "c"])
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (root / "requirements.lock").write_text(f"numpy=={np.__version__}\n")
    return cases, splits


def test_the_regression_set_and_splits_reach_a_real_store_as_datasets(tmp_path, empty_mlflow_store):
    root = tmp_path / "project"
    cases, splits = _project(root)
    inputs = gather_run_inputs(Layout(root), tmp_path / "scratch", env={"DVC_EXP_NAME": "my-exp"})
    client = MlflowClient(tracking_uri=empty_mlflow_store(tmp_path / "mlflow.db"))
    experiment = client.create_experiment("t", artifact_location=(tmp_path / "a").as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_inputs(run_id, datasets=inputs.datasets)

    logged = {d.dataset.name: d for d in client.get_run(run_id).inputs.dataset_inputs}
    assert set(logged) == {f"cases/{c}" for c in cases} | {f"splits/{s}" for s in SPLITS}
    for name, case in cases.items():
        entry = logged[f"cases/{name}"]
        tags = {t.key: t.value for t in entry.tags}
        arrays = {"features": case["x"], **({"targets": case["y"]} if "y" in case else {})}
        assert tags["sha256"] == array_digest(arrays)
        assert entry.dataset.digest == tags["sha256"][:DIGEST_FIELD_CHARS]
        assert tags["mlflow.data.context"] == "regression" and tags["kind"] == case["kind"]
        assert tags["file_sha256"] == sha256_file(root / "data" / "cases" / f"{name}.npz")
        assert json.loads(entry.dataset.source) == {"uri": f"data/cases/{name}.npz"}
        profile = json.loads(entry.dataset.profile)
        assert profile["features_shape"] == list(case["x"].shape)
        assert ("targets_shape" in profile) == ("y" in case)
    for name, (x, y) in splits.items():
        entry = logged[f"splits/{name}"]
        tags = {t.key: t.value for t in entry.tags}
        assert tags["sha256"] == array_digest({"features": x, "targets": y})
        assert tags["mlflow.data.context"] == name
        # Dtypes and shapes only: the row index (and any kept column) is not logged.
        stats = ("shape", "size", "nbytes")
        assert set(json.loads(entry.dataset.profile)) == {
            f"{part}_{stat}" for part in ("features", "targets") for stat in stats
        }
        assert "row" not in entry.dataset.schema
    assert inputs.tags["dvc_exp_name"] == "my-exp"
    assert inputs.tags["dvc_lock_sha256"] == sha256_file(root / "dvc.lock")
    assert inputs.tags["environment.matches_lock"] == "true"
    assert sorted(p.name for p in inputs.environment.iterdir()) == [
        "lock-mismatches.txt",
        "pip-freeze.txt",
        "requirements.lock",
    ]


def test_a_tampered_case_file_is_refused_before_anything_is_logged(tmp_path):
    root = tmp_path / "project"
    _project(root)
    atomic_save_npz(root / "data" / "cases" / "zeros.npz", {"x": np.ones((4, 3), np.float32)})
    with pytest.raises(ArtifactError, match=r"zeros\.npz: sha256 check failed"):
        gather_run_inputs(Layout(root), tmp_path / "scratch", env={})
    (root / "data" / "cases" / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"manifest\.json: not found; has the prepare stage"):
        gather_run_inputs(Layout(root), tmp_path / "scratch", env={})


def test_provenance_tags(tmp_path):
    assert provenance_tags(Layout(tmp_path), env={}) == {"dvc_lock_sha256": "missing"}
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    tags = provenance_tags(
        Layout(tmp_path), env={"DVC_EXP_NAME": "f64-exp", "DVC_EXP_BASELINE_REV": "a" * 40}
    )
    assert tags == {
        "dvc_lock_sha256": sha256_file(tmp_path / "dvc.lock"),
        "dvc_exp_name": "f64-exp",
        "dvc_exp_baseline_rev": "a" * 40,
    }
    assert "dvc_exp_name" not in provenance_tags(Layout(tmp_path), env={"DVC_EXP_NAME": " "})


def test_pins_the_interpreter_does_not_have_are_listed(tmp_path):
    lock = "\n".join(
        [
            "# comment",
            f"numpy=={np.__version__}",
            f"NumPy=={np.__version__}  # names are matched case-insensitively",
            "pytest==0.0.1",
            "surely-not-installed-xyz==1.0",
        ]
    )
    assert lock_check(lock) == (
        [f"pytest: locked 0.0.1, installed {pytest.__version__}"],
        ["surely-not-installed-xyz==1.0"],
    )
    (tmp_path / "requirements.lock").write_text(lock)
    tags = write_environment(Layout(tmp_path), tmp_path / "environment")
    assert tags["environment.matches_lock"] == "false"
    report = (tmp_path / "environment" / "lock-mismatches.txt").read_text().splitlines()
    assert report == [
        "installed at another version than requirements.lock:",
        f"pytest: locked 0.0.1, installed {pytest.__version__}",
        "locked, not installed (nothing installed requires them):",
        "surely-not-installed-xyz==1.0",
    ]
    # A pin nothing installs is no drift: the lock is pip's constraints file.
    (tmp_path / "requirements.lock").write_text("surely-not-installed-xyz==1.0\n")
    tags = write_environment(Layout(tmp_path), tmp_path / "environment")
    assert tags["environment.matches_lock"] == "true"
    freeze = (tmp_path / "environment" / "pip-freeze.txt").read_text()
    assert f"numpy=={np.__version__}" in freeze.splitlines()
    (tmp_path / "requirements.lock").unlink()
    tags = write_environment(Layout(tmp_path), tmp_path / "env2")
    assert tags == {"environment.matches_lock": "unknown"}
