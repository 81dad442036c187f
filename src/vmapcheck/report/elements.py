"""The HTML report's data building blocks: number formatting, tables as plain data, the
order paths and batches are listed in, and the ``prose`` filter of the template.

Nothing here writes HTML. A table is a dict the template lays out
(``templates/macros.html``)::

    {"id": str | None, "headers": [str], "rows": [{"cls": str, "cells": [Cell]}]}
    Cell = {"text": str, "cls": str, "title": str, "lines": [str], "prose": bool,
            "swatch": str}

``cls`` is a CSS class (``num``, ``pass``, ``fail``), ``title`` a tooltip, ``lines`` a
cell of several lines (instead of ``text``), ``prose`` a sentence whose backtick spans
are shown as code (:func:`code_spans`). Every value reaches the page through Jinja2's
autoescaping (case, path, leaf and feature names can come from the user).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, NotRequired, TypedDict, TypeVar, cast

from vmapcheck.core.paths import PATHS


class Cell(TypedDict):
    """A table cell, as the template lays it out (the module docstring)."""

    text: str
    cls: str  # CSS classes: num, pass, fail, result
    title: str  # a tooltip ("" none)
    lines: list[str]  # a cell of several lines, instead of text
    prose: bool  # a sentence whose backtick spans are code
    swatch: str  # a plotted series' colour (#rrggbb), "" none


class Row(TypedDict):
    """A table row: its CSS class (pass, fail, or the caller's) and its cells."""

    cls: str
    cells: list[Cell]


class Table(TypedDict):
    """A table as plain data (the module docstring; ``templates/macros.html``)."""

    id: str | None
    headers: list[str]
    rows: list[Row]


class TableSection(TypedDict):
    """A report section that is one table (environment, invalid inputs, training)."""

    table: Table


# What each of the check's sections (vmapcheck.report.check_sections) hands the template
# (templates/report.html).


class VerdictBanner(TypedDict):
    passed: bool
    word: str  # PASS / FAIL (vmapcheck.check.kinds.verdict_words)
    headline: str
    notes: list[str]


class CaseTables(TypedDict):
    """One case's own tables in the agreement section (None: the case has none)."""

    name: str
    n_pairs: int
    passed: bool
    pairs: Table
    losses: Table | None
    rules: Table | None


class AgreementSection(TypedDict):
    intro: str
    not_provided: list[str]
    capped: list[str]
    summary: Table
    cases: list[CaseTables]


class OracleSection(TypedDict):
    """Computed: its intro and table; else why not."""

    computed: bool
    why: NotRequired[str]
    intro: NotRequired[str]
    table: NotRequired[Table]


class ReferenceSection(TypedDict):
    """The stored reference: its meta as a table; the cases and losses compared (None:
    not compared, or no losses)."""

    compared: bool
    passed: bool
    meta: Table
    cases: Table | None
    losses: Table | None


class JudgedTableSection(TypedDict):
    """Batch composition: judged or not, its intro, its table (None: not judged)."""

    judged: bool
    intro: str
    table: Table | None


class MeasuredTableSection(TypedDict):
    """Bitwise batch invariance: measured or not, its intro, its table (None: not)."""

    measured: bool
    intro: str
    table: Table | None


class GradientsSection(TypedDict):
    """Checked: whether passed, the facts and every leaf's table; else why not."""

    checked: bool
    why: NotRequired[str]
    passed: NotRequired[bool]
    facts: NotRequired[Table]
    leaves: NotRequired[Table]


# A `span` in backticks, as the project's messages quote a command or a name (Markdown's
# code span): shown as <code>, not as literal backticks.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def code_spans(value: Any) -> list[tuple[str, bool]]:
    """The template's ``code_spans`` filter: a sentence as ``[(text, is_code)]``, each
    `span` in backticks a code part (shown as ``<code>``, the backticks dropped); the
    report's own and the stages' messages quote commands and names that way. The parts
    are plain text: the template escapes them like every other value."""
    parts = _CODE_SPAN.split(str(value))
    # re.split with one group: text, code, text, code, ..., text.
    return [(part, i % 2 == 1) for i, part in enumerate(parts) if part]


def num(value: Any, digits: int = 3) -> str:
    """A figure in ``digits`` significant digits; ``-`` when missing, ``nan``/``inf`` as such."""
    if value is None or isinstance(value, bool):
        return "-" if value is None else str(value)
    value = float(value)
    return f"{value:.{digits}g}" if math.isfinite(value) else str(value)


def atol_decided(tolerance: Mapping[str, Any], scale_at_worst: float | None) -> bool:
    """Whether the bound at the deciding element (the worst by bound ratio, whose
    magnitude ``S`` is ``scale_at_worst``) is mostly atol: ``atol >= rtol * S``. There a
    large ``max_rel`` of tiny values says nothing: the values are within atol of each
    other (a gradient of 2e-10 read as max_rel 1.66, issue 35)."""
    if scale_at_worst is None:
        return False
    return float(tolerance["atol"]) >= float(tolerance["rtol"]) * float(scale_at_worst)


def figure_text(
    bound_ratio: float | None,
    max_rel: float | None,
    max_abs: float | None,
    *,
    decided_by_atol: bool = False,
    cases: tuple[str | None, str | None, str | None] | None = None,
) -> str:
    """A check's figures in the order they decide: ``bound_ratio=0.00025 max_rel=1.66
    max_abs=2e-10``. The bound ratio (``|a - b|`` over the rule's bound at the worst
    element, above 1 a failure) decides the check; max_rel and max_abs follow as
    context. ``decided_by_atol`` (:func:`atol_decided`) adds ``atol decided`` to the
    ratio; ``cases``: where each of the three figures comes from (a case, a leaf), named
    after it: ``bound_ratio=0.0078 (embed; atol decided) max_rel=1.96 (attn.key.bias)``."""
    where = cases or (None, None, None)
    parts = []
    for (name, value), case in zip(
        (("bound_ratio", bound_ratio), ("max_rel", max_rel), ("max_abs", max_abs)),
        where,
        strict=True,
    ):
        notes = [case] if case else []
        if name == "bound_ratio" and decided_by_atol and value:
            notes.append("atol decided")
        text = f"{name}={num(value) if value is not None else 'None'}"
        parts.append(text + (f" ({'; '.join(notes)})" if notes else ""))
    return " ".join(parts)


def cell(
    value: Any,
    numeric: bool = False,
    *,
    cls: str | None = None,
    title: str = "",
    lines: list[str] | None = None,
    prose: bool = False,
    swatch: str = "",
) -> Cell:
    """A table cell: ``value`` as text (a figure via :func:`num` when ``numeric``);
    ``cls``, ``title``, ``lines``, ``prose`` (see the module docstring; ``cls`` None:
    ``num`` when numeric), ``swatch``: a plotted series' colour (``#rrggbb``,
    :func:`vmapcheck.core.paths.series_colours`) shown before the text, as the plots
    draw it. ``value`` already a cell (a dict made here) is returned as it is."""
    if isinstance(value, Mapping):  # already a cell
        return cast(Cell, dict(value))
    text = num(value) if numeric else ("-" if value is None else str(value))
    return {
        "text": text,
        "cls": ("num" if numeric else "") if cls is None else cls,
        "title": title,
        "lines": [] if lines is None else lines,
        "prose": prose,
        "swatch": swatch,
    }


def result_cell(passed: bool | None) -> Cell:
    """The ``pass`` / ``FAIL`` / ``-`` cell closing a row."""
    if passed is None:
        return cell("-", cls="result")
    return cell("pass" if passed else "FAIL", cls=f"result {'pass' if passed else 'fail'}")


def figure_cell(result: Mapping[str, Any], stat: str, title: str = "") -> Cell:
    """One comparison's figure ``result[stat]``, coloured by its ``passed``."""
    return cell(
        num(result[stat]),
        cls=f"num {'pass' if result['passed'] else 'fail'}",
        title=title,
    )


def table(
    headers: Iterable[str],
    rows: Iterable[tuple[Iterable[Any], bool | None]],
    *,
    numeric: Iterable[int] = (),
    table_id: str | None = None,
    row_class: str = "",
) -> Table:
    """A table; each row is (cells, passed), ``passed`` colours the row (None: neutral).

    A cell is a value (shown as text; the columns in ``numeric`` via :func:`num),
    right-aligned) or a dict made by :func:`cell`, used as it is."""
    numeric = set(numeric)
    body: list[Row] = []
    for cells, passed in rows:
        status = {True: "pass", False: "fail", None: ""}[passed]
        body.append(
            {
                "cls": " ".join(c for c in (row_class, status) if c),
                "cells": [cell(v, i in numeric) for i, v in enumerate(cells)],
            }
        )
    return {"id": table_id, "headers": list(headers), "rows": body}


def kv_table(rows: Iterable[tuple[str, Any]], table_id: str) -> Table:
    """A two-column (what, value) table."""
    return table(("what", "value"), (([k, v], None) for k, v in rows), table_id=table_id)


def by_batch(labels: Iterable[str]) -> list[str]:
    """``b<rows>`` labels (padded or not) in numeric order."""
    return sorted(labels, key=lambda label: int(label.lstrip("b")))


# A TypeVar, not `def in_path_order[V]`: PEP 695 syntax needs Python 3.12 (vmapcheck: 3.11+).
_V = TypeVar("_V")


def in_path_order(by_path: Mapping[str, _V]) -> list[tuple[str, _V]]:
    """The items of ``by_path`` (keyed by forward path name) in the order of the registry
    :data:`vmapcheck.core.paths.PATHS`; names it does not know (a report written by an
    older vmapcheck) follow in their own order, so nothing is left out."""
    known = [(p.name, by_path[p.name]) for p in PATHS.values() if p.name in by_path]
    return known + [(name, v) for name, v in by_path.items() if name not in PATHS]


def shape_text(shape: list[int] | Mapping[str, list[int]]) -> str:
    """A case's input shape: ``32x10``, or per leaf ``tokens 32x64, mask 32x64``."""
    if isinstance(shape, Mapping):
        return ", ".join(f"{leaf} {shape_text(dims)}" for leaf, dims in shape.items())
    return "x".join(str(d) for d in shape) or "scalar"
