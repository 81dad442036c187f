"""Python code in a fresh interpreter, for what this test process cannot do itself: JAX
starts with its CPU device count fixed (conftest.py's 2), so a test of 8 devices, or of
the backend chosen at start-up, runs its code in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S


def json_of_python(code: str, jax_platforms: str) -> Any:
    """Run ``code`` (dedented) with this interpreter in the repository root, in a bare
    environment (``JAX_PLATFORMS`` as given: "" lets JAX choose); the JSON of its last
    line of standard output. A non-zero exit fails the test with its standard error."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "JAX_PLATFORMS": jax_platforms}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])
