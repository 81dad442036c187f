"""DVC stage `gate` (``python -m vmapcheck.stages.gate``, the last, always run): the
verdict as the exit status (:mod:`vmapcheck.pipeline.gate`). Imports no JAX."""

from vmapcheck.pipeline.gate import main

if __name__ == "__main__":
    raise SystemExit(main())
