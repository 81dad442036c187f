"""On a TPU or GPU: the shipped models' checks pass on the accelerator and a planted
batching mistake fails there (docs/accelerators.md). Skipped, with the reason, where JAX
finds no accelerator: CI has none, and this machine's results are the CPU suite's.

Run on an accelerator machine with the suite in one process (one process at a time may
hold a TPU): ``python -m pytest tests/test_accelerator.py``. The probe and the check each
run in a subprocess of their own, which opens the device and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.numerics import run_numerics


def _accelerator() -> str | None:
    """The platform JAX picks when nothing pins it (tpu, gpu), or None for the CPU."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    platform = probe.stdout.strip().splitlines()[-1] if probe.stdout.strip() else "cpu"
    return None if platform == "cpu" else platform


@pytest.fixture(scope="module")
def accelerator() -> str:
    """The accelerator's platform; the test is skipped, with the reason, where JAX finds
    only the CPU. Probed when the test runs, not at collection: a subprocess that imports
    JAX costs every test session seconds otherwise."""
    platform = _accelerator()
    if platform is None:
        pytest.skip(
            "no accelerator: JAX finds only the CPU here (CI has none); "
            "run it on a TPU or GPU machine (docs/accelerators.md)"
        )
    return platform


def test_the_shipped_models_pass_on_the_accelerator_and_a_planted_mistake_fails(
    tmp_path, accelerator
):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    args = ["--models", "mlp", "flax_cnn", "--precisions", "f32"]
    args += ["--planted-precisions", "f32", "--planted-paths", "loop_jit", "direct_jit"]
    result, _ = run_numerics(tmp_path / "numerics.json", [*args, "--rows", "8"], env)
    assert result["device"]["platform"] == accelerator
    assert {(c["model"], c["passed"]) for c in result["cells"]} == {
        ("mlp", True),
        ("flax_cnn", True),
    }
    assert result["planted"] and all(p.get("passed") is False for p in result["planted"])
