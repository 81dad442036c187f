"""DVC stage `train`: fit on train, select on validation, test once -> verified params."""

import jax

from vmapcheck.config import Config
from vmapcheck.io import atomic_dir, atomic_write_json
from vmapcheck.keys import named_keys
from vmapcheck.models import build_model
from vmapcheck.params_io import save_params
from vmapcheck.regression import SPLITS, load_split
from vmapcheck.runtime import configure_cpu_float32
from vmapcheck.stage import PARAMS, PREPARED, REPORTS, stage_main
from vmapcheck.training import fit


@stage_main("train")
def main(config: Config) -> None:
    runtime = configure_cpu_float32()
    keys = named_keys(config.seed)
    model = build_model(config.model)
    splits = {name: load_split(PREPARED, name) for name in SPLITS}
    params, metrics = fit(model, model.init(keys["init"]), splits, config.train, keys["batches"])
    with atomic_dir(PARAMS) as folder:
        save_params(
            folder,
            jax.device_get(params),
            {"model": config.model.name, "seed": config.seed, "jax_version": runtime.jax_version},
        )
    atomic_write_json(REPORTS / "train.json", metrics)
    print(
        f"train: model {model.name}, trained={metrics['trained']}, best step "
        f"{metrics['best_step']}, val loss {metrics['val_loss']:.4g}, test loss "
        f"{metrics['test_loss']:.4g}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
