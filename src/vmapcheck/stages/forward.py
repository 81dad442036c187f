"""DVC stage `forward` (``python -m vmapcheck.stages.forward``): its body is
:func:`vmapcheck.pipeline.forward.run`."""

from vmapcheck.pipeline import forward
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("forward", forward.run, compile_cache=True))
