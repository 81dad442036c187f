"""What kind of finding a failed check is: :data:`FINDING_KINDS`, one entry per kind.

vmapcheck's question is whether batched inference can be trusted. A failed check answers
it only when the user can tell a batching fault (paths disagree) from a float32 result
that is poor on every path alike, or from a model that computes Inf on every path: those
call for other fixes, by other people. So every failure line the check writes is a
:class:`~vmapcheck.check.schema.CheckFinding` of one kind, named where the check finds
it (:mod:`vmapcheck.check.checks`), and the verdict, the summary, the HTML report, MLflow
and the Python API say which. Which kinds fail the run is the setting
``verdict.fail_on`` (:class:`vmapcheck.config.VerdictConfig`); a kind left out is still
reported, as a finding that does not fail.

To add a kind: one entry below, and the check that finds it names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmapcheck.check.schema import CheckFinding
from vmapcheck.config import FINDING_KIND_NAMES
from vmapcheck.config.run import FindingKindName as KindName


@dataclass(frozen=True)
class FindingKind:
    """One kind of finding.

    Attributes:
        name: the key in reports, metrics (``findings/<name>``) and ``verdict.fail_on``.
        title: how the verdict words one such finding (``batching fault``).
        about: what it means and whom it concerns, for the docs and the HTML report.
    """

    name: KindName
    title: str
    about: str


FINDING_KINDS: dict[str, FindingKind] = {
    k.name: k
    for k in [
        FindingKind(
            "batching",
            "batching fault",
            "the paths disagree, a row's output depends on the batch around it, or a path "
            "fails to refuse an invalid input: batched inference differs from the "
            "per-example loop",
        ),
        FindingKind(
            "numerical",
            "numerical finding",
            "every path computes the same thing, but the result is far from float64 (or "
            "from the stored reference): the precision's error, not a batching fault",
        ),
        FindingKind(
            "model",
            "model fault",
            "the model computes NaN or Inf on every path alike (on the rows named), or its "
            "loss, gradients or key stream are wrong: a fault of the model itself",
        ),
        FindingKind(
            "contract",
            "contract problem",
            "an output of the wrong shape or dtype on every path, or a stored reference "
            "that cannot be compared: the declared contract does not hold",
        ),
    ]
}
# verdict.fail_on is validated against the config's names: the two must be the same.
if tuple(FINDING_KINDS) != FINDING_KIND_NAMES:
    raise ImportError(
        f"FINDING_KINDS {tuple(FINDING_KINDS)} and vmapcheck.config.FINDING_KIND_NAMES "
        f"{FINDING_KIND_NAMES} must name the same kinds, in the same order"
    )


def finding(kind: KindName, line: str) -> CheckFinding:
    """A failure line of ``kind`` (its ``fails`` is set by :func:`judge_findings`)."""
    if kind not in FINDING_KINDS:  # a typo in the check would otherwise pass silently
        raise KeyError(f"unknown finding kind {kind!r}; registered: {', '.join(FINDING_KINDS)}")
    return {"kind": kind, "line": line, "fails": True}


def judge_findings(
    findings: Iterable[CheckFinding], fail_on: Sequence[str]
) -> tuple[list[CheckFinding], list[str]]:
    """``(findings with fails set, the failure lines)``: a finding fails the verdict
    when its kind is in ``fail_on`` (``verdict.fail_on``); the others stay reported."""
    judged: list[CheckFinding] = [{**f, "fails": f["kind"] in fail_on} for f in findings]
    return judged, [f["line"] for f in judged if f["fails"]]


def kind_counts(findings: Iterable[CheckFinding]) -> dict[str, int]:
    """Kind -> how many findings of it, in registry order (only the kinds found)."""
    counts = dict.fromkeys(FINDING_KINDS, 0)
    for f in findings:
        counts[f["kind"]] += 1
    return {k: n for k, n in counts.items() if n}


def kinds_text(findings: Sequence[CheckFinding], *, failing: bool) -> str:
    """``2 batching faults, 1 numerical finding``: the findings that fail the verdict
    (``failing``) or those only reported, by kind in registry order; "" when none."""
    chosen = [f for f in findings if f["fails"] == failing]
    parts = []
    for kind, n in kind_counts(chosen).items():
        title = FINDING_KINDS[kind].title
        parts.append(f"{n} {title}" + ("s" if n > 1 else ""))
    return ", ".join(parts)


def tagged(item: CheckFinding) -> str:
    """A finding as the verdict prints it: ``failure: [batching] standard/...`` when its
    kind fails the verdict, ``finding: [numerical] ... (reported, not failed)`` when
    ``verdict.fail_on`` leaves its kind out."""
    if item["fails"]:
        return f"failure: [{item['kind']}] {item['line']}"
    return f"finding: [{item['kind']}] {item['line']} (reported, not failed)"


def all_kind_counts(check: Mapping[str, Any]) -> dict[str, int]:
    """Kind -> how many findings of it (failing or reported), every kind, 0 included: the
    keys runs are compared on (MLflow ``check/findings/<kind>``, DVC metrics)."""
    found = kind_counts(check.get("findings", []))
    return {kind: found.get(kind, 0) for kind in FINDING_KINDS}


def failing_kinds(check: Mapping[str, Any]) -> list[str]:
    """The kinds of the findings that fail the verdict, in registry order."""
    return list(kind_counts(f for f in check.get("findings", []) if f["fails"]))


def verdict_words(check: Mapping[str, Any]) -> str:
    """``FAILED (1 batching fault, 2 model faults)``, or ``PASSED`` and the findings
    reported without failing (kinds left out of ``verdict.fail_on``): what kind of
    finding decided, at a glance."""
    findings = check.get("findings", [])
    failing = kinds_text(findings, failing=True)
    reported = kinds_text(findings, failing=False)
    if not check["passed"]:
        words = f"FAILED ({failing})" if failing else "FAILED"
        return words + (f", also {reported} reported" if reported else "")
    return "PASSED" + (f", {reported} reported (not in verdict.fail_on)" if reported else "")


# The findings the verdict prints: the first ones, and the stored reference's first where
# those leave it out (a planted mistake fails many pairs before the reference's lines).
SHOWN_FINDINGS = 10
REFERENCE_LINE = "reference"


def finding_lines(check: Mapping[str, Any], most: int = SHOWN_FINDINGS) -> list[str]:
    """The findings as the verdict prints them, each tagged with its kind (:func:`tagged`):
    the first ``most``, and the stored reference's first where those leave it out. A
    report older than the kinds gives its failure lines, untagged."""
    findings: list[CheckFinding] = check.get("findings") or [
        {"kind": "", "line": line, "fails": True} for line in check["failures"]
    ]
    shown = list(findings[:most])
    if not any(f["line"].startswith(REFERENCE_LINE) for f in shown):
        shown += [f for f in findings[most:] if f["line"].startswith(REFERENCE_LINE)][:1]
    return [tagged(f) if f["kind"] else f"failure: {f['line']}" for f in shown]
