"""The kinds of regression case: one :data:`CASE_KINDS` entry per kind.

Every case in the regression set (``data/cases/manifest.json``) names its kind. What
happens to a case follows from its kind's entry alone: which paths it runs through,
whether the float64 oracle judges it, whether the stored reference keeps its outputs,
and how check judges it. The forward stage, check, the oracle, the reference, the
diagnosis and the report all ask this registry; a kind it does not know is an error
(:func:`kind_of`), never a silently skipped case.

To add a kind: one entry below, the cases of that kind in
:func:`vmapcheck.data.regression.regression_cases`, and a rule of its own, if it has
one, in :data:`vmapcheck.check.rules.CASE_RULES` (docs/development.md).
"""

# No `from __future__ import annotations` here: the manifest's reader
# (vmapcheck.data.regression.read_cases_manifest) sees NotRequired only in evaluated
# annotations.
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np

from vmapcheck.core.paths import path_names
from vmapcheck.errors import ArtifactError

# The registry is read by the Python API at import (its edge kinds), which loads no JAX
# until a check runs: JAX and the contract are imported where a case's input is built.


class _Refusal(TypedDict, total=False):
    """An input to refuse (kind "invalid"): the substrings its error must contain, which
    paths get it ("batch" or "vector"), False to keep its stored dtype, the leaves kept as
    stored (:func:`case_input`)."""

    expect: list[str]
    runs_on: str
    cast: bool
    keep: list[str]


class CaseEntry(_Refusal):
    """A case's entry in ``data/cases/manifest.json`` (its arrays are beside it in the
    case's ``.npz``): what the forward stage, check and the report read of it."""

    kind: str  # a CASE_KINDS entry
    shape: Any  # x's shape: a list of ints, or per leaf (a dict contract)
    about: str
    # Written by vmapcheck.data.regression.write_cases: the case's file, its sha256,
    # x's dtype (a name, or per leaf) and whether the file holds targets ``y``. Absent
    # in the Python API's cases (vmapcheck.testing), which are never stored.
    file: NotRequired[str]
    sha256: NotRequired[str]
    dtype: NotRequired[Any]
    has_targets: NotRequired[bool]


class CasesManifest(TypedDict):
    """``data/cases/manifest.json``: the table's feature names in order (checked against
    the params contract) and every case's entry."""

    features: list[str]
    cases: dict[str, CaseEntry]


class Case(_Refusal):
    """A case with its arrays: ``x`` (a batch of the contract, batch axis 0: one array
    (rows, n_features) or a dict of leaves; one example for kind "vector"; for kind
    "invalid" the input to refuse) and its targets ``y`` (rows, out_features) where it
    has them, beside its manifest keys (:func:`vmapcheck.data.regression.
    regression_cases` builds it without the stored ones, :func:`vmapcheck.data.
    regression.load_cases` reads it back with them)."""

    x: Any
    kind: str
    about: str
    y: NotRequired[np.ndarray]
    shape: NotRequired[Any]
    file: NotRequired[str]
    sha256: NotRequired[str]
    dtype: NotRequired[Any]
    has_targets: NotRequired[bool]


@dataclass(frozen=True)
class CaseKind:
    """One kind of regression case.

    Attributes:
        name: the kind, as cases name it in the manifest.
        takes: the paths it runs through: those taking a ``"batch"`` (x: (rows,
            *example), batch axis 0) or one ``"vector"`` example; ``"per-case"``: the
            case's own ``runs_on`` says which.
        judged: ``"agreement"``: every pair of its outputs agrees, each agrees with the
            float64 oracle (``oracle``) and with the stored reference (``in_reference``);
            ``"refusal"``: every path must refuse it with the expected message.
        oracle: the float64 oracle computes its output (judging every path).
        in_reference: ``make reference`` stores its outputs, compared on later runs.
        about: one line for the report.
        edge: an edge case (values at or past the data's range, or a batch built to
            expose a batching bug): the Python API runs it with ``edge_cases=True``
            and reports its figures apart from the caller's examples.
        rules: the rules that judge it besides agreement, by name
            (:data:`vmapcheck.check.rules.CASE_RULES`).
    """

    name: str
    takes: Literal["batch", "vector", "per-case"]
    judged: Literal["agreement", "refusal"]
    oracle: bool
    in_reference: bool
    about: str
    edge: bool = False
    rules: tuple[str, ...] = ()

    def paths(self, case: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The paths a case of this kind runs through (``case``: its manifest entry,
        needed for a per-case kind)."""
        takes: str = self.takes
        if takes == "per-case":
            takes = case.get("runs_on", "batch") if case is not None else "batch"
        return path_names(takes)

    @property
    def valid(self) -> bool:
        """Its outputs exist and are compared (an input to refuse has none)."""
        return self.judged == "agreement"


CASE_KINDS: dict[str, CaseKind] = {
    k.name: k
    for k in [
        CaseKind(
            "batch",
            takes="batch",
            judged="agreement",
            oracle=True,
            in_reference=True,
            about="a batch of valid rows (batch axis 0)",
        ),
        CaseKind(
            "vector",
            takes="vector",
            judged="agreement",
            oracle=True,
            in_reference=True,
            about="one valid example, unbatched, for forward_one",
        ),
        CaseKind(
            "edge",
            takes="batch",
            judged="agreement",
            oracle=True,
            in_reference=True,
            about="a batch of edge values: zeros, the train split's bounds, large "
            "magnitudes (each float leaf; ids and masks at their extremes)",
            edge=True,
        ),
        CaseKind(
            "denormal",
            takes="batch",
            judged="agreement",
            oracle=True,
            in_reference=True,
            about="a batch of subnormal float inputs: a path that flushes them to zero "
            "(or mishandles them) disagrees with the others and with the oracle",
            edge=True,
        ),
        CaseKind(
            "duplicate_rows",
            takes="batch",
            judged="agreement",
            oracle=True,
            in_reference=False,
            about="copies of one row in one batch: each copy must get the same output",
            edge=True,
            rules=("copies_agree",),
        ),
        CaseKind(
            "invalid",
            takes="per-case",
            judged="refusal",
            oracle=False,
            in_reference=False,
            about="an input every path must refuse with a clear error",
        ),
    ]
}


def case_input(case: Case, dtype: Any) -> Any:
    """The input ``x`` of ``case`` as the paths get it at the run's ``dtype``: float leaves
    cast to it, ids and masks as stored; a case with ``cast`` False (a wrong dtype to be
    refused) exactly as stored, and the leaves named in its ``keep`` (the one leaf given
    a wrong dtype) as stored while the others are cast."""
    import jax.numpy as jnp

    from vmapcheck.core.contract import cast_floats

    if not case.get("cast", True):
        return case["x"]
    x = cast_floats(case["x"], dtype)
    kept = case.get("keep") or ()
    return {**x, **{name: jnp.asarray(case["x"][name]) for name in kept}} if kept else x


def case_rows(case: Mapping[str, Any]) -> int:
    """A batch case's rows: axis 0 of its ``x``, else of its manifest entry's ``shape`` (a
    list, or a dict of per-leaf shapes); 0 for a shape of rank 0."""
    if "x" in case:
        from vmapcheck.core.contract import rows

        return rows(case["x"])
    shape = case["shape"]
    if isinstance(shape, dict):
        shape = next(iter(shape.values()))
    return int(shape[0]) if len(shape) >= 1 else 0


def kind_of(case: Mapping[str, Any], name: str = "") -> CaseKind:
    """The registry entry of ``case`` (a case or its manifest entry, with ``kind``).

    Raises:
        ArtifactError: the kind is missing or not registered (names the case and the
            kinds known), so a new kind can never silently drop out of a check.
    """
    kind = case.get("kind")
    if kind not in CASE_KINDS:
        where = f"case {name!r}" if name else "a case"
        raise ArtifactError(
            f"{where} has kind {kind!r}; expected one of {', '.join(CASE_KINDS)} "
            "(vmapcheck.core.cases.CASE_KINDS)"
        )
    return CASE_KINDS[kind]
