"""The rules that judge a valid case's outputs: one :data:`CASE_RULES` entry per rule.

Every valid case is judged by agreement (each pair of paths, the float64 oracle, the
stored reference: :mod:`vmapcheck.check.checks`) and by every rule here whose
``every_case`` is set (a built-in rule: ``finite``, outputs finite on every path). A
case kind may name further rules in its ``rules`` (:class:`vmapcheck.core.cases.
CaseKind`). Each entry holds its rule (``judge``), the figures it reports, and the line
that shows it. check stores a kind's rule's result under the case's ``rules`` in
``reports/check_details.json``; the printed summary, the HTML report and MLflow (metrics
``rule/<case>/<rule>/<figure>``) show every such entry the same way, so a new rule needs
no edit there. A built-in rule's result is recorded in the case's own fields instead
(:attr:`RuleResult.fields`, e.g. ``finite``), which the report's sections show.

To add a rule, add its entry below (docs/development.md, "Adding a case rule"); a case
kind with a rule of its own also needs its entry in :data:`vmapcheck.core.cases.
CASE_KINDS` naming the rule and its cases in :func:`vmapcheck.data.regression.
regression_cases`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np

from vmapcheck.check.kinds import KindName
from vmapcheck.check.schema import BuiltinFields, RuleRecord
from vmapcheck.config import ToleranceConfig
from vmapcheck.errors import ArtifactError
from vmapcheck.io import missing_keys


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict on one case.

    Attributes:
        passed: the rule held on every path.
        figures: name -> value (None where nothing was measured), the rule's
            :attr:`CaseRule.figures` in that order; logged to MLflow.
        text: one line saying what was found, for the summary and the HTML report.
        failures: one line per failure (``case/path: what``), empty when passed.
        kinds: each failure's finding kind (:data:`vmapcheck.check.kinds.
            FINDING_KINDS`), in order; empty: every one is ``"batching"``.
        fields: what a built-in rule (:attr:`CaseRule.every_case`) records in the
            case's report (check_details.json ``cases.<case>``), e.g. ``finite``.
    """

    passed: bool
    figures: dict[str, float | None]
    text: str
    failures: list[str] = field(default_factory=list)
    # Not in the JSON record (to_json): a rule of a case kind records the four above.
    kinds: tuple[KindName, ...] = ()
    fields: BuiltinFields = field(default_factory=lambda: BuiltinFields())

    def to_json(self) -> RuleRecord:
        record = asdict(self)
        return cast(RuleRecord, {k: record[k] for k in ("passed", "figures", "text", "failures")})

    def findings(self) -> list[tuple[KindName, str]]:
        """``(kind, line)`` for each failure: its :attr:`kinds` entry, or "batching"."""
        batching: KindName = "batching"
        kinds = self.kinds or (batching,) * len(self.failures)
        return list(zip(kinds, self.failures, strict=True))

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> RuleResult:
        """A result read back from check_details.json (``where`` names it in errors)."""
        missing = missing_keys(data, RuleRecord)
        if missing:
            raise ArtifactError(f"{where}: expected keys {missing} in a rule's result")
        return cls(
            passed=bool(data["passed"]),
            figures=dict(data["figures"]),
            text=str(data["text"]),
            failures=list(data.get("failures", [])),
        )


# A rule's judge: (case name, path -> its output on the case (rows, ...), batch axis 0,
# the tolerance pairs are judged at) -> its result.
Judge = Callable[[str, Mapping[str, np.ndarray], ToleranceConfig], RuleResult]


@dataclass(frozen=True)
class CaseRule:
    """A rule a case kind adds to agreement.

    Attributes:
        name: as case kinds name it in ``rules``.
        about: what it checks, one line (the HTML report, docs/checks.md).
        figures: the figures its result carries, in order.
        judge: the rule itself (see :data:`Judge`).
        stochastic: the rule judging the case instead for a stochastic model.
        every_case: a built-in rule: it judges every valid case, whatever its kind
            names, and records its result in the case's own fields.
    """

    name: str
    about: str
    figures: tuple[str, ...]
    judge: Judge
    # The rule that judges the case instead for a stochastic model (Model.stochastic:
    # every row has its own key, so what held for a deterministic forward flips), or
    # None: the same rule.
    stochastic: str | None = None
    # Built-in (True): judged on every valid case, its result recorded in the case's own
    # fields (RuleResult.fields) and findings, which the report's sections show; a kind's
    # rule (False) is judged where a kind names it and recorded under the case's `rules`.
    every_case: bool = False

    def line(self, case: str, result: RuleResult) -> str:
        """The summary's line for ``result`` on ``case``."""
        return f"  {'ok  ' if result.passed else 'FAIL'} {case:<16} {self.name}: {result.text}"

    def metrics(self, case: str, result: RuleResult) -> dict[str, float]:
        """MLflow metrics: ``rule/<case>/<rule>/passed`` and each measured figure."""
        prefix = f"rule/{case}/{self.name}"
        found = {f"{prefix}/passed": float(result.passed)}
        found |= {f"{prefix}/{k}": float(v) for k, v in result.figures.items() if v is not None}
        return found


def _rows_text(rows: list[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
    return f"row{'s' if len(rows) > 1 else ''} {shown}"


def _finite(case: str, outputs: Mapping[str, np.ndarray], tolerance: ToleranceConfig) -> RuleResult:
    """Every path's output (rows, ...) finite, judged per row (batch axis 0). Rows
    non-finite on every path are the model's fault (the per-example loop computes them
    too), named once; a row non-finite on some paths only is a batching fault on those.
    Every other row is still compared (:func:`vmapcheck.core.compare.compare` measures
    around rows that hold the same NaN/Inf in both). ``tolerance`` is not used: a NaN is
    not a rounding. No output at all passes (agreement reports that no pair ran)."""
    from vmapcheck.core.compare import non_finite_rows  # loads JAX: only when judged

    non_finite = {
        p: non_finite_rows(~np.isfinite(v.astype(np.float64))) for p, v in outputs.items()
    }
    fields: BuiltinFields = {"finite": {p: not rows for p, rows in non_finite.items()}}
    failures: list[str] = []
    kinds: list[KindName] = []
    if any(non_finite.values()):
        fields["non_finite_rows"] = {p: rows for p, rows in non_finite.items() if rows}
        common = set.intersection(*(set(rows) for rows in non_finite.values()))
        if common:
            kinds.append("model")
            failures.append(
                f"{case}: non-finite output on {_rows_text(sorted(common))} on every path: "
                "the model computes it, not the batching (the other rows are compared)"
            )
        for p, rows in non_finite.items():
            extra = sorted(set(rows) - common)
            if extra:
                kinds.append("batching")
                failures.append(
                    f"{case}/{p}: non-finite output on {_rows_text(extra)}, where other "
                    "paths are finite"
                )
    broken = [p for p, rows in non_finite.items() if rows]
    text = (
        f"non-finite output on {', '.join(broken)}"
        if broken
        else f"finite on each of {len(non_finite)} paths"
    )
    return RuleResult(
        passed=not failures,
        figures={},
        text=text,
        failures=failures,
        kinds=tuple(kinds),
        fields=fields,
    )


def _copies_agree(
    case: str, outputs: Mapping[str, np.ndarray], tolerance: ToleranceConfig
) -> RuleResult:
    """Every row of each path's output (rows, ...) against its first row, at the pairs'
    ``tolerance`` by the output rule: the case's rows are copies of one row."""
    from vmapcheck.core.compare import compare, largest, worst_of  # loads JAX: only when judged

    found = {
        path: compare(out, np.broadcast_to(out[:1], out.shape), tolerance)
        for path, out in outputs.items()
    }
    failures = [
        f"{case}/{path}: copies of one row get different outputs: {r['reason']}"
        for path, r in found.items()
        if not r["passed"]
    ]
    worst = worst_of(found)
    measured = [r for r in found.values() if r.get("bound_ratio") is not None]
    figures = {
        "bound_ratio": found[worst].get("bound_ratio") if worst else None,
        "max_abs": largest(measured, "max_abs"),
    }
    rows = len(next(iter(outputs.values())))
    if failures:
        text = f"{rows} copies of one row get different outputs on " + ", ".join(
            p for p, r in found.items() if not r["passed"]
        )
    elif worst is None:  # no element to compare (a path that computed no row)
        text = f"{rows} copies of one row: nothing to compare on {len(found)} paths"
    else:
        text = (
            f"{rows} copies of one row, the same output on each of {len(found)} paths "
            f"(worst bound_ratio={figures['bound_ratio']:.3g} on {worst}, "
            f"max_abs={figures['max_abs']:.3g})"
        )
    return RuleResult(passed=not failures, figures=figures, text=text, failures=failures)


# What a forward that samples gets wrong when its rows share their randomness.
SHARED_RANDOMNESS = "the rows share their randomness"


def _copies_differ(
    case: str, outputs: Mapping[str, np.ndarray], tolerance: ToleranceConfig
) -> RuleResult:
    """A stochastic model's copies of one row, each with its own key: each path's output
    (rows, ...) must not be the same for every copy. One key shared by the batch (a
    ``forward_batch`` drawing from ``keys[0]``, a ``forward_one`` ignoring its key)
    gives every copy bit-identical outputs. A correct sampler may repeat a draw by
    chance (two equal dropout masks), so only all copies equal fails; ``tolerance`` is
    not used: a draw that moves an output less than the tolerance still moves it."""
    distinct = {
        path: len({np.asarray(row).tobytes() for row in np.asarray(out)})
        for path, out in outputs.items()
    }
    rows = len(next(iter(outputs.values())))
    shared = [path for path, n in distinct.items() if rows >= 2 and n == 1]
    failures = [
        f"{case}/{path}: {rows} copies of one row, each given its own key, got one and the "
        f"same output: {SHARED_RANDOMNESS} (one key used for the whole batch, or a key "
        "ignored)"
        for path in shared
    ]
    fewest = min(distinct.values()) if distinct else None
    figures: dict[str, float | None] = {"fewest_distinct": fewest, "rows": rows}
    if shared:
        text = f"{rows} copies with different keys get one output on {', '.join(shared)}: "
        text += SHARED_RANDOMNESS
    else:
        text = (
            f"{rows} copies of one row with different keys differ on each of "
            f"{len(distinct)} paths (fewest distinct outputs: {fewest})"
        )
    return RuleResult(passed=not failures, figures=figures, text=text, failures=failures)


CASE_RULES: dict[str, CaseRule] = {
    r.name: r
    for r in [
        CaseRule(
            "finite",
            about="every path's output is finite, row by row (batch axis 0): rows with a "
            "NaN or Inf on every path are the model's (one model finding), rows non-finite "
            "on some paths only are a batching fault on those; the other rows are still "
            "compared",
            figures=(),
            judge=_finite,
            every_case=True,
        ),
        CaseRule(
            "copies_agree",
            about="every copy of one row in a batch gets the first copy's output, on each "
            "path, at precision.tolerance (output rule): a batched form that lets a row's "
            "position or batch-mates change its result fails",
            figures=("bound_ratio", "max_abs"),
            judge=_copies_agree,
            stochastic="copies_differ",
        ),
        CaseRule(
            "copies_differ",
            about="for a stochastic model (its copies each get their own key): the copies "
            "of one row must not all get one and the same output, on each path: one key "
            "shared by the batch's rows fails",
            figures=("fewest_distinct", "rows"),
            judge=_copies_differ,
        ),
    ]
}


def every_case() -> tuple[str, ...]:
    """The built-in rules (:attr:`CaseRule.every_case`): judged on every valid case."""
    return tuple(name for name, r in CASE_RULES.items() if r.every_case)


def rules_for(names: tuple[str, ...], stochastic: bool) -> tuple[str, ...]:
    """A case kind's ``rules`` as they judge a model: each replaced by its
    :attr:`CaseRule.stochastic` entry for a stochastic one."""
    if not stochastic:
        return names
    return tuple(rule(name).stochastic or name for name in names)


def rule(name: str) -> CaseRule:
    """The registry entry ``name``; an error naming the rules known otherwise."""
    if name not in CASE_RULES:
        raise ArtifactError(
            f"case rule {name!r} is not registered; expected one of "
            f"{', '.join(CASE_RULES) or '(none)'} (vmapcheck.check.rules.CASE_RULES)"
        )
    return CASE_RULES[name]


def judge_case(
    case: str,
    rules: tuple[str, ...],
    outputs: Mapping[str, np.ndarray],
    tolerance: ToleranceConfig,
) -> dict[str, RuleResult]:
    """Every rule of ``rules`` (a case kind's, or :func:`every_case`) on ``case``'s
    outputs (path -> (rows, ...)); a case no path produced an output for fails each
    rule of a kind, saying so (a built-in rule judges that itself: agreement already
    fails a case with no pair of paths)."""
    results = {}
    for name in rules:
        if not outputs and not rule(name).every_case:
            results[name] = RuleResult(
                passed=False,
                figures=dict.fromkeys(rule(name).figures),
                text="no path produced an output to judge",
                failures=[f"{case}: {name}: no path produced an output"],
            )
        else:
            results[name] = rule(name).judge(case, outputs, tolerance)
    return results


def summary_lines(cases: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per rule result of every case in check_details' ``cases``."""
    return [
        rule(name).line(case, RuleResult.from_json(data, f"cases.{case}.rules.{name}"))
        for case, report in cases.items()
        for name, data in report.get("rules", {}).items()
    ]


def metrics(cases: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Every rule result's MLflow metrics (see :meth:`CaseRule.metrics`)."""
    found: dict[str, float] = {}
    for case, report in cases.items():
        for name, data in report.get("rules", {}).items():
            result = RuleResult.from_json(data, f"cases.{case}.rules.{name}")
            found |= rule(name).metrics(case, result)
    return found
