"""Params artifact: safetensors (never pickle) plus a manifest with sha256 and contract.

Loading verifies the file's sha256 against the manifest and every leaf's path, shape and
dtype against the model's template before the params are used.

JAX (and :mod:`vmapcheck.core.state`, which needs it) is imported by the functions that
walk a pytree, not here: the ``track`` stage reads contracts (:func:`contract_digest`)
and runs no JAX, and importing it costs about a second.
"""

# No `from __future__ import annotations` here: read_model_contract (through
# vmapcheck.io.read_json_typed) sees NotRequired only in evaluated annotations.
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from vmapcheck.core.leaves import check_finite, leaf_paths
from vmapcheck.core.record import InputLeafRecord
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_path, atomic_write_json, read_json, read_json_typed, sha256_file
from vmapcheck.layout import MANIFEST_FILE, PARAMS_FILE


class LeafSpec(TypedDict):
    """One params leaf as the contract states it (contract.json ``params``, the params
    manifest's ``contract``): its shape and dtype name (``"float"`` for any float, where
    :func:`check_params_like` compares)."""

    shape: list[int]
    dtype: str


# The contract's types (below), read back by read_model_contract.
class ContractInputs(TypedDict):
    """What the model takes (contract.json ``inputs``): the table's feature columns in
    order and their count, the batch axis, and one example unbatched in words; a flat
    vector's dtype, or a dict contract's leaves (each's shape, dtype, range, meaning); a
    stochastic model's key, in words."""

    features: list[str]
    n_features: int
    dtype: NotRequired[str]
    leaves: NotRequired[list[InputLeafRecord]]
    batch_axis: int | str
    unbatched: str
    key: NotRequired[str]


class ContractOutputs(TypedDict):
    """What the model returns: its outputs' names, count and meaning."""

    names: list[str]
    n_outputs: int
    meaning: str


class ModelContract(TypedDict):
    """``data/params/contract.json`` (:func:`model_contract`), written by train beside the
    params and checked whenever params or inputs cross a stage boundary."""

    model: str
    description: str
    params: dict[str, LeafSpec]
    state_leaves: list[str]
    inputs: ContractInputs
    outputs: ContractOutputs
    batched_forward: bool


def contract_of(params: Any) -> dict[str, LeafSpec]:
    """Shape and dtype of every leaf (arrays or ``jax.ShapeDtypeStruct``), by leaf path."""
    return {
        name: {"shape": list(leaf.shape), "dtype": str(np.dtype(leaf.dtype))}
        for name, leaf in leaf_paths(params).items()
    }


def check_contract(found: Mapping[str, LeafSpec], expected: Mapping[str, LeafSpec]) -> None:
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


def _kind(dtype: Any) -> str:
    """A dtype as :func:`check_params_like` compares it: every float dtype is "float"."""
    import jax.numpy as jnp

    return "float" if jnp.issubdtype(dtype, jnp.floating) else str(dtype)


def check_params_like(params: Any, template: Any, where: str = "params") -> None:
    """Refuse ``params`` unless they have ``template``'s leaves (``jax.eval_shape(model.init,
    key)``), each with its shape and dtype, any float dtype standing for any other (params
    are cast to the run's precision).

    Raises:
        ArtifactError: ``where``, then each missing, extra or mismatched leaf (as
            :func:`check_contract`).
    """

    def contract(tree: Any) -> dict[str, LeafSpec]:
        out: dict[str, LeafSpec] = {}
        for name, leaf in leaf_paths(tree).items():
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
            out[name] = {"shape": list(np.shape(leaf)), "dtype": _kind(dtype)}
        return out

    try:
        check_contract(contract(params), contract(template))
    except ArtifactError as exc:
        raise ArtifactError(f"{where}: {exc}") from None


def save_params(folder: Path, params: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    """Write params.safetensors and manifest.json into ``folder``; return the manifest."""
    folder = Path(folder)
    # np.ascontiguousarray would make a scalar leaf (a Haiku int32 counter, shape ()) 1-d.
    arrays = {
        name: np.require(np.asarray(leaf), requirements="C")
        for name, leaf in leaf_paths(params).items()
    }
    target = folder / PARAMS_FILE
    with atomic_path(target) as tmp:
        try:
            save_file(arrays, str(tmp))
        except SafetensorError as exc:
            # safetensors (Rust) reports a failed write as "I/O error: ... (os error 28)":
            # as the OSError it is, so that atomic_path names the folder and its free space.
            found = re.search(r"os error (\d+)", str(exc))
            if found is None:
                raise
            code = int(found.group(1))
            raise OSError(code, os.strerror(code)) from None
    manifest = {
        "file": PARAMS_FILE,
        "sha256": sha256_file(target),
        "contract": contract_of(params),
        **metadata,
    }
    atomic_write_json(folder / MANIFEST_FILE, manifest)
    return manifest


def read_params_file(path: Path, template: Any, expected_sha256: str) -> Any:
    """Params from a safetensors file, verified before any use.

    Checks, in order: the file exists; its sha256 is ``expected_sha256``; it is a
    safetensors file (a pickle or anything else is refused, never unpickled); every leaf
    matches ``template`` (``jax.eval_shape(model.init, key)``) by name, shape and dtype;
    every float leaf is finite.

    Raises:
        ArtifactError: naming the check that failed (and the leaf, for the contract and
            for a NaN or Inf).
    """
    import jax

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: not found")
    digest = sha256_file(path)
    if digest != expected_sha256:
        raise ArtifactError(
            f"{path}: sha256 check failed: expected {expected_sha256}, file is {digest}"
        )
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(
            f"{path}: refused, not a safetensors file ({exc}); params are never unpickled"
        ) from None
    check_contract(contract_of_arrays(arrays), contract_of(template))
    names = list(leaf_paths(template))
    check_finite({name: arrays[name] for name in names}, str(path))
    treedef = jax.tree_util.tree_structure(template)
    return jax.tree_util.tree_unflatten(treedef, [arrays[name] for name in names])


def load_params(folder: Path, template: Any) -> tuple[Any, dict[str, Any]]:
    """Load verified params shaped like ``template`` (``jax.eval_shape(model.init, key)``).

    Raises:
        ArtifactError: missing file, sha256 mismatch with the manifest, unreadable file,
            a contract mismatch or a NaN or Inf (naming the leaf).
    """
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST_FILE)
    _check_manifest(manifest, folder / MANIFEST_FILE)
    check_contract(manifest.get("contract", {}), contract_of(template))
    params = read_params_file(
        folder / manifest.get("file", PARAMS_FILE), template, manifest.get("sha256", "")
    )
    return params, manifest


def _check_manifest(manifest: Any, where: Path) -> None:
    """Refuse a manifest that is not what :func:`save_params` writes: a mapping whose
    ``file`` names a file beside it, ``sha256`` is text and ``contract`` maps each leaf
    to its shape and dtype (the values are then compared, not trusted)."""
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    file = manifest.get("file", PARAMS_FILE)
    if not isinstance(file, str) or not file or Path(file).name != file:
        raise ArtifactError(
            f"{where}: key 'file': expected the name of a file in {where.parent}, found "
            f"{type(file).__name__} {str(file)[:80]!r}"
        )
    if not isinstance(manifest.get("sha256", ""), str):
        raise ArtifactError(f"{where}: key 'sha256': expected hex text")
    contract = manifest.get("contract", {})
    if not isinstance(contract, dict) or not all(
        isinstance(leaf, dict) for leaf in contract.values()
    ):
        raise ArtifactError(
            f"{where}: key 'contract': expected a mapping of leaf names to shape and dtype"
        )


def read_model_contract(path: Path) -> ModelContract:
    """``data/params/contract.json`` (:func:`model_contract`), its keys checked down to
    the inputs and outputs (:func:`vmapcheck.io.read_json_typed`: the error names the
    file and each missing key)."""
    return read_json_typed(path, ModelContract)


def model_contract(model: Any, params: Any, features: list[str]) -> ModelContract:
    """The model's contract: params leaves, inputs (names, order, dtype, batch axis), outputs.

    Written next to the params artifact (contract.json) and checked whenever params or
    inputs cross a stage boundary.
    """
    from vmapcheck.core.state import partition

    spec = model.contract
    inputs: ContractInputs
    if spec.flat:
        inputs = {
            "features": list(features),
            "n_features": model.in_features,
            "dtype": "float32 (cast to the run's precision)",
            "batch_axis": 0,
            "unbatched": f"forward_one takes one vector of shape ({model.in_features},)",
        }
    else:
        inputs = {
            "features": list(features),
            "n_features": model.in_features,
            # Each leaf takes prod(shape) consecutive feature columns, in this order.
            "leaves": spec.describe(),
            "batch_axis": "0, on every leaf",
            "unbatched": "forward_one takes one dict {"
            + ", ".join(f"{leaf.name}: {leaf.shape} {leaf.dtype}" for leaf in spec.leaves)
            + "}",
        }

    if model.stochastic:
        # A forward that samples (Model.stochastic) takes its example's key too.
        inputs["key"] = (
            "forward_one(params, x, key): one typed PRNG key per example "
            "(jax.random.key); forward_batch(params, X, keys): keys (batch,), row i keys[i]"
        )
    return {
        "model": model.name,
        "description": model.description,
        "params": contract_of(params),
        # The params leaves that are the model's state (Model.state_leaves): kept in the
        # params, never trained (docs/state-leaves.md).
        "state_leaves": list(partition(model, params).state_names),
        "inputs": inputs,
        "outputs": {
            "names": list(model.outputs()),
            "n_outputs": model.out_features,
            "meaning": model.description,
        },
        "batched_forward": model.forward_batch is not None,
    }


def contract_digest(contract: ModelContract) -> str:
    """sha256 of what a model *is* for a benchmark: its params leaves with their shapes
    and dtypes, its input leaves (shapes, dtypes, batch axis) and its outputs' count,
    whether it has a hand-batched forward, and which leaves are state (only when some
    are). Not its name or description, nor the table's column names: two models of one
    name and other widths differ here, the same network on a renamed table does not. A
    run's identity for comparisons (vmapcheck.bench.verdict.baseline.CONTEXT, the MLflow tag
    ``model_contract_sha256``)."""
    inputs = {k: v for k, v in contract["inputs"].items() if k != "features"}
    identity = {
        "params": contract["params"],
        "inputs": inputs,
        "n_outputs": contract["outputs"]["n_outputs"],
        "batched_forward": contract.get("batched_forward"),
    }
    if contract.get("state_leaves"):  # absent for a model without state: digests kept
        identity["state_leaves"] = contract["state_leaves"]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def check_features(found: list[str], contract: dict[str, Any], where: str) -> None:
    """Raise ArtifactError unless ``found`` is the contract's feature list, in order."""
    expected = contract["inputs"]["features"]
    if list(found) == list(expected):
        return
    if len(found) != len(expected):
        raise ArtifactError(
            f"{where}: expected {len(expected)} features {expected}, found {len(found)} {found}"
        )
    position = next(i for i, (a, b) in enumerate(zip(found, expected, strict=True)) if a != b)
    raise ArtifactError(
        f"{where}: feature {position} is {found[position]!r}, the params contract expects "
        f"{expected[position]!r} (features in another order or renamed)"
    )


def contract_of_arrays(arrays: dict[str, np.ndarray]) -> dict[str, LeafSpec]:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()}


def load_model_params(model: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    """Verified params for ``model`` (a :class:`vmapcheck.core.models.Model`) from ``folder``.

    The template's structure, shapes and dtypes come from ``model.init`` traced
    abstractly (no computation), so they do not depend on the key.
    """
    import jax

    template = jax.eval_shape(model.init, jax.random.key(0))
    return load_params(folder, template)
