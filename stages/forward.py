"""DVC stage `forward`: loop, vmap and direct (eager and jit), and the data-parallel
sharded_jit over backend.num_devices devices, on every case, on the backend.

Also evaluates the stored reference's params on the reference's inputs, so `check` can
compare this run (this JAX, this backend) with the verified run that made it.
"""

import jax
import jax.numpy as jnp

from vmapcheck.config import Config
from vmapcheck.errors import ArtifactError
from vmapcheck.forward import run_forward
from vmapcheck.gradients import gradient_probe
from vmapcheck.io import atomic_dir, atomic_save_npz, atomic_write_json, read_json
from vmapcheck.models import build_model
from vmapcheck.params_io import check_features, load_model_params
from vmapcheck.paths import ShardedForward, cast_tree, data_mesh, not_provided
from vmapcheck.reference import load_reference, reference_dir
from vmapcheck.regression import load_cases
from vmapcheck.runtime import configure_jax
from vmapcheck.stage import CASES, FORWARD, PARAMS, ROOT, stage_main


def _run_reference(config: Config, model, dtype, mesh):
    """(outputs on the reference bundle, {"status", "message"})."""
    folder = reference_dir(config, ROOT)
    where = folder.relative_to(ROOT)
    try:
        reference = load_reference(folder)
    except ArtifactError as exc:
        return {}, {"status": "corrupt", "message": str(exc)}
    if reference is None:
        return {}, {
            "status": "missing",
            "message": f"no reference for model {config.model.name} in {where}: "
            "run the pipeline, then `make reference REASON='...'`",
        }
    try:
        params, _ = load_model_params(model, folder)
    except ArtifactError as exc:
        return {}, {
            "status": "incompatible",
            "message": f"{where} does not fit model {config.model.name} as configured: {exc}",
        }
    outputs, _ = run_forward(model, params, reference["cases"], dtype, mesh)
    return outputs, {"status": "ok", "message": f"evaluated {where}"}


@stage_main("forward")
def main(config: Config) -> None:
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, manifest = load_model_params(model, PARAMS)
    cases = load_cases(CASES)
    check_features(read_json(CASES / "manifest.json")["features"], manifest, "data/cases")
    dtype = jnp.dtype(config.precision.dtype)
    mesh = data_mesh(config.backend.num_devices)
    sharded = ShardedForward(model, mesh).describe()
    outputs, record = run_forward(model, params, cases, dtype, mesh)
    reference_outputs, reference_status = _run_reference(config, model, dtype, mesh)
    standard = cases["standard"]
    grad_arrays, grad_record = gradient_probe(
        model,
        cast_tree(params, dtype),
        jnp.asarray(standard["x"], dtype=dtype),
        jnp.asarray(standard["y"], dtype=dtype),
    )
    with atomic_dir(FORWARD) as folder:
        atomic_save_npz(folder / "outputs.npz", outputs)
        atomic_save_npz(folder / "reference_outputs.npz", reference_outputs)
        atomic_save_npz(folder / "gradients.npz", grad_arrays)
        atomic_write_json(
            folder / "record.json",
            {
                "runtime": runtime.as_dict(),
                "dtype": dtype.name,
                "params_sha256": manifest["sha256"],
                "not_provided": not_provided(model),
                "sharded": sharded,
                "reference": reference_status,
                "gradients": grad_record,
                "cases": record,
            },
        )
    refused = sum(
        entry.get("refused", False) for per_path in record.values() for entry in per_path.values()
    )
    print(
        f"forward: {len(outputs)} outputs and {refused} refusals from {len(cases)} cases on "
        f"{runtime.backend} ({runtime.device_kind}, {jax.device_count()} device(s)), dtype "
        f"{dtype.name}; sharded_jit (data-parallel, not vmap) over a mesh of "
        f"{sharded['devices']} device(s); reference: {reference_status['status']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
