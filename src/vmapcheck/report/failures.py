"""The HTML report's failure and diagnosis sections, as plain data for the template: what
decided the verdict (the kinds of finding, the deciding figure), the failures grouped by
what failed and where (never a wall of near-identical lines), and the diagnosis of the
check stage (``reports/diagnosis.json``: where the paths first diverge).

A failure line of the check reads ``<where>/<what>: <why>`` (``standard/loop_eager-vs-
direct_jit: element (2, 1): |a-b|=2.63 > ...``; :mod:`vmapcheck.check.checks`): ``where``
is a case (or ``reference``, ``gradients``, ``inputs``, an invalid-input case), ``what``
a pair of paths, a path, or a check of it. A planted fault in one path fails every pair
holding it in every case: 104 lines for the transposed weight of tests/helpers/faults.py.
Grouped by ``what`` they are a table of a few rows, each with the cases it failed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from vmapcheck.check.kinds import FINDING_KINDS, tagged
from vmapcheck.core.paths import PATHS
from vmapcheck.report.elements import Table, cell, num, table

if TYPE_CHECKING:
    from vmapcheck.check.schema import CheckDetails, CheckFinding, DiagnosisReport

# How many failure lines the full list shows (all are in reports/check_details.json).
SHOWN_LINES = 200
# The separator of a pair's two paths in a failure line and in check_details.json.
PAIR_SEPARATOR = "-vs-"


class DecidingFigure(TypedDict):
    """The figure that decides the agreement check (:func:`deciding_figure`)."""

    bound_ratio: float
    case: str
    pair: str  # "<left> vs <right>"
    max_rel: float | None
    max_abs: float | None
    passed: bool
    rtol: float  # precision.tolerance's
    atol: float


class KindCount(TypedDict):
    """One kind of finding the run has (:func:`kinds`)."""

    name: str
    title: str
    about: str
    count: int
    failing: int  # of count, those failing the verdict (verdict.fail_on)


class FailureRow(TypedDict):
    """One ``what`` that failed (:func:`groups`): its kind, the places (cases) it failed
    in, the largest bound ratio with its case where recorded, the first reason; a row of
    merged pairs has its summary and the pairs as ``lines``."""

    kind: str
    what: str
    places: list[str]
    ratio: tuple[float, str] | None
    why: str
    lines: NotRequired[list[str]]


class FailureGroups(TypedDict):
    """The report's failures section (:func:`groups`)."""

    table: Table
    by_case: list[tuple[str, int]]
    paths: list[tuple[str, int]]
    count: int
    failing: int


class DiagnosisSection(TypedDict):
    """The report's diagnosis section (:func:`diagnosis`): absent, or where the paths
    first diverge, every stage's status and the summary text."""

    present: bool
    status: NotRequired[str]
    headline: NotRequired[str]
    message: NotRequired[str]
    trigger: NotRequired[str]
    table: NotRequired[Table]
    text: NotRequired[str]


def _findings(check: Mapping[str, Any]) -> list[CheckFinding]:
    """Every finding, each with its kind; a report older than the kinds: its failure
    lines, kind ``""``."""
    return check.get("findings") or [
        {"kind": "", "line": line, "fails": True} for line in check["failures"]
    ]


def deciding_figure(check: CheckDetails) -> DecidingFigure | None:
    """The figure that decides the agreement check: the largest bound ratio (``|a - b|``
    over the allowed error of the rule in vmapcheck.core.compare at the worst element; above 1
    fails) over every pair of paths and case, with where it was reached and the
    tolerance it was judged at. ``{"bound_ratio", "case", "pair", "max_rel",
    "max_abs", "passed", "rtol", "atol"}``; None when no pair has a ratio."""
    worst: DecidingFigure | None = None
    tolerance = check["tolerance"]
    for case_name, case in check["cases"].items():
        for pair_name, result in case.get("pairs", {}).items():
            ratio = result.get("bound_ratio")
            if ratio is None or (worst is not None and ratio <= worst["bound_ratio"]):
                continue
            worst = {
                "bound_ratio": ratio,
                "case": case_name,
                "pair": pair_name.replace(PAIR_SEPARATOR, " vs "),
                "max_rel": result.get("max_rel"),
                "max_abs": result.get("max_abs"),
                "passed": bool(result.get("passed")),
                "rtol": tolerance["rtol"],
                "atol": tolerance["atol"],
            }
    return worst


def deciding_text(check: CheckDetails) -> str:
    """The deciding figure as the banner says it: ``worst bound ratio 9.5e+04 (above 1
    fails): pair loop_eager vs direct_jit, case standard, at rtol=1e-05 atol=1e-06
    (precision.tolerance)``."""
    figure = deciding_figure(check)
    if figure is None:
        return "no pair of paths was compared: no bound ratio"
    return (
        f"worst bound ratio {num(figure['bound_ratio'])} (|a - b| over its allowed error; "
        f"above 1 fails): pair {figure['pair']}, case {figure['case']}, at "
        f"rtol={figure['rtol']:g} atol={figure['atol']:g} (precision.tolerance)"
    )


def kinds(check: CheckDetails) -> list[KindCount]:
    """One entry per kind of finding the run has, in :data:`FINDING_KINDS` order:
    ``{"name", "title", "about", "count", "failing"}`` (``failing``: how many fail the
    verdict, the rest are reported only, ``verdict.fail_on``)."""
    found = _findings(check)
    out: list[KindCount] = []
    for kind in FINDING_KINDS.values():
        of_kind = [f for f in found if f["kind"] == kind.name]
        if of_kind:
            out.append(
                {
                    "name": kind.name,
                    "title": kind.title,
                    "about": kind.about,
                    "count": len(of_kind),
                    "failing": sum(bool(f["fails"]) for f in of_kind),
                }
            )
    return out


# Where a failure line may be found besides a case or an invalid-input case: the stored
# reference, the gradients and the inputs' checks (vmapcheck.check.checks, .probes).
_PLACES = ("reference", "gradients", "inputs")


def _split(line: str, places: list[str]) -> tuple[str, str, str]:
    """``(where, what, why)`` of a failure line ``<where>/<what>: <why>``, ``where`` one
    of ``places`` (case names hold any character, ``/`` too: the longest that starts
    the line is taken); a line that starts with none is all ``what``
    (``reference: missing: ...``)."""
    head, _, why = line.partition(": ")
    for place in places:
        if head.startswith(place + "/"):
            return place, head[len(place) + 1 :], why
    return "", head, why


def _pair_paths(what: str) -> list[str]:
    """The registered paths a ``what`` names: both of a pair, the one of a path's check
    (``direct_jit vs float64 oracle``); none for another check."""
    words = what.replace(PAIR_SEPARATOR, " ").replace(".", " ").split()
    return [w for w in words if w in PATHS]


def covering_paths(pairs: list[str]) -> list[str]:
    """The fewest paths (greedily, the most named first) one of which every pair in
    ``pairs`` holds: ``[direct_eager, direct_jit]`` for the 18 pairs a fault in the
    hand-batched forward fails. Where to look, when the pairs share a path."""
    left = [set(_pair_paths(pair)) for pair in pairs]
    chosen: list[str] = []
    while any(left):
        counts = Counter(path for held in left for path in held)
        best = max(counts, key=lambda path: (counts[path], -list(PATHS).index(path)))
        chosen.append(best)
        left = [held for held in left if best not in held]
    return chosen


def _merged_pairs(rows: list[FailureRow]) -> list[FailureRow]:
    """Rows of pairs of paths that failed in the same cases, of the same kind, merged
    into one (where the first of them stood): ``18 pairs, each holding direct_eager or
    direct_jit``, the pairs listed under it, the worst ratio of them all."""
    merged: dict[tuple[str, tuple[str, ...]], list[FailureRow]] = {}
    order: list[FailureRow | tuple[str, tuple[str, ...]]] = []
    for row in rows:
        if PAIR_SEPARATOR not in row["what"]:
            order.append(row)
            continue
        key = (row["kind"], tuple(row["places"]))
        if key not in merged:
            merged[key] = []
            order.append(key)
        merged[key].append(row)
    out: list[FailureRow] = []
    for item in order:
        if not isinstance(item, tuple):  # a row kept as it is
            out.append(item)
            continue
        group = merged[item]
        if len(group) == 1:
            out.append(group[0])
            continue
        pairs = [row["what"] for row in group]
        ratios = [row["ratio"] for row in group if row["ratio"] is not None]
        what = f"{len(pairs)} pairs, each holding " + " or ".join(covering_paths(pairs))
        first: FailureRow = {
            **group[0],
            "what": what,
            "lines": [what, ", ".join(pairs)],  # the summary, then every pair
            "ratio": max(ratios, key=lambda ratio: ratio[0]) if ratios else None,
        }
        out.append(first)
    return out


def groups(check: CheckDetails) -> FailureGroups:
    """The failures grouped, for the report's failures section:

    - ``table``: one row per ``what`` (a pair, a path's check, a check), in the order
      first found, the pairs that failed in the same cases merged into one row
      (:func:`_merged_pairs`): its kind, how many cases (or places) it failed in and
      which, the largest bound ratio among them where the check records one, and the
      first reason;
    - ``by_case``: ``[(where, count)]``, how many failures each case (or place) has;
    - ``paths``: ``[(path, count)]``, how many failures name each path, most first: a
      path in every failing pair is where to look;
    - ``count``, ``failing``: findings in all, and those failing the verdict.
    """
    found = _findings(check)
    places = sorted({*check["cases"], *check.get("negative", {}), *_PLACES}, key=len, reverse=True)
    rows: dict[tuple[str, str], FailureRow] = {}
    by_case: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for item in found:
        where, what, why = _split(item["line"], places)
        by_case[where or what] += 1
        paths.update(_pair_paths(what))
        row = rows.setdefault(
            (item["kind"], what),
            {"kind": item["kind"], "what": what, "places": [], "ratio": None, "why": why},
        )
        if where and where not in row["places"]:
            row["places"].append(where)
        case: Mapping[str, Any] = check["cases"].get(where) or {}
        ratio = case.get("pairs", {}).get(what, {}).get("bound_ratio")
        if ratio is not None and (row["ratio"] is None or ratio > row["ratio"][0]):
            row["ratio"] = (ratio, where)
    n_cases = len(check["cases"])
    body = []
    for row in _merged_pairs(list(rows.values())):
        places = row["places"]
        ratio = row["ratio"]
        body.append(
            (
                [
                    cell(row["what"], prose=True, lines=row.get("lines", [])),
                    row["kind"] or "-",
                    f"{len(places)} of {n_cases} cases"
                    if _all_cases(places, check)
                    else str(len(places) or 1),
                    ", ".join(places) if places else "-",
                    "-" if ratio is None else f"{num(ratio[0])} ({ratio[1]})",
                    cell(row["why"], cls="why", prose=True),
                ],
                None,
            )
        )
    return {
        "table": table(
            (
                "what failed",
                "kind",
                "failed in",
                "where",
                "worst bound ratio (case)",
                "first reason",
            ),
            body,
            table_id="failures-by-what",
        ),
        "by_case": sorted(by_case.items(), key=lambda item: -item[1]),
        "paths": paths.most_common(),
        "count": len(found),
        "failing": sum(bool(f["fails"]) for f in found),
    }


def _all_cases(places: list[str], check: CheckDetails) -> bool:
    """Whether every place of a row is one of the check's cases (then counted of them)."""
    return bool(places) and all(p in check["cases"] for p in places)


def lines(check: CheckDetails) -> tuple[list[str], int]:
    """The first :data:`SHOWN_LINES` findings tagged as the verdict prints them, and how
    many more there are."""
    found = _findings(check)
    shown = [tagged(f) if f["kind"] else f"failure: {f['line']}" for f in found[:SHOWN_LINES]]
    return shown, max(0, len(found) - SHOWN_LINES)


def diagnosis(report: DiagnosisReport | None) -> DiagnosisSection:
    """The diagnosis section (``reports/diagnosis.json``, None: the run has none):
    ``{"present", "status", "headline", "message", "table", "text", "trigger"}``: where
    the paths first diverge (stage, layer, leaf, paths) and its measurement, every
    stage's status and evidence, and the summary text (``reports/diagnosis.txt``)."""
    if report is None:
        return {"present": False}
    first = report.get("first_divergence")
    if report["status"] == "diverged" and first is not None:
        where = [f"stage {first['stage']}"]
        where += [f"{k} {first[k]}" for k in ("layer", "leaf") if first.get(k)]
        if first["paths"]:
            where.append(f"path(s) {', '.join(first['paths'])}")
        headline = "First divergence: " + ", ".join(where)
        message = first["message"]
    elif report["status"] == "not needed":
        headline, message = "Not needed: every check passed.", ""
    elif report["status"] == "error":
        headline = "The diagnosis could not run."
        message = str(report.get("error", ""))
    else:
        headline = "No divergence found: every stage reached was ruled out."
        message = ""
    rows = [
        (
            [stage["stage"], stage["status"].replace("_", " "), stage["summary"]],
            {"diverged": False, "ruled_out": True}.get(stage["status"]),
        )
        for stage in report.get("stages", [])
    ]
    if report["status"] == "diverged":  # the protocol stops at the first divergence
        rows += [
            ([name, "not reached", "after the first divergence"], None)
            for name in report.get("not_reached", [])
        ]
    return {
        "present": True,
        "status": report["status"],
        "headline": headline,
        "message": message,
        "trigger": report.get("trigger", ""),
        "table": table(("stage", "status", "evidence"), rows, table_id="diagnosis-stages"),
        "text": report.get("summary", ""),
    }


def diagnosis_line(report: DiagnosisReport | None) -> str:
    """One line for the verdict banner: where the diagnosis found the first divergence
    (``Diagnosis: First divergence: stage forward, layer layers[1], path(s) direct_eager``),
    or "" when there is nothing to say there."""
    section = diagnosis(report)
    if not section["present"] or section["status"] == "not needed":
        return ""
    return f"Diagnosis: {section['headline']}"
