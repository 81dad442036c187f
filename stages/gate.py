"""DVC stage `gate` (dvc.yaml: `python stages/gate.py`), written by `vmapcheck
init` (vmapcheck 0.1.0). Its body is the installed vmapcheck's
`vmapcheck.stages.gate`; `vmapcheck init --force` writes this file again."""

import os
import runpy
import sys

# Import from the repository's root (where DVC runs this), as `python -m` would: your
# model's package lives there. Not from this folder: stages/code.py would hide the
# standard library's `code` module from everything the stage imports.
sys.path[0] = os.getcwd()
try:
    import vmapcheck  # noqa: F401
except ModuleNotFoundError:
    sys.exit(
        f"stages/gate.py: vmapcheck is not installed for {sys.executable} (Python "
        f"{sys.version.split()[0]}): activate the environment it is installed in (e.g. "
        "`source .venv/bin/activate`), then run `dvc repro` again"
    )
runpy.run_module("vmapcheck.stages.gate", run_name="__main__", alter_sys=True)
