"""DVC stage `check` (``python -m vmapcheck.stages.check``): its body is
:func:`vmapcheck.pipeline.check.run`."""

from vmapcheck.pipeline import check
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("check", check.run, compile_cache=True))
