"""The report's sections on the benchmark (``reports/bench_details.json``) and training
(``reports/train.json``), as plain data for the template (``templates/report.html``):
latency tables and plots, machine conditions, training, and the limits of the whole
result.

Paths are listed in the order of the registry :data:`vmapcheck.core.paths.PATHS`
(:func:`~vmapcheck.report.elements.in_path_order`); no section names a path itself.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from vmapcheck.bench.timing.bounds import launch_bound_text, peak_caveat
from vmapcheck.bench.timing.machine import conditions_line
from vmapcheck.core.paths import SPEEDUPS, series_colours, speedup_text
from vmapcheck.report.elements import (
    Table,
    TableSection,
    by_batch,
    cell,
    in_path_order,
    kv_table,
    num,
    table,
)
from vmapcheck.report.headline import batch_from_label
from vmapcheck.report.plots import latency_png, speedup_png

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchDetails
    from vmapcheck.core.record import TrainMetrics


class LatencySection(TypedDict):
    """The benchmark's section: its intro, the latency table, the cells skipped and the
    launch-bound paths (in words), the speed-up table and the plots (:func:`plot`)."""

    intro: str
    table: Table
    skipped: list[str]
    launch_bound: list[str]
    speedups: Table
    plots: list[dict[str, str]]


class MachineSection(TypedDict):
    """The machine during the benchmark, when recorded: whether it was noisy, that in
    words, and the table of its load and memory before and after."""

    recorded: bool
    noisy: NotRequired[bool]
    said: NotRequired[str]
    table: NotRequired[Table]


# The check's own limits; the benchmark's come from bench_details.json ("limits").
CHECK_LIMITS = (
    "Agreement is shown for the regression cases listed above, at the tolerances named; "
    "other inputs, batch sizes, dtypes or models were not checked.",
    "The result holds for the backend, device and JAX / jaxlib versions in the "
    "environment table; another backend or version may round differently (the stored "
    "reference is how a later run finds out).",
    "The float64 oracle is computed on CPU: it bounds rounding error, not a bug shared by "
    "every path (the stored reference and the loss on real targets cover part of that).",
)


def plot(png: bytes, alt: str, caption: str, img_id: str) -> dict[str, str]:
    """A plot the project drew (matplotlib PNG), embedded as a ``data:`` URI:
    ``{"id", "alt", "caption", "png_base64"}``."""
    return {
        "id": img_id,
        "alt": alt,
        "caption": caption,
        "png_base64": base64.b64encode(png).decode("ascii"),
    }


def latency(
    bench: BenchDetails,
    title: str,
    not_provided: Mapping[str, str] | None = None,
    drawn: Mapping[str, bytes] | None = None,
) -> LatencySection:
    """``{"intro", "table", "skipped": [str], "speedups": table, "plots": [plot]}``;
    ``not_provided``: the paths the model does not have (check_details.json), named in
    the speed-up table where a ratio needs one; ``drawn``: PNGs of the same figures
    already drawn from ``bench`` (plot id -> bytes: the bench stage's reports/plots/),
    embedded instead of drawing them again (matplotlib costs the track stage ~1.5 s)."""
    skipped = [
        f"{path} at batch {batch_from_label(label)}: {reason}"
        for path, reasons in in_path_order(bench.get("skipped", {}))
        for label, reason in reasons.items()
    ]
    return {
        "intro": _intro(bench),
        "table": _latency_table(bench),
        "skipped": skipped,
        "launch_bound": [
            f"{path} {launch_bound_text(entry)}"
            for path, entry in bench.get("launch_bound", {}).items()
        ],
        "speedups": _speedup_table(bench, not_provided or {}),
        "plots": _latency_plots(bench, title, drawn or {}),
    }


def _latency_table(bench: BenchDetails) -> Table:
    """One row per path and batch size: its latency percentiles, the median's interval,
    throughput, compile and first call, GFLOP/s and share of the matmul peak."""
    by_path, figures = bench["latency_ms"], bench.get("figures", {})
    level = bench.get("bench", {}).get("confidence_level")
    ci = f"median {num(level * 100)}% CI" if level else "median CI"
    rows = []
    for path, stats in in_path_order(by_path):
        for label in by_batch(stats):
            s = stats[label]
            # A cell the bench did not time has no figures: every column reads empty.
            f: Mapping[str, Any] = figures.get(path, {}).get(label, {})
            roofline = f.get("roofline")
            rows.append(
                (
                    [
                        # In its colour in the plots above and below.
                        cell(path, swatch=series_colours().get(path, "")),
                        batch_from_label(label),
                        s["p50"],
                        s["p90"],
                        s["p99"],
                        f"{num(s.get('median_ci_low'))} - {num(s.get('median_ci_high'))}",
                        s.get("n"),
                        s.get("rows_per_s"),
                        f.get("compile_ms"),
                        f.get("first_call_ms"),
                        f.get("gflops"),
                        None if roofline is None else roofline * 100,
                    ],
                    None,
                )
            )
    return table(
        (
            "path",
            "batch",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            ci,
            "timed calls (n)",
            "rows/s (p50)",
            "compile ms",
            "first call ms",
            "GFLOP/s (p50)",
            "% of matmul peak",
        ),
        rows,
        numeric=(1, 2, 3, 4, 6, 7, 8, 9, 10, 11),
        table_id="latency-table",
        row_class="latency",
    )


def _speedup_table(bench: BenchDetails, missing: Mapping[str, str]) -> Table:
    """One row per batch size: each speed-up with its interval, or the paths the model
    does not provide (``missing``) where a ratio needs one."""
    entries = {entry.name: entry for entry in SPEEDUPS}
    speedup = bench.get("speedup", {})
    intervals = bench.get("speedup_ci", {})

    def ratio(label: str, name: str) -> str:
        value = speedup[label].get(name)
        if value is not None:
            return speedup_text(value, intervals.get(label, {}).get(name))
        entry = entries[name]
        absent = [p for p in (entry.slower, entry.faster) if p in missing]
        return f"{', '.join(absent)} not provided" if absent else "-"

    return table(
        ("batch", "vmap over loop (x faster)", "vmap over direct (cost, 1 = free)"),
        (
            (
                [
                    batch_from_label(label),
                    ratio(label, "vmap_over_loop"),
                    ratio(label, "vmap_over_direct"),
                ],
                None,
            )
            for label in by_batch(speedup)
        ),
        numeric=(0,),
        table_id="speedup-table",
    )


def _latency_plots(
    bench: BenchDetails, title: str, drawn: Mapping[str, bytes]
) -> list[dict[str, str]]:
    """The latency plot, and the speed-up plot where the run has speed-ups: each the PNG
    in ``drawn`` (plot id -> bytes) when there, else drawn now."""
    speedup = bench.get("speedup", {})
    plots = [
        plot(
            drawn.get("plot-latency") or latency_png(bench["latency_ms"], title),
            "p50 latency per call against batch size, per path",
            "Latency per call against batch size (log-log), p50 with a band to p90.",
            "plot-latency",
        )
    ]
    if speedup:
        plots.append(
            plot(
                drawn.get("plot-speedup") or speedup_png(speedup, title, bench.get("speedup_ci")),
                "vmap speed-up over the loop and cost over the hand-batched forward",
                "p50 ratios against batch size, each with its confidence interval (bars): "
                "vmap_over_loop > 1 means vmap is faster than the loop; vmap_over_direct "
                "near 1 means vmap costs nothing over the hand-batched forward; an "
                "interval across 1 is no measurable difference.",
                "plot-speedup",
            )
        )
    return plots


def _timed_calls(bench: BenchDetails) -> str:
    """How many calls each cell really timed (the latency table's ``timed calls (n)``):
    fewer than bench.repeats where a cell stopped early, its median's interval tight
    enough or the time budget spent (bench.early_stop)."""
    counts = [
        int(stats["n"])
        for by_batch in bench["latency_ms"].values()
        for stats in by_batch.values()
        if stats.get("n") is not None
    ]
    if not counts:
        return "no cell was timed"
    low, high = min(counts), max(counts)
    took = f"{low}" if low == high else f"{low} to {high}"
    planned = bench.get("bench", {}).get("repeats")
    if planned is not None and low < planned:
        return (
            f"each cell timed {took} calls (column `timed calls (n)`): fewer where it "
            "stopped early, its median's interval tight enough or the time budget spent "
            "(bench.early_stop)"
        )
    return f"each cell timed {took} calls (column `timed calls (n)`)"


def _intro(bench: BenchDetails) -> str:
    """The section's first paragraph: the bench profile's settings, what the ratios
    compare, and the matmul peak measured in the same run (when there is one)."""
    peak = bench.get("peak")
    config = bench.get("bench", {})
    return (
        f"Benchmark `{config.get('name', '?')}`: {config.get('warmup', '?')} warm-up "
        f"call(s), then up to {config.get('repeats', '?')} timed calls per path and batch "
        f"size (bench.repeats), after compilation (compile time apart); {_timed_calls(bench)}. "
        "Ratios compare p50s measured in the "
        "same run, with a bootstrap confidence interval; where it holds 1.0 there is no "
        "measurable difference."
        + (
            f" Matmul peak measured in the same run ({peak['size']}^3"
            + (
                f" {peak['dtype']}, matmul precision {peak['matmul_precision']}, the "
                f"largest of a sweep that stopped at {peak['stopped']}"
                if "sweep" in peak
                else ""
            )
            + f"): {num(peak['gflops'])} GFLOP/s"
            + (f", best of {len(peak['sweeps_gflops'])} sweeps" if "sweeps_gflops" in peak else "")
            + (f"; {contention}" if (contention := peak_caveat(peak)) else "")
            + ". A share of it is left out where a path's flop count would exceed it."
            if peak
            else ""
        )
    )


def machine(bench: BenchDetails) -> MachineSection:
    """``{"recorded", "noisy", "said", "table"}``: load and memory before and after."""
    conditions = bench.get("machine")
    if not conditions:
        return {"recorded": False}
    before, after = conditions["before"], conditions["after"]
    keys = list(before) + [k for k in after if k not in before]

    def shown(value: Any) -> Any:
        return num(value, 4) if isinstance(value, float) else value

    noisy = bool(conditions["noisy"])
    # From the bench's start to its end where sampled (vmapcheck.bench.timing.machine).
    over = conditions_line(conditions)
    return {
        "recorded": True,
        "noisy": noisy,
        "said": (
            f"YES: load average above the usable cores; treat the latencies as rough ({over})"
            if noisy
            else f"no ({over})"
        ),
        "table": table(
            ("what", "before", "after"),
            (([k, shown(before.get(k, "-")), shown(after.get(k, "-"))], None) for k in keys),
            table_id="machine-table",
        ),
    }


def training(train: TrainMetrics) -> TableSection:
    rows = [(k, num(v, 6) if isinstance(v, float) else v) for k, v in train.items()]
    return {"table": kv_table(rows, "train-table")}


def limits(bench: BenchDetails) -> list[str]:
    return [*CHECK_LIMITS, *bench.get("limits", [])]
