"""The pipeline's verdict as an exit status: DVC stage ``gate`` and ``vmapcheck gate``.

``track`` logs a failed run and exits 0: a failed verdict is data, and DVC keeps an
experiment (``dvc exp run``) only when every stage succeeded, so a failing track made a
failed run vanish from ``dvc exp show``. The last stage, ``gate`` (always run, no outs),
turns the verdict of the workspace's reports into the exit status:

- under ``dvc repro`` (``make demo``, CI, a scheduled job): non-zero on a failed check or
  guard replay, naming the verdict and the figure that decided;
- inside ``dvc exp run`` (DVC sets ``DVC_EXP_NAME`` for every stage command of an
  experiment: dvc/repo/experiments/queue/base.py, DVC 3.67): it says the failed run is
  kept as that experiment and exits 0, so that DVC saves it. A job that runs
  ``dvc exp run`` goes red with ``vmapcheck gate`` afterwards (docs/scheduled-ci.md).

It reads ``reports/check.json`` (the check's headline: ``passed``, the findings by kind,
``worst_bound_ratio``) and the guard replay's figures in ``reports/bench_details.json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vmapcheck.errors import ArtifactError
from vmapcheck.io import read_json_object
from vmapcheck.layout import Layout

# Set by DVC for each stage command of an experiment (`dvc exp run`), never by `dvc repro`.
EXP_NAME_ENV = "DVC_EXP_NAME"


@dataclass(frozen=True)
class Gate:
    """The workspace's verdict: ``passed``; ``line``: the verdict with the deciding figure."""

    passed: bool
    line: str


def _check_line(check: dict[str, object]) -> str:
    """The check's verdict, its findings by kind and the figure that decided: the worst
    bound ratio (the largest |a - b| over its allowed error; above 1 fails)."""
    ratio = check.get("worst_bound_ratio")
    figure = (
        f"worst_bound_ratio {ratio:.3g} (the largest disagreement over its bound; above 1 fails)"
        if isinstance(ratio, int | float)
        else "no bound ratio (no pair of forwards gave comparable outputs)"
    )
    findings = check.get("findings")
    kinds = (
        ", ".join(f"{n} {kind}" for kind, n in findings.items() if n)
        if isinstance(findings, dict)
        else ""
    )
    words = "PASSED" if check.get("passed") else "FAILED"
    return f"the check {words}" + (f" ({kinds} finding(s))" if kinds else "") + f"; {figure}"


def gate(layout: Layout) -> Gate:
    """The verdict of the workspace's reports (:class:`Gate`).

    Raises:
        ArtifactError: reports/check.json is missing or not the check's headline, or
            reports/bench_details.json is not JSON.
    """
    check = read_json_object(layout.check_report, ("passed",))
    if not isinstance(check["passed"], bool):
        raise ArtifactError(
            f"{layout.check_report}: passed: expected true or false, found {check['passed']!r}"
        )
    line = _check_line(check)
    passed = check["passed"]
    # The guard's replay (bench), judged with the run: a failed one fails it too.
    # Absent: no bench; anything else there is read (a FIFO or a folder refused by name).
    there = layout.bench_details.exists() or layout.bench_details.is_symlink()
    bench = read_json_object(layout.bench_details) if there else {}
    replay = (bench.get("replay") or {}).get("figures") or {}
    if replay and not replay.get("passed"):
        passed = False
        line += (
            f"; the guard's replay FAILED ({replay.get('compiles', 0):g} compiles for "
            f"{replay.get('buckets', 0):g} buckets, {replay.get('mismatched', 0):g} requests "
            "with another outcome than planted)"
        )
    return Gate(passed=passed, line=line)


def run_gate(layout: Layout, stage: bool) -> int:
    """Print the verdict; return the exit status: 1 when it failed, else 0, except for
    the DVC stage (``stage``) inside ``dvc exp run``, which exits 0 on a failure so that
    DVC keeps the failed run as an experiment."""
    verdict = gate(layout)
    name = "gate" if stage else "vmapcheck gate"
    if verdict.passed:
        print(f"{name}: {verdict.line}")
        return 0
    experiment = os.environ.get(EXP_NAME_ENV) if stage else None
    if experiment:
        print(
            f"{name}: {verdict.line}. The failed run is kept as experiment {experiment} "
            "(`dvc exp show` lists it); exiting 0 so that DVC keeps it: `vmapcheck gate` "
            "(or `dvc repro`) exits non-zero on it",
            flush=True,
        )
        return 0
    print(f"{name}: {verdict.line}; exiting non-zero", flush=True)
    return 1


def main(root: Path | None = None) -> int:
    """The ``gate`` stage: exit 2 with one line when the reports cannot be read."""
    layout = Layout(Path.cwd() if root is None else root)
    try:
        return run_gate(layout, stage=True)
    except ArtifactError as exc:
        print(f"gate: error: {exc}", flush=True)
        return 2
