"""On a TPU or GPU: the shipped models' checks pass on the accelerator and a planted
batching mistake fails there (docs/accelerators.md). Skipped, with the reason, where JAX
finds no accelerator: CI has none, and this machine's results are the CPU suite's.

Run on an accelerator machine with the suite in one process (one process at a time may
hold a TPU): ``python -m pytest tests/test_accelerator.py``. The probe and the check each
run in a subprocess of their own, which opens the device and exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.config import ROOT

SCRIPT = ROOT / "benchmarks" / "tpu_numerics.py"


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


ACCELERATOR = _accelerator()
pytestmark = pytest.mark.skipif(
    ACCELERATOR is None,
    reason="no accelerator: JAX finds only the CPU here (CI has none); "
    "run it on a TPU or GPU machine (docs/accelerators.md)",
)


def test_the_shipped_models_pass_on_the_accelerator_and_a_planted_mistake_fails(tmp_path):
    out = tmp_path / "numerics.json"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--models",
            "mlp",
            "flax_cnn",
            "--precisions",
            "f32",
            "--planted-precisions",
            "f32",
            "--planted-paths",
            "loop_jit",
            "direct_jit",
            "--rows",
            "8",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"]["platform"] == ACCELERATOR
    assert {(c["model"], c["passed"]) for c in result["cells"]} == {
        ("mlp", True),
        ("flax_cnn", True),
    }
    assert result["planted"] and all(p.get("passed") is False for p in result["planted"])
