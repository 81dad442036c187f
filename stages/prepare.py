"""DVC stage `prepare`: synthetic table -> disjoint train/val/test splits + regression cases."""

from vmapcheck.config import Config
from vmapcheck.data import (
    load_split,
    regression_cases,
    split_indices,
    synthetic_table,
    write_cases,
    write_splits,
)
from vmapcheck.io import atomic_dir, atomic_write_json
from vmapcheck.keys import named_keys
from vmapcheck.runtime import configure_cpu_float32
from vmapcheck.stage import CASES, PREPARED, stage_main


@stage_main("prepare")
def main(config: Config) -> None:
    configure_cpu_float32()
    keys = named_keys(config.seed)
    table = synthetic_table(keys["data"], config.data)
    parts = split_indices(keys["split"], config.data.n_rows, config.data)
    with atomic_dir(PREPARED) as folder:
        write_splits(folder, table, parts)
        atomic_write_json(
            folder / "manifest.json",
            {
                "source": config.data.source,
                "n_features": config.data.n_features,
                "n_targets": config.data.n_targets,
                "dtype": str(table.features.dtype),
                "rows": {name: int(idx.size) for name, idx in parts.items()},
            },
        )
        train_x, _ = load_split(folder, "train")
        test_x, _ = load_split(folder, "test")
    cases = regression_cases(train_x, test_x, config.data.standard_batch)
    with atomic_dir(CASES) as folder:
        write_cases(folder, cases)
    sizes = ", ".join(f"{name} {idx.size}" for name, idx in parts.items())
    print(f"prepare: {config.data.n_rows} rows split into {sizes}; {len(cases)} regression cases")


if __name__ == "__main__":
    raise SystemExit(main())
