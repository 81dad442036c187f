"""The benchmark, by job, one subpackage each:

- :mod:`vmapcheck.bench.timing`: the bench stage's timing of every forward path and
  batch size (latency distributions after warm-up, the control and the matmul peak, the
  time budget, the machine's conditions) and what its figures may claim;
- :mod:`vmapcheck.bench.verdict`: two benchmarks judged against each other, the
  regression verdict of two stored runs and the paired verdict with its worker processes.

The serving guard, which the bench stage replays and MLflow serving uses, is
:mod:`vmapcheck.guard`, a floor above (docs/development.md, "Dependency rules").
"""

__all__ = ["timing", "verdict"]
