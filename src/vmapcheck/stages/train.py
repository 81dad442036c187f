"""DVC stage `train` (``python -m vmapcheck.stages.train``): its body is
:func:`vmapcheck.pipeline.train.run`."""

from vmapcheck.pipeline import train
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("train", train.run, compile_cache=True))
