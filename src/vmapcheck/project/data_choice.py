"""The data ``vmapcheck init`` sets the project up for (``--data``, ``--data-path``): a
shipped option, or the user's table (a CSV) with its columns' roles, written as
conf/data/<name>.yaml; and the model's widths sized to that table."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from vmapcheck.errors import ConfigError, did_you_mean
from vmapcheck.project.model_choice import ModelChoice
from vmapcheck.project.options import OPTION_NAME, shipped_options


@dataclass(frozen=True)
class DataChoice:
    """The project's data: a shipped option (``synthetic``) or the user's own table."""

    name: str
    # None for a shipped option; else conf/data/<name>.yaml's content (source: csv).
    config: dict[str, Any] | None = None
    # The table, relative to the root, when it lies inside the repository (a DVC dep).
    dep: str | None = None


def _columns(path: Path) -> list[str]:
    """The column names of a .csv (its header) or .parquet table (its schema)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with path.open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise ConfigError(f"--data-path {path}: expected a header row of column names, found none")
    return header


def _listed(value: str | None) -> list[str]:
    return [c.strip() for c in (value or "").split(",") if c.strip()]


def _quasi_policies(value: str | None) -> dict[str, str]:
    """``--quasi-identifiers birth_date=year,postcode=prefix2`` as ``{column: policy}``.

    Raises:
        ConfigError: an entry without ``=``, or a policy vmapcheck does not know, naming
            it and the policies there are.
    """
    from typing import get_args

    from vmapcheck.config import QuasiPolicy

    known = get_args(QuasiPolicy)
    policies: dict[str, str] = {}
    for entry in _listed(value):
        column, _, policy = (part.strip() for part in entry.partition("="))
        if not column or policy not in known:
            raise ConfigError(
                f"--quasi-identifiers: expected column=policy with a policy of "
                f"{', '.join(known)}, found {entry!r}"
            )
        policies[column] = policy
    return policies


def resolve_data(
    root: Path,
    data: str | None,
    table: str | None = None,
    features: str | None = None,
    targets: str | None = None,
    identifiers: str | None = None,
    name: str | None = None,
    quasi_identifiers: str | None = None,
) -> DataChoice:
    """The project's data: a shipped option by name, or the user's table at ``table``
    (.csv or .parquet) with every column declared in one role, written as a data option
    of its own (``conf/data/<name>.yaml``, from the shipped ``csv`` option's settings).

    Raises:
        ConfigError: an unknown option, a table that does not exist, a column declared
            twice, declared but absent, or present but undeclared (it could be personal
            data: prepare would refuse it too).
    """
    if table is not None and data not in (None, "csv"):
        raise ConfigError(
            f"--data {data} and --data-path {table}: name a shipped option or your own "
            "table, not both"
        )
    data = data or "synthetic"
    if table is None:
        if data not in shipped_options("data"):
            raise ConfigError(
                f"--data: expected one of {', '.join(shipped_options('data'))}, found {data!r}"
                + did_you_mean(data, shipped_options("data"))
            )
        if features or targets or identifiers or quasi_identifiers or name:
            raise ConfigError(
                "--features, --targets, --identifiers, --quasi-identifiers, --data-name go "
                "with --data-path"
            )
        return DataChoice(name=data)
    path = (root / table) if not Path(table).is_absolute() else Path(table)
    if not path.is_file():
        raise ConfigError(f"--data-path: {table} is not a file (from {root})")
    quasi = _quasi_policies(quasi_identifiers)
    roles = {
        "features": _listed(features),
        "targets": _listed(targets),
        "identifiers": _listed(identifiers),
        "quasi-identifiers": list(quasi),
    }
    for role in ("features", "targets"):
        if not roles[role]:
            raise ConfigError(f"--data-path: name the table's {role} with --{role} a,b,...")
    declared = [c for cols in roles.values() for c in cols]
    twice = sorted({c for c in declared if declared.count(c) > 1})
    columns = _columns(path)
    absent = [c for c in declared if c not in columns]
    undeclared = [c for c in columns if c not in declared]
    if twice or absent or undeclared:
        raise ConfigError(
            f"--data-path {table}: every column in exactly one role (features, targets, "
            f"identifiers, quasi-identifiers); found declared twice: {twice or 'none'}; "
            f"declared, not in the table: {absent or 'none'}; in the table, not declared: "
            f"{undeclared or 'none'} "
            "(an undeclared column could be personal data: declare it --identifiers to drop it)"
        )
    config = yaml.safe_load(files("vmapcheck.conf").joinpath("data", "csv.yaml").read_text())
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = None
    config.update(
        path=rel or str(path),
        identifiers=roles["identifiers"],
        quasi_identifiers=quasi,
        features=roles["features"],
        targets=roles["targets"],
    )
    config["anonymize"]["group_by"] = roles["identifiers"][0] if roles["identifiers"] else None
    name = name or re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)
    if not OPTION_NAME.match(name) or name in shipped_options("data"):
        raise ConfigError(
            f"--data-name: expected a name of letters, digits, _ or - that no shipped data "
            f"option has, found {name!r}"
        )
    return DataChoice(name=name, config=config, dep=rel)


def sized_to_table(model: ModelChoice, data: DataChoice) -> dict[str, Any] | None:
    """The shipped model option ``model`` sized to the user's table ``data`` (its
    ``in_features`` = the feature columns, ``out_features`` = the target columns), or
    None when there is nothing to size: the user's own factory, a shipped data option,
    or sizes that already match.

    Raises:
        ConfigError: the shipped model takes an input contract of fixed shape (an image,
            token ids) that the table's feature columns do not fill, naming both.
    """
    if model.config is not None or data.config is None:
        return None
    shipped = yaml.safe_load(
        files("vmapcheck.conf").joinpath("model", f"{model.name}.yaml").read_text()
    )
    features, targets = len(data.config["features"]), len(data.config["targets"])
    if (shipped["in_features"], shipped["out_features"]) == (features, targets):
        return None
    if shipped.get("inputs") and shipped["in_features"] != features:
        raise ConfigError(
            f"--model {model.name} takes an input contract of {shipped['in_features']} "
            f"feature columns ({', '.join(shipped['inputs'])}), but --features names "
            f"{features}: choose a model that takes a flat vector (mlp, flax_mlp, "
            "equinox_mlp) or a factory of your own (docs/own-model.md)"
        )
    return {**shipped, "in_features": features, "out_features": targets}
