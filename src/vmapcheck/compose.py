"""Compose params.yaml from conf/ exactly as ``dvc exp run`` does (Hydra + OmegaConf).

Usage: ``vmapcheck params [override ...]`` (e.g. ``model=toy``; ``make params``).
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vmapcheck.errors import ConfigError
from vmapcheck.io import atomic_write_text
from vmapcheck.layout import Layout
from vmapcheck.running import register as register_run_guard


def compose_yaml(conf_dir: Path, overrides: list[str] | None = None) -> str:
    """Return the YAML text DVC's Hydra integration would write for these overrides.

    Raises:
        ConfigError: an override Hydra cannot apply (a key that does not exist without
            ``+``, an option no file of the group has, a malformed override), with
            Hydra's own message, which names the override.
    """
    # conf/config.yaml's seed goes through it (one pipeline run at a time in a workspace).
    register_run_guard()
    try:
        with initialize_config_dir(str(conf_dir.resolve()), version_base=None):
            cfg = compose(config_name="config", overrides=list(overrides or []))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"overrides {list(overrides or [])}: {exc}") from None
    return OmegaConf.to_yaml(cfg)


def run_params(layout: Layout, overrides: list[str] | None = None) -> int:
    """``vmapcheck params``: rewrite ``layout.params_yaml`` from ``layout.conf``."""
    overrides = list(overrides or [])
    if not layout.conf.is_dir():
        raise ConfigError(
            f"{layout.conf}: not found; `vmapcheck params` composes params.yaml from the "
            "project's conf/ (`vmapcheck init` writes it)"
        )
    text = compose_yaml(layout.conf, overrides)
    atomic_write_text(layout.params_yaml, text)
    print(f"params.yaml composed from conf/ with overrides {overrides or '[]'}")
    return 0
