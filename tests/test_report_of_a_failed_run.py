"""The HTML report of a real failed run, opened in Chromium (issue 43, item 3).

Every stage body runs in this process (tests/helpers/inprocess.py) on a temporary
project whose model is the built-in MLP with a transposed weight planted in its
hand-batched forward (tests/helpers/faults.py): the check fails on every pair holding a
direct path in every case (over a hundred failure lines) and its diagnosis localizes the
fault (stage forward, layer layers[1]). The track stage writes reports/report.html from
what the stages wrote; the page must lead with the verdict, the kind of finding and the
deciding figure, hold the diagnosis, group the failures with counts instead of listing
them, name its counts truly, and let nothing overflow its card.
"""

from __future__ import annotations

import copy
import html
import json
import re
from dataclasses import dataclass

import pytest

from tests.helpers.chromium import render
from tests.helpers.faults import factory_overrides
from tests.helpers.inprocess import STAGES, inputs_repository, run_stage, write_params
from tests.helpers.project import FAST_RUN, TWO_BATCH_SIZES, commit_all
from vmapcheck.bench.timing.records import read_bench_details
from vmapcheck.check.schema import CheckDetails, DiagnosisReport, read_check_details, read_diagnosis
from vmapcheck.core.paths import batch_paths
from vmapcheck.layout import Layout
from vmapcheck.report.failures import deciding_figure
from vmapcheck.report.html import render_report

pytestmark = pytest.mark.stages

OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    "backend.num_devices=2",  # the emulated CPU devices of this process (conftest.py)
    *FAST_RUN,
    TWO_BATCH_SIZES,
    "train.steps=0",  # the planted model's init params: the fault is in the forward
    "reference.required=false",  # a planted model has no stored reference
    *factory_overrides("transposed_weight"),
)


@dataclass(frozen=True)
class FailedRun:
    layout: Layout
    codes: dict[str, int]
    check: CheckDetails
    diagnosis: DiagnosisReport
    page: str  # reports/report.html as track wrote it


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> FailedRun:
    root = tmp_path_factory.mktemp("failed-run")
    layout = inputs_repository(root)
    write_params(root, *OVERRIDES)
    commit_all(root, "a planted fault")
    codes = {name: run_stage(root, name) for name in STAGES}
    return FailedRun(
        layout,
        codes,
        read_check_details(layout.check_details),
        read_diagnosis(layout.diagnosis),
        layout.html_report.read_text(encoding="utf-8"),
    )


def _text(fragment: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    inline = re.sub(r"</?(code|strong|a)\b[^>]*>", "", fragment)  # no space where none is
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def _element(page: str, element_id: str) -> str:
    """The text of the element with ``element_id`` up to the end of its tag's block."""
    start = page.index(f'id="{element_id}"')
    tag = page[page.rindex("<", 0, start) + 1 : start].split()[0]
    end = page.index(f"</{tag}>", start)
    return _text(page[page.index(">", start) + 1 : end])


def test_the_run_failed_and_every_stage_wrote_its_reports(failed):
    assert not failed.check["passed"]
    assert len(failed.check["failures"]) > 50  # the wall of lines the page must not be
    assert failed.diagnosis["status"] == "diverged"
    # Every stage before track exits 0 on a failed check: it is reported, not raised.
    assert all(code == 0 for name, code in failed.codes.items() if name != "track"), failed.codes
    assert failed.layout.html_report.is_file()


def test_the_verdict_leads_with_the_kind_and_the_deciding_figure(failed):
    page = failed.page
    banner = _element(page, "verdict")
    n = len(failed.check["failures"])
    assert banner.startswith(f"FAILED ({n} batching faults)"), banner
    figure = deciding_figure(failed.check)
    assert figure is not None and figure["bound_ratio"] > 1
    deciding = _element(page, "verdict-deciding")
    assert deciding.startswith(f"Deciding figure: worst bound ratio {figure['bound_ratio']:.3g}")
    assert f"pair {figure['pair']}, case {figure['case']}" in deciding
    assert "direct" in figure["pair"]  # the planted path
    assert "rtol=1e-05 atol=1e-06 (precision.tolerance)" in deciding
    # The verdict comes before everything else on the page, the failures after the cards.
    assert page.index('id="verdict"') < page.index('id="fs-worst"') < page.index('id="failures"')


def test_the_diagnosis_is_in_the_report(failed):
    page = failed.page
    first = failed.diagnosis["first_divergence"]
    assert first is not None
    said = "First divergence: stage forward, layer layers[1], path(s) direct_eager"
    assert said in _element(page, "verdict-diagnosis")
    assert said in _element(page, "diagnosis-headline")
    assert first["message"] in _element(page, "diagnosis-message")
    stages = _element(page, "diagnosis-stages")
    for stage in ("data", "key_stream", "shapes"):
        assert f"{stage} ruled out" in stages
    assert "forward diverged" in stages and "loss not reached" in stages
    # The summary as reports/diagnosis.txt has it, escaped, whole.
    pre = page[page.index('id="diagnosis-text"') :]
    pre = pre[pre.index("<pre>") + 5 : pre.index("</pre>")]
    assert html.unescape(pre) == failed.diagnosis["summary"]
    assert "diverg" in page


def test_failures_are_grouped_by_pair_and_case_with_counts(failed):
    page, check = failed.page, failed.check
    n_cases = len(check["cases"])
    table = page[
        page.index('id="failures-by-what"') : page.index(
            "</table>", page.index('id="failures-by-what"')
        )
    ]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S)[1:]
    cells = [
        [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)] for row in rows
    ]
    # The failing pairs of the batches, from the check's own records: every pair holding a
    # direct path (and not both), in the same cases.
    failing = {
        pair: [
            c
            for c, report in check["cases"].items()
            if not report["pairs"].get(pair, {"passed": True})["passed"]
        ]
        for pair in check["cases"]["standard"]["pairs"]
    }
    failing = {pair: cases for pair, cases in failing.items() if cases}
    # Each direct path against every batch path that is not direct (from the registry).
    expected = 2 * sum(p.form != "direct" for p in batch_paths())
    assert len(failing) == expected and all("direct" in pair for pair in failing)
    assert len({tuple(cases) for cases in failing.values()}) == 1  # the same cases
    # One row for them all, not a line per pair and case: where to look, then the pairs.
    merged = next(row for row in cells if row[0].startswith(f"{expected} pairs"))
    assert merged[0] == (
        f"{expected} pairs, each holding direct_eager or direct_jit " + ", ".join(failing)
    )
    cases = next(iter(failing.values()))
    assert merged[1:4] == ["batching", f"{len(cases)} of {n_cases} cases", ", ".join(cases)]
    worst = max(
        (check["cases"][c]["pairs"][pair]["bound_ratio"], c)
        for pair, cs in failing.items()
        for c in cs
    )
    assert merged[4] == f"{worst[0]:.3g} ({worst[1]})"
    # A handful of rows for over a hundred lines.
    assert len(rows) <= 6 < 100 < len(check["failures"]), cells
    # Every failure line is counted once, in a case's count.
    by_case = _element(page, "failures-by-case")
    counts = [int(n) for n in re.findall(r" (\d+)(?:,|$)", by_case)]
    assert sum(counts) == len(check["failures"]), by_case
    # The paths named: the two planted paths, in every failing pair, come first.
    named = _element(page, "failures-by-path")
    first_two = re.findall(r"(\w+) \d+", named.split(":", 1)[1])[:2]
    assert set(first_two) == {"direct_eager", "direct_jit"}, named
    # The lines themselves only inside a closed <details>, after the groups.
    assert '<details id="failures-list">' in page
    assert page.index('id="failures-by-what"') < page.index('id="failure-lines"')


def test_the_counts_are_named_and_true(failed):
    bench = json.loads(failed.layout.bench_details.read_text())
    latency = _element(failed.page, "latency")
    repeats = bench["bench"]["repeats"]
    counts = sorted({s["n"] for by in bench["latency_ms"].values() for s in by.values()})
    assert f"up to {repeats} timed calls per path and batch size (bench.repeats)" in latency
    took = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    assert f"each cell timed {took} calls (column timed calls (n))" in latency
    assert "<th>timed calls (n)</th>" in failed.page


# Every card, banner, section and details box: its content wider than itself is text
# that overflows it (a scroll box, .table-scroll, is the one place wide content may be).
_OVERFLOW = """<script>
window.addEventListener("load", () => {
  for (const d of document.querySelectorAll("details")) d.open = true;
  const over = [];
  const boxes = ".card, .verdict, section, details, main, li, p, td";
  for (const el of document.querySelectorAll(boxes)) {
    if (el.closest(".table-scroll") && !el.classList.contains("table-scroll")
        && el.tagName === "TD") continue;
    if (el.scrollWidth > el.clientWidth + 1) {
      over.push({tag: el.tagName, id: el.id, cls: el.className,
                 scroll: el.scrollWidth, client: el.clientWidth,
                 text: el.innerText.slice(0, 80)});
    }
  }
  const out = document.createElement("pre");
  out.id = "overflow-probe";
  out.style.display = "none";
  const page = [document.documentElement.scrollWidth, innerWidth];
  out.textContent = JSON.stringify({over, page});
  document.body.appendChild(out);
});
</script>"""


# A source location as a user's model brings into a failure line: one unbroken word.
LONG_PATH = "/home/user/projects/" + "very_long_package_name/" * 12 + "model.py:1234"


def _with_long_words(failed: FailedRun) -> str:
    """The run's report rendered again from its files, one finding and one reference
    message holding :data:`LONG_PATH`, and the run named by it."""
    layout = failed.layout
    check = copy.deepcopy(failed.check)
    check["findings"] = [
        *check["findings"],
        {"kind": "model", "line": f"inputs/{LONG_PATH}: raised at {LONG_PATH}", "fails": True},
    ]
    check["failures"] = [*check["failures"], check["findings"][-1]["line"]]
    check["reference"]["message"] = f"no reference at {LONG_PATH}"
    return render_report(
        check,
        read_bench_details(layout.bench_details),
        json.loads(layout.train_report.read_text()),
        json.loads(layout.contract.read_text()),
        perf=json.loads(layout.perf_verdict.read_text()),
        run={"MLflow run name": LONG_PATH},
        diagnosis=failed.diagnosis,
    )


@pytest.mark.parametrize("width", [1280, 800])
@pytest.mark.parametrize("long_words", [False, True], ids=["as-written", "long-words"])
def test_nothing_overflows_its_card_in_chromium(failed, tmp_path, width, long_words):
    page = tmp_path / "report.html"
    written = _with_long_words(failed) if long_words else failed.page
    if long_words:
        assert LONG_PATH in written
    page.write_text(written.replace("</body>", _OVERFLOW + "</body>"), encoding="utf-8")
    shown = render(page, tmp_path, width=width, height=900)
    dom = shown["dom"]
    start = dom.index('<pre id="overflow-probe"')
    found = json.loads(html.unescape(dom[dom.index(">", start) + 1 : dom.index("</pre>", start)]))
    assert found["over"] == [], found["over"]
    page_width, viewport = found["page"]
    assert page_width <= viewport, found["page"]  # no sideways scroll of the page
    print(f"report of a failed run at {width} px: {shown['screenshot']}")


_RECTS = """<script>
window.addEventListener("load", () => {
  const rects = {};
  for (const id of %s) {
    const r = document.getElementById(id).getBoundingClientRect();
    rects[id] = [r.top, r.bottom];
  }
  const out = document.createElement("pre");
  out.id = "rects-probe";
  out.style.display = "none";
  out.textContent = JSON.stringify({rects, height: innerHeight});
  document.body.appendChild(out);
});
</script>"""


def test_the_verdict_kind_deciding_figure_and_diagnosis_are_on_the_first_screen(failed, tmp_path):
    """At 1280x800 the banner with its kind, the deciding figure and the diagnosis' first
    divergence lie in the first viewport, as Chromium lays out the real run's report."""
    ids = ["verdict", "verdict-deciding", "verdict-diagnosis", "fs-worst"]
    page = tmp_path / "report.html"
    page.write_text(
        failed.page.replace("</body>", _RECTS % json.dumps(ids) + "</body>"), encoding="utf-8"
    )
    dom = render(page, tmp_path, width=1280, height=800)["dom"]
    start = dom.index('<pre id="rects-probe"')
    found = json.loads(html.unescape(dom[dom.index(">", start) + 1 : dom.index("</pre>", start)]))
    for element in ids:
        top, bottom = found["rects"][element]
        assert 0 <= top < bottom <= found["height"], (element, found)
