"""The acceptance corpus of real batching bugs (tests/real_bugs/, docs/real-bugs.md):
each reported bug must be caught by the check that fits it, and each published fix must
pass, or fail only with the finding kinds its entry allows.

Each ``check_batching`` call runs once per (entry, side) however many tests read it
(``_report`` is cached for the module). The checks take about 4 CPU s each, over a
minute for the corpus, so they are marked ``stages`` (``make test`` runs them, ``make
test-fast`` does not); the registry's own test is instant and unmarked.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jax
import pytest

from tests.real_bugs import FINDING_KINDS, KINDS, REAL_BUGS, RealBug
from vmapcheck.testing import BatchingReport, check_batching

# Published fixes that vmapcheck FAILs today (issue 42's false alarms), each with the
# failure line it shows. Not weakened to pass: the verdict's finding kinds (issue 42,
# item 2) and per-row non-finite judgement are what should clear them.
# Fixes that FAIL today and should not (a false alarm), with the line they fail on: none
# since the findings have kinds (a fix may still fail with a kind its entry allows).
FALSE_ALARMS_TODAY: dict[str, str] = {}


@functools.cache
def _report(name: str, side: str) -> BatchingReport:
    """The report of one entry's bug or fix (side), computed once for the module."""
    entry = REAL_BUGS[name]
    model, params, examples = entry.bug() if side == "bug" else entry.fix()
    # JAX's default promotion, as the users who reported these ran: the suite's strict
    # promotion (tests/conftest.py) would turn the dtype entry's silent promotion into a
    # TypePromotionError before the check could see the float32 output.
    with jax.numpy_dtype_promotion("standard"):
        return check_batching(model, params, examples, **dict(entry.check_kwargs))


def _findings(report: BatchingReport) -> list[Any] | None:
    """The report's typed findings (each with ``.kind`` and ``.line``), or None while the
    installed vmapcheck reports failure lines only."""
    return getattr(report, "findings", None)


def _params(side: str) -> list[Any]:
    params = []
    for name, entry in REAL_BUGS.items():
        marks = []
        missing = entry.missing()
        if missing:
            marks.append(pytest.mark.skipif(True, reason=f"needs vmapcheck feature(s) {missing}"))
        if side == "fix" and name in FALSE_ALARMS_TODAY:
            marks.append(pytest.mark.xfail(strict=False, reason=FALSE_ALARMS_TODAY[name]))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def test_the_corpus_covers_every_kind_with_real_sources() -> None:
    assert len(REAL_BUGS) >= 13
    assert {entry.kind for entry in REAL_BUGS.values()} == set(KINDS)
    threads = [(entry.source.repo, entry.source.number) for entry in REAL_BUGS.values()]
    assert len(set(threads)) == len(threads), "one thread cited by two entries"
    for entry in REAL_BUGS.values():
        assert re.fullmatch(
            rf"https://github\.com/{re.escape(entry.source.repo)}/(issues|pull)/"
            rf"{entry.source.number}",
            entry.source.url,
        )
        assert entry.what and entry.source.title and entry.source.fixed_by
        # No published fix may fail as a batching fault (issue 42, "Must show").
        assert "batching" not in entry.fix_may_fail
        assert set(entry.fix_may_fail) <= set(FINDING_KINDS)
    assert set(FALSE_ALARMS_TODAY) <= set(REAL_BUGS)


@pytest.mark.stages
@pytest.mark.parametrize("name", _params("bug"))
def test_the_bug_is_caught_by_the_check_that_fits_it(name: str) -> None:
    entry: RealBug = REAL_BUGS[name]
    report = _report(name, "bug")
    assert not report.passed, f"{name}: the bug passed\n{report.summary}"
    wanted = entry.caught_by
    lines = [line for line in report.failures if wanted.line in line]
    assert lines, f"{name}: no failure line contains {wanted.line!r}; the failures:\n" + "\n".join(
        report.failures
    )
    findings = _findings(report)
    if findings is not None:
        kinds = {finding.kind for finding in findings if wanted.line in finding.line}
        assert wanted.kind in kinds, (
            f"{name}: the lines with {wanted.line!r} are findings of kind(s) "
            f"{sorted(kinds)}, expected {wanted.kind!r}"
        )


@pytest.mark.stages
@pytest.mark.parametrize("name", _params("fix"))
def test_the_published_fix_passes(name: str) -> None:
    entry: RealBug = REAL_BUGS[name]
    report = _report(name, "fix")
    if report.passed:
        return
    findings = _findings(report)
    assert findings is not None, f"{name}: the published fix FAILED\n{report.summary}"
    unexpected = sorted({finding.kind for finding in findings} - set(entry.fix_may_fail))
    assert not unexpected, (
        f"{name}: the published fix fails with finding kind(s) {unexpected} (allowed: "
        f"{list(entry.fix_may_fail)})\n{report.summary}"
    )


# --- docs/real-bugs.md's table is the registry ------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "real-bugs.md"
TABLE_START, TABLE_END = "<!-- corpus table: start -->", "<!-- corpus table: end -->"


def _fix_today(entry: RealBug) -> str:
    """The fix's result as this file judges it: passes, or fails only with the kinds its
    entry allows (never a batching fault); skipped while a feature it needs is absent."""
    if entry.requires and entry.missing():
        return f"not run: needs `{'`, `'.join(entry.requires)}`"
    if entry.name in FALSE_ALARMS_TODAY:
        return f"FAILS (false alarm, xfail): {FALSE_ALARMS_TODAY[entry.name]}"
    if entry.fix_may_fail:
        return f"no batching finding; may fail as {' or '.join(entry.fix_may_fail)} only"
    return "passes"


def corpus_table() -> str:
    """The Markdown table of REAL_BUGS, one row an entry in registry order."""
    rows = [
        "| kind | source | the bug | caught by: finding kind, failure line | the fix |",
        "|---|---|---|---|---|",
    ]
    for entry in REAL_BUGS.values():
        source = entry.source
        link = f"[{source.repo}#{source.number}]({source.url})"
        caught = f"{entry.caught_by.kind}: `{entry.caught_by.line}`"
        rows.append(
            f"| {entry.kind} | {link} | `{entry.name}`: {entry.what.replace('|', '/')} "
            f"| {caught} | {_fix_today(entry).replace('|', '/')} |"
        )
    return "\n".join(rows)


def _doc_table(text: str) -> str:
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return text[start:end].strip()


def test_the_doc_table_is_the_registry() -> None:
    assert _doc_table(DOC.read_text()) == corpus_table(), (
        "docs/real-bugs.md's table differs from tests/real_bugs; rewrite it with "
        "`python -m tests.test_real_bugs`"
    )


if __name__ == "__main__":
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    DOC.write_text(f"{text[:start]}\n{corpus_table()}\n{text[end:]}")
