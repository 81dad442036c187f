"""One thin module per DVC stage (``python -m vmapcheck.stages.<stage>``, the ``cmd`` of
each stage in the dvc.yaml that ``vmapcheck init`` writes); the logic lives in the
library (:mod:`vmapcheck.pipeline`).

Before a stage imports anything else, two gates, each a one-line error: the `python`
that DVC ran must be a Python vmapcheck supports, and the installed jax/jaxlib inside
the ranges vmapcheck declares (:mod:`vmapcheck.versions`).
"""

import sys

# Both import only the standard library: the gate speaks on an older Python too.
from vmapcheck.errors import UnsupportedVersionError
from vmapcheck.versions import MIN_PYTHON, require_supported_jax

if sys.version_info < MIN_PYTHON:
    raise SystemExit(
        f"vmapcheck stages need Python >= {'.'.join(map(str, MIN_PYTHON))}, but `python` is "
        f"{sys.version.split()[0]} at {sys.executable}: activate the environment vmapcheck "
        "is installed in (e.g. `source .venv/bin/activate`) before `dvc repro`."
    )

try:
    require_supported_jax()
except UnsupportedVersionError as exc:
    # One line and exit status 2, as run_stage reports a VmapcheckError (the stage's name
    # is not known yet: `python -m` imports this package before the stage's module).
    print(f"vmapcheck stage: error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None

# Each run as ``python -m vmapcheck.stages.<stage>``, never imported.
__all__ = [
    "bench",
    "check",
    "code",
    "forward",
    "gate",
    "prepare",
    "track",
    "train",
]
