"""Judge the forward outputs: agreement, contract, oracle, reference, refusals.

Report first, then assert: :func:`run_checks` never raises on a failed check; it returns
a report whose ``passed`` is False, which ``track`` logs before the pipeline exits
non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from typing import TYPE_CHECKING, Any

import numpy as np

from vmapcheck.check.case_findings import (
    contract_findings,
    oracle_findings,
    oracle_not_float64,
)
from vmapcheck.check.kinds import finding, judge_findings
from vmapcheck.check.probes import judge_bitwise, judge_gradients, judge_inputs
from vmapcheck.check.rules import RuleResult, every_case, judge_case, rules_for
from vmapcheck.check.schema import (
    BudgetReport,
    BuiltinFields,
    Capped,
    CaseReport,
    CheckDetails,
    CheckFinding,
    JudgedBy,
    LossAgainstReference,
    NegativeReport,
    ReferenceReport,
    Refusal,
    StageResult,
)
from vmapcheck.config import FINDING_KIND_NAMES, Config, ToleranceConfig
from vmapcheck.core.cases import CaseEntry, CaseKind, CasesManifest, case_rows, kind_of
from vmapcheck.core.compare import (
    compare,
    largest,
    looser,
    within,
    worst_element,
)
from vmapcheck.core.composition import REGROUPINGS, applies, composition_key
from vmapcheck.core.paths import PATHS, output_key, path_names, plain_path, row_cap
from vmapcheck.core.record import (
    Comparison,
    ForwardRecord,
    GradientProbe,
    GradientProbeError,
    PathRun,
    RuntimeRecord,
    tolerance_record,
)
from vmapcheck.data.regression import SINGLE_CASE, STANDARD_CASE

if TYPE_CHECKING:
    from vmapcheck.check.reference import ReferenceRun
    from vmapcheck.core.magnitude import CaseMagnitude


def _contract(entry: PathRun, shape: list[int], dtype: str) -> list[str]:
    if entry.get("refused") or entry.get("crashed"):
        return [f"raised {entry.get('error')}: {entry.get('message')}"]
    problems = []
    if entry["shape"] != shape:
        problems.append(f"expected shape {shape}, got {entry['shape']}")
    if entry["dtype"] != dtype:
        problems.append(f"expected dtype {dtype}, got {entry['dtype']}")
    return problems


def _scale_for(tolerance: ToleranceConfig, magnitude: CaseMagnitude | None) -> Any:
    """The terms' magnitude to compare with under ``tolerance``, or None (rule "output":
    ``tolerance.scale`` says so, or no magnitude was computed for the case)."""
    if tolerance.scale != "terms" or magnitude is None:
        return None
    return magnitude.get("scale")


def _builtin_fields(results: Iterable[RuleResult]) -> BuiltinFields:
    """The built-in rules' fields of one case, merged in the registry's order (finite:
    path -> bool, non_finite_rows where any)."""
    fields: BuiltinFields = {}
    for result in results:
        fields.update(result.fields)
    return fields


def _rule(tolerance: ToleranceConfig, magnitude: CaseMagnitude | None) -> JudgedBy:
    """``rule`` (what a case is judged by under ``tolerance``), ``fallbacks`` (the
    primitives whose terms' magnitude fell back to |y|) and, when the magnitude forward
    failed on the case, ``magnitude_error``."""
    terms = _scale_for(tolerance, magnitude) is not None
    rule: JudgedBy = {
        "rule": "terms" if terms else "output",
        "fallbacks": list(magnitude["fallbacks"]) if terms and magnitude else [],
    }
    if tolerance.scale == "terms" and magnitude and magnitude.get("error"):
        rule["magnitude_error"] = magnitude["error"]  # why the output rule judged it
    return rule


def _fitting(scale: Any, a: np.ndarray) -> Any:
    """``scale`` where it describes an output of ``a``'s shape, else None (an output of
    the wrong shape is the contract's failure; it is compared under the output rule).

    A batch's ``S`` that covers fewer rows than ``a`` (``budget.magnitude_max_rows``) is
    extended with NaN, which :func:`vmapcheck.core.compare.scale_of` reads as "no terms'
    magnitude here": those rows are judged by the output rule, never by a made-up S. One
    covering more rows (``a`` is a capped path's output) is cut to ``a``'s rows.
    """
    if scale is None:
        return None
    if np.shape(scale) == np.shape(a):
        return scale
    if np.ndim(a) < 2 or np.shape(scale)[1:] != np.shape(a)[1:]:
        return None
    scale = np.asarray(scale)
    n, have = np.shape(a)[0], scale.shape[0]
    if have >= n:
        return scale[:n]
    missing = np.full((n - have, *scale.shape[1:]), np.nan, dtype=np.float64)
    return np.concatenate([scale.astype(np.float64), missing])


def _compare_rows(
    a: np.ndarray,
    b: np.ndarray,
    tolerance: ToleranceConfig,
    scale: Any,
    rows_of: int | None = None,
) -> Any:
    """:func:`compare` on the rows both batches have: a path or an oracle that a budget
    capped computed a case's first rows only, and is compared on those. ``rows`` in the
    result says how many when that is fewer than the case's ``rows_of`` (None: fewer
    than either has). Outputs of equal shape (and single examples) are compared whole."""
    if np.ndim(a) < 2 or np.ndim(b) < 2:
        return compare(a, b, tolerance, _fitting(scale, a))
    n = min(np.shape(a)[0], np.shape(b)[0])
    result = compare(a[:n], b[:n], tolerance, _fitting(scale, a[:n]))
    if n < (rows_of if rows_of is not None else max(np.shape(a)[0], np.shape(b)[0])):
        result["rows"] = n
    terms_rows = np.shape(scale)[0] if scale is not None and np.ndim(scale) >= 2 else n
    if result["rule"] == "terms" and terms_rows < n:
        # The rows past the magnitude's budget have no S_terms: the output rule judged them.
        result["terms_rows"] = int(terms_rows)
        if not result["passed"] and result["element"] and result["element"][0] >= terms_rows:
            result["reason"] += (
                f"; row {result['element'][0]} is past the {terms_rows} rows of the terms' "
                "magnitude (budget.magnitude_max_rows): judged there by the output rule"
            )
    return result


def _pairs(
    case: str,
    kind: CaseKind,
    outputs: dict[str, np.ndarray],
    tolerance: ToleranceConfig,
    scale: Any = None,
    rows_of: int | None = None,
) -> dict[str, Comparison]:
    """Every path against every other; one example also against the batch of one.

    ``scale``: the case's terms magnitude (its output's shape), or None: rule "output".
    ``rows_of``: a batch case's rows (a pair of capped paths covers fewer).
    """
    present = {
        p: outputs[output_key(case, p)] for p in kind.paths() if output_key(case, p) in outputs
    }
    results = {
        f"{a}-vs-{b}": _compare_rows(present[a], present[b], tolerance, scale, rows_of)
        for a, b in combinations(present, 2)
    }
    if kind.takes == "vector":
        for a in present:
            for b in path_names("batch"):
                batch = outputs.get(output_key(SINGLE_CASE, b))
                if batch is not None:
                    results[f"{a}-vs-single.{b}"] = compare(
                        present[a], batch[0], tolerance, _fitting(scale, present[a])
                    )
    return results


def _cap(rows_run: int, rows_of: int, key: str) -> Capped:
    return {"rows_run": rows_run, "rows_of": rows_of, "capped_by": f"budget.{key}"}


def _capped(
    config: Config,
    kind: CaseKind,
    meta: CaseEntry,
    paths: list[str],
    oracle: np.ndarray | None,
    magnitude: CaseMagnitude | None,
) -> dict[str, Capped]:
    """What the budget (``config.budget``) capped on a valid case: each capped path,
    ``oracle`` and ``magnitude`` -> ``{"rows_run", "rows_of", "capped_by"}``. A path's
    rows follow from the config alone (:func:`vmapcheck.core.paths.row_cap`), so a
    forward stage that ran other rows fails the contract; the oracle's and the
    magnitude's are the rows they computed."""
    if kind.takes != "batch":
        return {}
    rows = case_rows(meta)
    out: dict[str, Capped] = {}
    for p in paths:
        cap = row_cap(PATHS[p], config.budget, rows)
        if cap is not None:
            out[p] = _cap(cap, rows, str(PATHS[p].forward_cap))
    if oracle is not None and np.ndim(oracle) >= 1 and oracle.shape[0] < rows:
        out["oracle"] = _cap(oracle.shape[0], rows, "oracle_max_rows")
    scale = magnitude["scale"] if magnitude else None
    if scale is not None and np.ndim(scale) >= 1 and np.shape(scale)[0] < rows:
        out["magnitude"] = {
            **_cap(np.shape(scale)[0], rows, "magnitude_max_rows"),
            "beyond": "judged by the output rule, max(|a|, |b|)",
        }
    return out


def _valid_case(
    name: str,
    meta: CaseEntry,
    config: Config,
    outputs: dict[str, np.ndarray],
    record: dict[str, PathRun],
    oracle: dict[str, np.ndarray] | None,
    targets: np.ndarray | None,
    skip: dict[str, str],
    magnitude: CaseMagnitude | None,
    stochastic: bool = False,
) -> tuple[CaseReport, list[CheckFinding]]:
    kind = kind_of(meta, name)
    out_shape = (
        [config.model.out_features]
        if kind.takes == "vector"
        else [case_rows(meta), config.model.out_features]
    )
    paths = [p for p in kind.paths(meta) if p not in skip]
    capped = _capped(config, kind, meta, paths, oracle.get(name) if oracle else None, magnitude)
    contract = {
        p: _contract(
            record.get(p, {"crashed": True, "error": "NotRun", "message": "no record"}),
            # A path the budget caps runs the case's first rows only (forward stage).
            [capped[p]["rows_run"], *out_shape[1:]] if p in capped else out_shape,
            config.precision.dtype,
        )
        for p in paths
    }
    present = {p: outputs[output_key(name, p)] for p in paths if output_key(name, p) in outputs}
    tolerance = config.precision.tolerance
    # The built-in rules (vmapcheck.check.rules, every_case: outputs finite), on every path.
    builtin = judge_case(name, every_case(), present, tolerance)
    rows_of = case_rows(meta) if kind.takes == "batch" else None
    pairs = _pairs(name, kind, outputs, tolerance, _scale_for(tolerance, magnitude), rows_of)
    found = contract_findings(name, contract)
    if not pairs:
        # Fewer than two paths gave outputs: nothing was compared, so nothing agreed.
        found.append(
            finding(
                "batching",
                f"{name}: no pair of paths to compare ({len(present)} path(s) gave outputs: "
                f"{', '.join(present) or 'none'}); the check needs at least two",
            )
        )
    found += [finding(k, line) for r in builtin.values() for k, line in r.findings()]
    found += [
        finding("batching", f"{name}/{pair}: {r['reason']}")
        for pair, r in pairs.items()
        if not r["passed"]
    ]
    # The rules its kind adds to agreement (vmapcheck.check.rules), each on every path.
    rules = judge_case(name, rules_for(kind.rules, stochastic), present, tolerance)
    found += [finding(k, line) for r in rules.values() for k, line in r.findings()]
    report: CaseReport = {
        "kind": kind.name,
        "shape": meta["shape"],
        "about": meta.get("about", ""),
        "max_abs": largest(pairs.values(), "max_abs"),
        "max_rel": largest(pairs.values(), "max_rel"),
        "contract": contract,
        # The built-in rules' fields: finite (path -> bool), non_finite_rows where any.
        **_builtin_fields(builtin.values()),
        "pairs": pairs,
        # The rule the pairs were judged by, the primitives whose terms' magnitude fell
        # back to |y| (vmapcheck.core.magnitude), and S at the worst element.
        **_rule(tolerance, magnitude),
        **worst_element(pairs),
        "passed": False,  # judged below, once every failure is in
    }
    if rules:
        report["rules"] = {rule: result.to_json() for rule, result in rules.items()}
    if oracle is not None and name in oracle:
        not_float64 = oracle_not_float64(oracle[name])
        if not_float64:
            report["oracle_not_judged"] = not_float64
        else:
            cross = config.precision.cross_run_tolerance
            scale = _scale_for(cross, magnitude)
            report["oracle"] = {
                p: _compare_rows(v, oracle[name], cross, scale, rows_of) for p, v in present.items()
            }
            found += oracle_findings(name, report["oracle"], pairs)
    if targets is not None:
        # A capped path's loss is over the rows it ran (its entry in ``capped``).
        report["loss"] = {
            p: float(np.mean((v.astype(np.float64) - targets[: len(v)]) ** 2))
            for p, v in present.items()
        }
    if capped:
        report["capped"] = capped
    # A case with no pair compared never passes, whatever verdict.fail_on excludes.
    report["passed"] = bool(pairs) and not any(f["kind"] in fail_on(config) for f in found)
    return report, found


def fail_on(config: Config) -> list[str]:
    """The kinds of finding that fail the run (``verdict.fail_on``); a config built
    without a verdict group (the Python API before it had one) fails on every kind."""
    verdict = getattr(config, "verdict", None)
    return list(verdict.fail_on) if verdict is not None else list(FINDING_KIND_NAMES)


def _negative_case(
    name: str, meta: CaseEntry, record: dict[str, PathRun], skip: dict[str, str]
) -> tuple[NegativeReport, list[CheckFinding]]:
    """Every path must refuse the invalid case, naming the problem; one that computes an
    output instead (or raises another error) is a batching fault: batched inference
    takes what the per-example contract refuses."""
    per_path: dict[str, Refusal] = {}
    failures: list[CheckFinding] = []
    for path in kind_of(meta, name).paths(meta):
        if path in skip:
            continue
        entry: PathRun = record.get(path, {"refused": False, "message": "not run"})
        message = entry.get("message") or f"produced an output of shape {entry.get('shape')}"
        ok = (
            bool(entry.get("refused"))
            and entry.get("error") == "InvalidInputError"
            and all(part in message for part in meta["expect"])
        )
        per_path[path] = {
            "passed": ok,
            "refused": bool(entry.get("refused")),
            "error": entry.get("error"),
            "message": message,
        }
        if not ok:
            failures.append(
                finding(
                    "batching",
                    f"{name}/{path}: expected InvalidInputError naming {meta['expect']}, got "
                    f"{entry.get('error') or 'an output'}: {message!r}",
                )
            )
    report: NegativeReport = {
        "about": meta.get("about", ""),
        "expect": meta["expect"],
        "runs_on": meta.get("runs_on", "batch"),
        "passed": not failures,
        "paths": per_path,
    }
    return report, failures


def _reference(
    config: Config,
    runtime: RuntimeRecord,
    reference: ReferenceRun | None,
    skip: dict[str, str],
) -> tuple[ReferenceReport, list[CheckFinding]]:
    """Compare the current run of the reference's inputs with its stored outputs. A
    reference that cannot be compared (corrupt, incompatible, missing where required) is
    a contract problem; outputs or losses that moved from the stored ones are a
    numerical finding (this JAX, backend or precision computes other numbers)."""
    status = reference["status"] if reference else "missing"
    if status != "ok":
        message = reference.get("message", "") if reference else "no reference"
        # Only a reference not stored yet (a new model's first runs) is excused where it
        # is not required; a corrupt or incompatible one is a failure wherever it runs.
        passed = status == "missing" and not config.reference.required
        missing: ReferenceReport = {
            "status": status,
            "message": message,
            "required": config.reference.required,
            "passed": passed,
        }
        return missing, [] if passed else [finding("contract", f"reference: {status}: {message}")]
    assert reference is not None  # status "ok": a reference was loaded
    meta = reference["meta"]
    stored, current = reference["stored"], reference["current"]
    tolerance = looser(
        meta["cross_run_tolerance"], tolerance_record(config.precision.cross_run_tolerance)
    )
    magnitudes = reference.get("magnitudes") or {}
    cases: dict[str, dict[str, Comparison]] = {}
    failures: list[CheckFinding] = []
    for name, entry in meta["cases"].items():
        cases[name] = {}
        for path in kind_of(entry, name).paths(entry):
            key = output_key(name, path)
            if path in skip and key not in stored:
                continue
            # A reference older than this path: compare with the stored output of the
            # path that computes the same program on one device (its same_program_as).
            stand_in = path if key in stored else (PATHS[path].same_program_as or path)
            stored_key = output_key(name, stand_in)
            result: Comparison
            if key not in current:
                result = {
                    "max_abs": None,
                    "max_rel": None,
                    "passed": False,
                    "reason": "no current output (refused or crashed)",
                }
            elif stored_key not in stored:
                result = {
                    "max_abs": None,
                    "max_rel": None,
                    "passed": False,
                    "reason": "the reference stores no output for this path",
                }
            else:
                scale = _scale_for(tolerance, magnitudes.get(name))
                result = _compare_rows(current[key], stored[stored_key], tolerance, scale)
            if stand_in != path:
                result["stored_path"] = stand_in
            cases[name][path] = result
            if not result["passed"]:
                failures.append(
                    finding("numerical", f"reference/{name}/{path}: {result['reason']}")
                )
    losses: dict[str, LossAgainstReference] = {}
    for name, value in meta.get("losses", {}).items():
        y = reference["cases"][name]["y"]
        plain = current[output_key(name, plain_path())].astype(np.float64)
        # A capped plain path ran the first rows only: its loss is over those.
        now = float(np.mean((plain - y[: len(plain)]) ** 2))
        ok = within(now, value, tolerance)
        losses[name] = {"reference": value, "current": now, "passed": ok}
        if not ok:
            failures.append(
                finding("numerical", f"reference/{name}/loss: {now:.6g} vs stored {value:.6g}")
            )
    made, cur = meta["runtime"], runtime
    report: ReferenceReport = {
        "status": "ok",
        "message": (
            f"reference made with jax {made['jax_version']} / jaxlib {made['jaxlib_version']} "
            f"on {made['backend']} ({made['device_kind']}) in {meta['dtype']}, compared with "
            f"jax {cur['jax_version']} / jaxlib {cur['jaxlib_version']} on {cur['backend']} "
            f"({cur['device_kind']}) in {config.precision.dtype}"
        ),
        "made_with": {
            **{k: made[k] for k in ("jax_version", "jaxlib_version", "backend", "device_kind")},
            "dtype": meta["dtype"],
        },
        "compared_with": {
            **{k: cur[k] for k in ("jax_version", "jaxlib_version", "backend", "device_kind")},
            "dtype": config.precision.dtype,
        },
        "created_at": meta["created_at"],
        "reason": meta["reason"],
        "from_run": meta.get("from_run"),
        "tolerance_used": tolerance_record(tolerance),
        # Per case: the rule its outputs were judged by and the primitives whose terms'
        # magnitude fell back to |y| (the reference's own params and inputs).
        "rules": {name: _rule(tolerance, magnitudes.get(name)) for name in cases},
        "cases": cases,
        "losses": losses,
        "max_abs": max(
            (r["max_abs"] for c in cases.values() for r in c.values() if r["max_abs"] is not None),
            default=None,
        ),
        "max_rel": max(
            (r["max_rel"] for c in cases.values() for r in c.values() if r["max_rel"] is not None),
            default=None,
        ),
        "passed": not failures,
    }
    return report, failures


def _composition(
    config: Config,
    cases_manifest: CasesManifest,
    outputs: dict[str, np.ndarray],
    regrouped: dict[str, np.ndarray] | None,
    record: dict[str, Any] | None,
    skip: dict[str, str],
    magnitudes: dict[str, CaseMagnitude] | None,
) -> tuple[dict[str, Any] | None, list[CheckFinding]]:
    """Each batch path's outputs on every regrouped batch (:data:`~vmapcheck.core.
    composition.REGROUPINGS`) against its own outputs on the original batch, at
    ``precision.tolerance`` with the case's terms magnitude (as the pairs).

    The loop and vmap forms never see a row's batch-mates; a path that does (a
    hand-batched or distributed form) must not let them change the row's output. Every
    case that :func:`~vmapcheck.core.composition.applies` and every path with an output
    on it is judged; a regrouped output missing (the path raised, or the forward stage
    did not run it) fails too. ``regrouped`` None: not judged (None returned).
    """
    if regrouped is None:
        return None, []
    tolerance = config.precision.tolerance
    raised = (record or {}).get("cases", {})
    report: dict[str, Any] = {}
    failures: list[CheckFinding] = []
    for name, meta in cases_manifest["cases"].items():
        if not applies(meta, name):
            continue
        scale = _scale_for(tolerance, (magnitudes or {}).get(name))
        by_path: dict[str, Any] = {}
        for path in kind_of(meta, name).paths(meta):
            original = outputs.get(output_key(name, path))
            if path in skip or original is None:  # not provided; or the contract's failure
                continue
            result: dict[str, Any] = {}
            for g in REGROUPINGS.values():
                got = regrouped.get(composition_key(name, path, g.name))
                if got is None:
                    why = raised.get(name, {}).get("raised", {}).get(path, {}).get(g.name)
                    reason = (
                        f"no output: raised {why['error']}: {why['message']}"
                        if why
                        else "no output (not run by the forward stage)"
                    )
                    result[g.name] = {
                        "max_abs": None,
                        "max_rel": None,
                        "passed": False,
                        "reason": reason,
                    }
                else:
                    result[g.name] = compare(original, got, tolerance, _fitting(scale, original))
                if not result[g.name]["passed"]:
                    failures.append(
                        finding(
                            "batching",
                            f"{name}/{path}: outputs depend on batch composition "
                            f"({g.name}: {result[g.name]['reason']})",
                        )
                    )
            result["passed"] = all(result[g]["passed"] for g in REGROUPINGS)
            if np.shape(original)[0] < case_rows(meta):  # a capped path: on its rows
                result["rows"] = int(np.shape(original)[0])
            by_path[path] = result
        report[name] = by_path
    return report, failures


def run_checks(
    config: Config,
    cases_manifest: CasesManifest,
    outputs: dict[str, np.ndarray],
    forward_record: ForwardRecord,
    *,
    oracle: dict[str, np.ndarray] | None = None,
    targets: dict[str, np.ndarray] | None = None,
    reference: ReferenceRun | None = None,
    gradients: dict[str, np.ndarray] | None = None,
    inputs: dict[str, StageResult] | None = None,
    magnitudes: dict[str, CaseMagnitude] | None = None,
    composition: dict[str, np.ndarray] | None = None,
    bitwise: str = "report",
) -> CheckDetails:
    """Build the check report (``reports/check_details.json``, :class:`CheckDetails`).

    ``oracle``: case -> float64 output (None for a float64 run). ``targets``: case -> y
    for cases that have them. ``reference``: {"status", "message", and when "ok": "meta",
    "stored", "current", "cases", optionally "magnitudes" (as below, for the reference's
    own params and inputs)} (see :mod:`vmapcheck.check.reference`), or None if absent.
    ``inputs``: stage results of :mod:`vmapcheck.check.diagnosis` judged as checks (the
    key stream), or None. ``magnitudes``: case -> {"scale": S_terms of the case's
    output shape, "fallbacks": [primitive names]} (:func:`vmapcheck.core.magnitude.
    case_magnitudes`); a tolerance whose ``scale`` is "terms" judges a case with it
    (pairs, oracle, reference, composition), any other comparison uses the output rule.
    ``composition``: the regrouped outputs (data/forward/composition.npz,
    :mod:`vmapcheck.core.composition`), or None: batch composition is not judged and the
    report has no ``composition``. ``bitwise``: the mode of the bitwise batch
    invariance the forward record holds (:data:`vmapcheck.core.bitwise_verdict.MODES`).
    """
    cases_report: dict[str, CaseReport] = {}
    negative_report: dict[str, NegativeReport] = {}
    found_all: list[CheckFinding] = []
    skip = forward_record.get("not_provided", {})
    for name, meta in cases_manifest["cases"].items():
        record = forward_record["cases"].get(name, {})
        if kind_of(meta, name).judged == "refusal":
            negative_report[name], found = _negative_case(name, meta, record, skip)
        else:
            cases_report[name], found = _valid_case(
                name,
                meta,
                config,
                outputs,
                record,
                oracle,
                (targets or {}).get(name),
                skip,
                (magnitudes or {}).get(name),
                # A stochastic model's row keys (the forward stage's record says how drawn).
                stochastic="keys" in forward_record,
            )
        found_all += found
    reference_report, found = _reference(config, forward_record["runtime"], reference, skip)
    found_all += found
    gradients_report, found = judge_gradients(config, forward_record.get("gradients"), gradients)
    found_all += found
    inputs_report, found = judge_inputs(inputs)
    found_all += found
    composition_report, found = _composition(
        config,
        cases_manifest,
        outputs,
        composition,
        forward_record.get("composition"),
        skip,
        magnitudes,
    )
    found_all += found
    bitwise_report, found = judge_bitwise(forward_record.get("bitwise"), bitwise)
    found_all += found
    kinds = fail_on(config)
    findings, failures = judge_findings(found_all, kinds)
    # Nothing compared (no valid case, or one whose paths gave no pair) is no pass.
    compared = bool(cases_report) and all(case["pairs"] for case in cases_report.values())
    report: CheckDetails = {
        "passed": compared and not failures,
        "failures": failures,
        "findings": findings,
        "fail_on": kinds,
        "dtype": config.precision.dtype,
        "tolerance": tolerance_record(config.precision.tolerance),
        "cross_run_tolerance": tolerance_record(config.precision.cross_run_tolerance),
        "oracle": _oracle_line(oracle, forward_record),
        "runtime": forward_record["runtime"],
        "not_provided": skip,
        # Devices and mesh of the data-parallel path (absent in records older than it).
        "sharded": forward_record.get("sharded"),
        "cases": cases_report,
        "negative": negative_report,
        "reference": reference_report,
        "gradients": gradients_report,
        "inputs": inputs_report,
    }
    if "meshes" in forward_record:
        report["meshes"] = forward_record["meshes"]
    if composition_report is not None:
        report["composition"] = composition_report
    if bitwise_report is not None:
        report["bitwise"] = bitwise_report
    report["budget"] = _budget(config, cases_report, forward_record.get("gradients"))
    return report


def _oracle_line(oracle: dict[str, np.ndarray] | None, record: ForwardRecord) -> str:
    """What the float64 oracle was: computed, or why not (a float64 run; a stochastic
    model whose draws float64 cannot repeat: its record's ``keys`` say why)."""
    if oracle is not None:
        return "float64 (CPU)"
    keys = record.get("keys")
    if keys is not None and keys.get("oracle"):
        return str(keys["oracle"])
    return "none: the run is float64"


def _budget(
    config: Config,
    cases_report: dict[str, CaseReport],
    gradients: GradientProbe | GradientProbeError | None,
) -> BudgetReport:
    """The budgets and, per case, what each capped (never silently: the printed check
    lines and the HTML report read it)."""
    capped = {name: case["capped"] for name, case in cases_report.items() if case.get("capped")}
    if gradients and "error" not in gradients and gradients.get("capped"):
        capped.setdefault(STANDARD_CASE, {})["gradients"] = gradients["capped"]
    # No budget (the Python API, vmapcheck.testing): every part ran every row.
    limits = config.budget.model_dump() if config.budget is not None else None
    return {"limits": limits, "cases": capped}
