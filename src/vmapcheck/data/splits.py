"""What ``prepare`` does with the raw table: read or generate it, anonymize, split.

The raw table (personal columns included) exists only in memory here; what leaves this
module for disk is anonymized (see :mod:`vmapcheck.data.anonymize`).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from vmapcheck.config import DataConfig, FileDataConfig
from vmapcheck.data.anonymize import AnonymizedTable, AnonymizePolicy
from vmapcheck.data.builtin import (
    diabetes_raw_table,
    diabetes_schema,
    digit_tokens_raw_table,
    digit_tokens_schema,
    digits_raw_table,
    digits_schema,
    synthetic_raw_table,
)
from vmapcheck.data.git_guard import refuse_if_git_would_carry
from vmapcheck.data.regression import SPLITS
from vmapcheck.data.sources import RawTable, Schema, read_table
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_save_npz


def load_raw(config: DataConfig, key: jax.Array, root: Path, git_guard: bool = True) -> RawTable:
    """The raw table, personal columns included: it lives in memory only.

    ``synthetic``: generated from ``key``. ``csv``: read from ``root / config.path``
    (.csv or .parquet) against the declared schema, which raises SourceError naming the
    file, column and row of anything that does not fit. ``diabetes``: the table that
    scikit-learn ships, with its columns in the configured roles (ConfigError naming the
    key for a column it lacks or leaves undeclared); ``digits``: the 8x8 images
    scikit-learn ships, the same way, and ``digit_tokens`` the same images as padded
    token sequences (cropped by a fixed-seed generator, not ``key``). Only ``synthetic``
    uses ``key``. ``git_guard=False``: a file git would carry is read anyway (``vmapcheck
    init`` reads the table before it writes the .gitignore rules that keep it out).
    """
    if config.source == "synthetic":
        return synthetic_raw_table(
            key,
            config.n_rows,
            config.n_features,
            config.n_targets,
            config.noise_std,
            dict(config.quasi_identifiers),
        )
    bundled = {
        "diabetes": (diabetes_schema, diabetes_raw_table),
        "digits": (digits_schema, digits_raw_table),
        "digit_tokens": (digit_tokens_schema, digit_tokens_raw_table),
    }
    if config.source in bundled:
        schema_of, table_of = bundled[config.source]
        schema = schema_of(
            dict(config.quasi_identifiers), tuple(config.features), tuple(config.targets)
        )
        return table_of(schema)
    assert isinstance(config, FileDataConfig)  # the one source left: a file of the user's
    schema = Schema(
        identifiers=tuple(config.identifiers),
        quasi_identifiers=dict(config.quasi_identifiers),
        features=tuple(config.features),
        targets=tuple(config.targets),
    )
    path = root / config.path
    # Before a row is read: a table git carries (or would carry) is refused.
    if git_guard:
        refuse_if_git_would_carry(path, root)
    return read_table(path, schema, config.delimiter)


def anonymize_policy(config: DataConfig) -> AnonymizePolicy:
    anon = config.anonymize
    return AnonymizePolicy(
        join_key=anon.join_key, secret_env=anon.secret_env, group_by=anon.group_by
    )


def split_indices(
    key: jax.Array, group_ids: np.ndarray, config: DataConfig
) -> dict[str, np.ndarray]:
    """Disjoint, deterministic train/val/test row indices; a record never spans two splits.

    ``group_ids`` (n_rows,) marks rows of one record (the same person, say). Records are
    shuffled by one permutation drawn from ``key`` and dealt to train, then val, then test
    until each split holds its fraction of the rows, so every row of a record lands in
    the same split. Without ``data.anonymize.group_by`` (the diabetes table: one row per
    patient, no id) ``group_ids`` is 0..n-1: each row is a record, and the splits are
    disjoint by row.
    """
    n_rows = group_ids.shape[0]
    n_groups = int(group_ids.max()) + 1 if n_rows else 0
    order = np.asarray(jax.random.permutation(key, n_groups))
    sizes = np.bincount(group_ids, minlength=n_groups)[order]
    # Rows before each record, in shuffled order; the record goes where its first row falls.
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    bounds = np.array([config.split.train, config.split.train + config.split.val]) * n_rows
    split_of_group = np.empty(n_groups, dtype=np.int64)
    split_of_group[order] = np.searchsorted(bounds, starts, side="right")
    row_split = split_of_group[group_ids]
    parts = {name: np.flatnonzero(row_split == i) for i, name in enumerate(SPLITS)}
    for name, idx in parts.items():
        if idx.size == 0:
            raise ArtifactError(
                f"split {name!r} is empty ({n_rows} rows in {n_groups} records): use more rows "
                f"or a larger data.split.{name}"
            )
    return parts


def write_splits(folder: Path, table: AnonymizedTable, parts: dict[str, np.ndarray]) -> None:
    """One .npz per split: features, targets, the source row index and any kept columns."""
    for name, idx in parts.items():
        arrays = {"features": table.features[idx], "targets": table.targets[idx], "row": idx}
        if table.join_keys is not None:
            arrays["join_key"] = table.join_keys[idx]
        for column, values in table.generalized.items():
            arrays[column] = values[idx]
        atomic_save_npz(Path(folder) / f"{name}.npz", arrays)
