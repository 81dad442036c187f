"""Agreement between forward paths, with explicit tolerances.

Two outputs ``a`` and ``b`` agree when they have the same shape and, elementwise,
``|a - b| <= atol + rtol * max(|a|, |b|)`` (symmetric, so the pair order does not
matter). NaN or Inf in either output is a failure, never a pass: it is not masked.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from vmapcheck.config import ToleranceConfig


def compare(a: np.ndarray, b: np.ndarray, tolerance: ToleranceConfig) -> dict[str, Any]:
    """Max absolute and relative error of ``a`` vs ``b`` and whether they agree.

    Errors are computed in float64 so the comparison adds no rounding of its own.
    """
    if a.shape != b.shape:
        return {
            "max_abs": None,
            "max_rel": None,
            "passed": False,
            "reason": f"shape {a.shape} vs {b.shape}",
        }
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = bool(np.all(np.isfinite(a64)) and np.all(np.isfinite(b64)))
    if not finite:
        return {"max_abs": None, "max_rel": None, "passed": False, "reason": "non-finite output"}
    if a64.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "passed": True, "reason": ""}
    diff = np.abs(a64 - b64)
    scale = np.maximum(np.abs(a64), np.abs(b64))
    rel = np.divide(diff, scale, out=np.zeros_like(diff), where=scale > 0)
    allowed = tolerance.atol + tolerance.rtol * scale
    passed = bool(np.all(diff <= allowed))
    worst = int(np.argmax(diff - allowed))
    where = tuple(int(i) for i in np.unravel_index(worst, diff.shape))
    return {
        "max_abs": float(diff.max()),
        "max_rel": float(rel.max()),
        "passed": passed,
        "reason": ""
        if passed
        else (
            f"element {where}: |a-b|={diff.flat[worst]:.3g} "
            f"> atol + rtol*|x| = {allowed.flat[worst]:.3g}"
        ),
    }


def all_pairs(
    outputs: dict[str, np.ndarray], tolerance: ToleranceConfig
) -> dict[str, dict[str, Any]]:
    """Compare every path with every other: ``"loop_eager-vs-vmap_jit" -> compare(...)``."""
    return {
        f"{left}-vs-{right}": compare(outputs[left], outputs[right], tolerance)
        for left, right in combinations(outputs, 2)
    }
