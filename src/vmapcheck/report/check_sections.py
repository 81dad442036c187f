"""The report's sections on the check (``reports/check_details.json``), as plain data for
the template (``templates/report.html``): the verdict banner, the environment, agreement
of every pair of paths, the float64 oracle, the stored reference, batch composition,
invalid inputs and gradients.

Paths are listed in the order of the registry :data:`vmapcheck.core.paths.PATHS`
(:func:`~vmapcheck.report.elements.in_path_order`); no section names a path itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vmapcheck.check.kinds import verdict_words
from vmapcheck.check.rules import rule
from vmapcheck.check.schema import CaseReport, CheckDetails, RuleRecord
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.paths import PATHS, mesh_label
from vmapcheck.core.record import Comparison, InputLeafRecord
from vmapcheck.core.runtime import accelerator_runtime_text, device_text
from vmapcheck.report.elements import (
    AgreementSection,
    CaseTables,
    GradientsSection,
    JudgedTableSection,
    MeasuredTableSection,
    OracleSection,
    ReferenceSection,
    Table,
    TableSection,
    VerdictBanner,
    cell,
    figure_cell,
    in_path_order,
    kv_table,
    num,
    result_cell,
    shape_text,
    table,
)

if TYPE_CHECKING:
    from vmapcheck.bench.timing.records import BenchDetails
    from vmapcheck.params_io import ModelContract


def forms_compared(check: CheckDetails) -> str:
    """What the verdict is about, from the check's details: the forms of the one-device
    batch paths that ran (a path in ``not_provided`` did not), in registry order, with
    their modes, then the distributed path when it ran (``sharded``: data parallelism,
    not vmap, so named on its own): ``loop, map, vmap, vmap_of_jit and direct forwards
    (eager and jit), and sharded_jit (data-parallel over 2 device(s), not vmap)``."""
    missing = set(check.get("not_provided") or {})
    paths = [
        p
        for p in PATHS.values()
        if p.takes == "batch" and not p.distributed and p.name not in missing
    ]
    forms = list(dict.fromkeys(p.form for p in paths))
    modes = " and ".join(dict.fromkeys(p.mode for p in paths))
    text = f"{and_list(forms)} forwards ({modes})" if forms else "no one-device batch forward"
    meshes = check.get("meshes")
    if meshes:  # each mesh path with its parallelism and mesh: none is vmap
        text += ", and " + and_list([mesh_label(about) for about in meshes.values()])
        return text
    sharded = check.get("sharded")
    if sharded:
        text += (
            f", and {sharded['path']} (data-parallel over {sharded['devices']} device(s), not vmap)"
        )
    return text


def not_provided_lines(check: Mapping[str, Any]) -> list[str]:
    """One sentence per path the model does not provide (``not_provided``), in registry
    order: ``direct_jit not provided: model 'x' provides no hand-batched forward ...``."""
    return [
        f"{path} not provided: {reason}"
        for path, reason in in_path_order(check.get("not_provided") or {})
    ]


def budget_lines(check: CheckDetails) -> list[str]:
    """One sentence per part of a case that a budget capped (``budget.cases``), e.g.
    ``standard: oracle on the first 512 of 4096 rows (capped by budget.oracle_max_rows)``;
    none for a report older than the budgets or a run nothing was capped in."""
    lines = []
    budget = check.get("budget")
    for case, capped in (budget["cases"] if budget else {}).items():
        for what, cap in capped.items():
            beyond = f"; the rest {cap['beyond']}" if "beyond" in cap else ""
            lines.append(
                f"{case}: {what} on the first {cap['rows_run']} of {cap['rows_of']} rows "
                f"(capped by {cap['capped_by']}){beyond}"
            )
    return lines


def and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def verdict_sentence(check: CheckDetails) -> str:
    """What was compared, where, and at what tolerance: the one sentence that the printed
    verdict, the HTML banner, the MLflow run's description and the Python API's error
    each put after PASSED or FAILED (``check``: check_details.json)."""
    runtime, tol = check["runtime"], check["tolerance"]
    return (
        f"{forms_compared(check)} on {runtime['backend']} ({device_text(runtime)}), "
        f"{check['dtype']}, rtol={tol['rtol']:g} atol={tol['atol']:g}, "
        f"jax {runtime['jax_version']} / jaxlib {runtime['jaxlib_version']}"
    )


def verdict(check: CheckDetails, bench: BenchDetails) -> VerdictBanner:
    """The banner: ``{"passed", "word", "headline", "notes"}`` (the failures, grouped,
    are :mod:`vmapcheck.report.failures`')."""
    passed = bool(check["passed"])
    headline = verdict_sentence(check)
    notes = []
    if bench.get("machine", {}).get("noisy"):
        notes.append(
            "The machine was busy during the benchmark (load average above the usable "
            "cores): the latency figures are noisy."
        )
    ref = check.get("reference", {})
    if ref.get("status") not in (None, "ok"):
        notes.append(
            f"Stored reference: {ref['status']}: {ref.get('message', '')} "
            f"(required: {ref.get('required')})."
        )
    notes += [f"Path {line}" for line in not_provided_lines(check)]
    return {
        "passed": passed,
        "word": verdict_words(check),
        "headline": headline,
        "notes": notes,
    }


def _recorded(runtime: Mapping[str, Any], key: str, when_none: str) -> Any:
    """``runtime[key]``; ``when_none`` where it is recorded as None; "-" where a report
    older than the key lacks it."""
    if key not in runtime:
        return "-"
    value = runtime[key]
    return when_none if value is None else value


def environment(
    check: CheckDetails,
    bench: BenchDetails,
    contract: ModelContract | None,
    git: dict[str, str],
    run: dict[str, str],
) -> TableSection:
    runtime = check["runtime"]
    machine = bench.get("machine", {}).get("before", {})
    tol, cross = check["tolerance"], check["cross_run_tolerance"]
    rows: list[tuple[str, Any]] = [
        *((k, v) for k, v in run.items()),
        ("jax / jaxlib", f"{runtime['jax_version']} / {runtime['jaxlib_version']}"),
        ("Python", runtime["python_version"]),
        ("backend (platform)", f"{runtime['backend']} ({runtime['platform']})"),
        ("device kind, count", f"{runtime['device_kind']}, {runtime['device_count']}"),
        # Not recorded before these keys existed ("-"); CPU devices report no memory.
        ("device memory (GiB)", _recorded(runtime, "device_memory_gib", "(not reported)")),
        ("platform version", _recorded(runtime, "platform_version", "(not reported)")),
        (
            "accelerator runtime",
            accelerator_runtime_text(runtime)
            or ("-" if "accelerator_runtime" not in runtime else "(none)"),
        ),
        ("CPU model", machine.get("cpu_model", "-")),
        (
            "cores (logical / usable)",
            f"{machine.get('logical_cores', '-')} / {machine.get('usable_cores', '-')}",
        ),
        ("memory total (GiB)", machine.get("memory_total_gib", "-")),
        ("OS", runtime["os_platform"]),
        ("dtype", check["dtype"]),
        ("x64 enabled", runtime["enable_x64"]),
        ("matmul precision", runtime["matmul_precision"]),
        ("XLA_FLAGS", runtime.get("xla_flags") or "(none)"),
        ("tolerance (path vs path)", f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}"),
        (
            "cross-run tolerance (oracle, reference)",
            f"rtol={num(cross['rtol'])}, atol={num(cross['atol'])}",
        ),
        ("oracle", check.get("oracle", "-")),
        ("git commit", git.get("git_commit", "unknown")),
        ("git dirty", git.get("git_dirty", "unknown")),
        ("config digest", check.get("config_digest", "-")),
        ("forward outputs sha256", check.get("forward_outputs_sha256", "-")),
    ]
    if contract:
        rows[len(run) : len(run)] = [
            ("model", f"{contract['model']}: {contract.get('description', '')}"),
            ("input features", ", ".join(contract["inputs"]["features"])),
            *(
                [("input leaves", leaves_text(contract["inputs"]["leaves"]))]
                if "leaves" in contract["inputs"]
                else []
            ),
            ("outputs", ", ".join(contract["outputs"]["names"])),
            ("params leaves", len(contract.get("params", {}))),
            ("batched forward provided", contract.get("batched_forward")),
        ]
    return {"table": kv_table(rows, "environment-table")}


def leaves_text(leaves: list[InputLeafRecord]) -> str:
    """The input contract's leaves: ``tokens (64,) int32 ids 0..16; mask (64,) bool``."""
    return "; ".join(
        f"{leaf['leaf']} {tuple(leaf['shape'])} {leaf['dtype']}"
        + (f" ids {leaf['range'][0]}..{leaf['range'][1]}" if "range" in leaf else "")
        + (f" ({leaf['meaning']})" if leaf.get("meaning") else "")
        for leaf in leaves
    )


def agreement(check: CheckDetails) -> AgreementSection:
    """``{"intro", "not_provided", "capped", "summary": table, "cases": [{"name", "n_pairs",
    "passed", "pairs": table, "losses": table | None, "rules": table | None}]}``."""
    tol = check["tolerance"]
    summary = table(
        (
            "case",
            "kind",
            "shape",
            "what",
            "pairs",
            "worst max_abs",
            "worst max_rel",
            "worst max_rel vs float64",
            "contract / finiteness problems",
            "result",
        ),
        (_case_row(name, case) for name, case in check["cases"].items()),
        numeric=(5, 6, 7),
        table_id="agreement",
        row_class="case",
    )
    return {
        "intro": (
            f"Each pair passes when |a - b| <= atol + rtol * S elementwise, "
            f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}, S = {scale_text(tol)}; "
            "errors computed in float64. "
            "The vector case is also compared with every path's output for `single`."
        ),
        "not_provided": not_provided_lines(check),
        # What a budget capped: the rows each capped part covered (conf/budget/).
        "capped": budget_lines(check),
        "summary": summary,
        "cases": [_case_tables(name, case) for name, case in check["cases"].items()],
    }


def _case_row(name: str, case: CaseReport) -> tuple[list[Any], bool]:
    """A case's row of the agreement table: its worst figures and its problems."""
    oracle_rel = [r["max_rel"] for r in case.get("oracle", {}).values() if r["max_rel"] is not None]
    problems = [f"{p}: {m}" for p, msgs in in_path_order(case.get("contract", {})) for m in msgs]
    # Row by row (batch axis 0): the rows the other figures leave out.
    rows = case.get("non_finite_rows", {})
    problems += [
        f"{p}: non-finite output"
        + (f" on row(s) {', '.join(map(str, rows[p]))}" if p in rows else "")
        for p, ok in in_path_order(case.get("finite", {}))
        if not ok
    ]
    if case.get("oracle_not_judged"):
        problems.append(f"float64 oracle {case['oracle_not_judged']}")
    return (
        [
            name,
            case["kind"],
            shape_text(case["shape"]),
            case.get("about", ""),
            len(case["pairs"]),
            case["max_abs"],
            case["max_rel"],
            max(oracle_rel) if oracle_rel else None,
            "; ".join(problems) or "none",
            result_cell(case["passed"]),
        ],
        case["passed"],
    )


def _case_tables(name: str, case: CaseReport) -> CaseTables:
    """A case's own tables: every pair (in the order the check made them: registry
    order), the losses on its targets, and the rules its kind adds."""
    pairs = table(
        ("case", "pair", "max_abs", "max_rel", "result", "reason"),
        (
            (
                [
                    name,
                    pair,
                    r["max_abs"],
                    r["max_rel"],
                    result_cell(r["passed"]),
                    r.get("reason", ""),
                ],
                r["passed"],
            )
            for pair, r in case["pairs"].items()
        ),
        numeric=(2, 3),
        table_id=f"pairs-{name}",
        row_class="pair",
    )
    losses = case.get("loss", {})
    return {
        "name": name,
        "n_pairs": len(case["pairs"]),
        "passed": bool(case["passed"]),
        "pairs": pairs,
        "losses": table(
            ("path", "MSE on the case's targets"),
            (([p, v], None) for p, v in in_path_order(losses)),
            numeric=(1,),
        )
        if losses
        else None,
        "rules": _rules_table(name, case.get("rules", {})),
    }


def _rules_table(case: str, rules: Mapping[str, RuleRecord]) -> Any:
    """The rules a case's kind adds to agreement (vmapcheck.check.rules), each shown
    alike: what it checks, what it found, its figures; None when it has none."""
    if not rules:
        return None
    rows = (
        (
            [
                name,
                rule(name).about,
                r["text"],
                "; ".join(
                    f"{k} {num(v) if v is not None else 'not measured'}"
                    for k, v in r["figures"].items()
                ),
                result_cell(r["passed"]),
            ],
            r["passed"],
        )
        for name, r in rules.items()
    )
    return table(
        ("rule", "what it checks", "found", "figures", "result"),
        rows,
        table_id=f"rules-{case}",
        row_class="rule",
    )


def scale_text(tolerance: Mapping[str, Any]) -> str:
    """What S is under the tolerance's ``scale`` (docs/checks.md, Tolerances)."""
    if tolerance.get("scale", "output") == "terms":
        return "max(S_terms, |a|, |b|), S_terms the magnitude of the terms each output sums"
    return "max(|a|, |b|)"


def path_matrix(
    by_case: Mapping[str, Mapping[str, Comparison]], table_id: str, stat: str = "max_rel"
) -> Table:
    """case x path table of one statistic, each cell coloured by its pass/fail; the
    columns are the paths any case has, in registry order."""
    present = dict.fromkeys(path for results in by_case.values() for path in results)
    paths = [path for path, _ in in_path_order(present)]
    rows = []
    for case, results in by_case.items():
        cells: list[Any] = [case]
        for path in paths:
            r = results.get(path)
            if r is None:
                cells.append("")
            else:
                title = f"max_abs={num(r['max_abs'])} {r.get('reason', '')}".strip()
                cells.append(figure_cell(r, stat, title))
        rows.append((cells, all(r["passed"] for r in results.values())))
    return table(("case", *paths), rows, table_id=table_id)


def oracle(check: CheckDetails) -> OracleSection:
    """``{"computed", "why"}`` or ``{"computed", "intro", "table"}``."""
    by_case = {n: c["oracle"] for n, c in check["cases"].items() if "oracle" in c}
    cross = check["cross_run_tolerance"]
    if not by_case:
        why = check.get("oracle", "absent")
        # A sampling model's line says "not judged: <why>" itself (core.record).
        lead = "" if why.startswith("not judged") else "Not computed: "
        return {"computed": False, "why": f"{lead}{why}."}
    return {
        "computed": True,
        "intro": (
            f"max_rel per case and path, at the cross-run tolerance rtol={num(cross['rtol'])}, "
            f"atol={num(cross['atol'])} (hover a cell for max_abs)."
        ),
        "table": path_matrix(by_case, "oracle-table"),
    }


def reference(check: CheckDetails) -> ReferenceSection:
    """``{"compared", "passed", "meta": table, "cases": table | None, "losses": table | None}``."""
    ref = check["reference"]
    if ref.get("status") != "ok":
        return {
            "compared": False,
            "passed": bool(ref["passed"]),
            "meta": kv_table(
                [
                    ("status", ref.get("status")),
                    ("message", cell(ref.get("message", ""), prose=True)),
                    ("required", ref.get("required")),
                ],
                "reference-table",
            ),
            "cases": None,
            "losses": None,
        }
    tol = ref["tolerance_used"]
    losses = ref.get("losses", {})
    return {
        "compared": True,
        "passed": bool(ref["passed"]),
        "meta": kv_table(
            [
                ("compared", cell(ref["message"], prose=True)),
                ("made at", ref.get("created_at")),
                ("why", ref.get("reason")),
                ("from MLflow run", ref.get("from_run") or "-"),
                ("tolerance used", f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}"),
            ],
            "reference-table",
        ),
        "cases": path_matrix(ref.get("cases", {}), "reference-cases"),
        "losses": table(
            ("case", "stored loss", "loss now", "result"),
            (
                ([c, v["reference"], v["current"], result_cell(v["passed"])], v["passed"])
                for c, v in losses.items()
            ),
            numeric=(1, 2),
            table_id="reference-losses",
        )
        if losses
        else None,
    }


def composition(check: CheckDetails) -> JudgedTableSection:
    """Each batch path on each regrouped batch against itself on the batch as it is:
    ``{"judged", "intro", "table"}``."""
    by_case = check.get("composition")
    if by_case is None:
        return {"judged": False, "intro": "Not judged (a report older than it).", "table": None}
    tol = check["tolerance"]
    rows = []
    for case, by_path in by_case.items():
        for path, result in in_path_order(by_path):
            cells: list[Any] = [case, path]
            cells += [
                figure_cell(result[g], "max_abs", result[g].get("reason", "")) for g in REGROUPINGS
            ]
            reasons = [
                f"{g}: {result[g]['reason']}" for g in REGROUPINGS if not result[g]["passed"]
            ]
            cells += [result_cell(result["passed"]), "; ".join(reasons)]
            rows.append((cells, result["passed"]))
    return {
        "judged": True,
        "intro": (
            "The loop and vmap forms compute each row from that row alone; a hand-batched "
            "or distributed form may see its batch-mates. Each batch path also ran on every "
            "case of 2 or more rows "
            + "; ".join(f"{g.name}: {g.about}" for g in REGROUPINGS.values())
            + f". Its outputs, back in the original row order, must agree with its own "
            f"outputs on the batch as it is: |a - b| <= atol + rtol * S, "
            f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}, S = {scale_text(tol)}."
        ),
        "table": table(
            ("case", "path", *(f"{g} max_abs" for g in REGROUPINGS), "result", "reason"),
            rows,
            table_id="composition-table",
            row_class="composition",
        ),
    }


def bitwise(check: CheckDetails) -> MeasuredTableSection:
    """Bitwise batch invariance (:mod:`vmapcheck.core.bitwise`): one row per batch path,
    ``{"measured", "intro", "table"}``."""
    from vmapcheck.core.bitwise_verdict import first_op_text

    section = check.get("bitwise")
    if section is None:
        return {"measured": False, "intro": "Not measured in this run.", "table": None}
    rows = []
    for path, p in in_path_order(section["paths"]):
        plain = p["vs_plain"]
        cells: list[Any] = [
            path,
            "yes" if p["bitwise"] else "no",
            f"{p['rows_differing']}/{p['rows']}",
            p["max_ulp"],
            "-" if plain is None else ("yes" if plain["rows_differing"] == 0 else "no"),
            first_op_text(p["first_op"]) or "-",
            "-" if p["argmax_flips"] is None else p["argmax_flips"],
        ]
        # Coloured only where it is required: reported, a difference is no failure.
        judged = None if section.get("mode") != "require" else p["bitwise"]
        rows.append((cells, judged))
    flips = section["argmax_flips"]
    capped = (
        f" ({section['rows_alone']} of its {section['rows']} rows run alone: "
        f"{section['capped_by']})"
        if section["capped_by"]
        else ""
    )
    return {
        "measured": True,
        "intro": (
            f"On {section['backend']} ({section['device_kind']}), case {section['case']}"
            f"{capped}: each row of each batch path's output on the batch, against the same "
            "row computed alone (a batch of 1), with the rows permuted and with the batch "
            f"split, bit for bit; and against the plain loop ({section['plain']}). Max ULP "
            f"in {section['dtype']}. Mode {section.get('mode', 'report')!r}: "
            + (
                "a path that is not bitwise fails."
                if section.get("mode") == "require"
                else "reported, never failed (agreement within the tolerance is the check)."
            )
            + (
                f" Argmax flips over every output: {flips['flipped']}/{flips['rows']} rows."
                if flips is not None
                else ""
            )
        ),
        "table": table(
            (
                "path",
                "bitwise",
                "rows differing",
                "max ULP",
                "= loop",
                "first op where the bits part",
                "argmax flips",
            ),
            rows,
            numeric=(3,),
            table_id="bitwise-table",
            row_class="bitwise",
        ),
    }


def negative(check: CheckDetails) -> TableSection:
    """``{"table"}``: each invalid-input case, what every path said."""
    rows = []
    for name, case in check["negative"].items():
        paths = case["paths"]
        refused = sum(p["refused"] for p in paths.values())
        messages = {(p["error"], p["message"]) for p in paths.values()}
        if len(messages) == 1:
            error, message = next(iter(messages))
            said: Any = f"every path: {error}: {message}"
        else:
            said = cell(
                "",
                lines=[
                    f"{path}: {p['error'] or 'an output'}: {p['message']}"
                    for path, p in in_path_order(paths)
                ],
            )
        rows.append(
            (
                [
                    name,
                    case.get("about", ""),
                    case.get("runs_on", "batch"),
                    " ... ".join(case["expect"]),
                    f"{refused}/{len(paths)}",
                    said,
                    result_cell(case["passed"]),
                ],
                case["passed"],
            )
        )
    return {
        "table": table(
            (
                "case",
                "input",
                "runs on",
                "message must contain",
                "refused",
                "what the paths said",
                "result",
            ),
            rows,
            table_id="negative-table",
            row_class="negative",
        )
    }


def gradients(check: CheckDetails) -> GradientsSection:
    """``{"checked", "why"}`` or ``{"checked", "passed", "facts": table, "leaves": table}``."""
    grads = check.get("gradients", {})
    if grads.get("status") != "ok":
        return {"checked": False, "why": f"Not checked ({grads.get('status', 'absent')})."}
    probe = grads["nan_probe"]
    facts = kv_table(
        [
            ("loss on the standard case", num(grads["loss"], 6)),
            ("loss finite", grads["loss_finite"]),
            ("gradients finite", grads["grads_finite"]),
            ("per-example gradients finite", grads["per_example_finite"]),
            (
                "NaN probe",
                f"{probe['planted']}: loss "
                f"{'NaN (detected)' if not probe['loss_finite'] else 'finite (MASKED)'}, "
                f"gradients {'finite' if probe['grads_finite'] else 'not finite'}",
            ),
        ],
        "gradients-facts",
    )
    leaves = table(
        ("params leaf", "max_abs", "max_rel", "result", "reason"),
        (
            (
                [leaf, r["max_abs"], r["max_rel"], result_cell(r["passed"]), r.get("reason", "")],
                r["passed"],
            )
            for leaf, r in grads["per_example_vs_batch"].items()
        ),
        numeric=(1, 2),
        table_id="gradients-table",
    )
    return {"checked": True, "passed": bool(grads["passed"]), "facts": facts, "leaves": leaves}
