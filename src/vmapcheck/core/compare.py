"""The one comparison rule: agreement with explicit tolerances, ULP distance, looser.

Two arrays ``a`` and ``b`` agree when they have the same shape and, elementwise,
``|a - b| <= atol + rtol * S`` (:func:`allowed_error`), computed in float64 so the
comparison adds no rounding of its own. ``S`` is the magnitude the rounding is relative
to (:func:`scale_of`; ``precision.tolerance.scale`` picks the rule):

- rule ``"output"``: ``S = max(|a|, |b|)``, the result's own magnitude;
- rule ``"terms"``: ``S = max(S_terms, |a|, |b|)``, where ``S_terms`` is the magnitude
  of the terms each element is made of (:mod:`vmapcheck.core.magnitude`). Two paths
  that sum the same terms in another order differ by rounding relative to the terms,
  not to a result that cancelled: a 32-term dot product whose terms add up to 104 in
  magnitude may differ by ~1e-5 in float32 even when it comes out as -0.093.

Both are symmetric, so the pair order does not matter. A non-finite value in one array
where the other holds another value is a failure, never a pass: it is not masked. The
same non-finite value at the same element of both (both NaN, both +Inf, both -Inf) is
agreement between the two: both paths computed it, so it says nothing about batching.
:func:`compare` names those rows (``same_non_finite_rows``) and measures the others; the
non-finite output itself is judged by the check's contract, row by row
(:mod:`vmapcheck.check.checks`). A non-finite ``S_terms`` (an ill-conditioned point, or
no bound known) is never a licence: that element falls back to the output's own
magnitude.

Every caller (the checks, the reference, the diagnosis) goes through this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

from vmapcheck.config import ToleranceConfig
from vmapcheck.core.record import (
    Comparison,
    ExactResult,
    Measurement,
    ToleranceRecord,
    WorstElement,
)

# Bitwise: re-derived data must reproduce the stored bits.
EXACT = ToleranceConfig(rtol=0.0, atol=0.0)

Rule = Literal["output", "terms"]


def allowed_error(scale: Any, tolerance: ToleranceConfig) -> Any:
    """The error the rule allows at magnitude ``scale`` (:func:`scale_of`, elementwise).

    >>> from vmapcheck.config import ToleranceConfig
    >>> allowed_error(100.0, ToleranceConfig(rtol=1e-5, atol=1e-6))  # atol + rtol * S
    0.001001
    """
    return tolerance.atol + tolerance.rtol * scale


def scale_of(a64: np.ndarray, b64: np.ndarray, terms: Any = None) -> tuple[np.ndarray, Rule]:
    """``(S, rule)``: the magnitude the tolerance is relative to, elementwise, float64.

    ``terms`` None: rule ``"output"``, ``S = max(|a|, |b|)``. Otherwise ``terms`` has
    ``a``'s shape (it is never broadcast: a scale of another shape belongs to another
    output) and the rule is ``"terms"``: ``S = max(terms, |a|, |b|)``, where a
    non-finite entry of ``terms`` counts as 0 (the output's magnitude decides there).

    Raises:
        ValueError: ``terms`` does not have ``a``'s shape.
    """
    out = np.maximum(np.abs(a64), np.abs(b64))
    if terms is None:
        return out, "output"
    terms = np.asarray(terms, dtype=np.float64)
    if terms.shape != a64.shape:
        raise ValueError(
            f"the terms' magnitude has shape {terms.shape}, the outputs {a64.shape}: "
            "it must describe these very outputs"
        )
    with np.errstate(invalid="ignore"):
        finite = np.where(np.isfinite(terms), terms, 0.0)
    return np.maximum(finite, out), "terms"


def _worst(diff: np.ndarray, allowed: np.ndarray) -> tuple[int, float]:
    """``(flat index, bound ratio)`` of the worst element: the largest
    ``|a - b| / allowed`` (infinite where nothing is allowed and they differ); ties go to
    the largest excess ``|a - b| - allowed``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, diff / np.where(allowed > 0, allowed, 1.0), np.inf)
    ratio = np.where(diff == 0, 0.0, ratio)
    top = float(ratio.max())
    worst = int(np.argmax(np.where(ratio == top, diff - allowed, -np.inf)))
    return worst, top


def _scale_phrase(rule: Rule, value: float) -> str:
    which = "max(S_terms, |a|, |b|)" if rule == "terms" else "max(|a|, |b|)"
    return f"S = {which} = {value:.3g} (rule {rule!r})"


def within(a: float, b: float, tolerance: ToleranceConfig) -> bool:
    """The rule for two scalars (e.g. a loss against its stored value): rule "output".

    >>> from vmapcheck.config import ToleranceConfig
    >>> tolerance = ToleranceConfig(rtol=1e-5, atol=1e-6)
    >>> within(1.0, 1.000005, tolerance), within(1.0, 1.0001, tolerance)
    (True, False)
    """
    return abs(a - b) <= allowed_error(max(abs(a), abs(b)), tolerance)


def looser(a: ToleranceRecord, b: ToleranceRecord) -> ToleranceConfig:
    """The looser of two tolerances, element by element (each side's numerics count).

    ``scale`` (which rule) is not numerics: it is ``b``'s, the run that judges (``a``'s
    when ``b`` names none; the default when neither does).
    """
    scale = b.get("scale", a.get("scale"))
    # Validated: ``a`` comes from a file (a reference's meta.json); a scale no rule
    # knows is refused by ToleranceConfig, naming it.
    return ToleranceConfig.model_validate(
        {
            "rtol": max(a["rtol"], b["rtol"]),
            "atol": max(a["atol"], b["atol"]),
            **({} if scale is None else {"scale": scale}),
        }
    )


def worst_of(results: Mapping[str, Comparison]) -> str | None:
    """The key of the comparison in ``results`` with the largest bound ratio (the first
    of equals); None when none measured one (nothing compared)."""
    ratios = {k: ratio for k, r in results.items() if (ratio := r.get("bound_ratio")) is not None}
    return max(ratios, key=ratios.__getitem__, default=None)


def worst_element(results: Mapping[str, Comparison]) -> WorstElement:
    """The rule's figures at the worst element over ``results`` (the largest bound
    ratio): ``bound_ratio``, ``scale_at_worst`` (S there) and ``worst_pair``."""
    pair = worst_of(results)
    if pair is None:
        return {"bound_ratio": None, "scale_at_worst": None, "worst_pair": None}
    return {
        "bound_ratio": results[pair].get("bound_ratio"),
        "scale_at_worst": results[pair].get("scale_at_worst"),
        "worst_pair": pair,
    }


def largest(results: Iterable[Comparison], stat: Literal["max_abs", "max_rel"]) -> float | None:
    """The largest ``stat`` over ``results``; None when none measured it."""
    return max((v for r in results if (v := r[stat]) is not None), default=None)


def compare(
    a: np.ndarray, b: np.ndarray, tolerance: ToleranceConfig, scale: Any = None
) -> Comparison:
    """Max absolute and relative error of ``a`` vs ``b`` and whether they agree.

    ``scale``: the terms' magnitude ``S_terms`` of these outputs (``a``'s shape), or
    None for the output rule (:func:`scale_of`). Errors are computed in float64 so the
    comparison adds no rounding of its own. Besides ``max_abs``, ``max_rel`` (relative
    to ``max(|a|, |b|)``, whatever the rule), ``passed`` and ``reason``: ``rule``,
    ``bound_ratio`` (the largest ``|a - b| / (atol + rtol * S)``: at most 1 when they
    agree), ``element`` (the index of the element where it is reached) and
    ``scale_at_worst`` (``S`` there).

    Two ``(2, 2)`` outputs (batch axis 0) that differ by 1e-4 at element ``(1, 0)``,
    where ``S = max(|a|, |b|)`` is 2: the rule allows ``1e-6 + 1e-5 * 2``, about a fifth
    of the error.

    >>> import numpy as np
    >>> from vmapcheck.config import ToleranceConfig
    >>> a = np.array([[1.0, -0.5], [2.0, 3.0]])
    >>> b = np.array([[1.0, -0.5], [2.0001, 3.0]])
    >>> result = compare(a, b, ToleranceConfig(rtol=1e-5, atol=1e-6))
    >>> result["passed"], result["element"], result["rule"], round(result["bound_ratio"], 2)
    (False, [1, 0], 'output', 4.76)
    >>> result["reason"]
    "element (1, 0): |a-b|=0.0001 > atol + rtol*S = 2.1e-05, S = max(|a|, |b|) = 2 (rule 'output')"

    The same NaN at the same element of both is agreement (both paths computed it); the
    row is named:

    >>> result = compare(np.array([[np.nan], [1.0]]), np.array([[np.nan], [1.0]]),
    ...                  ToleranceConfig(rtol=1e-5, atol=1e-6))
    >>> result["passed"], result["same_non_finite_rows"]
    (True, [0])
    """
    rule: Rule = "output" if scale is None else "terms"

    def unmeasured(reason: str) -> Comparison:
        """Nothing measured: a failure, its reason given."""
        return {
            "max_abs": None,
            "max_rel": None,
            "passed": False,
            "reason": reason,
            "bound_ratio": None,
            "rule": rule,
            "element": None,
            "scale_at_worst": None,
        }

    if a.shape != b.shape:
        return unmeasured(f"shape {a.shape} vs {b.shape}")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    # The same NaN/Inf at the same element: both computed it (equal_nan: NaN == NaN).
    same = ~fa & ~fb & ((a64 == b64) | (np.isnan(a64) & np.isnan(b64)))
    apart = (~fa | ~fb) & ~same
    if apart.any():
        first = flat_index(int(np.flatnonzero(apart)[0]), a.shape)
        return {
            **unmeasured(
                f"non-finite output apart: element {tuple(first)} is "
                f"{a64[tuple(first)]:.3g} in one and {b64[tuple(first)]:.3g} in the other "
                f"({int(apart.sum())} element(s) differ so)"
            ),
            "element": first,
        }
    shared = non_finite_rows(same)
    if a64.size == 0 or same.all():
        nothing = unmeasured("")
        nothing["passed"] = True
        if a64.size == 0:
            nothing["max_abs"] = nothing["max_rel"] = 0.0
        if shared:
            nothing["same_non_finite_rows"] = shared
        return nothing
    both = ~same
    with np.errstate(invalid="ignore"):
        a64, b64 = np.where(both, a64, 0.0), np.where(both, b64, 0.0)
    diff = np.abs(a64 - b64)
    magnitude = np.maximum(np.abs(a64), np.abs(b64))
    rel = np.divide(diff, magnitude, out=np.zeros_like(diff), where=magnitude > 0)
    s, rule = scale_of(a64, b64, scale)
    allowed = allowed_error(s, tolerance)
    passed = bool(np.all(diff <= allowed))
    worst, ratio = _worst(diff, allowed)
    where = tuple(int(i) for i in np.unravel_index(worst, diff.shape))
    result: Comparison = {
        "max_abs": float(diff.max()),
        "max_rel": float(rel.max()),
        "passed": passed,
        "reason": ""
        if passed
        else (
            f"element {where}: |a-b|={diff.flat[worst]:.3g} "
            f"> atol + rtol*S = {allowed.flat[worst]:.3g}, "
            f"{_scale_phrase(rule, float(s.flat[worst]))}"
        ),
        "bound_ratio": ratio,
        "rule": rule,
        "element": list(where),
        "scale_at_worst": float(s.flat[worst]),
    }
    if shared:
        result["same_non_finite_rows"] = shared
    return result


def non_finite_rows(mask: np.ndarray) -> list[int]:
    """The rows (indices on axis 0, the batch axis) where ``mask`` holds any True; one
    example (a 0-d or 1-d output) is row 0 as a whole.

    >>> import numpy as np
    >>> non_finite_rows(np.array([[False, False], [True, False], [False, True]]))
    [1, 2]
    """
    if mask.ndim <= 1:
        return [0] if mask.any() else []
    return [int(i) for i in np.flatnonzero(mask.reshape(mask.shape[0], -1).any(axis=1))]


def all_pairs(
    outputs: dict[str, np.ndarray], tolerance: ToleranceConfig, scale: Any = None
) -> dict[str, Comparison]:
    """Compare every path with every other: ``"loop_eager-vs-vmap_jit" -> compare(...)``
    (``scale``: the outputs' terms magnitude, or None for the output rule)."""
    return {
        f"{left}-vs-{right}": compare(outputs[left], outputs[right], tolerance, scale)
        for left, right in combinations(outputs, 2)
    }


def flat_index(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index of element ``flat`` of an array of ``shape``, as a list (JSON-ready)."""
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def _float_dtype(a: np.ndarray, b: np.ndarray, dtype: Any) -> np.dtype | None:
    if dtype is not None:
        return np.dtype(dtype)
    both = jnp.promote_types(a.dtype, b.dtype)
    return np.dtype(both) if jnp.issubdtype(both, jnp.floating) else None


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Elementwise distance between ``a`` and ``b`` in ULPs of ``dtype``, as uint64.

    ``dtype`` defaults to the wider of the two (a bfloat16 path against a float32 one is
    measured in float32 ULPs; the caller passes the run's dtype for stored outputs).
    Values are cast to it (exact when they already hold values of it); then each float's
    bit pattern, read as a sign-magnitude integer, gives its position on the number
    line, and the distance is the difference of positions: 1 between neighbouring
    floats, 0 between +0.0 and -0.0, across zero the sum of both sides. Entries where
    either value is non-finite are 0: they are located separately, never measured.

    >>> import numpy as np
    >>> one = np.float32([1.0, 0.0])
    >>> ulp_distance(one, np.nextafter(one, np.float32(2)))  # the next float up: 1 ULP
    array([1, 1], dtype=uint64)
    """
    kind = _float_dtype(a, b, dtype)
    a, b = np.asarray(a), np.asarray(b)
    if kind is None:  # integers: the distance is the difference itself
        with np.errstate(over="ignore"):
            return np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.uint64)
    signed: dict[int, type[np.signedinteger[Any]]] = {2: np.int16, 4: np.int32, 8: np.int64}
    ints = signed[kind.itemsize]
    magnitude = np.iinfo(ints).max  # every bit but the sign

    def position(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bits = np.ascontiguousarray(x.astype(kind)).view(ints).astype(np.int64)
        negative = bits < 0
        return (bits & magnitude).astype(np.uint64), negative

    ma, na = position(a)
    mb, nb = position(b)
    same_side = na == nb
    apart = np.where(ma >= mb, ma - mb, mb - ma)
    across = ma + mb  # both magnitudes < 2**63: no overflow in uint64
    out = np.where(same_side, apart, across)
    finite = np.isfinite(a.astype(np.float64)) & np.isfinite(b.astype(np.float64))
    return np.where(finite, out, np.uint64(0))


def measure(
    a: Any,
    b: Any,
    tolerance: ToleranceConfig,
    source: str,
    ulp_dtype: Any = None,
    scale: Any = None,
) -> Measurement:
    """Compare ``a`` with ``b``: max abs / rel error, max ULP distance, and the verdict.

    The verdict is :func:`vmapcheck.core.compare.compare`'s rule, elementwise
    ``|a - b| <= atol + rtol * S`` in float64, with ``tolerance`` as given (``source``
    names the setting it comes from) and ``S`` from :func:`scale_of` (``scale``: the
    terms' magnitude, or None for the output rule). A non-finite value in either array is
    a failure, located (count and first index), never masked; the error figures then
    cover the elements finite in both. ``element`` is the index of the worst element
    (the largest ``bound_ratio``), ``scale_at_worst`` its ``S``.
    """
    a, b = np.asarray(a), np.asarray(b)
    out: Measurement = {
        "max_abs": None,
        "max_rel": None,
        "max_ulp": None,
        "ulp_dtype": None,
        "tolerance": {"rtol": tolerance.rtol, "atol": tolerance.atol, "from": source},
        "rule": "output" if scale is None else "terms",
        "bound_ratio": None,
        "scale_at_worst": None,
        "passed": False,
        "element": None,
        "reason": "",
    }
    if a.shape != b.shape:
        out["reason"] = f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
        return out
    if a.size == 0:
        out.update(
            {"max_abs": 0.0, "max_rel": 0.0, "max_ulp": 0, "bound_ratio": 0.0, "passed": True}
        )
        return out
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(both, np.abs(a64 - b64), 0.0)
        magnitude = np.where(both, np.maximum(np.abs(a64), np.abs(b64)), 0.0)
        s, rule = scale_of(np.where(both, a64, 0.0), np.where(both, b64, 0.0), scale)
    rel = np.divide(diff, magnitude, out=np.zeros_like(diff), where=magnitude > 0)
    allowed = allowed_error(s, tolerance)
    kind = _float_dtype(a, b, ulp_dtype)
    ulps = ulp_distance(a, b, kind)
    out.update(
        {
            "max_abs": float(diff.max()),
            "max_rel": float(rel.max()),
            "max_ulp": int(ulps.max()),
            "ulp_dtype": kind.name if kind is not None else "integer",
        }
    )
    if not both.all():
        first = flat_index(int(np.flatnonzero(~both)[0]), a.shape)
        out["non_finite"] = {"a": int((~fa).sum()), "b": int((~fb).sum())}
        out["element"] = first
        out["reason"] = (
            f"non-finite values: {int((~fa).sum())} in one, {int((~fb).sum())} in the other "
            f"(first at {tuple(first)})"
        )
        return out
    worst, ratio = _worst(diff, allowed)
    element = out["element"] = flat_index(worst, a.shape)
    out["bound_ratio"] = ratio
    out["scale_at_worst"] = float(s.flat[worst])
    out["passed"] = bool(np.all(diff <= allowed))
    if not out["passed"]:
        out["reason"] = (
            f"element {tuple(element)}: |a-b|={diff.flat[worst]:.3g} > atol + "
            f"rtol*S = {allowed.flat[worst]:.3g} ({int(ulps.flat[worst])} ULP), "
            f"{_scale_phrase(rule, float(s.flat[worst]))}"
        )
    return out


def exact(a: np.ndarray, b: np.ndarray) -> ExactResult:
    """Bitwise agreement of stored and re-derived arrays (data are never recomputed
    approximately: the same steps on the same CPU give the same bits)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        differs = f"dtype {a.dtype} vs {b.dtype}"
        if a.shape != b.shape:
            return {"passed": False, "reason": differs}
        return {**measure(a, b, EXACT, "exact"), "passed": False, "reason": differs}
    if jnp.issubdtype(a.dtype, jnp.floating):
        result = measure(a, b, EXACT, "exact")
        # NaN where the stored array holds NaN (an invalid case) is the same value.
        same = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        result["passed"] = bool(same)
        if same:
            result["reason"] = ""
        return {**result}
    same = a.shape == b.shape and np.array_equal(a, b)
    return {
        "passed": bool(same),
        "tolerance": {"rtol": 0.0, "atol": 0.0, "from": "exact"},
        "reason": "" if same else f"{a.dtype} arrays {tuple(a.shape)} vs {tuple(b.shape)} differ",
    }
