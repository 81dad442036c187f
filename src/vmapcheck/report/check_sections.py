"""The report's sections on the check (``reports/check_details.json``): the verdict
banner, the environment, agreement of every pair of paths, the float64 oracle, the
stored reference, batch composition, invalid inputs and gradients.

Paths are listed in the order of the registry :data:`vmapcheck.core.paths.PATHS`
(:func:`~vmapcheck.report.elements.in_path_order`); no section names a path itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vmapcheck.check.schema import CheckDetails
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.paths import PATHS
from vmapcheck.report.elements import (
    Markup,
    bullets,
    esc,
    in_path_order,
    kv_table,
    num,
    para,
    prose,
    section,
    shape_text,
    table,
    verdict_cell,
    verdict_line,
)


def forms_compared(check: Mapping[str, Any]) -> str:
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
    sharded = check.get("sharded")
    if sharded:
        text += (
            f", and {sharded['path']} (data-parallel over {sharded['devices']} device(s), not vmap)"
        )
    return text


def and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def verdict(check: CheckDetails, bench: dict[str, Any]) -> Markup:
    passed = bool(check["passed"])
    runtime, tol = check["runtime"], check["tolerance"]
    word = "PASSED" if passed else "FAILED"
    headline = (
        f"{forms_compared(check)} on {runtime['backend']} "
        f"({runtime['device_kind']}), {check['dtype']}, rtol={num(tol['rtol'])} "
        f"atol={num(tol['atol'])}, jax {runtime['jax_version']} / jaxlib "
        f"{runtime['jaxlib_version']}"
    )
    failures = list(check["failures"])
    shown = Markup("")
    if failures:
        shown = Markup(
            f"<p>{len(failures)} failure(s):</p>"
            + bullets(failures[:50], "failures")
            + (esc(f"... and {len(failures) - 50} more") if len(failures) > 50 else "")
        )
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
    for path, reason in in_path_order(check.get("not_provided", {})):
        notes.append(f"Path {path} not provided by the model: {reason}")
    note_html = (
        '<div id="verdict-notes">'
        + "".join(f'<div class="note">{prose(n)}</div>' for n in notes)
        + "</div>"
        if notes
        else ""
    )
    return Markup(
        f'<div id="verdict" class="verdict {"passed" if passed else "failed"}" '
        f'data-verdict="{"passed" if passed else "failed"}">'
        f'<div class="word">{word}</div><div>{esc(headline)}</div>{shown}</div>{note_html}'
    )


def environment(
    check: CheckDetails,
    bench: dict[str, Any],
    contract: dict[str, Any] | None,
    git: dict[str, str],
    run: dict[str, Any],
) -> Markup:
    runtime = check["runtime"]
    machine = bench.get("machine", {}).get("before", {})
    tol, cross = check["tolerance"], check["cross_run_tolerance"]
    rows: list[tuple[str, Any]] = [
        *((k, v) for k, v in run.items()),
        ("jax / jaxlib", f"{runtime['jax_version']} / {runtime['jaxlib_version']}"),
        ("Python", runtime["python_version"]),
        ("backend (platform)", f"{runtime['backend']} ({runtime['platform']})"),
        ("device kind, count", f"{runtime['device_kind']}, {runtime['device_count']}"),
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
    return section("Environment", "environment", kv_table(rows, "environment-table"))


def leaves_text(leaves: list[dict[str, Any]]) -> str:
    """The input contract's leaves: ``tokens (64,) int32 ids 0..16; mask (64,) bool``."""
    return "; ".join(
        f"{leaf['leaf']} {tuple(leaf['shape'])} {leaf['dtype']}"
        + (f" ids {leaf['range'][0]}..{leaf['range'][1]}" if "range" in leaf else "")
        + (f" ({leaf['meaning']})" if leaf.get("meaning") else "")
        for leaf in leaves
    )


def agreement(check: CheckDetails) -> Markup:
    tol = check["tolerance"]
    summary_rows = []
    details = []
    for name, case in check["cases"].items():
        oracle_rel = [
            r["max_rel"] for r in case.get("oracle", {}).values() if r["max_rel"] is not None
        ]
        problems = [
            f"{p}: {m}" for p, msgs in in_path_order(case.get("contract", {})) for m in msgs
        ]
        problems += [
            f"{p}: non-finite output" for p, ok in in_path_order(case.get("finite", {})) if not ok
        ]
        summary_rows.append(
            (
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
                    verdict_cell(case["passed"]),
                ],
                case["passed"],
            )
        )
        # Pairs in the order the check made them (every pair of paths, in registry order).
        pair_rows = (
            (
                [
                    name,
                    pair,
                    r["max_abs"],
                    r["max_rel"],
                    verdict_cell(r["passed"]),
                    r.get("reason", ""),
                ],
                r["passed"],
            )
            for pair, r in case["pairs"].items()
        )
        pairs = table(
            ("case", "pair", "max_abs", "max_rel", "result", "reason"),
            pair_rows,
            numeric=(2, 3),
            table_id=f"pairs-{name}",
            row_class="pair",
        )
        losses = case.get("loss", {})
        loss_html = (
            table(
                ("path", "MSE on the case's targets"),
                (([p, v], None) for p, v in in_path_order(losses)),
                numeric=(1,),
            )
            if losses
            else Markup("")
        )
        open_attr = "" if case["passed"] else " open"
        details.append(
            Markup(
                f"<details{open_attr}><summary>{esc(name)}: {len(case['pairs'])} pairs, "
                f"{'all agree' if case['passed'] else 'FAILED'}</summary>{pairs}{loss_html}"
                "</details>"
            )
        )
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
        summary_rows,
        numeric=(5, 6, 7),
        table_id="agreement",
        row_class="case",
    )
    return section(
        "Agreement: every path against every other",
        "agreement-section",
        para(
            f"Each pair passes when |a - b| <= atol + rtol * S elementwise, "
            f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}, S = {scale_text(tol)}; "
            "errors computed in float64. "
            "The vector case is also compared with every path's output for `single`."
        ),
        summary,
        Markup("<h3>Pairs, per case</h3>"),
        *details,
    )


def scale_text(tolerance: dict[str, Any]) -> str:
    """What S is under the tolerance's ``scale`` (docs/checks.md, Tolerances)."""
    if tolerance.get("scale", "output") == "terms":
        return "max(S_terms, |a|, |b|), S_terms the magnitude of the terms each output sums"
    return "max(|a|, |b|)"


def path_matrix(
    by_case: Mapping[str, Mapping[str, Mapping[str, Any]]], table_id: str, stat: str = "max_rel"
) -> Markup:
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
                cls = "pass" if r["passed"] else "fail"
                title = f"max_abs={num(r['max_abs'])} {r.get('reason', '')}".strip()
                cells.append(
                    Markup(f'<td class="num {cls}" title="{esc(title)}">{esc(num(r[stat]))}</td>')
                )
        rows.append((cells, all(r["passed"] for r in results.values())))
    return table(("case", *paths), rows, table_id=table_id)


def oracle(check: CheckDetails) -> Markup:
    by_case = {n: c["oracle"] for n, c in check["cases"].items() if "oracle" in c}
    cross = check["cross_run_tolerance"]
    if not by_case:
        return section(
            "Float64 oracle", "oracle", para(f"Not computed: {check.get('oracle', 'absent')}.")
        )
    return section(
        "Float64 oracle: each path against the same model in float64 on CPU",
        "oracle",
        para(
            f"max_rel per case and path, at the cross-run tolerance rtol={num(cross['rtol'])}, "
            f"atol={num(cross['atol'])} (hover a cell for max_abs)."
        ),
        path_matrix(by_case, "oracle-table"),
    )


def reference(check: CheckDetails) -> Markup:
    ref = check["reference"]
    if ref.get("status") != "ok":
        return section(
            "Stored reference",
            "reference",
            kv_table(
                [
                    ("status", ref.get("status")),
                    ("message", prose(ref.get("message", ""))),
                    ("required", ref.get("required")),
                ],
                "reference-table",
            ),
            Markup(verdict_line(ref["passed"])),
        )
    tol = ref["tolerance_used"]
    meta = kv_table(
        [
            ("compared", prose(ref["message"])),
            ("made at", ref.get("created_at")),
            ("why", ref.get("reason")),
            ("from MLflow run", ref.get("from_run") or "-"),
            ("tolerance used", f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}"),
        ],
        "reference-table",
    )
    losses = ref.get("losses", {})
    loss_table = (
        table(
            ("case", "stored loss", "loss now", "result"),
            (
                ([c, v["reference"], v["current"], verdict_cell(v["passed"])], v["passed"])
                for c, v in losses.items()
            ),
            numeric=(1, 2),
            table_id="reference-losses",
        )
        if losses
        else Markup("")
    )
    return section(
        "Stored reference: this run against a verified earlier one",
        "reference",
        meta,
        para("max_rel per case and path against the stored outputs:"),
        path_matrix(ref.get("cases", {}), "reference-cases"),
        loss_table,
        Markup(verdict_line(ref["passed"])),
    )


def composition(check: CheckDetails) -> Markup:
    """Each batch path on each regrouped batch against itself on the batch as it is."""
    by_case = check.get("composition")
    title = "Batch composition: each path against itself with the batch regrouped"
    if by_case is None:
        return section(title, "composition", para("Not judged (a report older than it)."))
    tol = check["tolerance"]
    rows = []
    for case, by_path in by_case.items():
        for path, result in in_path_order(by_path):
            cells: list[Any] = [case, path]
            for g in REGROUPINGS:
                r = result[g]
                cls = "pass" if r["passed"] else "fail"
                cells.append(
                    Markup(
                        f'<td class="num {cls}" title="{esc(r.get("reason", ""))}">'
                        f"{esc(num(r['max_abs']))}</td>"
                    )
                )
            reasons = [
                f"{g}: {result[g]['reason']}" for g in REGROUPINGS if not result[g]["passed"]
            ]
            cells += [verdict_cell(result["passed"]), "; ".join(reasons)]
            rows.append((cells, result["passed"]))
    return section(
        title,
        "composition",
        para(
            "The loop and vmap forms compute each row from that row alone; a hand-batched "
            "or distributed form may see its batch-mates. Each batch path also ran on every "
            "case of 2 or more rows "
            + "; ".join(f"{g.name}: {g.about}" for g in REGROUPINGS.values())
            + f". Its outputs, back in the original row order, must agree with its own "
            f"outputs on the batch as it is: |a - b| <= atol + rtol * S, "
            f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}, S = {scale_text(tol)}."
        ),
        table(
            ("case", "path", *(f"{g} max_abs" for g in REGROUPINGS), "result", "reason"),
            rows,
            table_id="composition-table",
            row_class="composition",
        ),
    )


def negative(check: CheckDetails) -> Markup:
    rows = []
    for name, case in check["negative"].items():
        paths = case["paths"]
        refused = sum(p["refused"] for p in paths.values())
        messages = {(p["error"], p["message"]) for p in paths.values()}
        if len(messages) == 1:
            error, message = next(iter(messages))
            said = f"every path: {error}: {message}"
        else:
            said = Markup(
                "<br>".join(
                    esc(f"{path}: {p['error'] or 'an output'}: {p['message']}")
                    for path, p in in_path_order(paths)
                )
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
                    verdict_cell(case["passed"]),
                ],
                case["passed"],
            )
        )
    return section(
        "Invalid inputs: each must be refused by every path, the problem named",
        "negative",
        para(
            "A case passes when every path raises InvalidInputError and its message contains "
            "every expected part."
        ),
        table(
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
        ),
    )


def gradients(check: CheckDetails) -> Markup:
    grads = check.get("gradients", {})
    if grads.get("status") != "ok":
        return section(
            "Gradients", "gradients", para(f"Not checked ({grads.get('status', 'absent')}).")
        )
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
                [leaf, r["max_abs"], r["max_rel"], verdict_cell(r["passed"]), r.get("reason", "")],
                r["passed"],
            )
            for leaf, r in grads["per_example_vs_batch"].items()
        ),
        numeric=(1, 2),
        table_id="gradients-table",
    )
    return section(
        "Gradients: mean of per-example gradients (vmap of grad) against the batch gradient",
        "gradients",
        facts,
        leaves,
        verdict_line(grads["passed"]),
    )
