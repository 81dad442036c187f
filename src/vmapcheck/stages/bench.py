"""DVC stage `bench` (``python -m vmapcheck.stages.bench``): its body is
:func:`vmapcheck.pipeline.bench.run`."""

from vmapcheck.pipeline import bench
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("bench", bench.run))
