"""DVC stage `prepare` (``python -m vmapcheck.stages.prepare``): its body is
:func:`vmapcheck.pipeline.prepare.run`."""

from vmapcheck.pipeline import prepare
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("prepare", prepare.run, compile_cache=True))
