"""The benchmark's verdicts: ``verdict`` (two stored runs judged) and ``verdict-paired``
(a baseline project and this one timed in alternating pairs, the pairs judged)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vmapcheck.cli.common import Verbs, batch_sizes, number_in, output_file, root_flag
from vmapcheck.layout import Layout

# Kept here so --help needs no heavy import; tests/test_cli.py checks they match the
# modules' own constants.
LAST_VERIFIED = "last-verified"  # vmapcheck.tracking.baselines.LAST_VERIFIED
PAIRED_ROUNDS = 40  # vmapcheck.bench.verdict.paired.DEFAULT_ROUNDS
PAIRED_SAMPLES = 10  # vmapcheck.bench.verdict.paired.DEFAULT_SAMPLES
PAIRED_PROCESSES = 3  # vmapcheck.bench.verdict.paired.DEFAULT_PROCESSES


def _verdict(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.baselines import run_verdict

    return run_verdict(
        layout,
        args.baseline,
        args.current,
        args.factor,
        args.alpha,
        args.out,
        require_same=args.require_same or (),
    )


def _verdict_paired(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.bench.verdict.paired import run_verdict_paired

    return run_verdict_paired(
        args.current_project or layout.root,
        args.baseline_project,
        args.paths.split(",") if args.paths else None,
        args.batch_sizes,
        args.rounds,
        args.samples,
        args.factor,
        args.alpha,
        args.out,
        args.baseline_python,
        args.current_python,
        require_same=args.require_same or (),
        order=args.order,
        processes=args.processes,
        share=args.share,
        looks=args.looks,
    )


def _verdict_flags(verdict: argparse.ArgumentParser) -> None:
    verdict.add_argument(
        "--baseline",
        required=True,
        help=f"a bench_details.json, an MLflow run id, or {LAST_VERIFIED!r} (the newest "
        "verified run other than the one judged; none: says so, exit 0)",
    )
    verdict.add_argument(
        "--current",
        default=None,
        help="the run to judge: a bench_details.json or an MLflow run id",
    )
    _regression_flags(verdict)
    verdict.add_argument("--out", type=output_file, help="also write the verdict as JSON here")
    verdict.add_argument(
        "--require-same",
        action="append",
        choices=("jax_version", "jaxlib_version", "model"),  # bench.baseline.OPTIONAL_KEYS
        help="also refuse to compare runs that differ in this (repeatable; e.g. "
        "jax_version and jaxlib_version for a same-version comparison)",
    )
    root_flag(verdict)


def _verdict_paired_flags(paired: argparse.ArgumentParser) -> None:
    paired.add_argument(
        "--baseline-project",
        type=Path,
        required=True,
        help="the baseline's project folder after `dvc repro train` (e.g. a git worktree "
        "of another revision); its own src/ and .venv are used when present",
    )
    paired.add_argument(
        "--current-project", type=Path, help="the current side (default: this project)"
    )
    paired.add_argument(
        "--paths", help="comma-separated paths to time (default: the single-device jit paths)"
    )
    paired.add_argument(
        "--batch-sizes", type=batch_sizes, help="comma-separated rows (default: bench.batch_sizes)"
    )
    _paired_schedule_flags(paired)
    _regression_flags(paired)
    paired.add_argument(
        "--out",
        type=output_file,
        help="the JSON report (default: reports/perf_verdict_paired.json)",
    )
    paired.add_argument("--baseline-python", help="the baseline worker's interpreter")
    paired.add_argument("--current-python", help="the current worker's interpreter")
    paired.add_argument(
        "--require-same",
        action="append",
        choices=("jax_version", "jaxlib_version", "model"),  # bench.baseline.OPTIONAL_KEYS
        help="refuse to compare sides that differ in this (repeatable)",
    )
    paired.add_argument(
        "--order",
        choices=("blocks", "interleaved"),  # vmapcheck.bench.verdict.worker.BLOCKS, INTERLEAVED
        default="blocks",
        help="within a round: each cell's samples back to back (blocks), or the bench "
        "stage's passes over the cells (interleaved)",
    )
    root_flag(paired)


def _regression_flags(parser: argparse.ArgumentParser) -> None:
    """``--factor`` and ``--alpha``, the regression rule's settings, as ``verdict`` and
    ``verdict-paired`` both take them (range-checked at the door)."""
    parser.add_argument(
        "--factor",
        type=number_in("a factor above 1 and at most 10 (as bench.regression.factor)", 1.0, 10.0),
        help="default: bench.regression.factor",
    )
    parser.add_argument(
        "--alpha",
        type=number_in("a significance level between 0 and 1 (as bench.regression.alpha)", 0, 1),
        help="default: bench.regression.alpha",
    )


def _paired_schedule_flags(paired: argparse.ArgumentParser) -> None:
    """verdict-paired's flags for how much is timed and by how many processes."""
    paired.add_argument(
        "--rounds", type=int, default=PAIRED_ROUNDS, help="rounds per side (pairs = rounds)"
    )
    paired.add_argument(
        "--samples", type=int, default=PAIRED_SAMPLES, help="samples per cell and round"
    )
    paired.add_argument(
        "--looks",
        type=int,
        help="looks of the group-sequential test: a cell decided at a look is timed no more "
        "(default: bench.early_stop.paired_looks; 1: every pair)",
    )
    paired.add_argument(
        "--processes",
        type=int,
        default=PAIRED_PROCESSES,
        help="process pairs, taking turns pair by pair (a majority must agree)",
    )
    paired.add_argument(
        "--no-share",
        dest="share",
        action="store_false",
        help="one process a side even where both sides could share one (same code, "
        "interpreter, backend and precision)",
    )


VERBS: Verbs = {
    "verdict": (_verdict, _verdict_flags),
    "verdict-paired": (_verdict_paired, _verdict_paired_flags),
}
