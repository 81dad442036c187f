"""Feature table, train/val/test splits and the regression cases.

Shapes: a table is ``features`` (n_rows, n_features) and ``targets`` (n_rows, n_targets),
float32, rows on axis 0. Cases are batches (batch axis 0) except where noted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.config import DataConfig
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_save_npz, atomic_write_json, load_npz, read_json, sha256_file

SPLITS = ("train", "val", "test")
CASES_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Table:
    features: np.ndarray  # (n_rows, n_features) float32
    targets: np.ndarray  # (n_rows, n_targets) float32
    row_ids: np.ndarray  # (n_rows,) int64: position in the source table, not an identifier


def synthetic_table(key: jax.Array, config: DataConfig) -> Table:
    """A smooth nonlinear regression problem: y = tanh(X A) B + noise, X ~ N(0, 1).

    ``key`` is split once into the three draws it feeds (X, A and B, noise).
    """
    k_x, k_w, k_noise = jax.random.split(key, 3)
    n, f, t = config.n_rows, config.n_features, config.n_targets
    features = jax.random.normal(k_x, (n, f), dtype=jnp.float32)
    k_a, k_b = jax.random.split(k_w)
    mix = jax.random.normal(k_a, (f, 2 * f), dtype=jnp.float32) / jnp.sqrt(f)
    head = jax.random.normal(k_b, (2 * f, t), dtype=jnp.float32) / jnp.sqrt(2 * f)
    noise = config.noise_std * jax.random.normal(k_noise, (n, t), dtype=jnp.float32)
    targets = jnp.tanh(features @ mix) @ head + noise
    return Table(np.asarray(features), np.asarray(targets), np.arange(n, dtype=np.int64))


def split_indices(key: jax.Array, n_rows: int, config: DataConfig) -> dict[str, np.ndarray]:
    """Disjoint, deterministic train/val/test row indices from one permutation of ``key``."""
    order = np.asarray(jax.random.permutation(key, n_rows))
    n_train = round(config.split.train * n_rows)
    n_val = round(config.split.val * n_rows)
    parts = {
        "train": order[:n_train],
        "val": order[n_train : n_train + n_val],
        "test": order[n_train + n_val :],
    }
    for name, idx in parts.items():
        if idx.size == 0:
            raise ArtifactError(f"split {name!r} is empty: raise data.n_rows or its fraction")
    return parts


def write_splits(folder: Path, table: Table, parts: dict[str, np.ndarray]) -> None:
    for name, idx in parts.items():
        atomic_save_npz(
            Path(folder) / f"{name}.npz",
            {"features": table.features[idx], "targets": table.targets[idx], "row_ids": idx},
        )


def load_split(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, targets) of one split written by :func:`write_splits`."""
    arrays = load_npz(Path(folder) / f"{name}.npz")
    return arrays["features"], arrays["targets"]


def regression_cases(
    train_x: np.ndarray, test_x: np.ndarray, standard_batch: int
) -> dict[str, dict[str, Any]]:
    """The regression set: name -> {"x": array, "valid": bool, "expect": str, "about": str}.

    Valid cases are float32 batches (batch axis 0) of width n_features; the invalid one
    has one feature too many and must be refused by every forward path.
    """
    n_features = train_x.shape[1]
    if test_x.shape[0] < standard_batch:
        raise ArtifactError(
            f"data.standard_batch={standard_batch} but the test split has only "
            f"{test_x.shape[0]} rows"
        )
    f32 = np.float32
    return {
        "standard": {
            "x": test_x[:standard_batch].astype(f32),
            "valid": True,
            "about": f"first {standard_batch} rows of the test split",
        },
        "single": {
            "x": test_x[:1].astype(f32),
            "valid": True,
            "about": "one row of the test split, as a batch of one",
        },
        "zeros": {
            "x": np.zeros((4, n_features), dtype=f32),
            "valid": True,
            "about": "all-zero rows",
        },
        "boundary": {
            "x": np.stack([train_x.min(axis=0), train_x.max(axis=0)]).astype(f32),
            "valid": True,
            "about": "per-feature min and max seen in the train split",
        },
        "invalid_shape": {
            "x": np.ones((4, n_features + 1), dtype=f32),
            "valid": False,
            "expect": f"expected {n_features} features, got {n_features + 1}",
            "about": "one feature too many: every path must refuse it",
        },
    }


def write_cases(folder: Path, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One .npz per case plus manifest.json with each file's sha256; returns the manifest."""
    folder = Path(folder)
    entries = {}
    for name, case in cases.items():
        path = folder / f"{name}.npz"
        atomic_save_npz(path, {"x": case["x"]})
        entries[name] = {
            "file": path.name,
            "sha256": sha256_file(path),
            "shape": list(case["x"].shape),
            "dtype": str(case["x"].dtype),
            "valid": case["valid"],
            "about": case["about"],
            **({"expect": case["expect"]} if "expect" in case else {}),
        }
    manifest = {"cases": entries}
    atomic_write_json(folder / CASES_MANIFEST, manifest)
    return manifest


def load_cases(folder: Path) -> dict[str, dict[str, Any]]:
    """Cases written by :func:`write_cases`, each file verified against its sha256."""
    folder = Path(folder)
    manifest = read_json(folder / CASES_MANIFEST)
    cases = {}
    for name, entry in manifest["cases"].items():
        path = folder / entry["file"]
        digest = sha256_file(path) if path.is_file() else "missing"
        if digest != entry["sha256"]:
            raise ArtifactError(
                f"{path}: sha256 check failed: manifest says {entry['sha256']}, found {digest}"
            )
        cases[name] = {**entry, "x": load_npz(path)["x"]}
    return cases
