"""Latency plots: one CSV per path for `dvc plots`, a PNG for the MLflow run, PNG bytes
for the HTML report (latency and speed-up against batch size)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from vmapcheck.core.paths import PATHS
from vmapcheck.io import atomic_path, atomic_write_text


def write_latency_csvs(folder: Path, latency: dict[str, dict[str, Any]]) -> list[Path]:
    """``<folder>/<path>.csv`` with batch_size, p50_ms, p90_ms, p99_ms (one line per path)."""
    written = []
    for path, by_batch in latency.items():
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["batch_size", "p50_ms", "p90_ms", "p99_ms"])
        for label, stats in sorted(by_batch.items(), key=lambda kv: int(kv[0][1:])):
            writer.writerow([int(label[1:]), stats["p50"], stats["p90"], stats["p99"]])
        target = Path(folder) / f"{path}.csv"
        atomic_write_text(target, buffer.getvalue())
        written.append(target)
    return written


def write_speedup_csv(target: Path, speedup: dict[str, dict[str, float]]) -> None:
    """batch_size, vmap_over_loop, vmap_over_direct (p50 ratios; empty where not measured)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["batch_size", "vmap_over_loop", "vmap_over_direct"])
    for label, ratios in sorted(speedup.items(), key=lambda kv: int(kv[0][1:])):
        writer.writerow(
            [int(label[1:]), ratios.get("vmap_over_loop", ""), ratios.get("vmap_over_direct", "")]
        )
    atomic_write_text(Path(target), buffer.getvalue())


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
    """p50 ratios vs batch size (``vmap_over_loop``, ``vmap_over_direct``), 1.0 marked.

    ``speedup``: ``b<rows>`` -> ratio name -> value (see :func:`vmapcheck.bench.timing.speedups`).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    labels = sorted(speedup, key=lambda label: int(label[1:]))
    for name in ("vmap_over_loop", "vmap_over_direct"):
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
