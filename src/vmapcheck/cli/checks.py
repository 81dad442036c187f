"""The commands about the last pipeline run: ``diagnose`` (localize a divergence),
``reference`` (store it as the model's reference, or show the reference), ``summary``
(print its verdict) and ``gate`` (its verdict as the exit status)."""

from __future__ import annotations

import argparse

from vmapcheck.cli.common import Verbs, output_file, root_flag
from vmapcheck.layout import Layout

DIAGNOSIS_ON_DEMAND = "diagnosis-on-demand.json"  # under reports/


def _diagnose(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.check.diagnosis import on_demand

    out = layout.report(DIAGNOSIS_ON_DEMAND) if args.out is None else layout.root / args.out
    return on_demand(layout, out)


def _reference(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.check import reference

    if args.verb == "make":
        return reference.run_make(layout, args.reason)
    return reference.run_show(layout)


def _summary(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.tracking.review import run_summary

    return run_summary(layout, args.repro_status)


def _gate(args: argparse.Namespace, layout: Layout) -> int:
    from vmapcheck.pipeline.gate import run_gate

    return run_gate(layout, stage=False)


def _diagnose_flags(diagnose: argparse.ArgumentParser) -> None:
    diagnose.add_argument(
        "--out",
        type=output_file,
        default=None,
        help="where to write the report (its summary goes beside it as .txt); the check "
        "stage's own diagnosis is reports/diagnosis.json",
    )


def _reference_verbs(reference: argparse.ArgumentParser) -> None:
    verbs = reference.add_subparsers(dest="verb", required=True)
    make = verbs.add_parser("make", help="store the current verified run as the reference")
    make.add_argument("--reason", required=True, help="why the reference changes (recorded)")
    verbs.add_parser("show", help="print the reference's metadata")


def _summary_flags(summary: argparse.ArgumentParser) -> None:
    summary.add_argument(
        "--repro-status", type=int, default=0, help="exit status of the dvc repro that just ran"
    )


VERBS: Verbs = {
    "diagnose": (_diagnose, _diagnose_flags),
    "reference": (_reference, _reference_verbs),
    "summary": (_summary, _summary_flags),
    "gate": (_gate, root_flag),
}
