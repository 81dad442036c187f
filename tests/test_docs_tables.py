"""The docs' registry tables are the registries (issue 36): docs/checks.md's table of
forward paths is checked against ``vmapcheck.core.paths.PATHS`` here, so a new path
fails this test until the doc names it (the failure prints the table to paste)."""

from __future__ import annotations

import re

from tests.helpers.config import ROOT
from vmapcheck.core.paths import PATHS

DOC = ROOT / "docs" / "checks.md"
BEGIN = "<!-- paths table: every vmapcheck.core.paths.PATHS entry (tests/test_docs_tables.py) -->"
END = "<!-- end of the paths table -->"


def paths_table() -> str:
    """The Markdown table of PATHS, one row an entry in registry order."""
    rows = ["| path | form | mode | takes | what it computes |", "|---|---|---|---|---|"]
    for path in PATHS.values():
        about = path.about.replace("|", r"\|")  # a pipe would end the cell
        rows.append(f"| `{path.name}` | {path.form} | {path.mode} | {path.takes} | {about} |")
    return "\n".join(rows)


def test_the_docs_table_of_paths_is_the_registry():
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), DOC.read_text(), re.S)
    assert found, f"{DOC}: expected the paths table between {BEGIN!r} and {END!r}"
    assert found.group(1) == paths_table(), (
        f"{DOC.name}'s table of paths differs from PATHS; paste this:\n{paths_table()}"
    )
