"""Compose params.yaml from conf/ exactly as ``dvc exp run`` does (Hydra + OmegaConf).

Usage: ``vmapcheck params [override ...]`` (e.g. ``model=toy``; ``make params``).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vmapcheck.config import validate_config
from vmapcheck.config.load import PARAMS_MAX_BYTES
from vmapcheck.errors import ArtifactError, ConfigError, describe, did_you_mean, redact
from vmapcheck.io import atomic_write_text, read_text_bounded
from vmapcheck.layout import Layout
from vmapcheck.running import register as register_run_guard


def compose_yaml(conf_dir: Path, overrides: list[str] | None = None) -> str:
    """Return the YAML text DVC's Hydra integration would write for these overrides.

    Raises:
        ConfigError: an override Hydra cannot apply (a key that does not exist without
            ``+``, an option no file of the group has, a malformed override). A
            mistyped key or option is named with the closest one and those there are
            (:func:`_unknown_name`); any other refusal with Hydra's own message, which
            names the override.
    """
    overrides = list(overrides or [])
    _check_conf_files(conf_dir)
    # A refused override is named without a credential it may hold (running.compose_guard).
    shown = [redact(o) for o in overrides]
    try:
        cfg = _composed(conf_dir, overrides)
        OmegaConf.resolve(cfg)
    except yaml.YAMLError as exc:  # a conf file Hydra could not parse: which one
        raise ConfigError(_broken_yaml(conf_dir, exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        found = _unknown_name(exc, conf_dir, overrides)
        if found is None:
            raise ConfigError(f"overrides {shown}: {exc}") from None
        # Hydra's own advice for a key the config lacks is to add it with "+": every key
        # is then refused by the stages' validation (no vmapcheck key is open-ended).
        raise ConfigError(f"overrides {shown}: {found}") from None
    return OmegaConf.to_yaml(cfg)


def _check_conf_files(conf_dir: Path) -> None:
    """Refuse, naming it, a file under ``conf_dir`` that Hydra would block on (a FIFO),
    read without end (a device), skip without a word (a directory, a symlink loop: then
    "cannot find primary config"), or fail on undecoded (not UTF-8): each must be a
    regular UTF-8 file of at most :data:`PARAMS_MAX_BYTES`.

    Raises:
        ConfigError: naming the file, what was expected and what was found.
    """
    for path in sorted(conf_dir.rglob("*.yaml")):
        try:
            read_text_bounded(path, PARAMS_MAX_BYTES, "a config file")
        except ArtifactError as exc:
            raise ConfigError(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: {describe(exc)}") from None
        except OSError as exc:  # a symlink loop, a dangling link, no permission
            raise ConfigError(str(describe(exc))) from None


def _broken_yaml(conf_dir: Path, error: yaml.YAMLError) -> str:
    """A refusal naming the file under ``conf_dir`` that is not valid YAML (Hydra's
    error names none), where, and what the parser expected and found."""
    for path in sorted(conf_dir.rglob("*.yaml")):
        try:
            yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            error = exc
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or "not valid YAML"
            context = getattr(exc, "context", None)
            return f"{path}:{where}: expected valid YAML, found {problem}" + (
                f" ({context})" if context else ""
            )
        except (OSError, UnicodeDecodeError):
            continue  # not what Hydra refused; the boundary names it if it matters
    return f"{conf_dir}: a config file is not valid YAML: {' '.join(str(error).split())}"


def _composed(conf_dir: Path, overrides: list[str]) -> DictConfig:
    # conf/config.yaml's seed goes through it (one pipeline run at a time in a workspace).
    register_run_guard()
    with initialize_config_dir(str(conf_dir.resolve()), version_base=None):
        return compose(config_name="config", overrides=overrides)


def _override_key(override: str) -> str:
    """``+precision.tolerance.rtol=1e-5`` -> ``precision.tolerance.rtol``."""
    return override.split("=", 1)[0].lstrip("+~")


def _unknown_name(exc: Exception, conf_dir: Path, overrides: list[str]) -> str | None:
    """What Hydra refused, when it is a name the config lacks, with the closest one:
    ``model=flax_mpl: no model option is named flax_mpl (did you mean flax_mlp?)``, or
    ``precision.tolerence: unknown key; precision's keys: dtype, tolerance, ... (did you
    mean tolerance?)``. The keys are those of the config composed without the overrides
    of the refused key. None for any other refusal (Hydra's message is then shown)."""
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        return (
            f"{group}={option}: no {group} option is named {option}"
            f"{did_you_mean(option, exc.options)}; the options: {', '.join(exc.options)}"
        )
    full_key = getattr(exc.__cause__, "full_key", None)
    if not isinstance(full_key, str) or not full_key:
        return None
    others = [
        o
        for o in overrides
        if not (_override_key(o) == full_key or _override_key(o).startswith(f"{full_key}."))
    ]
    try:
        cfg = _composed(conf_dir, others)
    except (HydraException, OmegaConfBaseException):
        return None  # another override is refused too: Hydra's message names the first
    parent, _, missing = full_key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig):
        return None
    known = [str(k) for k in node]
    where = f"{parent}'s keys" if parent else "the top-level keys"
    return f"{full_key}: unknown key{did_you_mean(missing, known)}; {where}: {', '.join(known)}"


def run_params(layout: Layout, overrides: list[str] | None = None) -> int:
    """``vmapcheck params``: rewrite ``layout.params_yaml`` from ``layout.conf``."""
    overrides = list(overrides or [])
    if not layout.conf.is_dir():
        raise ConfigError(
            f"{layout.conf}: not found; `vmapcheck params` composes params.yaml from the "
            "project's conf/ (`vmapcheck init` writes it)"
        )
    text = compose_yaml(layout.conf, overrides)
    # A key added with "+" (Hydra's advice for a mistyped one) composes, and every stage
    # would refuse it: refused here, named, and params.yaml left as it was.
    validate_config(yaml.safe_load(text), source=f"params.yaml composed with {overrides}")
    atomic_write_text(layout.params_yaml, text)
    print(f"params.yaml composed from conf/ with overrides {overrides or '[]'}")
    return 0
