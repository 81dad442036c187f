"""The house's size limits (issue 47): no module of ``src/vmapcheck`` over
:data:`MODULE_LIMIT` lines, no function over :data:`FUNCTION_LIMIT`.

A function's size is the lines of its ``def`` through its last line: the signature, the
docstring and the body, decorators excluded (``ast``'s ``lineno`` is the ``def`` line),
nested functions counted inside their parent and on their own. A module's is its count
of newlines. ``benchmarks/architecture.py`` reports the same figures (its
``modules_over_700`` and ``functions_over_120``) with these functions and limits, so the
report and this test cannot count two ways.

Over a limit, split along a seam of the code's jobs (docs/development.md, "Code
layout"), not by joining lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "vmapcheck"
MODULE_LIMIT = 700
FUNCTION_LIMIT = 120


def module_lines(package: Path) -> dict[str, int]:
    """Each ``.py`` file under ``package``, by its path relative to ``package``
    (``core/bitwise.py``) -> its lines (newlines)."""
    return {
        str(path.relative_to(package)): path.read_text().count("\n")
        for path in sorted(package.rglob("*.py"))
    }


def function_lines(package: Path) -> list[tuple[int, str]]:
    """Every function and method under ``package`` as ``(lines, "file.py:name")``,
    largest first: the lines from its ``def`` to its last line, decorators excluded."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(package))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                found.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    return sorted(found, reverse=True)


def test_no_module_is_over_the_limit():
    over = [f"{f}: {n} lines" for f, n in module_lines(PACKAGE).items() if n > MODULE_LIMIT]
    assert not over, (
        f"modules of src/vmapcheck over the limit of {MODULE_LIMIT} lines: {'; '.join(over)} "
        "(split by job: docs/development.md, code layout)"
    )


def test_no_function_is_over_the_limit():
    over = [f"{f}: {n} lines" for n, f in function_lines(PACKAGE) if n > FUNCTION_LIMIT]
    assert not over, (
        f"functions of src/vmapcheck over the limit of {FUNCTION_LIMIT} lines (def to last "
        f"line, docstring included): {'; '.join(over)} (move a step into a helper)"
    )


def test_the_counts_are_the_def_to_the_last_line(tmp_path):
    """The counting itself: decorators are not the function's lines, its docstring and
    a nested function are; a module's lines are its newlines."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import functools\n"
        "\n"
        "@functools.cache\n"
        "@functools.wraps(print)\n"
        "def outer():\n"
        '    """Doc."""\n'
        "    def inner():\n"
        "        return 1\n"
        "    return inner\n"
    )
    assert module_lines(package) == {"m.py": 9}
    assert function_lines(package) == [(5, "m.py:outer"), (2, "m.py:inner")]
