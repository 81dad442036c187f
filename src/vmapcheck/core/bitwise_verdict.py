"""Bitwise batch invariance judged and said: the modes (what a measurement that is not
bitwise does to the verdict), the check's section (:func:`judge`: the failures of mode
``"require"``), its lines (the summary's, the verdict's, a path's status) and the Python
API's :class:`PathBitwise`.

The measurement is :mod:`vmapcheck.core.bitwise`'s (:func:`~vmapcheck.core.bitwise.measure`:
the ``BitwiseReport`` this module reads, typed in :mod:`vmapcheck.core.record`). This module
imports neither JAX nor NumPy: the Python API imports :class:`PathBitwise` and the modes
in every pytest session, and ``vmapcheck summary`` prints the line without JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vmapcheck.errors import ConfigError

if TYPE_CHECKING:
    from vmapcheck.core.record import BitwiseFirstOp, BitwisePathReport, BitwiseReport

# What a measurement that is not bitwise does to the verdict: "report" (the default:
# never demand bit-identity unconditionally) or "require" (a failure line per path).
# "off": not measured (its cost is a batch-of-1 run per row and path).
Mode = Literal["report", "require", "off"]
MODES: tuple[Mode, ...] = ("report", "require", "off")
_DONE = {"report": "reported", "require": "required", "off": "not measured"}


def check_mode(mode: Any, where: str = "bitwise") -> Mode:
    """``mode`` if it is one of :data:`MODES`, else a :class:`ConfigError` naming
    ``where`` (the keyword or config key), what was expected and what was found."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigError(f"{where}: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


def first_op_text(first: BitwiseFirstOp | None) -> str:
    """``dot_general in layers[1] (models.py:189:11 (mlp_forward_one))``; with ``op by
    op; as the path runs, layer pool`` when the path, run as it runs (compiled), parts
    the bits at another layer first; ``layer layers[0]``; or "" (bitwise, or not
    located). The source's folders are left out."""
    if first is None:
        return ""
    if first["found_at"] == "jaxpr":
        source = first.get("source") or ""
        shown = f" ({source.rsplit('/', 1)[-1]})" if source else ""
        layer = first.get("layer")
        found = f"{first['primitive']}{f' in {layer}' if layer else ''}{shown}"
        if first.get("layer_as_run"):
            # Op by op the bits part there; the path as it runs (compiled) parts them in
            # another layer first: both said.
            return f"{found} op by op; as the path runs, layer {first['layer_as_run']}"
        return found
    if first["found_at"] == "layer":
        return f"layer {first['layer']}"
    return ""


def path_status(report: BitwisePathReport) -> str:
    """``yes`` or ``no (rows 3/32 differ, max 2 ulp, first at dot_general ...)``."""
    if report["bitwise"]:
        return "yes"
    if "alone_error" in report:
        return f"not measured (a row alone raised {report['alone_error'][:120]})"
    first = first_op_text(report["first_op"])
    where = f", first at {first}" if first else ""
    if not first:
        parted = [k for k, c in report["compositions"].items() if c["rows_differing"]]
        where = f", under {' and '.join(parted)}; first op not located"
    return (
        f"no (rows {report['rows_differing']}/{report['rows']} differ, "
        f"max {report['max_ulp']} ulp{where})"
    )


def summary_line(section: BitwiseReport) -> str:
    """``bitwise (cpu, standard): loop_eager, vmap_jit yes; direct_jit no (rows 3/32
    differ, max 2 ulp, first at dot_general ...); argmax flips 0/32``: the line the
    summary and the Python API print, paths with the same finding named together."""
    groups: dict[str, list[str]] = {}
    for name, p in section["paths"].items():
        groups.setdefault(path_status(p), []).append(name)
    paths = "; ".join(f"{', '.join(names)} {status}" for status, names in groups.items())
    flips = section["argmax_flips"]
    tail = f"; argmax flips {flips['flipped']}/{flips['rows']}" if flips is not None else ""
    mode = f", {_DONE[section['mode']]}" if "mode" in section else ""
    return f"bitwise ({section['backend']}, {section['case']}{mode}): {paths or 'no path'}{tail}"


def marked_line(section: BitwiseReport) -> str:
    """:func:`summary_line` as a line of the verdict: ``-`` in mode "report" (it never
    fails), ``ok`` or ``FAIL`` in mode "require"."""
    if section.get("mode") == "require":
        mark = "ok  " if section.get("passed") else "FAIL"
    else:
        mark = "-   "
    return f"  {mark} {summary_line(section)}"


def failures(section: BitwiseReport) -> list[str]:
    """One failure line per path that is not bitwise (what mode "require" fails)."""
    return [
        f"bitwise/{section['case']}/{name}: not bitwise batch-invariant on "
        f"{section['backend']}: {path_status(p)}; required (bitwise mode 'require')"
        for name, p in section["paths"].items()
        if not p["bitwise"]
    ]


def judge(measured: BitwiseReport, mode: Mode) -> tuple[BitwiseReport, list[str]]:
    """The check's section: the measurement with ``mode`` and ``passed``, and the
    failures (none in mode ``"report"``: reported, never failed)."""
    found = failures(measured) if check_mode(mode) == "require" else []
    return {**measured, "mode": mode, "passed": not found}, found


@dataclass(frozen=True)
class PathBitwise:
    """One batch path's bitwise batch invariance, as the Python API reports it.

    Attributes:
        path: the path's name; ``backend`` where it ran.
        bitwise: every row compared is the same bits alone, permuted and split as in
            the batch.
        rows_differing / rows: the rows that differ in the worst composition, of the
            rows it compared.
        max_ulp: the largest ULP distance over the compositions (run dtype).
        vs_plain: bitwise equal to the plain loop's outputs on the batch (None: the path
            is the loop, or the loop did not run).
        first_op: where the bits first part (``dot_general at file.py:12 (fn)``,
            ``layer layers[0]``), "" when bitwise or not located.
        argmax_flips: rows whose argmax changes under a composition (None: no class
            outputs).
    """

    path: str
    backend: str
    bitwise: bool
    rows_differing: int
    rows: int
    max_ulp: int
    vs_plain: bool | None
    first_op: str
    argmax_flips: int | None


def per_path(section: BitwiseReport) -> dict[str, PathBitwise]:
    """:class:`PathBitwise` for each path of a section (:func:`measure`/:func:`judge`)."""
    return {
        name: PathBitwise(
            path=name,
            backend=section["backend"],
            bitwise=p["bitwise"],
            rows_differing=p["rows_differing"],
            rows=p["rows"],
            max_ulp=p["max_ulp"],
            vs_plain=None if p["vs_plain"] is None else p["vs_plain"]["rows_differing"] == 0,
            first_op=first_op_text(p["first_op"]),
            argmax_flips=p["argmax_flips"],
        )
        for name, p in section["paths"].items()
    }
