"""Compose params.yaml from conf/ exactly as ``dvc exp run`` does (Hydra + OmegaConf).

Usage: ``python -m vmapcheck.compose [override ...]`` (e.g. ``model=toy``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from vmapcheck.io import atomic_write_text


def compose_yaml(conf_dir: Path, overrides: list[str] | None = None) -> str:
    """Return the YAML text DVC's Hydra integration would write for these overrides."""
    with initialize_config_dir(str(conf_dir.resolve()), version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    OmegaConf.resolve(cfg)
    return OmegaConf.to_yaml(cfg)


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    text = compose_yaml(Path("conf"), overrides)
    atomic_write_text(Path("params.yaml"), text)
    print(f"params.yaml composed from conf/ with overrides {overrides or '[]'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
