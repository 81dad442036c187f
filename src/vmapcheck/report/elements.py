"""The HTML report's building blocks: escaping, number formatting, tables, sections,
embedded images and the page's inline CSS.

Every value taken from a report goes through :func:`esc` (:func:`html.escape`; case,
path, leaf and feature names can come from the user); only fragments built by the
report's modules are marked :class:`Markup` and inserted as they are.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from vmapcheck.core.paths import PATHS

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #1f2328; background: #fff; line-height: 1.4; }
main { max-width: 1200px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.5rem; margin: 0.5rem 0; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1rem; margin-bottom: 0.3rem; }
.verdict { padding: 1rem 1.25rem; border-radius: 6px; color: #fff; margin: 1rem 0; }
.verdict.passed { background: #1a7f37; }
.verdict.failed { background: #cf222e; }
.verdict .word { font-size: 2rem; font-weight: 700; letter-spacing: 0.05em; }
.verdict ul { margin: 0.5rem 0 0; }
.note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px;
  padding: 0.5rem 0.75rem; margin: 0.5rem 0; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.85rem; }
th, td { border: 1px solid #d0d7de; padding: 0.2rem 0.5rem; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; font-family: ui-monospace,
  SFMono-Regular, Menlo, monospace; }
tr.pass td.result, td.pass { background: #dafbe1; }
tr.fail td, td.fail { background: #ffebe9; font-weight: 600; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.85em; }
details { margin: 0.3rem 0; }
summary { cursor: pointer; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { font-size: 0.85rem; color: #59636e; }
footer { margin-top: 2rem; font-size: 0.8rem; color: #59636e; }
"""


class Markup(str):
    """HTML built by the report's modules: inserted as is (everything else is escaped)."""


def esc(value: Any) -> Markup:
    """``value`` as escaped HTML text (a :class:`Markup` passes through unchanged)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


# A `span` in backticks, as the project's messages quote a command or a name (Markdown's
# code span): shown as <code>, not as literal backticks.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def prose(value: Any) -> Markup:
    """``value`` as escaped HTML text in which each `span` in backticks is a ``<code>``
    element (a :class:`Markup` passes through unchanged). For sentences (paragraphs,
    bullets, notes): the report's own and the stages' messages quote commands and names
    that way. Table cells show values as they are, with :func:`esc`."""
    if isinstance(value, Markup):
        return value
    return Markup(_CODE_SPAN.sub(r"<code>\1</code>", esc(value)))


def num(value: Any, digits: int = 3) -> str:
    """A figure in ``digits`` significant digits; ``-`` when missing, ``nan``/``inf`` as such."""
    if value is None or isinstance(value, bool):
        return "-" if value is None else str(value)
    value = float(value)
    return f"{value:.{digits}g}" if math.isfinite(value) else str(value)


def verdict_cell(passed: bool | None) -> Markup:
    if passed is None:
        return Markup('<td class="result">-</td>')
    return Markup(
        f'<td class="result {"pass" if passed else "fail"}">{"pass" if passed else "FAIL"}</td>'
    )


def verdict_line(passed: bool) -> Markup:
    return Markup(f"<p><strong>{'passed' if passed else 'FAILED'}</strong></p>")


def _cell(value: Any, numeric: bool = False) -> Markup:
    if isinstance(value, Markup) and value.startswith("<td"):
        return value
    if numeric and not isinstance(value, Markup):
        return Markup(f'<td class="num">{esc(num(value))}</td>')
    return Markup(f"<td>{esc(value)}</td>")


def table(
    headers: Iterable[str],
    rows: Iterable[tuple[Iterable[Any], bool | None]],
    *,
    numeric: Iterable[int] = (),
    table_id: str | None = None,
    row_class: str = "",
) -> Markup:
    """A table; each row is (cells, passed), ``passed`` colours the row (None: neutral).

    Cells are escaped unless they are :class:`Markup`; a cell that is a whole ``<td>``
    (see :func:`verdict_cell`) is used as it is. Columns in ``numeric`` are formatted with
    :func:`num` and right-aligned.
    """
    numeric = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for cells, passed in rows:
        classes = " ".join(
            c for c in (row_class, {True: "pass", False: "fail", None: ""}[passed]) if c
        )
        attr = f' class="{classes}"' if classes else ""
        tds = "".join(_cell(v, i in numeric) for i, v in enumerate(cells))
        body.append(f"<tr{attr}>{tds}</tr>")
    id_attr = f' id="{esc(table_id)}"' if table_id else ""
    return Markup(
        f"<table{id_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def kv_table(rows: Iterable[tuple[str, Any]], table_id: str) -> Markup:
    """A two-column (what, value) table."""
    return table(("what", "value"), (([k, v], None) for k, v in rows), table_id=table_id)


def section(title: str, section_id: str, *parts: Any) -> Markup:
    body = "\n".join(esc(p) if not isinstance(p, Markup) else p for p in parts)
    return Markup(f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>\n{body}\n</section>')


def para(text: Any) -> Markup:
    return Markup(f"<p>{prose(text)}</p>")


def bullets(items: Iterable[Any], list_id: str | None = None) -> Markup:
    id_attr = f' id="{esc(list_id)}"' if list_id else ""
    return Markup(f"<ul{id_attr}>" + "".join(f"<li>{prose(i)}</li>" for i in items) + "</ul>")


def png_img(data: bytes, alt: str, caption: str, img_id: str) -> Markup:
    """A figure whose image is embedded as a ``data:image/png;base64`` URI."""
    encoded = base64.b64encode(data).decode("ascii")
    return Markup(
        f'<figure><img id="{esc(img_id)}" alt="{esc(alt)}" '
        f'src="data:image/png;base64,{encoded}"><figcaption>{esc(caption)}</figcaption></figure>'
    )


def by_batch(labels: Iterable[str]) -> list[str]:
    """``b<rows>`` labels in numeric order."""
    return sorted(labels, key=lambda label: int(label[1:]))


def in_path_order[V](by_path: Mapping[str, V]) -> list[tuple[str, V]]:
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
