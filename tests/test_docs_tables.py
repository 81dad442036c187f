"""The docs' registry tables are the registries (issue 36): docs/checks.md's tables of
forward paths (``PATHS``), case kinds (``CASE_KINDS``) and case rules (``CASE_RULES``)
are checked here, so a new entry fails this test until the doc names it. The failure
prints the table to paste; ``python -m tests.test_docs_tables`` rewrites them all."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.helpers.config import ROOT
from vmapcheck.check.rules import CASE_RULES, every_case
from vmapcheck.core.cases import CASE_KINDS
from vmapcheck.core.paths import PATHS

DOC = ROOT / "docs" / "checks.md"


def cell(text: str) -> str:
    return text.replace("|", r"\|")  # a pipe would end the cell


def paths_table() -> str:
    """The Markdown table of PATHS, one row an entry in registry order."""
    rows = ["| path | form | mode | takes | what it computes |", "|---|---|---|---|---|"]
    for path in PATHS.values():
        rows.append(
            f"| `{path.name}` | {path.form} | {path.mode} | {path.takes} | {cell(path.about)} |"
        )
    return "\n".join(rows)


def kinds_table() -> str:
    """The Markdown table of CASE_KINDS, one row a kind in registry order."""
    rows = [
        "| kind | takes | judged by | float64 oracle | stored reference | edge | what it is |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in CASE_KINDS.values():
        # A valid case is judged by agreement and the built-in rules besides its kind's.
        judged = ", ".join([kind.judged, *(every_case() if kind.valid else ()), *kind.rules])
        rows.append(
            f"| `{kind.name}` | {kind.takes} | {judged} | {'yes' if kind.oracle else 'no'} | "
            f"{'yes' if kind.in_reference else 'no'} | {'yes' if kind.edge else 'no'} | "
            f"{cell(kind.about)} |"
        )
    return "\n".join(rows)


def judges(name: str) -> str:
    """Which cases the rule ``name`` judges: every valid case (a built-in rule), those of
    the kinds naming it, or, for a stochastic model, those of the rules it replaces."""
    if CASE_RULES[name].every_case:
        return "every valid case"
    found = [f"`{k.name}` cases" for k in CASE_KINDS.values() if name in k.rules]
    found += [
        f"instead of `{r.name}` for a stochastic model"
        for r in CASE_RULES.values()
        if r.stochastic == name
    ]
    return "; ".join(found) or "none (no kind names it)"


def rules_table() -> str:
    """The Markdown table of CASE_RULES, one row a rule in registry order."""
    rows = ["| rule | judges | figures | what it checks |", "|---|---|---|---|"]
    for rule in CASE_RULES.values():
        rows.append(
            f"| `{rule.name}` | {judges(rule.name)} | {', '.join(rule.figures) or '-'} | "
            f"{cell(rule.about)} |"
        )
    return "\n".join(rows)


# name -> (the registry it shows, its builder); the doc marks each table's place with
# <!-- <name> table ... --> and <!-- end of the <name> table -->.
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "paths": ("vmapcheck.core.paths.PATHS", paths_table),
    "case kinds": ("vmapcheck.core.cases.CASE_KINDS", kinds_table),
    "case rules": ("vmapcheck.check.rules.CASE_RULES", rules_table),
}


def markers(name: str) -> tuple[str, str]:
    registry = TABLES[name][0]
    return (
        f"<!-- {name} table: every {registry} entry (tests/test_docs_tables.py) -->",
        f"<!-- end of the {name} table -->",
    )


def place(name: str, text: str) -> re.Match[str] | None:
    begin, end = markers(name)
    return re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), text, re.S)


@pytest.mark.parametrize("name", list(TABLES))
def test_the_docs_table_is_the_registry(name):
    found = place(name, DOC.read_text())
    assert found, f"{DOC}: expected the {name} table between {markers(name)}"
    wanted = TABLES[name][1]()
    assert found.group(1) == wanted, (
        f"{DOC.name}'s table of {name} differs from {TABLES[name][0]}; paste this, or run "
        f"`python -m tests.test_docs_tables`:\n{wanted}"
    )


def rewrite() -> None:
    """Write every table into docs/checks.md, where its markers are."""
    text = DOC.read_text()
    for name, (_, build) in TABLES.items():
        found = place(name, text)
        if found is None:
            raise SystemExit(f"{DOC}: no markers for the {name} table: {markers(name)}")
        text = text[: found.start(1)] + build() + text[found.end(1) :]
    DOC.write_text(text)


if __name__ == "__main__":
    rewrite()
