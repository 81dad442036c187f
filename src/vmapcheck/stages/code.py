"""DVC stage `code` (dvc.yaml: `python -m vmapcheck.stages.code`, always run): records the
installed vmapcheck's version and, per stage, a digest of the library files that stage
runs (:func:`vmapcheck.project.code.run`). Imports no JAX: it costs well under a second."""

from vmapcheck.project.code import run

if __name__ == "__main__":
    raise SystemExit(run())
