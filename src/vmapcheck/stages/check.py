"""DVC stage `check` (``python -m vmapcheck.stages.check``): its body is
:func:`vmapcheck.pipeline.check.run`."""

from vmapcheck.core.runtime import cpu_only_process

# Before anything below imports JAX: this stage runs on CPU whatever the run's backend,
# and never opens the accelerator.
cpu_only_process()

from vmapcheck.pipeline import check  # noqa: E402
from vmapcheck.pipeline.stage import run_stage  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_stage("check", check.run, compile_cache=True))
