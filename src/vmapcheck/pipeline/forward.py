"""Stage `forward`: loop, vmap and direct (eager and jit), and the data-parallel
sharded_jit over backend.num_devices devices, on every case, on the backend; every batch
path also on each batch of 2 or more rows regrouped (rows permuted; split in halves),
which check compares with the original batch's outputs (vmapcheck.core.composition).

Also evaluates the stored reference's params on the reference's inputs, so `check` can
compare this run (this JAX, this backend) with the verified run that made it.

With backend.processes > 1 the stage runs as that many processes joined by
jax.distributed (vmapcheck.pipeline.multiprocess starts them on this machine; a cluster
starts them on its hosts): each runs this body, the sharded path's mesh spans every
process's devices, and process 0 writes the outputs (docs/multiprocess.md).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vmapcheck.check.reference import load_reference, reference_dir, shown_reference_dir
from vmapcheck.config import Config
from vmapcheck.core import contract
from vmapcheck.core.bitwise import measure_case
from vmapcheck.core.cases import Case, case_input
from vmapcheck.core.distributed import barrier, join, launched, writes
from vmapcheck.core.forms import FORWARD_KEYS, cast_tree, forward_keys
from vmapcheck.core.forward import Built, build_all, run_composition, run_forward
from vmapcheck.core.gradients import gradient_probe
from vmapcheck.core.mesh import run_mesh
from vmapcheck.core.models import Model, Params, build_model
from vmapcheck.core.paths import describe_distributed, describe_meshes, mesh_label, not_provided
from vmapcheck.core.record import (
    GradientProbe,
    MeshRecord,
    ReferenceStatus,
    forward_record,
    keys_record,
)
from vmapcheck.core.runtime import configure_jax
from vmapcheck.data.regression import STANDARD_CASE, load_cases
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_dir, atomic_save_npz, atomic_write_json, read_json_object
from vmapcheck.layout import Layout
from vmapcheck.params_io import check_features, load_model_params
from vmapcheck.pipeline.multiprocess import follow_launcher, run_group


def _run_reference(
    config: Config, layout: Layout, model: Model, dtype: Any, mesh: Mesh | None, built: Built
) -> tuple[dict[str, np.ndarray], ReferenceStatus]:
    """(outputs on the reference bundle, {"status", "message"}); ``built``: the paths
    the cases ran on (vmapcheck.core.forward.build_all), reused so that a jit path is
    not compiled again for a shape the cases already had."""
    folder = reference_dir(config, layout)
    where = shown_reference_dir(config, layout)
    try:
        reference = load_reference(folder)
    except ArtifactError as exc:
        return {}, {"status": "corrupt", "message": str(exc)}
    if reference is None:
        return {}, {
            "status": "missing",
            "message": f"no reference yet for model {config.model.name} ({where}): once the "
            "other checks pass, store this run's with `vmapcheck reference make --reason '...'`",
        }
    try:
        params, _ = load_model_params(model, folder)
    except ArtifactError as exc:
        return {}, {
            "status": "incompatible",
            "message": f"{where} does not fit model {config.model.name} as configured: {exc}",
        }
    outputs, _ = run_forward(
        model, params, reference["cases"], dtype, mesh, built=built, budget=config.budget
    )
    return outputs, {"status": "ok", "message": f"evaluated {where}"}


def _across(processes: int) -> str:
    return "" if processes == 1 else f" across {processes} processes (process 0 wrote)"


def _sharded(model: Model, mesh: Mesh) -> MeshRecord | None:
    """The distributed path's record (:func:`vmapcheck.core.paths.describe_distributed`),
    with the processes its mesh spans, each with its devices' ids (1: this one alone);
    None when the model has no distributed path here."""
    sharded = describe_distributed(model, mesh)
    if sharded is not None:
        sharded["processes"] = jax.process_count()
        sharded["process_devices"] = {
            str(p): [int(d.id) for d in mesh.devices.flat if d.process_index == p]
            for p in range(jax.process_count())
        }
    return sharded


def _gradients(
    config: Config, model: Model, params: Params, standard: Case, dtype: Any, key: Any
) -> tuple[dict[str, np.ndarray], GradientProbe]:
    """The gradient probe (:func:`vmapcheck.core.gradients.gradient_probe`) on the
    standard case's first rows, ``x`` and ``y`` batch axis 0: vmap(grad) holds one
    gradient per row, so it runs the rows ``budget.gradient_max_rows`` allows; the
    record says how many (``rows``) and what was cut (``capped``)."""
    standard_rows = contract.rows(standard["x"])
    probe_rows = min(standard_rows, config.budget.gradient_max_rows)
    grad_arrays, grad_record = gradient_probe(
        model,
        cast_tree(params, dtype),
        contract.take(case_input(standard, dtype), slice(0, probe_rows)),
        jnp.asarray(standard["y"][:probe_rows], dtype=dtype),
        key=key,
    )
    grad_record["rows"] = probe_rows
    if probe_rows < standard_rows:
        grad_record["capped"] = {
            "rows_run": probe_rows,
            "rows_of": standard_rows,
            "capped_by": "budget.gradient_max_rows",
        }
    return grad_arrays, grad_record


def _say_what_was_cut(record: Mapping[str, Mapping[str, Any]], grad_record: GradientProbe) -> None:
    """One line per case and budget that ran fewer rows than the case has (``record``:
    case -> path -> its entry of the forward record), and one for the gradient probe:
    what the budget cut, never silently."""
    for case_name, per_path in record.items():
        capped = {p: e for p, e in per_path.items() if "rows_run" in e}
        for entry in {e["capped_by"]: e for e in capped.values()}.values():
            names = ", ".join(p for p, e in capped.items() if e["capped_by"] == entry["capped_by"])
            print(
                f"forward: {names} ran {entry['rows_run']} of the {entry['rows_of']} rows of "
                f"{case_name} ({entry['capped_by']})"
            )
    if "capped" in grad_record:
        cut = grad_record["capped"]
        print(
            f"forward: the gradient probe ran {cut['rows_run']} of the {cut['rows_of']} rows "
            f"of {STANDARD_CASE} ({cut['capped_by']})"
        )


def run(config: Config, layout: Layout) -> int | None:
    if config.backend.processes > 1 and launched() is None:
        # This process launches the group and watches it; it starts no JAX backend.
        return run_group("forward", config.backend, layout.root)
    follow_launcher()  # one of a local group: it ends with its launcher
    join(config.backend)  # one of a group: joined before JAX starts its backend
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, manifest = load_model_params(model, layout.params)
    cases = load_cases(layout.cases)
    check_features(
        read_json_object(layout.cases_manifest, ("features",))["features"], manifest, "data/cases"
    )
    dtype = jnp.dtype(config.precision.dtype)
    mesh = run_mesh(config.backend.num_devices, config.backend.model_axis)
    sharded = _sharded(model, mesh)
    meshes = describe_meshes(model, mesh)
    # A stochastic model's row keys: split from the seed's "forward" key on every path.
    key = forward_keys(config.seed)
    built = build_all(model, dtype, mesh, key)
    outputs, record = run_forward(
        model, params, cases, dtype, mesh, built=built, budget=config.budget, key=key
    )
    regrouped, composition = run_composition(
        model, params, cases, dtype, outputs, mesh, built=built, budget=config.budget, key=key
    )
    reference_outputs, reference_status = _run_reference(config, layout, model, dtype, mesh, built)
    grad_arrays, grad_record = _gradients(config, model, params, cases[STANDARD_CASE], dtype, key)
    # Bitwise batch invariance on the standard case, on this backend (the check reports
    # it, or fails it in mode "require"): each row alone costs one call per row and
    # path, so as many rows as the loop paths run (budget.loop_max_rows).
    # verdict.bitwise "off": not measured; nor for a sampling model, whose row alone
    # would be drawn with row 0's key, not its own.
    bits = (
        None
        if config.verdict.bitwise == "off" or model.stochastic
        else measure_case(
            model,
            params,
            cases,
            STANDARD_CASE,
            dtype,
            built["batch"],
            outputs,
            regrouped,
            runtime=runtime.as_dict(),
            max_rows=config.budget.loop_max_rows,
            capped_by="budget.loop_max_rows",
        )
    )
    # Every process has computed its part (the collectives were entered by all); only then
    # does process 0 write, once. The others are done.
    barrier("vmapcheck forward: outputs computed")
    if not writes():
        return None
    with atomic_dir(layout.forward) as folder:
        atomic_save_npz(folder / layout.outputs.name, outputs)
        atomic_save_npz(folder / layout.composition.name, regrouped)
        atomic_save_npz(folder / layout.reference_outputs.name, reference_outputs)
        atomic_save_npz(folder / layout.gradients.name, grad_arrays)
        atomic_write_json(
            folder / layout.record.name,
            forward_record(
                runtime=runtime.as_dict(),
                dtype=dtype.name,
                params_sha256=manifest["sha256"],
                not_provided=not_provided(model),
                sharded=sharded,
                meshes=meshes,
                reference=reference_status,
                gradients=grad_record,
                cases=record,
                composition=composition,
                # The budgets this stage applies (dvc.yaml: its params deps).
                budget=config.budget.model_dump(include={"loop_max_rows", "gradient_max_rows"}),
                bitwise=bits,
                keys=keys_record(config.seed, FORWARD_KEYS) if model.stochastic else None,
            ),
        )
    refused = sum(
        entry.get("refused", False) for per_path in record.values() for entry in per_path.values()
    )
    print(
        f"forward: {len(outputs)} outputs and {refused} refusals from {len(cases)} cases, "
        f"{len(regrouped)} on regrouped batches ({len(composition['cases'])} cases), on "
        f"{runtime.backend} ({runtime.device_kind}, {jax.device_count()} device(s)), dtype "
        f"{dtype.name}; {'; '.join(mesh_label(about) for about in meshes.values())}"
        f"{_across(jax.process_count())}; reference: {reference_status['status']}"
    )
    _say_what_was_cut(record, grad_record)
    return None
