"""Timing the forward paths: what the bench stage measures and writes.

Its public names, by module (imported from the module: importing this package loads no
JAX, as the summary and the track stage need, so it re-exports nothing):

- ``run``: :func:`~vmapcheck.bench.timing.run.run_bench`, every path at every batch size
  timed in rounds after warm-up;
- ``sampling``: how one sample is taken (``warm_up``, ``sample_passes``,
  ``balanced_orders``, ``no_compiles``, ``CompileCounter``, ``bench_input``);
- ``budget``: how long each cell is timed (``round_slices``, ``early_stops``,
  ``samples_per_round``, ``BudgetClock``);
- ``control``: the control matmul and the matmul peak (``control_figures``,
  ``peak_sweep``, ``best_peak``);
- ``latency``: figures of latency samples (``latency_stats``, ``speedups``,
  ``speedup_intervals``);
- ``bounds``: what the figures may claim (``roofline_share``, ``launch_bound``);
- ``machine``: the machine's conditions (``conditions``, ``ConditionsSampler``,
  ``machine_record``);
- ``progress``: the progress and ETA of long work (``Progress``, ``Phase``, ``Eta``);
- ``records``: ``reports/bench_details.json`` typed (``BenchResult``, ``BenchDetails``,
  ``read_bench_details``, and its parts: ``LatencyCell``, ``CellFigures``, ``Peak``,
  ``ControlFigures``, ``LaunchBound``, ``MachineRecord``, ``EarlyStopRecord``,
  ``ReplayRecord``, ...).

It imports nothing from :mod:`vmapcheck.bench.verdict`, which judges its records.
"""

__all__ = [
    "bounds",
    "budget",
    "control",
    "latency",
    "machine",
    "progress",
    "records",
    "run",
    "sampling",
]
