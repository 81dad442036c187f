"""Shared test set-up: JAX on CPU, project paths, a helper to compose configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before JAX starts: the tests run on CPU whatever the machine has.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def compose_config(*overrides: str):
    """Validated Config composed from conf/ with Hydra overrides (as dvc exp run -S)."""
    import yaml

    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import validate_config

    return validate_config(yaml.safe_load(compose_yaml(ROOT / "conf", list(overrides))))
