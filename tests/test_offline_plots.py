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
        timeout=300,
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
