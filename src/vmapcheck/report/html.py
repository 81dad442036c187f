"""One self-contained HTML page for a pipeline run: verdict, environment, agreement,
negative cases, gradients, latency tables and plots, machine conditions and the limits.

The page needs nothing but itself: the CSS is inline and the plots are PNG data URIs
(matplotlib, via :mod:`vmapcheck.bench.plots`), so it opens from the MLflow artifact store, a
mail attachment or a CI artifact alike. Every value taken from a report goes through
:func:`html.escape` (case, path, leaf and feature names can come from the user); only
fragments built here are marked :class:`Markup` and inserted as they are.

Inputs are the stage reports as written: ``check`` = ``reports/check_details.json``,
``bench`` = ``reports/bench_details.json``, ``train`` = ``reports/train.json``,
``contract`` = ``data/params/contract.json``.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from vmapcheck.bench.plots import latency_png, speedup_png

# The check's own limits; the benchmark's come from bench_details.json ("limits").
CHECK_LIMITS = (
    "Agreement is shown for the regression cases listed above, at the tolerances named; "
    "other inputs, batch sizes, dtypes or models were not checked.",
    "The result holds for the backend, device and JAX / jaxlib versions in the "
    "environment table; another backend or version may round differently (the stored "
    "reference is how a later run finds out).",
    "The float64 oracle is computed on CPU: it bounds rounding error, not a bug shared by "
    "every path (the stored reference and the loss on real targets cover part of that).",
)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #1f2328; background: #fff; line-height: 1.4; }
main { max-width: 1200px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.5rem; margin: 0.5rem 0; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1rem; margin-bottom: 0.3rem; }
.verdict { padding: 1rem 1.25rem; border-radius: 6px; color: #fff; margin: 1rem 0; }
.verdict.passed { background: #1a7f37; }
.verdict.failed { background: #cf222e; }
.verdict .word { font-size: 2rem; font-weight: 700; letter-spacing: 0.05em; }
.verdict ul { margin: 0.5rem 0 0; }
.note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px;
  padding: 0.5rem 0.75rem; margin: 0.5rem 0; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.85rem; }
th, td { border: 1px solid #d0d7de; padding: 0.2rem 0.5rem; text-align: left;
  vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; font-family: ui-monospace,
  SFMono-Regular, Menlo, monospace; }
tr.pass td.result, td.pass { background: #dafbe1; }
tr.fail td, td.fail { background: #ffebe9; font-weight: 600; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.85em; }
details { margin: 0.3rem 0; }
summary { cursor: pointer; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { font-size: 0.85rem; color: #59636e; }
footer { margin-top: 2rem; font-size: 0.8rem; color: #59636e; }
"""


class Markup(str):
    """HTML built by this module: inserted as is (everything else is escaped)."""


def esc(value: Any) -> Markup:
    """``value`` as escaped HTML text (a :class:`Markup` passes through unchanged)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def num(value: Any, digits: int = 3) -> str:
    """A figure in ``digits`` significant digits; ``-`` when missing, ``nan``/``inf`` as such."""
    if value is None or isinstance(value, bool):
        return "-" if value is None else str(value)
    value = float(value)
    return f"{value:.{digits}g}" if math.isfinite(value) else str(value)


def verdict_cell(passed: bool | None) -> Markup:
    if passed is None:
        return Markup('<td class="result">-</td>')
    return Markup(
        f'<td class="result {"pass" if passed else "fail"}">{"pass" if passed else "FAIL"}</td>'
    )


def _cell(value: Any, numeric: bool = False) -> Markup:
    if isinstance(value, Markup) and value.startswith("<td"):
        return value
    if numeric and not isinstance(value, Markup):
        return Markup(f'<td class="num">{esc(num(value))}</td>')
    return Markup(f"<td>{esc(value)}</td>")


def table(
    headers: Iterable[str],
    rows: Iterable[tuple[Iterable[Any], bool | None]],
    *,
    numeric: Iterable[int] = (),
    table_id: str | None = None,
    row_class: str = "",
) -> Markup:
    """A table; each row is (cells, passed), ``passed`` colours the row (None: neutral).

    Cells are escaped unless they are :class:`Markup`; a cell that is a whole ``<td>``
    (see :func:`verdict_cell`) is used as it is. Columns in ``numeric`` are formatted with
    :func:`num` and right-aligned.
    """
    numeric = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for cells, passed in rows:
        classes = " ".join(
            c for c in (row_class, {True: "pass", False: "fail", None: ""}[passed]) if c
        )
        attr = f' class="{classes}"' if classes else ""
        tds = "".join(_cell(v, i in numeric) for i, v in enumerate(cells))
        body.append(f"<tr{attr}>{tds}</tr>")
    id_attr = f' id="{esc(table_id)}"' if table_id else ""
    return Markup(
        f"<table{id_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def section(title: str, section_id: str, *parts: Any) -> Markup:
    body = "\n".join(esc(p) if not isinstance(p, Markup) else p for p in parts)
    return Markup(f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>\n{body}\n</section>')


def para(text: Any) -> Markup:
    return Markup(f"<p>{esc(text)}</p>")


def bullets(items: Iterable[Any], list_id: str | None = None) -> Markup:
    id_attr = f' id="{esc(list_id)}"' if list_id else ""
    return Markup(f"<ul{id_attr}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")


def png_img(data: bytes, alt: str, caption: str, img_id: str) -> Markup:
    """A figure whose image is embedded as a ``data:image/png;base64`` URI."""
    encoded = base64.b64encode(data).decode("ascii")
    return Markup(
        f'<figure><img id="{esc(img_id)}" alt="{esc(alt)}" '
        f'src="data:image/png;base64,{encoded}"><figcaption>{esc(caption)}</figcaption></figure>'
    )


def _by_batch(labels: Iterable[str]) -> list[str]:
    """``b<rows>`` labels in numeric order."""
    return sorted(labels, key=lambda label: int(label[1:]))


# --- sections ------------------------------------------------------------------------------


def _verdict(check: dict[str, Any], bench: dict[str, Any]) -> Markup:
    passed = bool(check["passed"])
    runtime, tol = check["runtime"], check["tolerance"]
    word = "PASSED" if passed else "FAILED"
    headline = (
        f"loop, vmap and direct forwards (eager and jit) on {runtime['backend']} "
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
    reference = check.get("reference", {})
    if reference.get("status") not in (None, "ok"):
        notes.append(
            f"Stored reference: {reference['status']}: {reference.get('message', '')} "
            f"(required: {reference.get('required')})."
        )
    for path, reason in check.get("not_provided", {}).items():
        notes.append(f"Path {path} not provided by the model: {reason}")
    note_html = (
        '<div id="verdict-notes">'
        + "".join(f'<div class="note">{esc(n)}</div>' for n in notes)
        + "</div>"
        if notes
        else ""
    )
    return Markup(
        f'<div id="verdict" class="verdict {"passed" if passed else "failed"}" '
        f'data-verdict="{"passed" if passed else "failed"}">'
        f'<div class="word">{word}</div><div>{esc(headline)}</div>{shown}</div>{note_html}'
    )


def _environment(
    check: dict[str, Any],
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
            ("outputs", ", ".join(contract["outputs"]["names"])),
            ("params leaves", len(contract.get("params", {}))),
            ("batched forward provided", contract.get("batched_forward")),
        ]
    return section("Environment", "environment", _kv_table(rows, "environment-table"))


def _kv_table(rows: Iterable[tuple[str, Any]], table_id: str) -> Markup:
    return table(("what", "value"), (([k, v], None) for k, v in rows), table_id=table_id)


def _agreement(check: dict[str, Any]) -> Markup:
    tol = check["tolerance"]
    summary_rows = []
    details = []
    for name, case in check["cases"].items():
        oracle = [r["max_rel"] for r in case.get("oracle", {}).values() if r["max_rel"] is not None]
        problems = [f"{p}: {m}" for p, msgs in case.get("contract", {}).items() for m in msgs]
        problems += [
            f"{p}: non-finite output" for p, ok in case.get("finite", {}).items() if not ok
        ]
        summary_rows.append(
            (
                [
                    name,
                    case["kind"],
                    "x".join(str(d) for d in case["shape"]),
                    case.get("about", ""),
                    len(case["pairs"]),
                    case["max_abs"],
                    case["max_rel"],
                    max(oracle) if oracle else None,
                    "; ".join(problems) or "none",
                    verdict_cell(case["passed"]),
                ],
                case["passed"],
            )
        )
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
                (([p, v], None) for p, v in losses.items()),
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
            f"Each pair passes when |a - b| <= atol + rtol * max(|a|, |b|) elementwise, "
            f"rtol={num(tol['rtol'])}, atol={num(tol['atol'])}; errors computed in float64. "
            "The vector case is also compared with every path's output for `single`."
        ),
        summary,
        Markup("<h3>Pairs, per case</h3>"),
        *details,
    )


def _path_matrix(
    by_case: dict[str, dict[str, dict[str, Any]]], table_id: str, stat: str = "max_rel"
) -> Markup:
    """case x path table of one statistic, each cell coloured by its pass/fail."""
    paths: list[str] = []
    for results in by_case.values():
        paths += [p for p in results if p not in paths]
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


def _oracle(check: dict[str, Any]) -> Markup:
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
        _path_matrix(by_case, "oracle-table"),
    )


def _reference(check: dict[str, Any]) -> Markup:
    ref = check["reference"]
    if ref.get("status") != "ok":
        return section(
            "Stored reference",
            "reference",
            _kv_table(
                [
                    ("status", ref.get("status")),
                    ("message", ref.get("message", "")),
                    ("required", ref.get("required")),
                ],
                "reference-table",
            ),
            Markup(verdict_line(ref["passed"])),
        )
    tol = ref["tolerance_used"]
    meta = _kv_table(
        [
            ("compared", ref["message"]),
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
        _path_matrix(ref.get("cases", {}), "reference-cases"),
        loss_table,
        Markup(verdict_line(ref["passed"])),
    )


def verdict_line(passed: bool) -> Markup:
    return Markup(f"<p><strong>{'passed' if passed else 'FAILED'}</strong></p>")


def _negative(check: dict[str, Any]) -> Markup:
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
                    for path, p in paths.items()
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


def _gradients(check: dict[str, Any]) -> Markup:
    grads = check.get("gradients", {})
    if grads.get("status") != "ok":
        return section(
            "Gradients", "gradients", para(f"Not checked ({grads.get('status', 'absent')}).")
        )
    probe = grads["nan_probe"]
    facts = _kv_table(
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


def _latency(bench: dict[str, Any], title: str) -> Markup:
    latency, figures = bench["latency_ms"], bench.get("figures", {})
    level = bench.get("bench", {}).get("confidence_level")
    ci = f"median {num(level * 100)}% CI" if level else "median CI"
    rows = []
    for path, by_batch in latency.items():
        for label in _by_batch(by_batch):
            s = by_batch[label]
            f = figures.get(path, {}).get(label, {})
            roofline = f.get("roofline")
            rows.append(
                (
                    [
                        path,
                        int(label[1:]),
                        s["p50"],
                        s["p90"],
                        s["p99"],
                        f"{num(s.get('median_ci_low'))} - {num(s.get('median_ci_high'))}",
                        s.get("n"),
                        s.get("rows_per_s"),
                        f.get("compile_ms"),
                        f.get("first_call_ms"),
                        f.get("gflops"),
                        None if roofline is None else roofline * 100,
                    ],
                    None,
                )
            )
    latency_table = table(
        (
            "path",
            "batch",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            ci,
            "n",
            "rows/s (p50)",
            "compile ms",
            "first call ms",
            "GFLOP/s (p50)",
            "% of matmul peak",
        ),
        rows,
        numeric=(1, 2, 3, 4, 6, 7, 8, 9, 10, 11),
        table_id="latency-table",
        row_class="latency",
    )
    skipped = [
        f"{path} at batch {label[1:]}: {reason}"
        for path, by_batch in bench.get("skipped", {}).items()
        for label, reason in by_batch.items()
    ]
    speedup = bench.get("speedup", {})
    speed_table = table(
        ("batch", "vmap over loop (x faster)", "vmap over direct (cost, 1 = free)"),
        (
            (
                [
                    int(label[1:]),
                    speedup[label].get("vmap_over_loop"),
                    speedup[label].get("vmap_over_direct"),
                ],
                None,
            )
            for label in _by_batch(speedup)
        ),
        numeric=(0, 1, 2),
        table_id="speedup-table",
    )
    peak = bench.get("peak")
    config = bench.get("bench", {})
    parts: list[Any] = [
        para(
            f"Benchmark `{config.get('name', '?')}`: {config.get('warmup', '?')} warm-up "
            f"call(s), then {config.get('repeats', '?')} timed calls per path and batch size, "
            "after compilation (compile time apart). Ratios compare p50s measured in the "
            "same run."
            + (
                f" Matmul peak measured in the same run ({peak['size']}^3): "
                f"{num(peak['gflops'])} GFLOP/s."
                if peak
                else ""
            )
        ),
        latency_table,
    ]
    if skipped:
        parts += [para("Not measured:"), bullets(skipped, "skipped")]
    parts += [
        speed_table,
        png_img(
            latency_png(latency, title),
            "p50 latency per call against batch size, per path",
            "Latency per call against batch size (log-log), p50 with a band to p90.",
            "plot-latency",
        ),
    ]
    if speedup:
        parts.append(
            png_img(
                speedup_png(speedup, title),
                "vmap speed-up over the loop and cost over the hand-batched forward",
                "p50 ratios against batch size: vmap_over_loop > 1 means vmap is faster "
                "than the loop; vmap_over_direct near 1 means vmap costs nothing over the "
                "hand-batched forward.",
                "plot-speedup",
            )
        )
    return section("Latency", "latency", *parts)


def _machine(bench: dict[str, Any]) -> Markup:
    machine = bench.get("machine")
    if not machine:
        return section("Machine conditions", "machine", para("Not recorded."))
    before, after = machine["before"], machine["after"]
    keys = list(before) + [k for k in after if k not in before]

    def shown(value: Any) -> Any:
        return num(value, 4) if isinstance(value, float) else value

    rows = (([k, shown(before.get(k, "-")), shown(after.get(k, "-"))], None) for k in keys)
    noisy = bool(machine["noisy"])
    said = (
        "YES: load average above the usable cores; treat the latencies as rough" if noisy else "no"
    )
    flag = Markup(
        f'<p id="noisy" data-noisy="{str(noisy).lower()}"><strong>noisy: {said}</strong></p>'
    )
    return section(
        "Machine conditions during the benchmark",
        "machine",
        flag,
        table(("what", "before", "after"), rows, table_id="machine-table"),
    )


def _train(train: dict[str, Any]) -> Markup:
    rows = [(k, num(v, 6) if isinstance(v, float) else v) for k, v in train.items()]
    return section("Training", "train", _kv_table(rows, "train-table"))


def _limits(bench: dict[str, Any]) -> Markup:
    return section(
        "Limits of this result",
        "limits",
        bullets([*CHECK_LIMITS, *bench.get("limits", [])], "limits-list"),
    )


def render_report(
    check: dict[str, Any],
    bench: dict[str, Any],
    train: dict[str, Any],
    contract: dict[str, Any] | None = None,
    *,
    git: dict[str, str] | None = None,
    run: dict[str, Any] | None = None,
    generated_at: datetime | None = None,
) -> str:
    """The whole report as one HTML document (str, UTF-8 text).

    ``git``: {"git_commit", "git_dirty"} (:func:`vmapcheck.tracking.provenance.git_state`);
    ``run``: extra rows shown first in the environment table (e.g. model, MLflow run name).
    """
    git = git or {"git_commit": "unknown", "git_dirty": "unknown"}
    run = run or {}
    runtime = check["runtime"]
    model = (contract or {}).get("model", run.get("model", "model"))
    title = (
        f"{model} on {runtime['backend']} ({runtime['device_kind']}), {check['dtype']}, "
        f"jax {runtime['jax_version']}"
    )
    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    verdict = "PASSED" if check["passed"] else "FAILED"
    body = "\n".join(
        [
            f"<h1>vmapcheck: {esc(title)}</h1>",
            _verdict(check, bench),
            _environment(check, bench, contract, git, run),
            _agreement(check),
            _oracle(check),
            _reference(check),
            _negative(check),
            _gradients(check),
            _latency(bench, title),
            _machine(bench),
            _train(train),
            _limits(bench),
            f"<footer>Generated {esc(when)} by vmapcheck from reports/check_details.json, "
            "reports/bench_details.json, reports/train.json and data/params/contract.json."
            "</footer>",
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>vmapcheck {verdict}: {esc(title)}</title>"
        f"<style>{CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n"
    )
