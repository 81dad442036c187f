"""One thin module per DVC stage (``python -m vmapcheck.stages.<stage>``, the ``cmd`` of
each stage in the dvc.yaml that ``vmapcheck init`` writes); the logic lives in the
library (:mod:`vmapcheck.pipeline`)."""

import sys

if sys.version_info < (3, 12):  # noqa: UP036 - guards a wrong interpreter
    raise SystemExit(
        f"vmapcheck stages need Python >= 3.12 (JAX 0.11), but `python` is "
        f"{sys.version.split()[0]} at {sys.executable}: activate the environment vmapcheck "
        "is installed in (e.g. `source .venv/bin/activate`) before `dvc repro`."
    )
