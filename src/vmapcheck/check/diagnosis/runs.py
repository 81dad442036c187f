"""Stages 9-11: the run against other runs of the same computation.

9. ``backend``: the run's stored outputs against the same paths recomputed here, on CPU;
10. ``sharding``: each distributed path against the path running the same program on
    one device (its registry entry's ``same_program_as``);
11. ``reference``: the check's comparison with the stored verified run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from vmapcheck.check.diagnosis.subject import (
    StoredRun,
    Subject,
    error_line,
    make_finding,
    stage_result,
)
from vmapcheck.check.schema import Evidence
from vmapcheck.core.compare import measure
from vmapcheck.core.contract import cast_floats, rows, take
from vmapcheck.core.forms import OUTPUT
from vmapcheck.core.paths import (
    PATHS,
    ForwardPath,
    mesh_axis_blamed,
    mesh_label,
    output_key,
    path_names,
    split_output_key,
)
from vmapcheck.core.record import Measurement

if TYPE_CHECKING:
    from vmapcheck.check.schema import CheckDetails, StageResult

# --- 9-11. backend, sharding, reference -----------------------------------------------


def _recompute(subject: Subject, x: np.ndarray, path: ForwardPath) -> np.ndarray | None:
    fn = path.compile(subject.model)
    if fn is None:
        return None
    x = subject.keyed(cast_floats(x, subject.dtype), example=path.takes == "vector")
    return np.asarray(jax.block_until_ready(fn(subject.run_params, x)))


def backend_stage(subject: Subject, stored: StoredRun | None) -> StageResult:
    """Stage 9: the run's stored outputs (its backend) against the same path, same mode,
    recomputed here on CPU, within precision.cross_run_tolerance (backends round
    differently; that tolerance is the run's own setting for it)."""
    evidence: list[Evidence] = []
    if stored is None:
        return stage_result("backend", evidence, skipped="no stored run outputs given")
    runtime = stored.record.get("runtime", {})
    platform = runtime.get("platform", "?")
    here = jax.devices()[0].platform
    tolerance = subject.cross_run_tolerance
    run_dtype = np.dtype(subject.dtype)
    for case, x in stored.cases.items():
        vector = np.ndim(x) == 1
        for path in path_names("vector" if vector else "batch"):
            key = output_key(case, path)
            # A distributed path is judged against its one-device program (sharding).
            if PATHS[path].distributed or key not in stored.outputs:
                continue
            # A path the budget capped stored the case's first rows only: recomputed on
            # those (a loop_jit of thousands of rows would not compile).
            run_x = x
            if not vector and np.shape(stored.outputs[key])[0] < rows(x):
                run_x = take(x, slice(0, np.shape(stored.outputs[key])[0]))
            try:
                mine = _recompute(subject, run_x, PATHS[path])
            except Exception as exc:
                evidence.append(
                    {"what": f"{key} recomputed", "passed": False, "reason": error_line(exc)}
                )
                continue
            if mine is None:
                continue
            result = measure(
                stored.outputs[key], mine, tolerance, "precision.cross_run_tolerance", run_dtype
            )
            pair = f"{path}@{platform}-vs-{path}@{here}"
            evidence.append({"what": f"case {case}", "pair": pair, **result})
            if not result["passed"]:
                return stage_result(
                    "backend",
                    evidence,
                    make_finding(
                        "backend",
                        f"case {case}: the run's {path} on {platform} "
                        f"({runtime.get('device_kind', '?')}) differs from {path} recomputed "
                        f"here on {here} ({result['reason']}); everything before agrees on "
                        f"{here}, so the backend is where it diverges",
                        what="output",
                        input=f"case {case}",
                        layer=OUTPUT,
                        paths=[path],
                        pair=pair,
                        figures=result,
                    ),
                )
    if not evidence:
        return stage_result("backend", evidence, skipped="no stored outputs for the probed cases")
    return stage_result(
        "backend",
        evidence,
        summary=f"the run's outputs on {platform} agree with this machine's {here} "
        f"recomputation within precision.cross_run_tolerance",
    )


def _mesh_of(stored: StoredRun, path: ForwardPath) -> dict[str, Any]:
    """``path``'s mesh as the run recorded it (``meshes``; a record older than them has
    sharded_jit's alone, under ``sharded``), else its registry axes of unknown size."""
    # A record's MeshRecord, or (none recorded) the path's axes with their sizes unknown.
    recorded: Mapping[str, Any] | None = (stored.record.get("meshes") or {}).get(path.name)
    sharded = stored.record.get("sharded")
    if recorded is None and sharded is not None and sharded.get("path") == path.name:
        recorded = sharded
    if recorded is None:
        recorded = {"path": path.name, "mesh_shape": dict.fromkeys(path.mesh_axes, "?")}
    return {"parallelism": path.parallelism, **recorded}


def sharding_stage(subject: Subject, stored: StoredRun | None) -> StageResult:
    """Stage 10: each distributed path of the run (``sharded_jit``, ``tensor_parallel_jit``,
    ``data_model_jit``) against the path running the same program on one device (its
    ``same_program_as``: ``vmap_jit``), every batch case, within precision.tolerance.
    The first to diverge is named with its parallelism (which is data-parallel, which
    tensor-parallel; none is vmap) and the mesh axis the divergence lies on
    (:func:`mesh_axis_blamed`)."""
    evidence: list[Evidence] = []
    if stored is None:
        return stage_result("sharding", evidence, skipped="no stored run outputs given")
    agreed: set[str] = set()
    by_case: dict[str, list[tuple[ForwardPath, str, Measurement]]] = {}
    for key in stored.outputs:
        case, path = split_output_key(key)
        one_device = path.same_program_as
        if (
            not path.distributed
            or one_device is None
            or output_key(case, one_device) not in stored.outputs
        ):
            continue
        result = measure(
            stored.outputs[output_key(case, one_device)],
            stored.outputs[key],
            subject.tolerance,
            "precision.tolerance",
            np.dtype(subject.dtype),
        )
        pair = f"{one_device}-vs-{path.name}"
        evidence.append({"what": f"case {case}", "pair": pair, **result})
        by_case.setdefault(case, []).append((path, pair, result))
    for case, results in by_case.items():
        agreeing = {path.name for path, _, result in results if result["passed"]}
        for path, pair, result in sorted(results, key=lambda r: list(PATHS).index(r[0].name)):
            mesh = _mesh_of(stored, path)
            if result["passed"]:
                agreed.add(f"{mesh_label(mesh)} agrees with {path.same_program_as}")
                continue
            axis = mesh_axis_blamed(path, mesh.get("mesh_shape", {}), agreeing)
            return stage_result(
                "sharding",
                evidence,
                make_finding(
                    "sharding",
                    f"case {case}: {mesh_label(mesh)} differs from {path.same_program_as} "
                    f"({result['reason']}); it diverges on {axis}",
                    what="output",
                    input=f"case {case}",
                    layer=OUTPUT,
                    paths=[path.name],
                    pair=pair,
                    figures=result,
                ),
            )
    if not evidence:
        return stage_result(
            "sharding", evidence, skipped="the run has no distributed path's outputs"
        )
    return stage_result(
        "sharding",
        evidence,
        summary=f"{'; '.join(sorted(agreed))} on {len(by_case)} case(s)",
    )


def reference_stage(check: CheckDetails | None) -> StageResult:
    """Stage 11: the check's comparison with the stored reference run, and what differs
    between the two runs (versions, backend, dtype)."""
    evidence: list[Evidence] = []
    reference = check.get("reference") if check is not None else None
    if not reference:
        return stage_result("reference", evidence, skipped="no check report given")
    if reference.get("status") != "ok":
        evidence.append({"what": "reference", "status": reference.get("status")})
        if not reference.get("passed", True):
            return stage_result(
                "reference",
                evidence,
                make_finding(
                    "reference",
                    f"reference {reference['status']}: {reference.get('message', '')}",
                    what="reference",
                ),
            )
        return stage_result("reference", evidence, skipped=f"reference {reference['status']}")
    for case, paths in reference.get("cases", {}).items():
        for path, result in paths.items():
            evidence.append({"what": f"reference {case}/{path}", **result})
            if not result["passed"]:
                made, now = reference.get("made_with", {}), reference.get("compared_with", {})
                changed = {k: [made.get(k), now.get(k)] for k in made if made.get(k) != now.get(k)}
                return stage_result(
                    "reference",
                    evidence,
                    make_finding(
                        "reference",
                        f"case {case}, {path}: this run differs from the stored reference "
                        f"({result['reason']}); everything within this run agrees, so the "
                        "difference is between the runs"
                        + (
                            ": " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
                            if changed
                            else " (same versions, backend and dtype)"
                        ),
                        what="reference",
                        input=f"case {case}",
                        layer=OUTPUT,
                        paths=[path],
                        figures=result,
                        changed=changed,
                    ),
                )
    for case, loss in reference.get("losses", {}).items():
        evidence.append({"what": f"reference loss {case}", **loss})
        if not loss["passed"]:
            return stage_result(
                "reference",
                evidence,
                make_finding(
                    "reference",
                    f"case {case}: the loss differs from the stored reference's",
                    what="reference loss",
                    input=f"case {case}",
                    layer="loss",
                ),
            )
    return stage_result("reference", evidence, summary="this run agrees with the stored reference")
