"""The project root, and configs composed from conf/ as ``dvc exp run -S`` composes them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The shipped config groups (vmapcheck/conf/), on the search path of conf/config.yaml.
PACKAGE_CONF = ROOT / "src" / "vmapcheck" / "conf"


def compose_config(*overrides: str):
    """Validated Config composed from conf/ with Hydra overrides (as dvc exp run -S)."""
    import yaml

    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import validate_config

    return validate_config(yaml.safe_load(compose_yaml(ROOT / "conf", list(overrides))))
