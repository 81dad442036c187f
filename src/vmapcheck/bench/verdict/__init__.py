"""Two benchmarks judged against each other: is the current one slower than its baseline,
beyond the machine's noise?

Its public names, by module (imported from the module: importing this package loads no
JAX, so it re-exports nothing):

- ``regression``: the regression verdict of two stored runs (``compare``,
  ``format_table``, ``report_verdict``, ``comparability``, ``judge_control``);
- ``records``: ``reports/perf_verdict.json`` typed (``PerfOutcome``: a ``PerfVerdict`` or
  a ``NoVerdict``; ``CellComparison``, ``ControlVerdict``, ``RoundsCompared``);
- ``baseline``: what a benchmark is to both verdicts (``BenchRecord``,
  ``read_bench_file``, ``record_from_details``, ``CONTEXT``);
- ``labels``: what a compared cell is called in both (``cell_label``,
  ``verdict_headline``, ``min_detectable_ratio``);
- ``paired``: the paired verdict, baseline and current timed in alternating pairs
  (``run_paired``, ``run_verdict_paired``), with ``pairs`` (its statistics and schedule:
  ``judge_paired``, ``SequentialPlan``), ``sequential`` (group-sequential boundaries:
  ``Design``, ``look_sizes``), ``sides`` (its worker processes: ``SideSpec``, ``Worker``,
  ``Channel``), ``worker`` (one side, run as ``python -m vmapcheck.bench.verdict.worker``)
  and ``paired_report`` (its report: ``format_paired``).

It reads the timings through :mod:`vmapcheck.bench.timing`; nothing there imports it.
"""

__all__ = [
    "baseline",
    "labels",
    "paired",
    "paired_report",
    "pairs",
    "records",
    "regression",
    "sequential",
    "sides",
    "worker",
]
