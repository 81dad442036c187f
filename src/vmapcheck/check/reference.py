"""The stored reference: params, inputs and outputs of a verified run, kept in git.

``data/reference/<model>/`` holds ``params.safetensors`` + ``manifest.json`` (the params
artifact), ``inputs.npz`` (each valid case's ``<case>.x`` and, where it has targets,
``<case>.y``), ``outputs.npz`` (``<case>.<path>`` for every path) and ``meta.json``: when,
from which run and why it was made, the versions, backend, device and dtype it was made
with, the tolerances, the config digest and the sha256 of every file.

Later runs evaluate the reference's own params on its own inputs and compare with its
outputs, so a JAX upgrade or a backend change is judged on exactly the same numbers.
The reference changes only through :func:`make_reference` (``make reference``), never as
a side effect of ``dvc repro``.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from vmapcheck.check.schema import (
    ReferenceMeta,
    ReplacedReference,
    read_check_details,
    read_record,
    read_reference_meta,
)
from vmapcheck.config import Config, config_digest, load_config
from vmapcheck.core.cases import Case, kind_of
from vmapcheck.core.paths import output_key, plain_path
from vmapcheck.core.record import tolerance_record
from vmapcheck.data.regression import read_cases_manifest, x_arrays, x_from_arrays
from vmapcheck.errors import ArtifactError, VmapcheckError
from vmapcheck.io import (
    atomic_dir,
    atomic_save_npz,
    atomic_write_json,
    load_npz,
    read_json,
    sha256_file,
)
from vmapcheck.layout import Layout
from vmapcheck.provenance import git_state

if TYPE_CHECKING:
    from vmapcheck.core.magnitude import CaseMagnitude

META = "meta.json"
FILES = ("params.safetensors", "manifest.json", "inputs.npz", "outputs.npz")


def reference_dir(config: Config, layout: Layout) -> Path:
    """``<reference.dir>/<model>`` under the project root."""
    return layout.root / config.reference.dir / config.model.name


def shown_reference_dir(config: Config, layout: Layout) -> Path:
    """:func:`reference_dir` as messages show it: relative to the project root when it
    lies under it, else whole (an absolute ``reference.dir`` elsewhere)."""
    folder = reference_dir(config, layout)
    return folder.relative_to(layout.root) if folder.is_relative_to(layout.root) else folder


def mse(outputs: np.ndarray, targets: np.ndarray) -> float:
    """Mean squared error in float64 (the loss the model is trained on), over the rows
    ``outputs`` has: a path the budget capped ran a case's first rows only."""
    head = targets[: len(outputs)] if np.ndim(outputs) >= 1 else targets
    return float(np.mean((outputs.astype(np.float64) - head.astype(np.float64)) ** 2))


class StoredReference(TypedDict):
    """A reference as :func:`load_reference` reads it: its meta.json, its cases (each
    with ``x`` and, where stored, ``y``: batch axis 0) and its outputs by
    ``<case>.<path>``."""

    meta: ReferenceMeta
    cases: dict[str, Case]
    outputs: dict[str, np.ndarray]


class ReferenceRun(TypedDict):
    """What the check compares with the reference (:func:`vmapcheck.check.checks.
    run_checks`' ``reference``): the forward stage's status and message, and when "ok"
    the stored reference, this run's outputs on its inputs (data/forward/
    reference_outputs.npz) and the terms' magnitude of its cases (None: not computed)."""

    status: str
    message: str
    meta: NotRequired[ReferenceMeta]
    stored: NotRequired[dict[str, np.ndarray]]
    cases: NotRequired[dict[str, Case]]
    current: NotRequired[dict[str, np.ndarray]]
    magnitudes: NotRequired[dict[str, CaseMagnitude] | None]


def load_reference(folder: Path) -> StoredReference | None:
    """The reference in ``folder`` with every file verified, or None when there is none.

    Raises:
        ArtifactError: a file is missing or its sha256 differs from meta.json.
    """
    folder = Path(folder)
    if not (folder / META).exists():
        return None
    meta = read_reference_meta(folder / META)
    for name in FILES:
        path = folder / name
        found = sha256_file(path) if path.is_file() else "missing"
        if found != meta["sha256"].get(name):
            raise ArtifactError(
                f"{path}: sha256 check failed (meta.json says {meta['sha256'].get(name)}, "
                f"found {found}): the reference was modified outside `vmapcheck reference make`"
            )
    inputs = load_npz(folder / "inputs.npz")
    cases: dict[str, Case] = {}
    for name, entry in meta["cases"].items():
        cases[name] = {
            "kind": entry["kind"],
            "shape": entry["shape"],
            "about": f"the stored reference's {name}",
            "x": x_from_arrays(inputs, f"{name}.x"),
        }
        if f"{name}.y" in inputs:
            cases[name]["y"] = inputs[f"{name}.y"]
    return {"meta": meta, "cases": cases, "outputs": load_npz(folder / "outputs.npz")}


def make_reference(layout: Layout, config: Config, reason: str) -> ReferenceMeta:
    """Store the current run as the reference for ``config.model.name``; return meta.

    Only a verified run qualifies: every check but the reference comparison itself must
    have passed (a missing reference, or one this run disagrees with, is what a new one
    replaces — the reason says why), the report must have judged exactly the forward
    outputs on disk, and those must come from the params on disk.

    Raises:
        VmapcheckError: no reason given, or the current run is not verified.
    """
    if not reason.strip():
        raise VmapcheckError("a reference needs a reason: vmapcheck reference make --reason '...'")
    check = read_check_details(layout.check_details)
    record = read_record(layout.record)
    params_manifest = read_json(layout.params_manifest)
    outputs_path = layout.outputs
    blocking = [f for f in check["failures"] if not f.startswith("reference")]
    if blocking:
        raise VmapcheckError(
            f"the last check FAILED ({len(blocking)} failures besides the reference, first: "
            f"{blocking[0]}): only a verified run can become the reference"
        )
    if check.get("forward_outputs_sha256") != sha256_file(outputs_path):
        raise VmapcheckError(
            "reports/check_details.json did not judge the outputs now in data/forward: "
            "run `dvc repro` first"
        )
    if record["params_sha256"] != params_manifest["sha256"]:
        raise VmapcheckError("data/forward was computed from other params: run `dvc repro`")
    if check.get("config_digest") != config_digest(config):
        raise VmapcheckError("params.yaml changed since the last check: run `dvc repro` first")
    cases_manifest = read_cases_manifest(layout.cases_manifest)["cases"]
    valid = {n: e for n, e in cases_manifest.items() if kind_of(e, n).in_reference}
    outputs = load_npz(outputs_path)
    inputs: dict[str, np.ndarray] = {}
    losses: dict[str, float] = {}
    for name, entry in valid.items():
        arrays = load_npz(layout.cases / entry["file"])
        inputs.update(x_arrays(x_from_arrays(arrays), f"{name}.x"))
        if "y" in arrays:
            inputs[f"{name}.y"] = arrays["y"]
            losses[name] = mse(outputs[output_key(name, plain_path())], arrays["y"])
    track = read_json(layout.track_report) if layout.track_report.exists() else {}
    same_outputs = track.get("forward_outputs_sha256") == check["forward_outputs_sha256"]
    from_run = track.get("run_id") if same_outputs else None
    target = reference_dir(config, layout)
    previous: ReplacedReference | None = None
    if (target / META).exists():
        # Read as found (an older or hand-edited meta.json is replaced, not refused).
        old = read_json(target / META)
        previous = {
            "created_at": old.get("created_at"),
            "reason": old.get("reason"),
            "from_run": old.get("from_run"),
            "runtime": old.get("runtime"),
            "dtype": old.get("dtype"),
        }
    with atomic_dir(target) as folder:
        for name in ("params.safetensors", "manifest.json"):
            shutil.copy2(layout.params / name, folder / name)
        atomic_save_npz(folder / "inputs.npz", inputs)
        atomic_save_npz(
            folder / "outputs.npz",
            {
                output_key(n, p): outputs[output_key(n, p)]
                for n, e in valid.items()
                for p in kind_of(e, n).paths(e)
                if output_key(n, p) in outputs  # a path the model does not provide
            },
        )
        meta: ReferenceMeta = {
            "model": config.model.name,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "reason": reason.strip(),
            "from_run": from_run,
            "git": git_state(layout.root),
            # What this reference replaces, and how the run compared with it.
            "replaces": previous,
            "comparison_with_replaced": {
                "status": check["reference"].get("status"),
                "passed": check["reference"].get("passed"),
                "message": check["reference"].get("message"),
            },
            "runtime": check["runtime"],
            "dtype": check["dtype"],
            "tolerance": check["tolerance"],
            "cross_run_tolerance": tolerance_record(config.precision.cross_run_tolerance),
            "config_digest": config_digest(config),
            "params_sha256": params_manifest["sha256"],
            "cases": {n: {"kind": e["kind"], "shape": e["shape"]} for n, e in valid.items()},
            "losses": losses,
            "sha256": {name: sha256_file(folder / name) for name in FILES},
        }
        atomic_write_json(folder / META, meta)
    return meta


def run_make(layout: Layout, reason: str) -> int:
    """``vmapcheck reference make --reason ...``: exit 0, or 2 with the reason on stderr."""
    try:
        config = load_config(layout.params_yaml)
        meta = make_reference(layout, config, reason)
    except VmapcheckError as exc:
        print(f"reference: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"reference for model {meta['model']} written to "
        f"{shown_reference_dir(config, layout)} (jax "
        f"{meta['runtime']['jax_version']}, {meta['runtime']['backend']}, "
        f"{meta['dtype']}); commit it with git"
    )
    return 0


def run_show(layout: Layout) -> int:
    """``vmapcheck reference show``: the reference's metadata as JSON; exit 1 when there is
    none, 2 when it cannot be read."""
    try:
        config = load_config(layout.params_yaml)
        ref = load_reference(reference_dir(config, layout))
    except VmapcheckError as exc:
        print(f"reference: error: {exc}", file=sys.stderr)
        return 2
    if ref is None:
        print(f"no reference for model {config.model.name}")
        return 1
    meta = {k: v for k, v in ref["meta"].items() if k != "sha256"}
    print(json.dumps(meta, indent=2))
    return 0
