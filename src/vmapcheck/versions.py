"""The jax and jaxlib versions vmapcheck runs with, and the one check of the installed ones.

The supported ranges are declared once, in pyproject.toml's ``[project] dependencies``
(``jax>=0.10.2,<0.13``). pip's resolver reads them from the wheel's metadata, and
:func:`supported_ranges` reads the same metadata back from the installed vmapcheck, so
``pip install`` keeps a jax that is in range and this check refuses one that is not (one
installed afterwards, or with ``--no-deps``), naming the same range. Each range is what
has been tested (docs/use-in-your-project.md).

:func:`require_supported_jax` runs before JAX is imported: in the stages
(:mod:`vmapcheck.stages`), in every ``vmapcheck`` command (:func:`vmapcheck.cli.main`) and
in the Python API (:func:`vmapcheck.testing.check_batching`, behind the pytest fixture too).
With ``VMAPCHECK_ALLOW_UNTESTED_JAX=1`` in the environment it warns instead of refusing:
for trying a JAX release before the range admits it (docs/scheduled-ci.md).

Only the standard library is imported at module level (``packaging`` when a check runs):
the stages' interpreter gate reads :data:`MIN_PYTHON` here before anything else loads.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import TYPE_CHECKING

from vmapcheck.errors import UnsupportedVersionError

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

# pyproject.toml's requires-python (">=3.11"), for the stages' gate, which must run before
# any dependency can be imported; tests/test_versions.py holds the two equal.
MIN_PYTHON = (3, 11)

DISTRIBUTION = "vmapcheck"
# The packages whose installed version is checked against vmapcheck's declared range.
CHECKED = ("jax", "jaxlib")
# Set to 1: an out-of-range jax/jaxlib is run with a warning instead of refused.
ALLOW_UNTESTED = "VMAPCHECK_ALLOW_UNTESTED_JAX"

# Lower bounds first in a range's text (">=0.10.2,<0.13"); packaging sorts them as strings.
_OPERATOR_ORDER = {">=": 0, ">": 0, "~=": 0, "==": 1, "===": 1, "!=": 2, "<=": 3, "<": 3}


@functools.cache
def supported_ranges() -> dict[str, SpecifierSet]:
    """``{name: SpecifierSet}`` for each of :data:`CHECKED`, from the installed vmapcheck's
    metadata (its ``Requires-Dist``, written from pyproject.toml). Empty when vmapcheck is
    not installed as a distribution (a source tree put on ``sys.path`` by hand): then
    there is nothing to check against."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    ranges: dict[str, SpecifierSet] = {}
    for line in requires:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        # Only the unconditional dependencies: not an extra's (`; extra == "flax"`).
        if name in CHECKED and (
            requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        ):
            ranges[name] = requirement.specifier
    return ranges


def installed_versions(names: Iterable[str] = CHECKED) -> dict[str, str | None]:
    """The installed version of each package (None: not installed), from its metadata:
    nothing is imported."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def range_text(specifier: SpecifierSet) -> str:
    """``>=0.10.2,<0.13``: the range, lower bound first."""
    ordered = sorted(specifier, key=lambda s: (_OPERATOR_ORDER.get(s.operator, 1), s.version))
    return ",".join(str(s) for s in ordered)


def out_of_range(
    installed: Mapping[str, str | None], ranges: Mapping[str, SpecifierSet]
) -> str | None:
    """What is wrong with ``installed`` (name -> version, None: not installed) against
    ``ranges``, or None when each version is inside its range (a name without a range is
    not checked): each package outside (or missing, or no version) named with its
    version and range, and the ``pip install`` that puts it in range."""
    from packaging.version import InvalidVersion, Version

    problems = {}
    for name, version in installed.items():
        if name not in ranges:
            continue
        wanted = range_text(ranges[name])
        if version is None:
            problems[name] = f"{name} is not installed (vmapcheck supports {wanted})"
            continue
        try:
            inside = ranges[name].contains(Version(version), prereleases=True)
        except InvalidVersion:
            inside = False
        if not inside:
            problems[name] = f"{name} {version} is outside the range vmapcheck supports ({wanted})"
    if not problems:
        return None
    fixes = " ".join(f"'{name}{range_text(ranges[name])}'" for name in problems)
    return (
        f"{'; '.join(problems.values())}: install {'one' if len(problems) == 1 else 'them'} "
        f"in range, e.g. pip install {fixes}"
    )


def check_versions(installed: Mapping[str, str | None], ranges: Mapping[str, SpecifierSet]) -> None:
    """Refuse what :func:`out_of_range` finds.

    Raises:
        UnsupportedVersionError: a package is outside its range (its message).
    """
    problem = out_of_range(installed, ranges)
    if problem is not None:
        raise UnsupportedVersionError(f"{problem} (or set {ALLOW_UNTESTED}=1 to run untested)")


def require_supported_jax() -> None:
    """Check the installed jax and jaxlib against the ranges vmapcheck declares
    (:func:`check_versions`); called before JAX is imported.

    Raises:
        UnsupportedVersionError: one is outside its range. With
            ``VMAPCHECK_ALLOW_UNTESTED_JAX=1``, a warning instead.
    """
    installed, ranges = installed_versions(), supported_ranges()
    if os.environ.get(ALLOW_UNTESTED) == "1":
        problem = out_of_range(installed, ranges)
        if problem is not None:
            warnings.warn(f"{problem}; running it untested ({ALLOW_UNTESTED}=1)", stacklevel=2)
        return
    check_versions(installed, ranges)
