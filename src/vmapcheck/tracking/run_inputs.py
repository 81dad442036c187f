"""What a run was made from, so a run can be judged without the machine it ran on.

- **Datasets**: every regression case (``data/cases/<case>.npz``: ``x``, and ``y`` where
  the case has targets) and the train/val/test splits (``data/prepared/<split>.npz``:
  ``features`` and ``targets`` only, never identifiers or quasi-identifiers) as MLflow
  dataset inputs named ``cases/<case>`` and ``splits/<split>``. Their digest is
  :func:`array_digest`, a sha256 over every byte of every array: MLflow's own digest
  (``mlflow.data.from_numpy``) hashes only the first 10,000 values of each array, so two
  sets that differ after that would look identical. MLflow keeps a dataset's name, digest,
  source path, schema (dtype, shape) and profile (shapes, sizes), never its values.
- **Provenance tags**: ``dvc_lock_sha256`` (the ``dvc.lock`` logged with the run) and,
  under ``dvc exp run``, ``dvc_exp_name`` / ``dvc_exp_baseline_rev`` (the environment
  variables DVC sets for every stage of an experiment).
- **Environment**: an ``environment/`` artifact folder with the project's
  ``requirements.lock``, ``pip freeze`` of the interpreter that ran the stage, and the
  pins whose installed version differs from the lock (tag ``environment.matches_lock``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vmapcheck.data.regression import SPLITS, load_cases, load_split
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_write_text, sha256_file
from vmapcheck.layout import Layout

ENVIRONMENT_DIR = "environment"
LOCK_FILE = "requirements.lock"
# MLflow stores at most 36 characters of a dataset digest (mlflow.utils.validation):
# the first 32 hex digits (128 bits) go there, the whole sha256 into the input tag.
DIGEST_FIELD_CHARS = 32
# DVC sets these for each stage of `dvc exp run` (dvc/repo/experiments/queue/base.py).
DVC_ENV_TAGS = {"DVC_EXP_NAME": "dvc_exp_name", "DVC_EXP_BASELINE_REV": "dvc_exp_baseline_rev"}
MAX_TAG_CHARS = 250


def array_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over named arrays: for each name in sorted order, a header with the name,
    dtype (with byte order) and shape, then every byte of the array in C order.

    Any array of any shape and numeric or boolean dtype; the batch axis plays no part.
    Two inputs get the same digest only when every name, dtype, shape and value match.

    Raises:
        ArtifactError: an array holds Python objects (no fixed bytes to hash).
    """
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        if array.dtype.hasobject:
            raise ArtifactError(f"array {name!r}: expected a numeric dtype, got {array.dtype}")
        header = {"name": name, "dtype": array.dtype.str, "shape": list(array.shape)}
        digest.update(json.dumps(header, sort_keys=True).encode() + b"\n")
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def local_source(path: str) -> Any:
    """MLflow's ``local`` dataset source for a (project-relative) path. Built from its JSON
    form: given a bare path, MLflow's resolver finds two candidate classes and warns."""
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json

    return get_dataset_source_from_json(json.dumps({"uri": path}), source_type="local")


def _dataset_input(
    name: str,
    features: np.ndarray | dict[str, np.ndarray],
    targets: np.ndarray | None,
    source: str,
    context: str,
    tags: Mapping[str, str],
) -> Any:
    """One MLflow ``DatasetInput``: name, our digest, the project-relative source path,
    schema and profile (computed by MLflow from dtypes and shapes), and input tags."""
    from mlflow.data.numpy_dataset import from_numpy
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    # A dict of leaves (a model whose example is a pytree) is MLflow's dict-of-arrays
    # dataset, each leaf digested under its own name.
    if isinstance(features, dict):
        feature_arrays = {f"features.{leaf}": value for leaf, value in features.items()}
    else:
        feature_arrays = {"features": features}
    arrays = {**feature_arrays, **({"targets": targets} if targets is not None else {})}
    sha256 = array_digest(arrays)
    dataset = from_numpy(
        features,
        source=local_source(source),
        # mlflow annotates targets without None, its default (a dataset without targets).
        targets=targets,  # type: ignore[arg-type]
        name=name,
        digest=sha256[:DIGEST_FIELD_CHARS],
    )
    input_tags = [InputTag(MLFLOW_DATASET_CONTEXT, context), InputTag("sha256", sha256)]
    input_tags += [InputTag(key, value) for key, value in tags.items()]
    return DatasetInput(dataset=dataset._to_mlflow_entity(), tags=input_tags)


def case_datasets(cases_dir: Path, relative_to: Path) -> list[Any]:
    """The regression set: one dataset ``cases/<case>`` per case of ``cases_dir`` (each
    file verified against its manifest sha256 first), context ``regression``.

    Features are the case's ``x`` as stored (batch cases (rows, n_features), batch axis 0,
    or a dict of leaves each with the batch axis 0; ``single_vector`` one example;
    invalid cases any shape/dtype); targets its ``y``
    (rows, n_targets) when it has one.
    """
    out = []
    for name, case in load_cases(cases_dir).items():
        path = Path(cases_dir) / case["file"]
        out.append(
            _dataset_input(
                f"cases/{name}",
                case["x"],
                case.get("y"),
                str(path.relative_to(relative_to)),
                "regression",
                {"kind": case["kind"], "file_sha256": case["sha256"]},
            )
        )
    return out


def split_datasets(prepared_dir: Path, relative_to: Path) -> list[Any]:
    """The splits: ``splits/<split>`` with features (rows, n_features) and targets
    (rows, n_targets), batch axis 0; context is the split's name (train, val, test)."""
    out = []
    for name in SPLITS:
        path = Path(prepared_dir) / f"{name}.npz"
        features, targets = load_split(prepared_dir, name)
        out.append(
            _dataset_input(
                f"splits/{name}",
                features,
                targets,
                str(path.relative_to(relative_to)),
                name,
                {"file_sha256": sha256_file(path)},
            )
        )
    return out


def dvc_exp_name(env: Mapping[str, str] | None = None) -> str | None:
    """The name of the DVC experiment this stage runs in (``DVC_EXP_NAME``, set by
    ``dvc exp run``), None under a plain ``dvc repro``."""
    value = (os.environ if env is None else env).get("DVC_EXP_NAME", "").strip()
    return value[:MAX_TAG_CHARS] or None


def provenance_tags(layout: Layout, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``dvc_lock_sha256`` (``missing`` before any stage was locked) and, under
    ``dvc exp run``, the experiment's name and baseline commit."""
    env = os.environ if env is None else env
    lock = layout.dvc_lock
    tags = {"dvc_lock_sha256": sha256_file(lock) if lock.is_file() else "missing"}
    for variable, tag in DVC_ENV_TAGS.items():
        value = env.get(variable, "").strip()
        if value:
            tags[tag] = value[:MAX_TAG_CHARS]
    return tags


def lock_check(lock_text: str) -> tuple[list[str], list[str]]:
    """Compare a requirements lock (``name==version`` lines) with this interpreter.

    Returns ``(differs, not_installed)``: pins installed at another version
    (``name: locked X, installed Y``), and pins not installed at all (``name==X``). The
    lock is used as pip constraints: a pin nothing requires is not installed, which is
    no drift, so only ``differs`` makes the environment not match its lock.
    """
    differs, not_installed = [], []
    for line in lock_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" not in line:
            continue
        name, locked = (part.strip() for part in line.split("==", 1))
        name = name.split("[", 1)[0]
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            not_installed.append(f"{name}=={locked}")
            continue
        if installed != locked:
            differs.append(f"{name}: locked {locked}, installed {installed}")
    return differs, not_installed


def pip_freeze() -> str:
    """``pip freeze --all`` of the running interpreter; when pip cannot run, the installed
    distributions as ``name==version`` from importlib.metadata (the first line says so)."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "freeze", "--all"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return result.stdout
    except (OSError, subprocess.SubprocessError):
        pins = sorted(
            f"{dist.metadata['Name']}=={dist.version}"
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"]
        )
        return "# pip freeze failed; installed distributions (importlib.metadata):\n" + (
            "\n".join(pins) + "\n"
        )


def write_environment(layout: Layout, dest: Path, frozen: str | None = None) -> dict[str, str]:
    """Fill folder ``dest`` (created) with ``requirements.lock`` (the project's),
    ``pip-freeze.txt`` (``frozen``: :func:`pip_freeze`'s text, taken now when None) and
    ``lock-mismatches.txt`` (:func:`lock_check`); return the environment tags."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "pip-freeze.txt", pip_freeze() if frozen is None else frozen)
    lock = layout.requirements_lock
    if not lock.is_file():
        atomic_write_text(dest / "lock-mismatches.txt", f"no {LOCK_FILE} in the project\n")
        return {"environment.matches_lock": "unknown"}
    shutil.copyfile(lock, dest / LOCK_FILE)
    differs, not_installed = lock_check(lock.read_text(encoding="utf-8"))
    report = [f"installed at another version than {LOCK_FILE}:", *(differs or ["(none)"])]
    report += ["locked, not installed (nothing installed requires them):"]
    report += not_installed or ["(none)"]
    atomic_write_text(dest / "lock-mismatches.txt", "\n".join(report) + "\n")
    return {
        "environment.matches_lock": str(not differs).lower(),
        "environment.lock_sha256": sha256_file(lock),
    }


@dataclass(frozen=True)
class RunInputs:
    """What ``track`` adds to a run: tags, dataset inputs, the environment folder."""

    tags: dict[str, str]
    datasets: list[Any]
    environment: Path


def gather_run_inputs(
    layout: Layout,
    scratch: Path,
    env: Mapping[str, str] | None = None,
    frozen: str | None = None,
) -> RunInputs:
    """Everything above for the project ``layout``; the environment folder is written
    under ``scratch`` (a temporary folder the caller removes after logging). ``frozen``:
    :func:`pip_freeze`'s text when the caller took it already (None: taken here)."""
    manifest = layout.cases_manifest
    if not manifest.is_file():
        raise ArtifactError(f"{manifest}: not found; has the prepare stage run?")
    environment = Path(scratch) / ENVIRONMENT_DIR
    tags = {**provenance_tags(layout, env), **write_environment(layout, environment, frozen)}
    datasets = case_datasets(layout.cases, layout.root) + split_datasets(
        layout.prepared, layout.root
    )
    return RunInputs(tags=tags, datasets=datasets, environment=environment)
