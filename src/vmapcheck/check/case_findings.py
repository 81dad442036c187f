"""A valid case's problems as findings, each of its kind (:data:`vmapcheck.check.kinds.
FINDING_KINDS`): the contract on every path or on some, and paths far from the float64
oracle (non-finite rows are the ``finite`` rule's, :mod:`vmapcheck.check.rules`).
:func:`vmapcheck.check.checks.run_checks` calls them on each case; the rule of each is in
its docstring, and docs/checks.md ("What kind of finding") says it for users.
"""

from __future__ import annotations

import numpy as np

from vmapcheck.check.kinds import finding
from vmapcheck.check.schema import CheckFinding
from vmapcheck.core.compare import worst_of
from vmapcheck.core.paths import plain_path
from vmapcheck.core.record import Comparison


def contract_findings(name: str, contract: dict[str, list[str]]) -> list[CheckFinding]:
    """The contract's problems on a case. The same problem on every path is the model's
    (it raised) or the contract's (shape, dtype): batching cannot explain it, since the
    per-example loop has it too. A problem on some paths only is a batching fault."""
    broken = {p: msgs for p, msgs in contract.items() if msgs}
    if not broken:
        return []
    everywhere = len(broken) == len(contract) and len({tuple(m) for m in broken.values()}) == 1
    if not everywhere:
        return [
            finding("batching", f"{name}/{p}: {msg}") for p, msgs in broken.items() for msg in msgs
        ]
    paths = ", ".join(broken)
    return [
        finding(
            "model" if msg.startswith("raised") else "contract",
            f"{name}: {msg} on every path ({paths})",
        )
        for msg in next(iter(broken.values()))
    ]


def oracle_not_float64(oracle: np.ndarray) -> str:
    """Why the float64 oracle cannot judge a case, or "": its output must be float64. A
    model that computes in its own dtype whatever x64 says (a wrapper that casts, Keras
    on JAX) gives the run's dtype again: comparing with it would be float32 against
    float32, a figure that means nothing, so none is given."""
    if np.asarray(oracle).dtype == np.float64:
        return ""
    return (
        f"not judged: the model's output under x64 is {np.asarray(oracle).dtype}, not "
        "float64 (it computes in its own dtype), so there is no float64 result to compare with"
    )


def oracle_findings(
    name: str, oracle: dict[str, Comparison], pairs: dict[str, Comparison]
) -> list[CheckFinding]:
    """Paths far from float64. When the plain per-example path is far too (or, where it
    did not run, every path is), the error is shared by the paths: one numerical finding
    for the case, naming how many paths and the worst, and whether the paths agree
    bitwise. A path far from float64 where the plain path is close is a batching fault
    (its disagreement with the plain path is a failed pair as well)."""
    failed = {p: r for p, r in oracle.items() if not r["passed"]}
    if not failed:
        return []
    plain = plain_path()
    shared = plain in failed if plain in oracle else len(failed) == len(oracle)
    if not shared:
        return [
            finding("batching", f"{name}/{p} vs float64 oracle: {r['reason']}")
            for p, r in failed.items()
        ]
    worst = worst_of(failed) or next(iter(failed))
    agree = (
        "bitwise"
        if all(r["passed"] and r["max_abs"] == 0 for r in pairs.values())
        else "within tolerance"
        if all(r["passed"] for r in pairs.values())
        else "not all"
    )
    which = (
        f"all {len(oracle)} paths"
        if len(failed) == len(oracle)
        else f"{len(failed)} of {len(oracle)} paths, the plain loop among them"
    )
    return [
        finding(
            "numerical",
            f"{name}: {which} far from the float64 oracle (the paths agree with each other: "
            f"{agree}); worst {worst}: {failed[worst]['reason']}",
        )
    ]
