"""Params artifact: safetensors (never pickle) plus a manifest with sha256 and contract.

Loading verifies the file's sha256 against the manifest and every leaf's path, shape and
dtype against the model's template before the params are used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_path, atomic_write_json, read_json, sha256_file

PARAMS_FILE = "params.safetensors"
MANIFEST_FILE = "manifest.json"


def leaf_paths(params: Any) -> dict[str, Any]:
    """Map ``layers.0.W``-style leaf paths to leaves, in tree order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {jax.tree_util.keystr(path, simple=True, separator="."): leaf for path, leaf in flat}


def contract_of(params: Any) -> dict[str, dict[str, Any]]:
    """Shape and dtype of every leaf (arrays or ``jax.ShapeDtypeStruct``), by leaf path."""
    return {
        name: {"shape": list(leaf.shape), "dtype": str(np.dtype(leaf.dtype))}
        for name, leaf in leaf_paths(params).items()
    }


def check_contract(found: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]) -> None:
    """Raise ArtifactError naming each missing, extra or mismatched leaf."""
    problems = [f"missing leaf {name}" for name in expected if name not in found]
    problems += [f"unexpected leaf {name}" for name in found if name not in expected]
    for name in expected.keys() & found.keys():
        want, got = expected[name], found[name]
        if want != got:
            problems.append(
                f"leaf {name}: expected shape {want['shape']} dtype {want['dtype']}, "
                f"found shape {got['shape']} dtype {got['dtype']}"
            )
    if problems:
        raise ArtifactError("params do not match the model's contract: " + "; ".join(problems))


def save_params(folder: Path, params: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """Write params.safetensors and manifest.json into ``folder``; return the manifest."""
    folder = Path(folder)
    arrays = {name: np.ascontiguousarray(leaf) for name, leaf in leaf_paths(params).items()}
    target = folder / PARAMS_FILE
    with atomic_path(target) as tmp:
        save_file(arrays, str(tmp))
    manifest = {
        "file": PARAMS_FILE,
        "sha256": sha256_file(target),
        "contract": contract_of(params),
        **metadata,
    }
    atomic_write_json(folder / MANIFEST_FILE, manifest)
    return manifest


def load_params(folder: Path, template: Any) -> tuple[Any, dict[str, Any]]:
    """Load verified params shaped like ``template`` (``jax.eval_shape(model.init, key)``).

    Raises:
        ArtifactError: missing file, sha256 mismatch, unreadable file, or a contract
            mismatch (naming the leaf).
    """
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST_FILE)
    path = folder / manifest.get("file", PARAMS_FILE)
    if not path.is_file():
        raise ArtifactError(f"{path}: not found")
    digest = sha256_file(path)
    if digest != manifest.get("sha256"):
        raise ArtifactError(
            f"{path}: sha256 check failed: manifest says {manifest.get('sha256')}, file is {digest}"
        )
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"{path}: not a readable safetensors file ({exc})") from None
    expected = contract_of(template)
    check_contract(contract_of_arrays(arrays), expected)
    check_contract(manifest.get("contract", {}), expected)
    names = list(leaf_paths(template))
    treedef = jax.tree_util.tree_structure(template)
    params = jax.tree_util.tree_unflatten(treedef, [arrays[name] for name in names])
    return params, manifest


def contract_of_arrays(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()}


def load_model_params(model: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    """Verified params for ``model`` (a :class:`vmapcheck.models.Model`) from ``folder``.

    The template's structure, shapes and dtypes come from ``model.init`` traced
    abstractly (no computation), so they do not depend on the key.
    """
    template = jax.eval_shape(model.init, jax.random.key(0))
    return load_params(folder, template)
