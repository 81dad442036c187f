"""One thin module per DVC stage; the logic lives in the vmapcheck library."""

import sys

if sys.version_info < (3, 12):  # noqa: UP036 - guards a wrong interpreter
    raise SystemExit(
        f"vmapcheck stages need Python >= 3.12 (JAX 0.11), but `python` is "
        f"{sys.version.split()[0]} at {sys.executable}: activate the project's environment "
        "(`source .venv/bin/activate`, created by `make setup`) or run through `make demo`."
    )
