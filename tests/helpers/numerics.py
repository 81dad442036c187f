"""Running benchmarks/tpu_numerics.py from a test, in a subprocess of its own (it opens
whichever device JAX picks, and one process at a time may hold a TPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.config import ROOT
from tests.helpers.wait import COMMAND_HANG_S

SCRIPT = ROOT / "benchmarks" / "tpu_numerics.py"


def run_numerics(out: Path, args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """The script's JSON (written to ``out``) and its stdout, for ``args`` after
    ``--out``; fails the test, with the end of stderr, when the script fails."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=COMMAND_HANG_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8")), done.stdout
