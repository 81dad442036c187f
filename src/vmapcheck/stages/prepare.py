"""DVC stage `prepare` (``python -m vmapcheck.stages.prepare``): its body is
:func:`vmapcheck.pipeline.prepare.run`."""

from vmapcheck.core.runtime import cpu_only_process

# Before anything below imports JAX: this stage runs on CPU whatever the run's backend,
# and never opens the accelerator.
cpu_only_process()

from vmapcheck.pipeline import prepare  # noqa: E402
from vmapcheck.pipeline.stage import run_stage  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_stage("prepare", prepare.run, compile_cache=True))
