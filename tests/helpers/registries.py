"""What the registries hold, as tests that are not about a registry's entries expect it:
derived here from the registry, so a new path, case kind or rule touches no such test
(issue 47, "tests derive the lists from the registries")."""

from __future__ import annotations

from collections.abc import Iterable

from vmapcheck.core.cases import CASE_KINDS
from vmapcheck.core.paths import PATHS


def one_device_forms(left_out: Iterable[str] = ()) -> list[str]:
    """The forms of the one-device batch paths of ``PATHS`` in registry order, each once,
    leaving out the paths named in ``left_out`` (not provided or not selected): what the
    verdict's sentence lists before "forwards (eager and jit)"."""
    gone = set(left_out)
    paths = [
        p for p in PATHS.values() if p.takes == "batch" and not p.distributed and p.name not in gone
    ]
    return list(dict.fromkeys(p.form for p in paths))


def forms_text(left_out: Iterable[str] = ()) -> str:
    """:func:`one_device_forms` as the verdict writes them: ``loop, map, ... and direct``."""
    forms = one_device_forms(left_out)
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} and {forms[-1]}"


def edge_kinds(takes: str = "batch") -> set[str]:
    """The valid case kinds the Python API runs with ``edge_cases=True`` whose cases
    take ``takes`` ("batch": run by batch paths, "vector": by forward_one)."""
    return {k.name for k in CASE_KINDS.values() if k.edge and k.valid and k.takes == takes}
