"""Latency plots: one CSV per path for `dvc plots`, and a PNG for the MLflow run."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

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


def write_latency_png(target: Path, latency: dict[str, dict[str, Any]], title: str) -> None:
    """Log-log p50 latency vs batch size per path, with a p50-p90 band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for path, by_batch in latency.items():
        if not by_batch:
            continue
        points = sorted((int(k[1:]), v) for k, v in by_batch.items())
        sizes = [b for b, _ in points]
        # Dotted: the data-parallel path, a different thing from the one-device paths.
        style = ":" if path.startswith("sharded") else "--" if path.endswith("eager") else "-"
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
    with atomic_path(Path(target)) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
