"""Judge the forward outputs: agreement of every pair, the output contract, refusals.

Report first, then assert: :func:`run_checks` never raises on a failed check; it returns
a report whose ``passed`` is False, which ``track`` logs before the pipeline exits
non-zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vmapcheck.agreement import all_pairs
from vmapcheck.config import Config
from vmapcheck.names import PATH_NAMES, output_key


def _contract(entry: dict[str, Any], rows: int, out_features: int, dtype: str) -> list[str]:
    problems = []
    if entry.get("refused") or entry.get("crashed"):
        return [f"raised {entry.get('error')}: {entry.get('message')}"]
    if entry["shape"] != [rows, out_features]:
        problems.append(f"expected shape {[rows, out_features]}, got {entry['shape']}")
    if entry["dtype"] != dtype:
        problems.append(f"expected dtype {dtype}, got {entry['dtype']}")
    return problems


def run_checks(
    config: Config,
    cases_manifest: dict[str, Any],
    outputs: dict[str, np.ndarray],
    forward_record: dict[str, Any],
) -> dict[str, Any]:
    """Build the check report (see ``reports/check_details.json`` for its layout)."""
    tolerance = config.precision.tolerance
    cases_report: dict[str, Any] = {}
    negative_report: dict[str, Any] = {}
    failures: list[str] = []
    for case_name, meta in cases_manifest["cases"].items():
        record = forward_record["cases"].get(case_name, {})
        if meta["valid"]:
            contract = {
                path: _contract(
                    record[path],
                    meta["shape"][0],
                    config.model.out_features,
                    config.precision.dtype,
                )
                for path in PATH_NAMES
            }
            present = {
                p: outputs[output_key(case_name, p)]
                for p in PATH_NAMES
                if output_key(case_name, p) in outputs
            }
            finite = {p: bool(np.all(np.isfinite(v))) for p, v in present.items()}
            pairs = all_pairs(present, tolerance)
            for path, problems in contract.items():
                failures += [f"{case_name}/{path}: {p}" for p in problems]
            failures += [
                f"{case_name}/{p}: non-finite output" for p, ok in finite.items() if not ok
            ]
            failures += [
                f"{case_name}/{pair}: {r['reason']}" for pair, r in pairs.items() if not r["passed"]
            ]
            worst_abs = max(
                (r["max_abs"] for r in pairs.values() if r["max_abs"] is not None), default=None
            )
            worst_rel = max(
                (r["max_rel"] for r in pairs.values() if r["max_rel"] is not None), default=None
            )
            cases_report[case_name] = {
                "rows": meta["shape"][0],
                "passed": not any(contract.values())
                and all(finite.values())
                and all(r["passed"] for r in pairs.values()),
                "max_abs": worst_abs,
                "max_rel": worst_rel,
                "contract": contract,
                "finite": finite,
                "pairs": pairs,
            }
        else:
            per_path = {}
            for path in PATH_NAMES:
                entry = record.get(path, {"refused": False, "message": "not run"})
                ok = bool(entry.get("refused")) and meta["expect"] in entry.get("message", "")
                per_path[path] = {
                    "passed": ok,
                    "refused": bool(entry.get("refused")),
                    "error": entry.get("error"),
                    "message": entry.get(
                        "message", f"produced an output of shape {entry.get('shape')}"
                    ),
                }
                if not ok:
                    failures.append(
                        f"{case_name}/{path}: expected a refusal naming {meta['expect']!r}, "
                        f"got {per_path[path]['message']!r}"
                    )
            negative_report[case_name] = {
                "expect": meta["expect"],
                "passed": all(p["passed"] for p in per_path.values()),
                "paths": per_path,
            }
    return {
        "passed": not failures,
        "failures": failures,
        "dtype": config.precision.dtype,
        "tolerance": tolerance.model_dump(),
        "runtime": forward_record["runtime"],
        "cases": cases_report,
        "negative": negative_report,
    }


def metrics_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The compact figures DVC shows as metrics (reports/check.json)."""
    n_pairs = sum(len(c["pairs"]) for c in report["cases"].values())
    return {
        "passed": report["passed"],
        "n_failures": len(report["failures"]),
        "n_pairs": n_pairs,
        "tolerance": report["tolerance"],
        "agreement": {
            name: {"max_abs": c["max_abs"], "max_rel": c["max_rel"], "passed": c["passed"]}
            for name, c in report["cases"].items()
        },
        "negative": {
            name: {
                "refused_paths": sum(p["refused"] for p in n["paths"].values()),
                "passed": n["passed"],
            }
            for name, n in report["negative"].items()
        },
    }
