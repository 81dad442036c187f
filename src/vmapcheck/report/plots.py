"""Latency plots: one CSV per path and one per speed-up for `dvc plots` (drawn on log-log
axes by the template .dvc/plots/loglog.json), a PNG for the MLflow run, PNG bytes for the
HTML report (latency and speed-up against batch size)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from vmapcheck.core.paths import PATHS, SPEEDUPS, batch_paths
from vmapcheck.io import atomic_path, atomic_write_text
from vmapcheck.report.headline import batch_from_label

# Qualitative colour schemes by size, (Vega's name, matplotlib's colormap, colours): a
# plot gets the smallest one with a colour for each of its series, so the registry can
# grow past ten paths without two sharing a colour.
COLOUR_SCHEMES = (("tableau10", "tab10", 10), ("tableau20", "tab20", 20))


def colour_scheme(series: int) -> tuple[str, str]:
    """(Vega scheme, matplotlib colormap) with at least ``series`` colours.

    Raises:
        ValueError: more series than the largest scheme has colours.
    """
    for vega, matplotlib, colours in COLOUR_SCHEMES:
        if series <= colours:
            return vega, matplotlib
    raise ValueError(f"{series} series: no qualitative scheme has that many colours")


def plotted_series() -> int:
    """The most series one plot draws: a line per batch path (latency) or per speed-up."""
    return max(len(batch_paths()), len(SPEEDUPS))


def _colours(plt: Any) -> list[Any]:
    """One colour per series, from the scheme sized by :func:`plotted_series`."""
    cmap = plt.get_cmap(colour_scheme(plotted_series())[1])
    return [cmap(i) for i in range(cmap.N)]


def _rows_by_batch(by_label: dict[str, Any]) -> list[tuple[int, Any]]:
    """``{"b128": v, ...}`` as ``[(128, v), ...]`` in batch order (labels padded or not)."""
    return sorted((batch_from_label(label), value) for label, value in by_label.items())


def write_latency_csvs(folder: Path, latency: dict[str, dict[str, Any]]) -> list[Path]:
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


def write_speedup_csvs(folder: Path, speedup: dict[str, dict[str, float]]) -> list[Path]:
    """``<folder>/<name>.csv`` with batch_size, ratio for every
    :data:`vmapcheck.core.paths.SPEEDUPS` entry (p50 ratios of the same run): one row per
    batch size both paths ran at. Where one did not run there is no row (never an empty
    cell, which a plot would draw as 0); a ratio measured nowhere is a header alone."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    written = []
    for name in (s.name for s in SPEEDUPS):
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["batch_size", "ratio"])
        for batch, ratios in _rows_by_batch(speedup):
            if name in ratios:
                writer.writerow([batch, ratios[name]])
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


def latency_figure(latency: dict[str, dict[str, Any]], title: str) -> Any:
    """Log-log p50 latency vs batch size per path, with a p50-p90 band (a matplotlib Figure).

    ``latency``: path -> ``b<rows>`` -> {"p50", "p90", ...} in ms per call.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ax.set_prop_cycle(color=_colours(plt))
    for path, by_batch in latency.items():
        if not by_batch:
            continue
        points = sorted((int(k[1:]), v) for k, v in by_batch.items())
        sizes = [b for b, _ in points]
        # Dotted: a data-parallel path, a different thing from the one-device paths.
        entry = PATHS[path]
        style = ":" if entry.distributed else "-" if entry.jit else "--"
        (line,) = ax.plot(sizes, [s["p50"] for _, s in points], style, marker="o", label=path)
        ax.fill_between(
            sizes,
            [s["p50"] for _, s in points],
            [s["p90"] for _, s in points],
            color=line.get_color(),
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


def speedup_figure(speedup: dict[str, dict[str, float]], title: str) -> Any:
    """p50 ratios vs batch size, one line per :data:`vmapcheck.core.paths.SPEEDUPS` entry,
    1.0 marked.

    ``speedup``: ``b<rows>`` -> ratio name -> value (see :func:`vmapcheck.bench.latency.speedups`).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.set_prop_cycle(color=_colours(plt))
    labels = sorted(speedup, key=lambda label: int(label[1:]))
    for name in (s.name for s in SPEEDUPS):
        points = [
            (int(label[1:]), speedup[label][name]) for label in labels if name in speedup[label]
        ]
        if points:
            ax.plot([b for b, _ in points], [v for _, v in points], marker="o", label=name)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (rows)")
    ax.set_ylabel("p50 ratio, same run")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency_png(latency: dict[str, dict[str, Any]], title: str) -> bytes:
    """:func:`latency_figure` as PNG bytes (for embedding in the HTML report)."""
    return _png(latency_figure(latency, title))


def speedup_png(speedup: dict[str, dict[str, float]], title: str) -> bytes:
    """:func:`speedup_figure` as PNG bytes (for embedding in the HTML report)."""
    return _png(speedup_figure(speedup, title))


def write_latency_png(target: Path, latency: dict[str, dict[str, Any]], title: str) -> None:
    """:func:`latency_figure` written atomically as a PNG file."""
    data = latency_png(latency, title)
    with atomic_path(Path(target)) as tmp:
        tmp.write_bytes(data)


def write_speedup_png(target: Path, speedup: dict[str, dict[str, float]], title: str) -> None:
    """:func:`speedup_figure` written atomically as a PNG file."""
    data = speedup_png(speedup, title)
    with atomic_path(Path(target)) as tmp:
        tmp.write_bytes(data)
