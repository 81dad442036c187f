"""The HTML report: one self-contained page, every value escaped, reviewer first,
rendered by a browser.

The inputs are built here in the layout the stages write (check_details.json,
bench_details.json, train.json, contract.json, perf_verdict.json), small but complete;
one case name and one feature name carry markup, as a user's names could. The report of
a real pipeline run is opened in Chromium by tests/test_e2e_pipeline.py.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import tomllib
from dataclasses import replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from itertools import combinations
from typing import Any

import numpy as np
import pytest

from tests.helpers.chromium import png_size, render
from tests.helpers.config import ROOT, compose_config
from tests.helpers.registries import forms_text
from vmapcheck.check.diagnosis import Probe, Subject, diagnose
from vmapcheck.check.schema import CheckDetails, read_check_details
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import not_provided, path_names
from vmapcheck.layout import Layout
from vmapcheck.report.check_sections import forms_compared
from vmapcheck.report.elements import code_spans
from vmapcheck.report.headline import check_headline
from vmapcheck.report.html import render_report
from vmapcheck.report.plots import latency_png
from vmapcheck.report.summary import summarize
from vmapcheck.tracking.review import tracked_lines

HOSTILE = '<script>alert("x")</script>'


def _result(max_abs: float, passed: bool = True, reason: str = "") -> dict[str, Any]:
    return {"max_abs": max_abs, "max_rel": max_abs / 2, "passed": passed, "reason": reason}


def _case(about: str, rows: int, bad_path: str | None = None) -> dict[str, Any]:
    pairs = {}
    for a, b in combinations(path_names("batch"), 2):
        bad = bad_path in (a, b)
        pairs[f"{a}-vs-{b}"] = (
            _result(0.37, False, "|a-b| = 0.37 > 1e-06 + 1e-05 * 0.5 at (0, 1)")
            if bad
            else _result(1.2e-7)
        )
    return {
        "kind": "batch",
        "shape": [rows, 3],
        "about": about,
        "max_abs": max(p["max_abs"] for p in pairs.values()),
        "max_rel": max(p["max_rel"] for p in pairs.values()),
        "contract": {p: [] for p in path_names("batch")},
        "finite": {p: True for p in path_names("batch")},
        "pairs": pairs,
        "oracle": {p: _result(2e-7) for p in path_names("batch")},
        "loss": {p: 0.0371 for p in path_names("batch")},
        "passed": bad_path is None,
    }


def _composition(bad_path: str | None) -> dict[str, Any]:
    """Each batch path against itself regrouped; ``bad_path`` changes when split."""
    by_path: dict[str, Any] = {}
    for p in path_names("batch"):
        by_path[p] = {g: _result(0.0) for g in REGROUPINGS}
        if p == bad_path:
            by_path[p]["split"] = _result(0.25, False, "element (1, 0): |a-b|=0.25 > 1e-06")
        by_path[p]["passed"] = p != bad_path
    return by_path


def _negative(refused_by_all: bool) -> dict[str, Any]:
    paths = {
        p: {
            "passed": True,
            "refused": True,
            "error": "InvalidInputError",
            "message": "expected 3 features, got 4",
        }
        for p in path_names("batch")
    }
    if not refused_by_all:
        paths["vmap_jit"] = {
            "passed": False,
            "refused": False,
            "error": None,
            "message": "produced an output of shape [2, 2]",
        }
    return {
        "about": "one feature too many",
        "expect": ["expected 3 features, got 4"],
        "runs_on": "batch",
        "passed": refused_by_all,
        "paths": paths,
    }


def _runtime() -> dict[str, Any]:
    return {
        "backend": "cpu",
        "platform": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "jax_version": "0.11.2",
        "jaxlib_version": "0.11.2",
        "python_version": "3.12.1",
        "os_platform": "Linux-x86_64-with-glibc2.36",
        "enable_x64": False,
        "matmul_precision": "highest",
        "xla_flags": "",
    }


def make_inputs(failed: bool) -> tuple[CheckDetails, dict, dict, dict]:
    """(check, bench, train, contract) as the stages write them; ``failed``: the
    hand-batched path disagrees on one case and vmap_jit accepts one invalid input."""
    cases = {
        "standard": _case("first 8 rows of the test split", 8),
        HOSTILE: _case("a user's case <b>name</b>", 2, "direct_jit" if failed else None),
    }
    negative = {"invalid_features": _negative(refused_by_all=not failed)}
    failures = []
    if failed:
        failures = [
            f"{HOSTILE}/{pair}: {r['reason']}"
            for pair, r in cases[HOSTILE]["pairs"].items()
            if not r["passed"]
        ] + [
            f"{HOSTILE}/direct_jit: outputs depend on batch composition (split: element (1, 0): "
            "|a-b|=0.25 > 1e-06)",
            "invalid_features/vmap_jit: expected InvalidInputError, got an output",
        ]
    check: CheckDetails = {
        "passed": not failed,
        "failures": failures,
        "dtype": "float32",
        "tolerance": {"rtol": 1e-5, "atol": 1e-6},
        "cross_run_tolerance": {"rtol": 1e-4, "atol": 1e-5},
        "oracle": "float64 (CPU)",
        "runtime": _runtime(),
        "not_provided": {},
        "sharded": None,
        "cases": cases,
        "negative": negative,
        "reference": {
            "status": "missing",
            "message": "no reference for model mlp",
            "required": False,
            "passed": True,
        },
        "gradients": {
            "status": "ok",
            "loss": 0.0371,
            "loss_finite": True,
            "grads_finite": True,
            "per_example_finite": True,
            "nan_probe": {
                "planted": "NaN in target row 0, output 0",
                "loss_finite": False,
                "grads_finite": False,
            },
            "per_example_vs_batch": {"layers[0].W": _result(1.9e-9), "layers[0].b": _result(0.0)},
            "max_abs": 1.9e-9,
            "max_rel": 9.5e-10,
            "passed": True,
        },
        "inputs": {
            "status": "ok",
            "key_stream": {"status": "ok", "summary": "every subkey feeds one draw"},
            "passed": True,
        },
        "composition": {
            "standard": _composition(None),
            HOSTILE: _composition("direct_jit" if failed else None),
        },
        "config_digest": "b4" * 32,
        "forward_outputs_sha256": "ed" * 32,
    }
    latency = {
        path: {
            f"b{rows}": {
                "p50": 0.01 * rows * (i + 1),
                "p90": 0.012 * rows * (i + 1),
                "p99": 0.02 * rows * (i + 1),
                "median_ci_low": 0.009 * rows * (i + 1),
                "median_ci_high": 0.011 * rows * (i + 1),
                "n": 5,
                "rows_per_s": rows / (0.01e-3 * rows * (i + 1)),
            }
            for rows in (1, 8)
        }
        for i, path in enumerate(path_names("batch"))
    }
    del latency["loop_eager"]["b8"]
    machine = {
        "cpu_model": "AMD EPYC",
        "logical_cores": 2,
        "usable_cores": 2,
        "load_avg_1m": 3.5,
        "memory_total_gib": 23.5,
        "backend": "cpu",
        "jax_version": "0.11.2",
    }
    bench = {
        "runtime": _runtime(),
        "bench": {"name": "quick", "warmup": 1, "repeats": 5, "confidence_level": 0.95},
        "batch_sizes": [1, 8],
        "latency_ms": latency,
        "figures": {
            p: {"b1": {"compile_ms": 80.0, "first_call_ms": 0.5, "gflops": 0.2, "roofline": 0.003}}
            for p in path_names("batch")
        },
        "speedup": {
            "b1": {"vmap_over_loop": 0.98, "vmap_over_direct": 1.0},
            "b8": {"vmap_over_loop": 1.5, "vmap_over_direct": 1.1},
        },
        "speedup_ci": {
            "b1": {"vmap_over_loop": [0.9, 1.05], "vmap_over_direct": [0.97, 1.04]},
            "b8": {"vmap_over_loop": [1.4, 1.6], "vmap_over_direct": [1.05, 1.15]},
        },
        "peak": {"size": 512, "p50_ms": 3.3, "gflops": 80.7},
        "skipped": {
            **{p: {} for p in path_names("batch")},
            "loop_eager": {"b8": "loop path capped at 1 rows (bench.loop_max_batch)"},
        },
        "machine": {"before": machine, "after": {**machine, "load_avg_1m": 3.9}, "noisy": True},
        "limits": ["A CPU result says nothing about GPU or TPU."],
    }
    train = {"trained": True, "best_step": 30, "train_loss": 0.0224, "val_loss": 0.0336}
    contract = {
        "model": "mlp",
        "description": "MLP [3, 4, 2]",
        "params": {"layers[0].W": {"shape": [3, 4], "dtype": "float32"}},
        "inputs": {"features": ["x0", "<i>x1</i>", "x2"], "n_features": 3},
        "outputs": {"names": ["y0", "y1"], "n_outputs": 2},
        "batched_forward": True,
    }
    return check, bench, train, contract


def perf_verdict(verdict: str = "no regression") -> dict[str, Any]:
    """reports/perf_verdict.json as track writes it (vmapcheck.bench.verdict.regression.compare),
    trimmed to what the report reads."""
    return {
        "verdict": verdict,
        "baseline": {"source": "run 4d67f809c2f14671808e61d678392840", "noisy": False},
        "current": {"source": "reports/bench_details.json", "noisy": False},
        "factor": 1.1,
        "alpha": 0.01,
        "regressions": ["vmap_jit/b8"] if verdict == "regression" else [],
        "improvements": ["loop_jit/b1"],
    }


class _Page(HTMLParser):
    """What the page holds: element ids, table rows by table id, images, link targets."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: dict[str, dict[str, str | None]] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self.images: list[dict[str, str | None]] = []
        self.urls: list[str] = []
        self.tags: list[str] = []
        self._table: list[str] = []
        self._cell: list[str] | None = None
        self._text: dict[str, list[str]] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids[a["id"] or ""] = a
            self._text[a["id"] or ""] = []
            if tag != "img":
                self._open.append(a["id"] or "")
        elif tag not in ("img", "br", "meta"):
            self._open.append("")
        if tag == "table":
            self._table.append(a.get("id") or "")
            self.rows.setdefault(self._table[-1], [])
        elif tag == "tr":
            self.rows[self._table[-1]].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(a)
        for name in ("src", "href"):
            if a.get(name):
                self.urls.append(a[name] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[self._table[-1]][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table.pop()
        if tag not in ("img", "br", "meta") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for element in self._open:
            if element:
                self._text[element].append(data)

    def text(self, element_id: str) -> str:
        return " ".join("".join(self._text[element_id]).split())


def parse(page: str) -> _Page:
    parsed = _Page()
    parsed.feed(page)
    parsed.close()
    return parsed


def _data_pngs(page: _Page) -> dict[str, bytes]:
    pngs = {}
    for img in page.images:
        src = img.get("src") or ""
        assert src.startswith("data:image/png;base64,"), f"{img.get('id')}: not embedded"
        pngs[img.get("id") or ""] = base64.b64decode(src.split(",", 1)[1], validate=True)
    return pngs


@pytest.mark.parametrize("failed", [False, True], ids=["passed", "failed"])
def test_report_holds_every_section_self_contained(failed):
    check, bench, train, contract = make_inputs(failed)
    before = copy.deepcopy((check, bench, train, contract))
    page_html = render_report(
        check,
        bench,
        train,
        contract,
        git={"git_commit": "a" * 40, "git_dirty": "false"},
        run={"MLflow run name": "mlp-cpu-f32-jax0.11.2-aaaaaaa"},
    )
    assert (check, bench, train, contract) == before  # the inputs are not modified
    page = parse(page_html)
    verdict = page.ids["verdict"]
    assert verdict["data-verdict"] == ("failed" if failed else "passed")
    assert page.text("verdict").startswith("FAILED" if failed else "PASSED")
    if failed:
        listed = page.text("failures")
        assert "invalid_features/vmap_jit" in listed and "direct_jit" in listed
    else:
        assert "failures" not in page.ids

    env = dict(tuple(row) for row in page.rows["environment-table"][1:])
    assert env["jax / jaxlib"] == "0.11.2 / 0.11.2"
    assert env["backend (platform)"] == "cpu (cpu)" and env["CPU model"] == "AMD EPYC"
    assert env["dtype"] == "float32" and env["git commit"] == "a" * 40
    assert env["tolerance (path vs path)"] == "rtol=1e-05, atol=1e-06"
    assert env["input features"] == "x0, <i>x1</i>, x2"  # shown as text, not markup
    assert env["MLflow run name"] == "mlp-cpu-f32-jax0.11.2-aaaaaaa"

    agreement = {row[0]: row for row in page.rows["agreement"][1:]}
    assert set(agreement) == {"standard", HOSTILE}
    assert agreement["standard"][-1] == "pass"
    assert agreement[HOSTILE][-1] == ("FAIL" if failed else "pass")
    pairs = page.rows[f"pairs-{HOSTILE}"][1:]
    assert len(pairs) == len(list(combinations(path_names("batch"), 2)))
    failing = [row[1] for row in pairs if row[4] == "FAIL"]
    assert failing == ([p for p in (r[1] for r in pairs) if "direct_jit" in p] if failed else [])

    assert [row[0] for row in page.rows["oracle-table"][1:]] == ["standard", HOSTILE]
    assert page.rows["reference-table"][1] == ["status", "missing"]
    negative = page.rows["negative-table"][1]
    assert negative[0] == "invalid_features"
    n = len(path_names("batch"))
    assert negative[4] == (f"{n - 1}/{n}" if failed else f"{n}/{n}")
    assert negative[-1] == ("FAIL" if failed else "pass")
    assert [row[0] for row in page.rows["gradients-table"][1:]] == ["layers[0].W", "layers[0].b"]
    composition = page.rows["composition-table"]
    assert composition[0] == [
        "case",
        "path",
        "permuted max_abs",
        "split max_abs",
        "result",
        "reason",
    ]
    assert len(composition) - 1 == 2 * len(path_names("batch"))
    failing = [row[:2] for row in composition[1:] if row[4] == "FAIL"]
    assert failing == ([[HOSTILE, "direct_jit"]] if failed else [])
    if failed:
        assert "outputs depend on batch composition" in page.text("failures")
        bad = next(row for row in composition if row[:2] == [HOSTILE, "direct_jit"])
        assert bad[3] == "0.25" and bad[5].startswith("split: element (1, 0)")

    latency = page.rows["latency-table"]
    assert latency[0][:5] == ["path", "batch", "p50 ms", "p90 ms", "p99 ms"]
    assert len(latency) - 1 == len(path_names("batch")) * 2 - 1  # loop_eager at batch 8 was skipped
    vmap_8 = next(row[:5] for row in latency if row[:2] == ["vmap_jit", "8"])
    k = path_names("batch").index("vmap_jit") + 1  # make_inputs: p50 = 0.01 ms * rows * k
    assert vmap_8 == ["vmap_jit", "8", *(f"{v * 8 * k:.3g}" for v in (0.01, 0.012, 0.02))]
    assert "loop_eager at batch 8: loop path capped" in page.text("skipped")
    assert page.ids["noisy"]["data-noisy"] == "true"
    assert "load average above" in page.text("verdict-notes")
    limits = page.text("limits-list")
    assert "A CPU result says nothing about GPU or TPU." in limits
    assert "other inputs, batch sizes, dtypes or models were not checked" in limits

    # Self-contained: the only URLs are the embedded PNGs, which decode as plots, and
    # links within the page to an element it has.
    assert all(
        url.startswith("data:image/png;base64,") or (url[0] == "#" and url[1:] in page.ids)
        for url in page.urls
    ), page.urls
    pngs = _data_pngs(page)
    assert set(pngs) == {"plot-latency", "plot-speedup"}
    for data in pngs.values():
        width, height = png_size(data)
        assert width > 300 and height > 200
    # Names from the reports are text: the only elements are the ones the report makes.
    assert "script" not in page.tags and "i" not in page.tags
    assert HOSTILE not in page_html and "&lt;script&gt;" in page_html


def test_report_renders_the_check_details_as_read_back(tmp_path):
    """The inputs are a whole CheckDetails: read back through the schema's reader (which
    checks the top-level keys), they render the same page."""
    check, bench, train, contract = make_inputs(failed=True)
    details = tmp_path / "check_details.json"
    details.write_text(json.dumps(check), encoding="utf-8")
    when = datetime(2024, 1, 2, tzinfo=UTC)
    assert render_report(
        read_check_details(details), bench, train, contract, generated_at=when
    ) == render_report(check, bench, train, contract, generated_at=when)


def test_plots_the_bench_stage_drew_are_embedded_as_they_are():
    """track hands over the bench stage's PNGs (reports/plots/): the page embeds those
    bytes, not a second drawing; a figure not handed over is drawn from bench."""
    check, bench, train, contract = make_inputs(failed=False)
    latency = latency_png(bench["latency_ms"], "drawn by bench")
    page = parse(
        render_report(check, bench, train, contract, drawn_plots={"plot-latency": latency})
    )
    pngs = _data_pngs(page)
    assert pngs["plot-latency"] == latency
    assert set(pngs) == {"plot-latency", "plot-speedup"}
    assert png_size(pngs["plot-speedup"])[0] > 300


def test_a_ratio_whose_interval_holds_one_reads_no_measurable_difference():
    check, bench, train, contract = make_inputs(failed=False)
    rows = parse(render_report(check, bench, train, contract)).rows["speedup-table"]
    assert rows[1:] == [
        ["1", "no measurable difference (CI 0.90-1.05)", "no measurable difference (CI 0.97-1.04)"],
        ["8", "1.50x (CI 1.40-1.60)", "1.10x (CI 1.05-1.15)"],
    ]
    del bench["speedup_ci"]  # a report from before the intervals: the ratios alone
    rows = parse(render_report(check, bench, train, contract)).rows["speedup-table"]
    assert rows[1:] == [["1", "0.98x", "1.00x"], ["8", "1.50x", "1.10x"]]


def test_optional_sections_say_what_was_not_done():
    check, bench, train, _ = make_inputs(failed=False)
    check["gradients"] = {"status": "not run", "passed": True}
    check["oracle"] = "none: the run is float64"
    for case in check["cases"].values():
        del case["oracle"]
    check["not_provided"] = {"direct_eager": "the model has no hand-batched forward"}
    del check["composition"]  # a report older than the composition check
    bench["speedup"] = {}
    page = parse(render_report(check, bench, train, None))
    assert "Not checked (not run)" in page.text("gradients")
    assert "Not computed: none: the run is float64" in page.text("oracle")
    assert "Not judged" in page.text("composition")
    assert "Not measured" in page.text("bitwise")  # no bitwise section in the report
    assert "direct_eager not provided: the model has no hand-batched" in page.text("verdict-notes")
    assert set(_data_pngs(page)) == {"plot-latency"}
    assert "git commit" in dict(tuple(r) for r in page.rows["environment-table"][1:])


@pytest.mark.parametrize(
    "failed,colour", [(False, (26, 127, 55)), (True, (207, 34, 46))], ids=["passed", "failed"]
)
def test_report_renders_in_headless_chromium(failed, colour, tmp_path):
    from PIL import Image

    check, bench, train, contract = make_inputs(failed)
    page = tmp_path / "report.html"
    page.write_text(render_report(check, bench, train, contract), encoding="utf-8")
    shown = render(page, tmp_path)
    print(f"screenshot: {shown['screenshot']}")
    probe = shown["probe"]
    word = "FAILED" if failed else "PASSED"
    assert probe["title"].startswith(f"vmapcheck {word}")
    assert probe["verdict"]["text"].startswith(word)
    assert probe["verdict"]["height"] > 40 and probe["verdict"]["width"] > 600
    assert probe["verdict"]["background"] == f"rgb({colour[0]}, {colour[1]}, {colour[2]})"
    assert [i["id"] for i in probe["images"]] == ["plot-latency", "plot-speedup"]
    for image in probe["images"]:  # decoded by the browser and laid out on the page
        assert image["complete"] and image["src_scheme"] == "data", image
        assert image["natural_width"] > 300 and image["natural_height"] > 200, image
        assert image["shown_width"] > 300, image
    assert probe["fetched"] == []  # nothing loaded from outside the page
    rows = re.findall(r'<tr class="pair (?:pass|fail)">', shown["dom"])
    assert len(rows) == 2 * len(list(combinations(path_names("batch"), 2)))
    # The screenshot shows the banner in its colour near the top of the page.
    with Image.open(shown["screenshot"]) as shot:
        assert shot.size == (1280, 4000)
        top = np.asarray(shot.convert("RGB"))[:300].astype(int)
    banner = int(np.sum(np.all(np.abs(top - np.array(colour)) <= 8, axis=-1)))
    assert banner > 1280 * 40, f"banner colour covers {banner} px"


def test_chromium_helper_sees_a_broken_or_external_image(tmp_path):
    """The browser check would catch a plot that does not decode or is fetched."""
    check, bench, train, contract = make_inputs(failed=False)
    page_html = render_report(check, bench, train, contract)
    broken = page_html.replace("base64,iVBOR", "base64,AAAAA", 1).replace(
        "<h1>", '<img id="outside" src="http://example.invalid/x.png"><h1>', 1
    )
    page = tmp_path / "broken.html"
    page.write_text(broken, encoding="utf-8")
    probe = render(page, tmp_path)["probe"]
    widths = {i["id"]: i["natural_width"] for i in probe["images"]}
    assert widths["outside"] == 0 and widths["plot-latency"] == 0
    assert probe["fetched"] == ["http://example.invalid/x.png"]


def test_backtick_spans_are_code_not_literal_backticks():
    check, bench, train, contract = make_inputs(failed=True)
    check["reference"] = {
        "status": "stale",
        "message": "made from other params: run `make reference REASON='...'`",
        "required": False,
        "passed": True,
    }
    # A user's name quoted in a message: its span is escaped before it becomes code.
    check["failures"].append(f"case `{HOSTILE}` failed")
    page_html = render_report(check, bench, train, contract, perf=perf_verdict())
    # The report's own sentences (benchmark name, the vector case), a stage's message in
    # a note, a table cell and a first-screen card, and a failure in the list.
    assert "`" not in page_html
    assert "Benchmark <code>quick</code>:" in page_html
    assert "output for <code>single</code>." in page_html
    assert page_html.count("run <code>make reference REASON=&#39;...&#39;</code>") == 3
    assert "case <code>&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;</code> failed" in page_html
    page = parse(page_html)
    assert "code" in page.tags and "script" not in page.tags
    assert code_spans("a lone ` stays") == [("a lone ` stays", False)]
    assert code_spans("run `make ui`, then `open`") == [
        ("run ", False),
        ("make ui", True),
        (", then ", False),
        ("open", True),
    ]


def test_the_headline_names_the_paths_that_ran_and_only_those():
    check, bench, train, contract = make_inputs(failed=False)
    check["sharded"] = {"path": "sharded_jit", "devices": 2}
    # The verdict word and the headline are adjacent divs: their texts join.
    headline = parse(render_report(check, bench, train, contract)).text("verdict")
    assert headline.startswith(
        f"PASSED{forms_text()} forwards (eager and jit), and "
        "sharded_jit (data-parallel over 2 device(s), not vmap) on cpu (cpu), float32"
    )
    assert forms_text().startswith("loop, ") and forms_text().endswith(" and direct")
    # An Equinox module has no hand-batched forward: the headline does not claim one.
    pytest.importorskip("equinox", reason="equinox is not installed: pip install -e '.[equinox]'")
    model = build_model(compose_config("model=equinox_mlp").model)
    check["not_provided"] = not_provided(model)
    assert set(check["not_provided"]) == {"direct_eager", "direct_jit"}
    check["sharded"] = None  # and when no distributed path ran, none is named
    headline = parse(render_report(check, bench, train, contract)).text("verdict")
    assert headline.startswith(
        f"PASSED{forms_text(check['not_provided'])} forwards (eager and jit) on cpu (cpu), float32"
    )
    assert "direct" not in headline and "sharded" not in headline
    assert forms_compared(check) in headline


def test_the_terminal_summary_says_what_the_headline_says(tmp_path):
    check, bench, train, contract = make_inputs(failed=False)
    check["sharded"] = {"path": "sharded_jit", "devices": 2}
    check["not_provided"] = {
        p: "model 'equinox_mlp' provides no hand-batched forward (forward_batch)"
        for p in ("direct_eager", "direct_jit")
    }
    layout = Layout(tmp_path)
    layout.check_details.parent.mkdir(parents=True)
    layout.check_details.write_text(json.dumps(check), encoding="utf-8")
    first = summarize(layout, tracked_lines(layout)).splitlines()[0]
    assert first == (
        f"verdict: PASSED - {forms_text(check['not_provided'])} forwards (eager and jit), and "
        "sharded_jit (data-parallel over 2 device(s), not vmap) on cpu (cpu), float32, "
        "rtol=1e-05 atol=1e-06, jax 0.11.2 / jaxlib 0.11.2"
    )
    headline = parse(render_report(check, bench, train, contract)).text("verdict")
    assert forms_compared(check) in first and forms_compared(check) in headline


def test_the_terminal_summary_says_when_verified_stays_off_the_deployment_target(tmp_path):
    check, _, _, _ = make_inputs(failed=False)
    layout = Layout(tmp_path)
    layout.check_details.parent.mkdir(parents=True)
    layout.check_details.write_text(json.dumps(check), encoding="utf-8")
    why = "this run's precision is f64 (float64), the deployment target's is f32 (float32)"
    track = {
        "run_id": "r1",
        "run_name": "mlp-cpu-f64",
        "experiment": "vmapcheck-mlp",
        "experiment_id": "1",
        "tracking_uri": "sqlite:///mlflow.db",
        "verdict": "passed",
        "forward_outputs_sha256": None,
        "git_commit": "unknown",
        "git_dirty": "unknown",
        "registry": {
            "status": "registered",
            "registered_model": "vmapcheck-mlp",
            "version": "3",
            "uri": "models:/vmapcheck-mlp/3",
            "alias": "verified",
            "previous": "1",
            "verified_alias": "stays",
            "off_target": why,
        },
    }
    layout.track_report.write_text(json.dumps(track), encoding="utf-8")
    assert (
        "registry: registered as models:/vmapcheck-mlp/3; @verified stays at version 1: "
        f"{why} (registry.target in conf/config.yaml); promote it with: vmapcheck promote "
        "--version 3"
    ) in summarize(layout, tracked_lines(layout)).splitlines()


# --- reviewer first ---------------------------------------------------------------------

FIRST_SCREEN = ("fs-worst", "fs-reference", "fs-float64", "fs-invalid", "fs-speedups", "fs-perf")


def _texts(page: _Page) -> dict[str, str]:
    return {card: page.text(card) for card in FIRST_SCREEN}


@pytest.mark.parametrize("failed", [False, True], ids=["passed", "failed"])
def test_the_first_figures_are_the_headline_ones(failed):
    """Under the verdict: the worst errors with where they are, invalid inputs refused,
    the speed-ups at the headline batch with their CIs and the benchmark's verdict, the
    same figures as vmapcheck.report.headline gives the metrics."""
    check, bench, train, contract = make_inputs(failed)
    check["reference"] = {
        "status": "ok",
        "message": "compared with the verified run of 2026-11-30",
        "created_at": "2026-11-30T10:00:00+00:00",
        "reason": "first verified run",
        "from_run": "abc",
        "tolerance_used": {"rtol": 1e-4, "atol": 1e-5},
        "cases": {
            "standard": {"vmap_jit": _result(3e-7), "loop_jit": _result(1e-7)},
            HOSTILE: {"vmap_jit": _result(8e-7)},
        },
        "losses": {},
        "max_abs": 8e-7,
        "max_rel": 4e-7,
        "passed": True,
    }
    check["cases"]["standard"]["oracle"]["map_jit"] = _result(6e-7)
    verdict = "regression" if failed else "no regression"
    page = parse(render_report(check, bench, train, contract, perf=perf_verdict(verdict)))
    text = _texts(page)
    head = check_headline(check)
    worst = head["worst"]
    assert text["fs-worst"].startswith(
        f"Worst agreement error (between paths) max_rel {worst['max_rel']:.3g}"
    )
    assert f"case {worst['case']}, pair {worst['pair']}" in text["fs-worst"]
    assert (worst["case"], worst["max_rel"]) == ((HOSTILE, 0.185) if failed else ("standard", 6e-8))
    assert "max_rel 4e-07" in text["fs-reference"]  # the reference's own figure
    assert f"case {HOSTILE}, path vmap_jit" in text["fs-reference"]
    assert "max_rel 3e-07 case standard, path map_jit" in text["fs-float64"]
    n = len(check["negative"])
    assert text["fs-invalid"].startswith(f"Invalid inputs refused {0 if failed else n}/{n}")
    assert page.ids["fs-invalid"]["data-status"] == ("fail" if failed else "pass")
    assert text["fs-speedups"] == (
        "vmap speed-ups at batch 8 (p50) "
        "vmap over loop: 1.50x (CI 1.40-1.60) "
        "vmap over direct: 1.10x (CI 1.05-1.15)"
    )
    assert text["fs-perf"].startswith(f"Benchmark vs baseline {verdict}")
    assert page.ids["fs-perf"]["data-status"] == ("fail" if failed else "pass")
    if failed:
        assert "1 regression(s): vmap_jit/b8" in text["fs-perf"]
    assert "baseline: run 4d67f809c2f14671808e61d678392840" in text["fs-perf"]


def test_a_mixed_benchmark_verdict_is_said_as_such_on_the_first_screen():
    """Issue 35 (3): slower at small batches and faster at a large one is not headlined
    by one word: the card says where each was found, as the console and MLflow do."""
    check, bench, train, contract = make_inputs(failed=False)
    perf = perf_verdict("regression") | {
        "cells": {
            "vmap_jit": {
                "b256": {"status": "regression"},
                "b1024": {"status": "regression"},
                "b4096": {"status": "faster"},
            }
        }
    }
    page = parse(render_report(check, bench, train, contract, perf=perf))
    text = page.text("fs-perf")
    assert text.startswith("Benchmark vs baseline regression")
    assert "REGRESSION at 256 and 1,024 rows; faster at 4,096 rows" in text


def test_no_headline_figure_is_made_up():
    """Figures the run does not have say so: no oracle, no reference, no benchmark
    ratio, no perf verdict."""
    check, bench, train, contract = make_inputs(failed=False)
    for case in check["cases"].values():
        del case["oracle"]
    check["oracle"] = "none: the run is float64"
    bench["speedup"], bench["speedup_ci"] = {}, {}
    text = _texts(parse(render_report(check, bench, train, contract)))
    assert text["fs-reference"].startswith("Worst vs stored reference not compared (missing)")
    assert "no reference for model mlp" in text["fs-reference"]
    assert text["fs-float64"] == "Worst vs float64 oracle not computed none: the run is float64"
    assert text["fs-speedups"] == "vmap speed-ups not measured"
    assert text["fs-perf"] == "Benchmark vs baseline not judged"


def test_the_page_reads_verdict_figures_agreement_latency_then_the_rest_environment_last():
    check, bench, train, contract = make_inputs(failed=True)
    page_html = render_report(check, bench, train, contract, perf=perf_verdict())
    order = [
        "verdict",
        *FIRST_SCREEN,
        "failures",
        "diagnosis",
        "agreement-section",
        "latency",
        "plot-latency",
        "oracle",
        "reference",
        "composition",
        "negative",
        "gradients",
        "machine",
        "train",
        "limits",
        "environment",
    ]
    positions = [page_html.index(f'id="{i}"') for i in order]
    assert positions == sorted(positions), order
    # The environment is the last section: nothing but the footer follows it.
    assert "<section" not in page_html[page_html.index('id="environment"') :]


# Records where each first-screen element lies in the viewport, once the page has loaded.
_RECTS = """<script>
window.addEventListener("load", () => {
  const rects = {};
  for (const id of %s) {
    const el = document.getElementById(id);
    const r = el && el.getBoundingClientRect();
    rects[id] = r && {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                      text: el.innerText};
  }
  const out = document.createElement("pre");
  out.id = "rects-probe";
  out.style.display = "none";
  out.textContent = JSON.stringify({rects, viewport: [innerWidth, innerHeight]});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.parametrize("failed", [False, True], ids=["passed", "failed"])
def test_the_first_screen_holds_the_reviewers_figures_in_chromium(failed, tmp_path):
    """At 1280x800 the verdict and every first-screen figure lie inside the viewport,
    as the browser lays them out (a failed run with its failure list included)."""
    check, bench, train, contract = make_inputs(failed)
    ids = ["verdict", *FIRST_SCREEN]
    page_html = render_report(
        check,
        bench,
        train,
        contract,
        perf=perf_verdict("regression" if failed else "no regression"),
    )
    page = tmp_path / "report.html"
    page.write_text(
        page_html.replace("</body>", _RECTS % json.dumps(ids) + "</body>"), encoding="utf-8"
    )
    shown = render(page, tmp_path, width=1280, height=800)
    print(f"first screen: {shown['screenshot']}")
    start = shown["dom"].index('<pre id="rects-probe"')
    found = json.loads(
        __import__("html").unescape(
            shown["dom"][shown["dom"].index(">", start) + 1 : shown["dom"].index("</pre>", start)]
        )
    )
    # The first viewport: the window's content area (headless Chromium reports less
    # height than the window's 800 px), the stricter of the two.
    width, height = found["viewport"]
    assert width == 1280 and 500 <= height <= 800, found["viewport"]
    for element in ids:
        rect = found["rects"][element]
        assert rect is not None, f"{element} is not on the page"
        assert 0 <= rect["top"] < rect["bottom"] <= height, (element, rect)
        assert 0 <= rect["left"] < rect["right"] <= 1280, (element, rect)
    rects = found["rects"]
    assert rects["verdict"]["text"].startswith("FAILED" if failed else "PASSED")
    assert "1.50x (CI 1.40-1.60)" in rects["fs-speedups"]["text"]
    assert ("regression" if failed else "no regression") in rects["fs-perf"]["text"]
    from PIL import Image

    with Image.open(shown["screenshot"]) as shot:
        assert shot.size == (1280, 800)


def test_a_model_without_a_direct_path_is_never_said_to_have_one(tmp_path):
    """A model without a hand-batched forward (as an Equinox module): the report, the
    summary and the diagnosis name the direct paths as not provided, and no headline
    claims them."""
    config = compose_config()
    mlp = build_model(config.model)
    model = replace(mlp, forward_batch=None)
    missing = not_provided(model)
    assert set(missing) == {"direct_eager", "direct_jit"}
    check, bench, train, contract = make_inputs(failed=False)
    check["not_provided"] = missing
    check["sharded"] = {"path": "sharded_jit", "devices": 2}
    for case in check["cases"].values():  # the check compared only the paths that ran
        for key in ("contract", "finite", "oracle", "loss"):
            case[key] = {p: v for p, v in case[key].items() if p not in missing}
        case["pairs"] = {
            pair: r for pair, r in case["pairs"].items() if not any(p in pair for p in missing)
        }
    for name in ("vmap_over_direct",):
        for label in bench["speedup"]:
            del bench["speedup"][label][name], bench["speedup_ci"][label][name]
    contract["batched_forward"] = False
    page_html = render_report(check, bench, train, contract, perf=perf_verdict())
    page = parse(page_html)
    headline = page.text("verdict")
    assert headline.startswith(
        f"PASSED{forms_text(missing)} forwards (eager and jit), and sharded_jit "
        "(data-parallel over 2 device(s), not vmap) on cpu (cpu)"
    )
    assert "direct" not in headline
    reason = "model 'mlp' provides no hand-batched forward (forward_batch)"
    for path in missing:
        said = f"{path} not provided: {reason}"
        assert said in page.text("verdict-notes") and said in page.text("not-provided")
    assert [row[2] for row in page.rows["speedup-table"][1:]] == ["direct_jit not provided"] * 2
    assert page.text("fs-speedups").endswith(
        "vmap over direct: direct_jit not provided by the model"
    )
    # The terminal summary: the same headline, then the paths not provided.
    layout = Layout(tmp_path)
    layout.check_details.parent.mkdir(parents=True)
    layout.check_details.write_text(json.dumps(check), encoding="utf-8")
    lines = summarize(layout, tracked_lines(layout)).splitlines()
    assert lines[0].startswith(f"verdict: PASSED - {forms_compared(check)} on cpu")
    assert "direct" not in lines[0]
    assert lines[1:3] == [f"  -    {p} not provided: {reason}" for p in missing]
    # The diagnosis: the direct form is named as not provided, never said to agree.
    params = model.init(named_keys(config.seed)["init"])
    rng = np.random.default_rng(0)
    probe = Probe(
        "4 random rows",
        rng.normal(size=(4, model.in_features)).astype(np.float32),
        rng.normal(size=(4, model.out_features)).astype(np.float32),
    )
    report = diagnose(
        Subject(
            model=model,
            params=params,
            dtype=np.float32,
            tolerance=config.precision.tolerance,
            cross_run_tolerance=config.precision.cross_run_tolerance,
            probes=(probe,),
        )
    )
    assert report["not_provided"] == missing
    text = report["summary"]
    for path in missing:
        assert f"not provided by the model, so not compared: {path} ({reason})" in text
    said_to_agree = [line for line in text.splitlines() if "agree" in line]
    assert said_to_agree and not any("direct" in line for line in said_to_agree)


def test_the_templates_are_package_data():
    """An installed (not editable) vmapcheck has its report template: pyproject.toml
    declares every file of the templates folder as package data."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-data"]["vmapcheck.report"]
    folder = ROOT / "src" / "vmapcheck" / "report"
    files = sorted(p for p in (folder / "templates").iterdir())
    assert {"report.html", "macros.html", "style.css"} <= {p.name for p in files}
    matched = {p for pattern in declared for p in folder.glob(pattern)}
    assert set(files) <= matched, declared


def test_the_pairs_failing_together_are_named_by_the_paths_they_share():
    from vmapcheck.report.failures import covering_paths

    pairs = [
        "loop_jit-vs-direct_jit",
        "vmap_jit-vs-direct_jit",
        "map_jit-vs-direct_jit",
        "loop_jit-vs-direct_eager",
        "vmap_jit-vs-direct_eager",
    ]
    assert covering_paths(pairs) == ["direct_jit", "direct_eager"]
    assert covering_paths(["loop_jit-vs-vmap_jit"]) == ["loop_jit"]  # a tie: registry order
    assert covering_paths([]) == []


def test_a_passed_run_says_its_deciding_figure_and_that_no_diagnosis_was_needed():
    from vmapcheck.check.diagnosis import not_needed

    check, bench, train, contract = make_inputs(failed=False)
    check["cases"]["standard"]["pairs"]["loop_eager-vs-vmap_jit"]["bound_ratio"] = 0.031
    page_html = render_report(check, bench, train, contract, diagnosis=not_needed(check))
    page = parse(page_html)
    assert page.text("verdict-deciding") == (
        "Deciding figure: worst bound ratio 0.031 (|a - b| over its allowed error; above 1 "
        "fails): pair loop_eager vs vmap_jit, case standard, at rtol=1e-05 atol=1e-06 "
        "(precision.tolerance)"
    )
    assert "verdict-diagnosis" not in page.ids and 'id="failures"' not in page_html
    assert page.text("diagnosis-headline") == "Not needed: every check passed."
    assert "diagnosis-stages" not in page.ids  # no stage said to be "not reached"
