"""DVC stage `forward`: loop, vmap and direct (eager and jit) on every case, on the backend."""

import jax.numpy as jnp

from vmapcheck.config import Config
from vmapcheck.data import load_cases
from vmapcheck.forward import run_forward
from vmapcheck.io import atomic_dir, atomic_save_npz, atomic_write_json
from vmapcheck.models import build_model
from vmapcheck.params_io import load_model_params
from vmapcheck.runtime import configure_jax
from vmapcheck.stage import CASES, FORWARD, PARAMS, stage_main


@stage_main("forward")
def main(config: Config) -> None:
    runtime = configure_jax(config.backend, config.precision)
    model = build_model(config.model)
    params, manifest = load_model_params(model, PARAMS)
    cases = load_cases(CASES)
    dtype = jnp.dtype(config.precision.dtype)
    outputs, record = run_forward(model, params, cases, dtype)
    with atomic_dir(FORWARD) as folder:
        atomic_save_npz(folder / "outputs.npz", outputs)
        atomic_write_json(
            folder / "record.json",
            {
                "runtime": runtime.as_dict(),
                "dtype": dtype.name,
                "params_sha256": manifest["sha256"],
                "cases": record,
            },
        )
    print(
        f"forward: {len(outputs)} outputs from {len(cases)} cases on {runtime.backend} "
        f"({runtime.device_kind}), dtype {dtype.name}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
