"""Whether the data ``vmapcheck init`` sets up fills the model's input contract: a model
whose leaves take token ids or a mask (``model.inputs``, :mod:`vmapcheck.core.contract`)
needs feature columns of whole ids in range and 0/1 values, which a table of real numbers
(the default synthetic one) does not hold. Checked on the table itself, before anything is
written, by the one function ``prepare`` builds its cases with
(:meth:`~vmapcheck.core.contract.InputSpec.from_table`), so that init refuses what
``prepare`` would, naming the option that fits."""

from __future__ import annotations

from pathlib import Path

import yaml

from vmapcheck.compose import compose_yaml
from vmapcheck.config import Config, validate_config
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.project.options import shipped_options

# A data option of a table of the user's own (--data-path): never a built-in that fits.
FILE_OPTION = "csv"


def misfit(config: Config, root: Path) -> str | None:
    """Why the data of ``config`` (validated) does not fill its model's input leaves,
    naming the leaf and the column (never a value: a table may hold personal data); None
    when it does. Float leaves take any number and ``Config`` checks the widths, so the
    table is read (generated, for a synthetic one) only for a model with id or mask
    leaves."""
    from vmapcheck.core.contract import InputSpec
    from vmapcheck.core.keys import named_keys
    from vmapcheck.data.splits import load_raw

    spec = InputSpec.from_config(config.model)
    if not (spec.has("int32") or spec.has("bool")):
        return None
    raw = load_raw(config.data, named_keys(config.seed)["data"], root, git_guard=False)
    try:
        spec.from_table(raw.features, raw.schema.features)
    except ArtifactError as exc:
        return str(exc)
    return None


def _leaves(config: Config) -> str:
    """``tokens (64,) int32 ids in [0, 17), mask (64,) bool`` from ``model.inputs``."""
    from vmapcheck.core.contract import InputSpec

    parts = []
    for leaf in InputSpec.from_config(config.model).leaves:
        what = {"int32": f"int32 ids in [0, {leaf.vocab})", "bool": "bool (0 or 1)"}
        parts.append(f"{leaf.name} {tuple(leaf.shape)} {what.get(leaf.dtype, leaf.dtype)}")
    return ", ".join(parts)


def refuse_unfit_data(conf: Path, params: str, root: Path, model: str, data: str) -> None:
    """Refuse a data option whose table does not fill the model's leaves (:func:`misfit`),
    naming the model, what its leaves take, what the data gives and the options that fix
    it: the built-in data options that fit (each composed from ``conf``, the planned
    conf/ folder, and tried), and ``--data-path`` for a table of the user's own.

    Raises:
        ConfigError: the data does not fit.
    """
    config = validate_config(yaml.safe_load(params))
    problem = misfit(config, root)
    if problem is None:
        return
    fitting = []
    for option in shipped_options("data"):
        if option in (data, FILE_OPTION):
            continue
        try:
            other = validate_config(yaml.safe_load(compose_yaml(conf, [f"data={option}"])))
        except ConfigError:
            continue  # another width than the model's: it does not fit either
        if misfit(other, root) is None:
            fitting.append(option)
    chosen = " or ".join(f"--data {option}" for option in fitting)
    raise ConfigError(
        f"--model {model} takes {_leaves(config)} (model.inputs), but --data {data} gives "
        f"{config.data.n_features} feature columns that do not fill them: {problem}. Fix: "
        + (f"{chosen} (its table fits), or " if fitting else "")
        + "a table of your own (--data-path FILE --features a,b,... --targets y) whose "
        "feature columns hold what the leaves take, in their order"
    )
