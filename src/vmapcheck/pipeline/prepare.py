"""Stage `prepare`: raw table -> anonymized, disjoint train/val/test -> regression cases.

The raw table (personal columns included) exists only in memory: what is written has
its identifiers dropped or pseudonymized and its quasi-identifiers generalized or
dropped, and the manifest says what was done to each column, never a value. Everything
is validated before anything is written, so a bad input leaves no outputs behind.
"""

from vmapcheck.config import Config
from vmapcheck.core.contract import InputSpec
from vmapcheck.core.keys import named_keys
from vmapcheck.core.memory import check_table_memory
from vmapcheck.core.runtime import configure_cpu_float32
from vmapcheck.data.anonymize import anonymize
from vmapcheck.data.regression import SPLITS, regression_cases, write_cases
from vmapcheck.data.splits import anonymize_policy, load_raw, split_indices, write_splits
from vmapcheck.io import atomic_dir, atomic_write_json
from vmapcheck.layout import Layout

PERSONAL_ROLES = ("identifier", "quasi_identifier")


def run(config: Config, layout: Layout) -> None:
    configure_cpu_float32()
    keys = named_keys(config.seed)
    if config.data.source == "synthetic":
        # Generated from the config: its size is known before a row is made.
        data = config.data
        check_table_memory(
            data.n_rows,
            data.n_features + data.n_targets,
            f"data.n_rows={data.n_rows}, data.n_features={data.n_features}, "
            f"data.n_targets={data.n_targets}",
        )
    raw = load_raw(config.data, keys["data"], layout.root)
    table = anonymize(raw, anonymize_policy(config.data))
    del raw  # nothing personal beyond this point
    parts = split_indices(keys["split"], table.group_ids, config.data)
    cases = regression_cases(
        table.features[parts["train"]],
        table.features[parts["test"]],
        table.targets[parts["test"]],
        config.data.standard_batch,
        InputSpec.from_config(config.model),
        table.feature_names,
    )
    anon = config.data.anonymize
    # The source's identifier and quasi-identifier columns; [] says it had none at all
    # (data=digits: pixels and labels only), not that some were left out.
    personal = [c["name"] for c in table.columns if c["role"] in PERSONAL_ROLES]
    manifest = {
        "source": config.data.source,
        **({"path": config.data.path} if config.data.source == "csv" else {}),
        "features": list(table.feature_names),
        "targets": list(table.target_names),
        "dtype": str(table.features.dtype),
        "columns": table.columns,
        "anonymization": {
            "personal_columns": personal,
            "join_key": anon.join_key,
            "pseudonym": f"HMAC-SHA256, secret from the environment variable {anon.secret_env}"
            if anon.join_key
            else None,
            "split_records_by": anon.group_by,
        },
        "rows": {name: int(parts[name].size) for name in SPLITS},
    }
    with atomic_dir(layout.prepared) as folder:
        write_splits(folder, table, parts)
        atomic_write_json(folder / layout.prepared_manifest.name, manifest)
    with atomic_dir(layout.cases) as folder:
        write_cases(folder, cases, list(table.feature_names))
    sizes = ", ".join(f"{name} {parts[name].size}" for name in SPLITS)
    done = [f"{c['name']}: {c['action']}" for c in table.columns if c["role"] in PERSONAL_ROLES]
    actions = ", ".join(done) or "nothing to do: no identifier or quasi-identifier column"
    print(f"prepare: {table.features.shape[0]} rows ({config.data.source}) split into {sizes}")
    print(f"prepare: anonymized ({actions}); {len(cases)} regression cases")
