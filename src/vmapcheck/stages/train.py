"""DVC stage `train` (``python -m vmapcheck.stages.train``): its body is
:func:`vmapcheck.pipeline.train.run`."""

from vmapcheck.core.runtime import cpu_only_process

# Before anything below imports JAX: this stage runs on CPU whatever the run's backend,
# and never opens the accelerator.
cpu_only_process()

from vmapcheck.pipeline import train  # noqa: E402
from vmapcheck.pipeline.stage import run_stage  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_stage("train", train.run, compile_cache=True))
