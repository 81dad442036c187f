"""The page `dvc plots show` writes draws its plots with no network (issue 25, item 3).

DVC's own page loads Vega from a CDN: offline it is blank and says nothing. `vmapcheck
init` writes .dvc/plots/offline.html, with the pinned Vega builds inlined, and names it in
.dvc/config (plots.html_template). Here a project made by `vmapcheck init` gets plot data
written by the bench stage's own writers, the real `dvc plots show` runs through
`vmapcheck plots`, and headless Chromium, with every host name unresolvable, must draw
each plot as an SVG; DVC's default page, shown the same way, must not (the control that
proves the browser really was offline).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.chromium import OFFLINE, render
from tests.helpers.config import ROOT
from tests.helpers.wait import HANG_S
from vmapcheck.core.paths import SPEEDUPS, path_names
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.layout import Layout
from vmapcheck.project import plots_page
from vmapcheck.project.plots_page import bundle, page_template, remote_resources, run_plots
from vmapcheck.report.plots import (
    write_latency_csvs,
    write_latency_png,
    write_speedup_csvs,
    write_speedup_png,
)

BATCHES = (1, 8, 64, 512)


def _run(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
        env={**_env(), "DVC_NO_ANALYTICS": "1"},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "MLFLOW_TRACKING_URI")}


def _vmapcheck(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(root, sys.executable, "-m", "vmapcheck", *args, check=check)


def _project(path: Path) -> Layout:
    """A git repository after `vmapcheck init --model mlp`, with no plot data yet."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    _vmapcheck(path, "init", "--model", "mlp")
    return Layout(path)


def _write_plot_data(layout: Layout) -> None:
    """reports/plots/ as the bench stage writes it (its own writers), made-up figures:
    every batch path at every batch size, every speed-up, both PNGs."""
    latency = {
        name: {
            f"b{rows}": {
                q: scale * (i + 1) * 0.02 * rows**0.6
                for q, scale in zip(("p50", "p90", "p99"), (1.0, 1.2, 1.5), strict=True)
            }
            for rows in BATCHES
        }
        for i, name in enumerate(path_names("batch"))
    }
    speedup = {
        f"b{rows}": {s.name: 1.0 + 0.5 * j * rows**0.3 for j, s in enumerate(SPEEDUPS)}
        for rows in BATCHES
    }
    layout.plots.mkdir(parents=True)
    write_latency_csvs(layout.plots, latency)
    write_speedup_csvs(layout.plots / "speedup", speedup)
    write_latency_png(layout.latency_png, latency, "made-up figures")
    write_speedup_png(layout.speedup_png, speedup, "made-up figures")


def _plot_divs(dom: str) -> dict[str, str]:
    """Each Vega plot's `<div id=...>` DVC wrote (named after dvc.yaml's plot) -> the DOM
    from there to the next plot's div or the end of the body, as the browser left it."""
    starts = sorted(
        (dom.find(f'<div id="{name}"'), name)
        for name in _vega_plot_names()
        if f'<div id="{name}"' in dom
    )
    ends = [start for start, _ in starts[1:]] + [dom.rfind("</body>")]
    return {name: dom[start:end] for (start, name), end in zip(starts, ends, strict=True)}


def _vega_plot_names() -> dict[str, str]:
    """dvc.yaml's Vega plots (those with a template): id -> title."""
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    return {
        name: spec["title"]
        for entry in plots
        if isinstance(entry, dict)
        for name, spec in entry.items()
        if isinstance(spec, dict) and "template" in spec
    }


def test_the_pinned_builds_match_their_digests_and_the_page_loads_nothing_from_outside():
    manifest = json.loads((ROOT / "src/vmapcheck/project/vega/bundle.json").read_text())
    scripts = bundle()  # checks every sha256
    assert [(s.name, s.version) for s in scripts] == [
        (p["name"], p["version"]) for p in manifest["packages"]
    ]
    assert [s.name for s in scripts] == ["vega", "vega-lite", "vega-embed"]
    for package in manifest["packages"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", package["version"]), package  # exact pins
        assert package["integrity"].startswith("sha512-"), package
        path = ROOT / "src/vmapcheck/project/vega" / package["script"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == package["sha256"]
        assert (path.parent / package["license_file"]).is_file()

    page = page_template()
    # DVC's placeholders: the plots and the refresh tag, never its CDN scripts.
    assert "{plot_divs}" in page and "{refresh_tag}" in page
    assert "{scripts}" not in page
    assert remote_resources(page) == []
    assert "cdn." not in page.lower()
    for script in scripts:
        assert script.text in page
        assert f"{script.name} {script.version}" in page
    # The repository's own copy is init's (tests/test_init.py checks every file init writes).
    assert (ROOT / ".dvc/plots/offline.html").read_text(encoding="utf-8") == page
    assert "html_template = plots/offline.html" in (ROOT / ".dvc/config").read_text()
    # The check of scripts/fetch-vega, with no network: what `make vega-bundle` verifies.
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts/fetch-vega"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert "every file matches its pinned sha256" in checked.stdout


def test_a_missing_or_altered_build_is_named_with_the_command_that_fetches_it(
    tmp_path, monkeypatch
):
    folder = tmp_path / "vega"
    shutil.copytree(ROOT / "src/vmapcheck/project/vega", folder)
    monkeypatch.setattr(plots_page, "_bundle_dir", lambda: folder)

    (folder / "vega-lite.min.js").write_text("/* not vega-lite */", encoding="utf-8")
    with pytest.raises(ConfigError, match="sha256") as altered:
        page_template()
    assert "vega-lite@5.23.0" in str(altered.value) and "make vega-bundle" in str(altered.value)

    (folder / "vega-lite.min.js").unlink()
    with pytest.raises(ConfigError) as missing:
        page_template()
    message = str(missing.value)
    assert str(folder / "vega-lite.min.js") in message
    assert "make vega-bundle" in message and "scripts/fetch-vega" in message


def test_vmapcheck_plots_says_what_to_run_when_the_template_or_the_data_is_missing(tmp_path):
    layout = _project(tmp_path / "user")
    no_data = _vmapcheck(layout.root, "plots", check=False)  # the command line's error
    assert no_data.returncode == 2
    assert "no plot data: reports/plots" in no_data.stderr and "dvc repro bench" in no_data.stderr

    layout.plots_page.unlink()
    with pytest.raises(ConfigError, match=r"\.dvc/plots/offline\.html.*--write-template"):
        run_plots(layout)

    with pytest.raises(ArtifactError, match=r"no plot data.*dvc repro bench"):
        run_plots(layout, write=True)
    # A plots folder without the CSVs dvc.yaml's plots name: DVC writes a page with no plot.
    layout.plots.mkdir(parents=True)
    with pytest.raises(ArtifactError, match=r"drew no plot.*dvc repro bench"):
        run_plots(layout)
    # --write-template wrote the page again before it found no data.
    assert layout.plots_page.read_text(encoding="utf-8") == page_template()


def test_the_plots_page_draws_every_plot_in_chromium_with_no_network(tmp_path):
    layout = _project(tmp_path / "user")
    _write_plot_data(layout)

    shown = _vmapcheck(layout.root, "plots")
    assert "plots page (2 Vega plots, 1 image; draws offline" in shown.stdout
    page = Path(shown.stdout.split("no network needed): ", 1)[1].splitlines()[0])
    assert page == (layout.root / "dvc_plots" / "index.html").resolve(), shown.stdout
    assert "reports/plots/latency.png, reports/plots/speedup.png" in shown.stdout
    assert remote_resources(page.read_text(encoding="utf-8")) == []

    drawn = render(page, page.parent, height=2200, chromium_args=OFFLINE)
    print(f"screenshot: {drawn['screenshot']}")
    divs = _plot_divs(drawn["dom"])
    names = _vega_plot_names()
    assert set(divs) == set(names), (sorted(divs), sorted(names))
    for name, title in names.items():
        content = divs[name]
        assert 'data-plot="drawn"' in content, f"{name} was not drawn:\n{content[:2000]}"
        assert '<svg xmlns="http://www.w3.org/2000/svg"' in content and 'class="marks"' in content
        assert title in content, f"{name}: its title {title!r} is not in the drawn SVG"
        assert "could not be drawn" not in content
    # The legend names every path, every speed-up (the CSVs dvc.yaml lists, drawn).
    for path in path_names("batch"):
        assert f">{path}</text>" in divs["latency_p50_ms_vs_batch_size"], path
    for speedup in SPEEDUPS:
        assert f">{speedup.name}</text>" in divs["vmap_speedup_vs_batch_size"], speedup.name
    # Nothing was fetched from outside the page's folder; the PNG plot is there too.
    probe = drawn["probe"]
    assert all(url.startswith("file://") for url in probe["fetched"]), probe["fetched"]
    (png,) = probe["images"]
    assert png["complete"] and png["natural_width"] > 100, png
    assert drawn["screenshot"].stat().st_size > 50_000

    # The control: DVC's own page, the same data, the same offline browser, draws nothing.
    from dvc_render.html import PAGE_HTML

    default = tmp_path / "dvc-default.html"
    default.write_text(PAGE_HTML, encoding="utf-8")
    _run(
        layout.root,
        sys.executable,
        "-m",
        "dvc",
        "plots",
        "show",
        "--html-template",
        str(default),
        "-o",
        "default_page",
    )
    default_page = layout.root / "default_page" / "index.html"
    assert len(remote_resources(default_page.read_text(encoding="utf-8"))) == 3  # its CDN scripts
    blank = render(default_page, default_page.parent, height=1200, chromium_args=OFFLINE)
    blank_divs = _plot_divs(blank["dom"])
    assert set(blank_divs) == set(names)
    for name, content in blank_divs.items():
        assert "<svg" not in content and "<canvas" not in content, name


def test_the_pngs_draw_each_series_in_its_registry_colour_with_the_intervals():
    """The PNGs take each line's colour from vmapcheck.core.paths.series_colours, as the
    Vega templates do (whichever paths a run has: a model without direct paths leaves
    the others' colours unchanged), and the speed-ups carry their intervals as bars."""
    import matplotlib.colors

    from vmapcheck.core.paths import series_colours
    from vmapcheck.report.plots import latency_figure, speedup_figure

    colours = series_colours()
    some = ("loop_jit", "vmap_jit", "sharded_jit")  # not every path: no colour moves
    stats = {"p50": 1.0, "p90": 1.5, "p99": 2.0}
    fig = latency_figure({p: {"b1": stats, "b8": stats} for p in some}, "three paths")
    drawn = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    assert {p: matplotlib.colors.to_hex(drawn[p]) for p in some} == {p: colours[p] for p in some}

    speedup = {"b16": {"vmap_over_loop": 1.5, "vmap_over_direct": 0.9}}
    # The console's "no measurable difference (CI 0.86-1.16)": drawn with its interval.
    intervals = {"b16": {"vmap_over_loop": [1.4, 1.6], "vmap_over_direct": [0.86, 1.16]}}
    fig = speedup_figure(speedup, "with intervals", intervals)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if line.get_label() in colours}
    for name in ("vmap_over_loop", "vmap_over_direct"):
        assert matplotlib.colors.to_hex(lines[name].get_color()) == colours[name]
    bars = [
        segment
        for collection in ax.collections
        if isinstance(collection, matplotlib.collections.LineCollection)
        for segment in collection.get_segments()
    ]
    spans = sorted((round(s[0][1], 2), round(s[1][1], 2)) for s in bars)
    assert spans == [(0.86, 1.16), (1.4, 1.6)], spans


def _commit_plot_data(layout: Layout, scale: float, message: str) -> None:
    """reports/plots/ written by the bench stage's writers, every figure times
    ``scale``, committed (a run's plot data as a revision holds it)."""
    latency = {
        name: {
            f"b{rows}": {q: scale * (i + 1) * 0.02 * rows**0.6 for q in ("p50", "p90", "p99")}
            for rows in BATCHES
        }
        for i, name in enumerate(path_names("batch"))
    }
    speedup = {
        f"b{rows}": {s.name: scale * (0.9 + 0.5 * j * rows**0.3) for j, s in enumerate(SPEEDUPS)}
        for rows in BATCHES
    }
    intervals = {
        label: {name: [0.85 * r, 1.2 * r] for name, r in ratios.items()}
        for label, ratios in speedup.items()
    }
    write_latency_csvs(layout.plots, latency)
    write_speedup_csvs(layout.plots / "speedup", speedup, intervals)
    _run(layout.root, "git", "add", "-A")
    _run(layout.root, "git", "add", "-f", "reports/plots")
    _run(layout.root, "git", "commit", "-qm", message)


def test_a_plots_diff_of_three_runs_is_one_panel_per_run_in_chromium(tmp_path):
    """`dvc plots diff` of three revisions: each plot is one panel per revision, in the
    order given, each path in its registry colour in every panel (not 33 lines told
    apart by markers), and the page draws offline with no error."""
    from vmapcheck.core.paths import series_colours

    layout = _project(tmp_path / "user")
    layout.plots.mkdir(parents=True)
    for i, scale in enumerate((1.0, 1.3, 0.8)):
        _commit_plot_data(layout, scale, f"run {i}")
    revisions = ("HEAD~2", "HEAD~1", "HEAD")
    dvc = (sys.executable, "-m", "dvc", "plots", "diff", *revisions)
    shown = json.loads(_run(layout.root, *dvc, "--json").stdout)["data"]
    colours = series_colours()
    for name in _vega_plot_names():
        (plot,) = [p for p in shown[name] if p["type"] == "vega"]
        assert plot["revisions"] == list(revisions)
        content = plot["content"]
        assert content["facet"]["field"] == "rev" and content["facet"]["sort"] is None
        scale = content["spec"]["encoding"]["color"]["scale"]
        assert scale["range"] == [colours[s] for s in scale["domain"]]
        assert {d["rev"] for d in content["data"]["values"]} == set(revisions)
    out = layout.root / "diff"
    _run(layout.root, *dvc, "-o", str(out))
    drawn = render(out / "index.html", out, height=2400, chromium_args=OFFLINE)
    print(f"screenshot: {drawn['screenshot']}")
    divs = _plot_divs(drawn["dom"])
    assert set(divs) == set(_vega_plot_names())
    for name, content in divs.items():
        assert 'data-plot="drawn"' in content and "could not be drawn" not in content, name
        for revision in revisions:  # each panel's header
            assert f">{revision}</text>" in content, (name, revision)
        # One colour per path, the registry's, in the SVG the browser drew.
        assert colours["vmap_jit" if "latency" in name else "vmap_over_loop"] in content
