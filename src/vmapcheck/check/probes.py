"""The checks of what the forward stage probed beside the cases: the loss and gradients
(:func:`vmapcheck.core.gradients.gradient_probe`), the key stream (a diagnosis stage
judged as a check) and bitwise batch invariance (:mod:`vmapcheck.core.bitwise`). Each
returns its report section and its findings, each of its kind; :func:`vmapcheck.check.
checks.run_checks` gathers them.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from vmapcheck.check.kinds import finding
from vmapcheck.check.schema import (
    CheckFinding,
    GradientsReport,
    InputsReport,
    StageResult,
)
from vmapcheck.config import Config
from vmapcheck.core.compare import compare, largest, worst_element
from vmapcheck.core.record import BitwiseReport, GradientProbe, GradientProbeError
from vmapcheck.data.regression import STANDARD_CASE


def judge_gradients(
    config: Config,
    record: GradientProbe | GradientProbeError | None,
    arrays: dict[str, np.ndarray] | None,
) -> tuple[GradientsReport, list[CheckFinding]]:
    """Finite loss and gradients; NaN detected; mean per-example gradient = batch gradient.
    Non-finite loss or gradients, or a NaN the loss does not carry, are model faults; a
    batch gradient other than the mean of the per-example ones is a batching fault."""
    if record is not None and "error" in record:
        raised = cast(GradientProbeError, record)
        line = (
            f"gradients/{raised['case']}: the loss cannot be differentiated: "
            f"{raised['error']} (the forward paths are still checked)"
        )
        return {"status": "error", "error": raised["error"], "passed": False}, [
            finding("model", line)
        ]
    if record is None or arrays is None:
        return {"status": "not run", "passed": True}, []
    failures: list[CheckFinding] = []
    case = record.get("case", STANDARD_CASE)
    nonfinite = record.get("nonfinite_leaves")
    # The leaves to look at first (a NaN from the untaken branch of a jnp.where shows
    # in the gradient only: the forward is finite).
    leaves_text = f" (leaves: {', '.join(nonfinite)})" if nonfinite else ""
    for finite, what, named in (
        (record["loss_finite"], "loss", ""),
        (record["grads_finite"], "gradients", leaves_text),
        (record["per_example_finite"], "per-example gradients", leaves_text),
    ):
        if not finite:
            failures.append(
                finding("model", f"gradients/{case}: the {what} are not finite on real data{named}")
            )
    probe = record["nan_probe"]
    # The loss must carry the NaN. The gradients may legitimately stay finite: a relu
    # that is off for that output passes no gradient (JAX selects 0, it does not
    # multiply 0 by NaN), so they are reported, not judged.
    if probe["loss_finite"]:
        failures.append(
            finding(
                "model", "gradients/nan_probe: a NaN target gave a finite loss: something masks NaN"
            )
        )
    leaves = {}
    for key in arrays:
        if key.startswith("batch_grad."):
            leaf = key.removeprefix("batch_grad.")
            leaves[leaf] = compare(
                arrays[f"per_example_mean.{leaf}"], arrays[key], config.precision.tolerance
            )
            if not leaves[leaf]["passed"]:
                failures.append(
                    finding(
                        "batching",
                        f"gradients/{leaf}: mean of per-example gradients vs batch gradient: "
                        f"{leaves[leaf]['reason']}",
                    )
                )
    report: GradientsReport = {
        "status": "ok",
        **record,  # the probe's own figures (finiteness, the NaN probe)
        "per_example_vs_batch": leaves,
        "max_abs": largest(leaves.values(), "max_abs"),
        "max_rel": largest(leaves.values(), "max_rel"),
        # The figure that decides (the largest bound ratio, its leaf as worst_pair): a
        # leaf of values near 0 can show a large max_rel well within atol.
        **worst_element(leaves),
        "passed": not failures,
    }
    return report, failures


def judge_bitwise(measured: Any, mode: str) -> tuple[BitwiseReport | None, list[CheckFinding]]:
    """The bitwise batch invariance the forward stage measured (:mod:`vmapcheck.core.
    bitwise`), with its verdict: reported (mode "report"), failed per path not bitwise
    (mode "require"); None when not measured or mode "off"."""
    from vmapcheck.core.bitwise_verdict import check_mode, judge

    if measured is None or check_mode(mode) == "off":
        return None, []
    report, lines = judge(cast(BitwiseReport, measured), check_mode(mode))
    # Required and not bitwise: a row's bits depend on the batch around it.
    return report, [finding("batching", line) for line in lines]


def judge_inputs(
    stages: dict[str, StageResult] | None,
) -> tuple[InputsReport, list[CheckFinding]]:
    """The pipeline's inputs judged with its outputs: each stage result of
    :mod:`vmapcheck.check.diagnosis` given (the key stream: each subkey feeds one random draw)
    fails the check when it diverged."""
    if stages is None:
        return {"status": "not run", "passed": True}, []
    # A key fed to two random draws (or another input fault) is the model's, not the
    # batching's: the seed's key-stream criterion.
    failures = [
        finding("model", f"inputs/{name}: {stage['summary']}")
        for name, stage in stages.items()
        if stage["status"] == "diverged"
    ]
    report = {
        "status": "ok",
        **{name: {"status": s["status"], "summary": s["summary"]} for name, s in stages.items()},
        "passed": not failures,
    }
    # One key per stage beside status and passed: a TypedDict cannot name them.
    return cast(InputsReport, report), failures
