"""Latency plots: one CSV per path and one per speed-up for `dvc plots` (drawn on log-log
axes by the templates .dvc/plots/latency.json and speedup.json), a PNG for the MLflow
run, PNG bytes for the HTML report (latency and speed-up against batch size). Every plot
draws a series in its one colour (:func:`colour`), the Vega templates too."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vmapcheck.core.paths import PATHS, SPEEDUPS, series_colours
from vmapcheck.io import atomic_path, atomic_write_text
from vmapcheck.report.headline import batch_from_label

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import LatencyCell


def colour(series: str) -> str:
    """The colour of a plotted series (a batch path or a speed-up), the same in every
    plot: :func:`vmapcheck.core.paths.series_colours`."""
    return series_colours()[series]


# A cell's value, whatever the table holds (a latency cell, a ratio).
V = TypeVar("V")


def _rows_by_batch(by_label: Mapping[str, V]) -> list[tuple[int, V]]:
    """``{"b128": v, ...}`` as ``[(128, v), ...]`` in batch order (labels padded or not)."""
    return sorted((batch_from_label(label), value) for label, value in by_label.items())


def write_latency_csvs(
    folder: Path, latency: Mapping[str, Mapping[str, LatencyCell]]
) -> list[Path]:
    """``<folder>/<path>.csv`` with batch_size, p50_ms, p90_ms, p99_ms: one row per batch
    size the path was timed at. A batch size it was not timed at (the per-row loop is
    capped by ``bench.loop_max_batch``) has no row, so no plot draws it."""
    written = []
    for path, by_batch in latency.items():
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["batch_size", "p50_ms", "p90_ms", "p99_ms"])
        for batch, stats in _rows_by_batch(by_batch):
            writer.writerow([batch, stats["p50"], stats["p90"], stats["p99"]])
        target = Path(folder) / f"{path}.csv"
        atomic_write_text(target, buffer.getvalue())
        written.append(target)
    return written


def write_speedup_csvs(
    folder: Path,
    speedup: dict[str, dict[str, float]],
    intervals: dict[str, dict[str, list[float]]] | None = None,
) -> list[Path]:
    """``<folder>/<name>.csv`` with batch_size, ratio, ci_low, ci_high for every
    :data:`vmapcheck.core.paths.SPEEDUPS` entry (p50 ratios of the same run and their
    bootstrap confidence interval, ``bench_details.json``'s ``speedup_ci``: label -> name
    -> [low, high]): one row per batch size both paths ran at. Where one did not run
    there is no row (never an empty ratio, which a plot would draw as 0); a ratio
    measured nowhere is a header alone. A ratio without an interval has empty ci cells
    (the plots draw no band there, never one of zero width)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    intervals = intervals or {}
    written = []
    for name in (s.name for s in SPEEDUPS):
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["batch_size", "ratio", "ci_low", "ci_high"])
        for label, ratios in sorted(speedup.items(), key=lambda item: batch_from_label(item[0])):
            if name in ratios:
                ci = intervals.get(label, {}).get(name)
                low, high = ci if ci is not None and len(ci) == 2 else ("", "")
                writer.writerow([batch_from_label(label), ratios[name], low, high])
        target = Path(folder) / f"{name}.csv"
        atomic_write_text(target, buffer.getvalue())
        written.append(target)
    return written


def _pyplot():
    """pyplot on the Agg backend (no display: stages and tests run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    _pyplot().close(fig)
    return buffer.getvalue()


def latency_figure(latency: Mapping[str, Mapping[str, LatencyCell]], title: str) -> Any:
    """Log-log p50 latency vs batch size per path, with a p50-p90 band (a matplotlib Figure).

    ``latency``: path -> ``b<rows>`` -> {"p50", "p90", ...} in ms per call.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for path, by_batch in latency.items():
        if not by_batch:
            continue
        points = sorted((int(k[1:]), v) for k, v in by_batch.items())
        sizes = [b for b, _ in points]
        # Dotted: a data-parallel path, a different thing from the one-device paths.
        entry = PATHS[path]
        style = ":" if entry.distributed else "-" if entry.jit else "--"
        ax.plot(
            sizes, [s["p50"] for _, s in points], style, marker="o", label=path, color=colour(path)
        )
        ax.fill_between(
            sizes,
            [s["p50"] for _, s in points],
            [s["p90"] for _, s in points],
            color=colour(path),
            alpha=0.15,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (rows)")
    ax.set_ylabel("latency per call, ms (p50, band to p90)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speedup_figure(
    speedup: dict[str, dict[str, float]],
    title: str,
    intervals: dict[str, dict[str, list[float]]] | None = None,
) -> Any:
    """p50 ratios vs batch size, one line per :data:`vmapcheck.core.paths.SPEEDUPS` entry
    in its colour, each point with its confidence interval as an error bar and a band
    (``intervals``: ``b<rows>`` -> ratio name -> [low, high], bench_details.json's
    ``speedup_ci``; a point without one has no bar), 1.0 marked: a bar across it is no
    measurable difference.

    ``speedup``: ``b<rows>`` -> ratio name -> value (see
    :func:`vmapcheck.bench.timing.latency.speedups`).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    intervals = intervals or {}
    labels = sorted(speedup, key=batch_from_label)
    for name in (s.name for s in SPEEDUPS):
        points = [
            (batch_from_label(label), speedup[label][name], intervals.get(label, {}).get(name))
            for label in labels
            if name in speedup[label]
        ]
        if not points:
            continue
        sizes, ratios = [b for b, _, _ in points], [v for _, v, _ in points]
        ax.plot(sizes, ratios, marker="o", label=name, color=colour(name))
        with_ci = [(b, v, ci) for b, v, ci in points if ci is not None and len(ci) == 2]
        if with_ci:
            ax.errorbar(
                [b for b, _, _ in with_ci],
                [v for _, v, _ in with_ci],
                yerr=[
                    [max(v - ci[0], 0.0) for _, v, ci in with_ci],
                    [max(ci[1] - v, 0.0) for _, v, ci in with_ci],
                ],
                fmt="none",
                ecolor=colour(name),
                capsize=3,
            )
            ax.fill_between(
                [b for b, _, _ in with_ci],
                [ci[0] for _, _, ci in with_ci],
                [ci[1] for _, _, ci in with_ci],
                color=colour(name),
                alpha=0.15,
            )
    ax.axhline(1.0, color="grey", linewidth=1, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (rows)")
    ax.set_ylabel("p50 ratio, same run (bars: confidence interval)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency_png(latency: Mapping[str, Mapping[str, LatencyCell]], title: str) -> bytes:
    """:func:`latency_figure` as PNG bytes (for embedding in the HTML report)."""
    return _png(latency_figure(latency, title))


def speedup_png(
    speedup: dict[str, dict[str, float]],
    title: str,
    intervals: dict[str, dict[str, list[float]]] | None = None,
) -> bytes:
    """:func:`speedup_figure` as PNG bytes (for embedding in the HTML report)."""
    return _png(speedup_figure(speedup, title, intervals))


def write_latency_png(
    target: Path, latency: Mapping[str, Mapping[str, LatencyCell]], title: str
) -> None:
    """:func:`latency_figure` written atomically as a PNG file."""
    data = latency_png(latency, title)
    with atomic_path(Path(target)) as tmp:
        tmp.write_bytes(data)


def write_speedup_png(
    target: Path,
    speedup: dict[str, dict[str, float]],
    title: str,
    intervals: dict[str, dict[str, list[float]]] | None = None,
) -> None:
    """:func:`speedup_figure` written atomically as a PNG file."""
    data = speedup_png(speedup, title, intervals)
    with atomic_path(Path(target)) as tmp:
        tmp.write_bytes(data)
