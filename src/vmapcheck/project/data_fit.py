"""Whether the data ``vmapcheck init`` sets up fills the model's input contract
(``model.inputs``, :mod:`vmapcheck.core.contract`): as many feature columns as its leaves
take, and, for leaves of token ids or a mask, columns of whole ids in range and 0/1
values, which a table of real numbers (the default synthetic one) does not hold. Checked
before anything is written, on the table itself, by the function ``prepare`` builds its
cases with (:meth:`~vmapcheck.core.contract.InputSpec.from_table`), so that init refuses
what ``prepare`` would, naming the data options that fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from vmapcheck.compose import compose_yaml
from vmapcheck.config import DataConfig, ModelConfig
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.project.options import shipped_options

# A data option of a table of the user's own (--data-path): never a built-in that fits.
FILE_OPTION = "csv"


def _sections(params: dict[str, Any]) -> tuple[ModelConfig, DataConfig, int] | None:
    """The validated model and data sections and the seed of composed ``params``; None
    when one does not validate (``validate_config`` then names the key)."""
    try:
        model = ModelConfig.model_validate(params["model"])
        data: DataConfig = TypeAdapter(DataConfig).validate_python(params["data"])
        seed = int(params["seed"])
    except (ValidationError, KeyError, TypeError, ValueError):
        return None
    return model, data, seed


def misfit(params: dict[str, Any], root: Path) -> str | None:
    """Why the data of composed ``params`` does not fill its model's input leaves: its
    width, or the leaf and column of a value the leaf cannot take (never a value: a table
    may hold personal data); None when it fills them, or when a section does not
    validate. Float leaves take any number, so the table is read (generated, for a
    synthetic one) only for a model with id or mask leaves."""
    from vmapcheck.core.contract import InputSpec
    from vmapcheck.core.keys import named_keys
    from vmapcheck.data.splits import load_raw

    sections = _sections(params)
    if sections is None:
        return None
    model, data, seed = sections
    if data.n_features != model.in_features:
        return (
            f"its table has {data.n_features} feature columns, the leaves take "
            f"{model.in_features} (model.in_features)"
        )
    spec = InputSpec.from_config(model)
    if not (spec.has("int32") or spec.has("bool")):
        return None
    raw = load_raw(data, named_keys(seed)["data"], root, git_guard=False)
    try:
        spec.from_table(raw.features, raw.schema.features)
    except ArtifactError as exc:
        return str(exc)
    return None


def _leaves(model: ModelConfig) -> str:
    """``tokens (64,) int32 ids in [0, 17), mask (64,) bool (0 or 1) (model.inputs)``, or
    ``one float vector of 8 features (model.in_features)``."""
    if model.inputs is None:
        return f"one float vector of {model.in_features} features (model.in_features)"
    parts = []
    for name, leaf in model.inputs.items():
        what = {"int32": f"int32 ids in [0, {leaf.vocab})", "bool": "bool (0 or 1)"}
        parts.append(f"{name} {tuple(leaf.shape)} {what.get(leaf.dtype, leaf.dtype)}")
    return ", ".join(parts) + " (model.inputs)"


def refuse_unfit_data(conf: Path, params: str, root: Path, model: str, data: str) -> None:
    """Refuse a data option whose table does not fill the model's leaves (:func:`misfit`),
    naming the model, what its leaves take, what the data gives and the options that fix
    it: the built-in data options that fit (each composed from ``conf``, the planned
    conf/ folder, and tried), and ``--data-path`` for a table of the user's own.

    Raises:
        ConfigError: the data does not fit.
    """
    composed = yaml.safe_load(params)
    problem = misfit(composed, root)
    sections = _sections(composed)
    if problem is None or sections is None:
        return
    fitting = []
    for option in shipped_options("data"):
        if option in (data, FILE_OPTION):
            continue
        try:
            other = yaml.safe_load(compose_yaml(conf, [f"data={option}"]))
        except ConfigError:
            continue  # it does not compose with this conf/: no option to offer
        if _sections(other) is not None and misfit(other, root) is None:
            fitting.append(option)
    fits = "its table fits" if len(fitting) == 1 else "each fits"
    chosen = " or ".join(f"--data {option}" for option in fitting) + f" ({fits}), or "
    raise ConfigError(
        f"--model {model} takes {_leaves(sections[0])}, but --data {data} does not fill "
        f"them: {problem}. Fix: "
        + (chosen if fitting else "")
        + "a table of your own (--data-path FILE --features a,b,... --targets y) whose "
        "feature columns hold what the leaves take, in their order"
    )
