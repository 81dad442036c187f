"""DVC stage `track` (``python -m vmapcheck.stages.track``): its body is
:func:`vmapcheck.pipeline.track.run`."""

from vmapcheck.pipeline import track
from vmapcheck.pipeline.stage import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("track", track.run))
