"""What the stages after ``prepare`` read: the splits and the regression cases.

Shapes: ``features`` (n_rows, n_features) and ``targets`` (n_rows, n_targets), float32,
rows on axis 0. Cases are batches (batch axis 0) except where noted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_save_npz, atomic_write_json, load_npz, read_json, sha256_file

SPLITS = ("train", "val", "test")
CASES_MANIFEST = "manifest.json"
# The cases other stages name: the standard batch (bench times its rows, forward probes
# gradients on it, the diagnosis falls back to it) and the batch of one (the vector case
# is compared with it).
STANDARD_CASE = "standard"
SINGLE_CASE = "single"


def load_split(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, targets) of one split written by :func:`write_splits`."""
    arrays = load_npz(Path(folder) / f"{name}.npz")
    return arrays["features"], arrays["targets"]


# Large magnitudes near float32's limit (the dtype cases are stored in): sqrt(max) ~ 1.8e19,
# so one product with a weight of order one stays far from overflow, while float32's
# absolute rounding step at this magnitude (~2e12) makes any difference between paths
# in how they accumulate visible.
LARGE_MAGNITUDE = float(np.sqrt(np.finfo(np.float32).max))


def subnormal_rows(n_features: int) -> np.ndarray:
    """(4, n_features) float32 subnormals: the smallest, the largest, alternating signs,
    and a row mixing subnormals with exact zeros."""
    tiny = np.finfo(np.float32).smallest_subnormal
    largest = np.nextafter(np.finfo(np.float32).smallest_normal, np.float32(0))
    signs = np.where(np.arange(n_features) % 2 == 0, 1.0, -1.0).astype(np.float32)
    steps = np.arange(1, n_features + 1, dtype=np.float32)
    rows = [
        np.full(n_features, tiny, np.float32),
        np.full(n_features, largest, np.float32),
        (signs * steps * tiny * np.float32(1000)).astype(np.float32),
        np.where(steps % 2 == 0, np.float32(0), -largest).astype(np.float32),
    ]
    return np.stack(rows).astype(np.float32)


def regression_cases(
    train_x: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, standard_batch: int
) -> dict[str, dict[str, Any]]:
    """The regression set: case name -> {"x", "kind", "about", ...}.

    ``kind`` is "batch" (x: (rows, n_features), batch axis 0), "vector" (x: (n_features,)
    for ``forward_one``) or "invalid" (must be refused; ``expect`` lists substrings the
    error message must contain, ``runs_on`` says which paths get it, and ``cast`` False
    keeps its stored dtype instead of casting to the run's). Cases drawn from the test
    split carry their targets ``y`` (rows, n_targets) so a loss can be compared too.
    """
    n_features = train_x.shape[1]
    if test_x.shape[0] < standard_batch:
        raise ArtifactError(
            f"data.standard_batch={standard_batch} but the test split has only "
            f"{test_x.shape[0]} rows"
        )
    f32 = np.float32
    ones = np.ones((4, n_features), dtype=f32)
    with_nan, with_inf = ones.copy(), ones.copy()
    with_nan[1, 0] = np.nan
    with_inf[2, n_features - 1] = np.inf
    alternating = np.where(np.arange(n_features) % 2 == 0, 1.0, -1.0)
    large = LARGE_MAGNITUDE * np.stack([np.ones(n_features), -np.ones(n_features), alternating])

    def batch(x, about, y=None):
        case = {"x": np.asarray(x, dtype=f32), "kind": "batch", "about": about}
        if y is not None:
            case["y"] = np.asarray(y, dtype=f32)
        return case

    def invalid(x, about, expect, runs_on="batch", cast=True):
        return {
            "x": x,
            "kind": "invalid",
            "about": about,
            "expect": expect,
            "runs_on": runs_on,
            "cast": cast,
        }

    return {
        STANDARD_CASE: batch(
            test_x[:standard_batch],
            f"first {standard_batch} rows of the test split",
            test_y[:standard_batch],
        ),
        SINGLE_CASE: batch(test_x[:1], "one row of the test split, as a batch of one", test_y[:1]),
        "single_vector": {
            "x": test_x[0].astype(f32),
            "kind": "vector",
            "about": "the same row unbatched, for forward_one",
        },
        "zeros": batch(np.zeros((4, n_features)), "all-zero rows"),
        "boundary": batch(
            np.stack([train_x.min(axis=0), train_x.max(axis=0)]),
            "per-feature min and max seen in the train split",
        ),
        "large_magnitude": batch(
            large, f"+/-{LARGE_MAGNITUDE:.3g} (sqrt of float32's max) in every feature"
        ),
        "denormal": {
            "x": subnormal_rows(n_features),
            "kind": "denormal",
            "about": "subnormal float32 values of both signs, smallest to largest, and zero",
        },
        "invalid_features": invalid(
            np.ones((4, n_features + 1), f32),
            "one feature too many",
            [f"expected {n_features} features, got {n_features + 1}"],
        ),
        "invalid_rank": invalid(
            np.ones((2, 2, n_features), f32),
            "a rank-3 array",
            ["expected a batch of rank 2", "got rank 3"],
        ),
        "invalid_dtype": invalid(
            np.ones((4, n_features), np.int32),
            "integer features",
            ["expected dtype", "got int32"],
            cast=False,
        ),
        "invalid_nan": invalid(
            with_nan, "a NaN in row 1", ["expected finite values, got NaN", "first at index (1, 0)"]
        ),
        "invalid_inf": invalid(
            with_inf,
            "an Inf in row 2",
            ["expected finite values, got Inf", f"first at index (2, {n_features - 1})"],
        ),
        "invalid_empty": invalid(
            np.ones((0, n_features), f32),
            "a batch of zero rows",
            ["expected at least one row, got an empty batch"],
        ),
        "invalid_vector": invalid(
            np.ones(n_features + 1, f32),
            "forward_one given one feature too many",
            [f"expected {n_features} features, got {n_features + 1}"],
            runs_on="vector",
        ),
    }


def write_cases(
    folder: Path, cases: dict[str, dict[str, Any]], features: list[str] | None = None
) -> dict[str, Any]:
    """One .npz per case plus manifest.json with each file's sha256 and the feature names
    in order (checked against the params contract downstream); returns the manifest."""
    folder = Path(folder)
    entries = {}
    for name, case in cases.items():
        path = folder / f"{name}.npz"
        arrays = {"x": case["x"], **({"y": case["y"]} if "y" in case else {})}
        atomic_save_npz(path, arrays)
        entries[name] = {
            "file": path.name,
            "sha256": sha256_file(path),
            "kind": case["kind"],
            "shape": list(case["x"].shape),
            "dtype": str(case["x"].dtype),
            "has_targets": "y" in case,
            "about": case["about"],
            **{k: case[k] for k in ("expect", "runs_on", "cast") if k in case},
        }
    manifest = {"features": list(features or []), "cases": entries}
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
        cases[name] = {**entry, **load_npz(path)}
    return cases
