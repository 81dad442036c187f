"""What every stage module shares: load the validated config, report errors clearly."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

from jax.errors import KeyReuseError

from vmapcheck.config import Config, load_config
from vmapcheck.errors import VmapcheckError

# Stages run from the project root (DVC runs each stage's cmd in the dvc.yaml folder).
ROOT = Path.cwd()
DATA = ROOT / "data"
REPORTS = ROOT / "reports"
PREPARED = DATA / "prepared"
CASES = DATA / "cases"
PARAMS = DATA / "params"
FORWARD = DATA / "forward"


def stage_main(name: str) -> Callable[[Callable[[Config], int | None]], Callable[[], int]]:
    """Wrap a stage body: validate params.yaml, turn known errors into one clear message.

    The body returns an exit code (None = 0). A :class:`VmapcheckError` prints
    ``<stage>: error: <message>`` and exits 2; anything else is a bug and keeps its traceback.
    """

    def decorate(body: Callable[[Config], int | None]) -> Callable[[], int]:
        @functools.wraps(body)
        def main() -> int:
            try:
                return body(load_config(ROOT / "params.yaml")) or 0
            except VmapcheckError as exc:
                print(f"{name}: error: {exc}", file=sys.stderr)
                return 2
            except KeyReuseError as exc:
                first_line = str(exc).splitlines()[0]
                print(
                    f"{name}: error: a PRNG key was used twice ({first_line}); each subkey of "
                    "the key stream (vmapcheck.keys) must feed exactly one random operation",
                    file=sys.stderr,
                )
                return 2

        return main

    return decorate
