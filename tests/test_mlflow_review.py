"""MLflow at a glance and reviewing many runs there (issues 13 and 25): real runs, read
where users read them, in the MLflow UI.

Three real pipeline runs, every stage in this process (tests/helpers/inprocess.py) on a
small temporary project: mlp at float32, mlp at float64 and toy at float32. The float64
run reruns only what ``dvc repro`` would rerun after a precision edit (forward, check,
bench, track); the stage time records of prepare and train are made a day older first,
as they are when that first run was yesterday's (DVC keeps a skipped stage's record).

The last run carries its summary metrics, description, source and per-stage timeline;
the runs are in one experiment, each with its own start and end and few params. Then
``mlflow ui`` serves the store on 127.0.0.1 and headless Chromium opens the URLs
vmapcheck prints: the experiment's runs table (``make ui``), the last run's page (``make
demo``'s summary) and the compare view of the three runs (``vmapcheck compare``). They
must show MLflow's classic ML view (runs, metrics), not the GenAI one (traces,
evaluations), with the verdict and the ``_summary/*`` metrics first. The screenshots are
kept (``pytest -s`` prints their paths; ``VMAPCHECK_SCREENSHOT_DIR`` copies the compare
view's and the runs table's there).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.inprocess import STAGES, inputs_repository, run_stage, write_params
from tests.helpers.mlflow_ui import browse, serving, vmapcheck_ui
from tests.helpers.project import FAST_RUN, commit_all
from vmapcheck.io import atomic_write_json, read_json
from vmapcheck.layout import Layout
from vmapcheck.pipeline.stage import read_stage_times
from vmapcheck.tracking.experiment import NOTE_TAG
from vmapcheck.tracking.log import COMPARED_IF_PRESENT, COMPARED_PARAMS
from vmapcheck.tracking.runs import compare_view_line, select_runs
from vmapcheck.tracking.store import tracking_uri
from vmapcheck.tracking.ui import compare_url, experiment_url, run_url

pytestmark = pytest.mark.stages

FAILING = ("model=mc_dropout", "model.factory.shared_key=true")
OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    "backend.num_devices=2",  # this process's emulated CPU devices (tests/conftest.py)
    *FAST_RUN,
)
# (overrides, the stages `dvc repro` reruns after the edit) in the order they are logged.
RUNS = (
    (("model=mlp", "precision=f32"), STAGES),
    (("model=mlp", "precision=f64"), ("forward", "check", "bench", "track")),
    (("model=toy", "precision=f32"), STAGES),
    # A failed check: the MC dropout example with its shared-key bug planted (every row
    # draws from one key); track logs the run and exits 0 (the gate stage, not run here,
    # turns the verdict into the exit status).
    (FAILING, STAGES),
)
DAY_S = 86400.0
# The compare view's sections that list params, metrics and tags (their toggle's label).
SECTIONS = ("Parameters", "Metrics", "Tags")
# What only MLflow's GenAI view shows in an experiment's navigation (its ML view shows
# Runs, Models, Traces).
GENAI_ONLY = ("Sessions", "Judges", "Evaluation runs", "Prompts & versions", "Playground")


def _age_records(layout: Layout, stages: set[str], seconds: float) -> None:
    """Move the time records of ``stages`` ``seconds`` into the past."""
    for name, record in read_stage_times(layout).items():
        if name in stages:
            moved = {**record, "start": record["start"] - seconds, "end": record["end"] - seconds}
            atomic_write_json(layout.stage_times / f"{name}.json", moved)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Layout, list[dict[str, Any]]]:
    """A temporary project after three pipeline runs; of each, its track.json with the
    stage time records as that run left them (``"stages"``)."""
    root = tmp_path_factory.mktemp("review")
    layout = inputs_repository(root)
    tracks = []
    for overrides, stages in RUNS:
        if tracks:  # the stages not rerun: as if the run before were yesterday's
            _age_records(layout, set(STAGES) - set(stages), DAY_S)
        write_params(root, *overrides, *OVERRIDES)
        commit_all(root, " ".join(overrides))
        codes = {name: run_stage(root, name) for name in stages}
        assert codes == dict.fromkeys(stages, 0), overrides
        tracks.append(read_json(layout.track_report) | {"stages": read_stage_times(layout)})
    return layout, tracks


def _uri(layout: Layout) -> str:
    from vmapcheck.config import load_config

    return tracking_uri(load_config(layout.params_yaml).tracking, layout.root)


def _runs(layout: Layout, tracks: list[dict[str, Any]]) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=_uri(layout))
    return [client.get_run(t["run_id"]) for t in tracks]


@pytest.fixture(scope="module")
def server(project) -> Iterator[str]:
    layout, _ = project
    with serving(_uri(layout), layout.root) as base:
        yield base


def test_every_model_in_one_experiment_with_its_own_times_and_few_params(project):
    layout, tracks = project
    runs = _runs(layout, tracks)
    assert {t["experiment"] for t in tracks} == {"vmapcheck"}
    assert len({r.info.experiment_id for r in runs}) == 1
    assert [(r.data.tags["model"], r.data.tags["precision"]) for r in runs] == [
        ("mlp", "f32"),
        ("mlp", "f64"),
        ("toy", "f32"),
        ("mc_dropout", "f32"),
    ]
    for r in runs[:3]:
        assert r.info.status == "FINISHED" and r.data.tags["verdict"] == "passed"
    # The failed check's run ends FAILED (a red cross in the runs list), complete.
    assert runs[3].info.status == "FAILED" and runs[3].data.tags["verdict"] == "failed"
    assert runs[3].data.tags["pipeline_complete"] == "true"
    for r in runs:
        # The compared knobs only; the whole config is the artifact params.yaml.
        assert sorted(r.data.params) == sorted([*COMPARED_PARAMS, *COMPARED_IF_PRESENT])
        print(f"{r.info.run_name}: {len(r.data.params)} params, {len(r.data.metrics)} metrics")
    # Each run starts with its own first stage, never a stage DVC skipped (the float64
    # run's prepare and train are a day old), and ends when its track ended.
    f64 = tracks[1]["stages"]
    assert f64["train"]["end"] < f64["forward"]["start"] - DAY_S / 2
    assert runs[1].info.start_time == int(1000 * f64["forward"]["start"])
    assert runs[0].info.start_time == int(1000 * tracks[0]["stages"]["prepare"]["start"])
    assert runs[1].info.start_time > runs[0].info.end_time
    for r in runs:
        assert r.info.end_time > r.info.start_time
    # Newest first, as the runs were made.
    selection = select_runs(_uri(layout), n=10, prefix="vmapcheck")
    assert [r.info.run_id for r in selection.runs] == [t["run_id"] for t in reversed(tracks)]


def test_the_compare_view_opens_in_the_ml_mode_with_the_verdict_and_summary_first(
    project, server, tmp_path_factory, capsys
):
    from vmapcheck.tracking.runs import run_compare

    layout, tracks = project
    runs = _runs(layout, tracks)
    pairs = [(r.info.experiment_id, r.info.run_id) for r in reversed(runs)]
    # The address `vmapcheck compare` prints: its local UI's, with the ML mode.
    assert run_compare(layout, n=4, width=200) == 0
    printed = capsys.readouterr().out
    local = compare_url("http://127.0.0.1:5000", pairs)
    assert f"vmapcheck ui, then {local}" in printed and "workflowType=machine_learning" in local
    assert compare_view_line(select_runs(_uri(layout), n=4, prefix="vmapcheck")) in printed

    out = tmp_path_factory.mktemp("mlflow-review-screenshots")
    text = browse(compare_url(server, pairs), out, "compare-runs", window="1280,2050")
    with capsys.disabled():
        print(
            f"\ncompare view: {compare_url(server, pairs)}\nscreenshot: {out / 'compare-runs.png'}"
        )
    for r in runs:
        assert r.info.run_name in text
    # MLflow's ML mode (its switch reads "GenAI | Model training"), not the GenAI one.
    assert "Model training" in text and "Traces" not in text and "Judges" not in text
    # Params (the compared knobs), then the metrics with the summary first, then the tags
    # with the verdict.
    parameters, metrics, tags = (text.index(f" {s} Show diff only") for s in SECTIONS)
    assert parameters < metrics < tags
    assert text.index("_summary/worst_max_rel") < text.index("agree/") and "guard." not in text
    assert parameters < text.index("precision.tolerance.rtol") < metrics
    assert " verdict failed passed passed passed " in text[tags:]
    # The parallel coordinates plot opens on the deciding figure (the first metric
    # logged), before the params table.
    assert text.index("_summary/worst_bound_ratio") < parameters
    # vmapcheck logs no NaN: a figure a run did not measure is left out, which this page
    # shows as "NaN" (the float64 run has no float64 oracle to be compared with).
    for r in runs:
        assert all(math.isfinite(v) for v in r.data.metrics.values()), r.info.run_name
    assert "_summary/worst_vs_f64_max_rel" not in runs[1].data.metrics

    # The runs table of the one experiment: the verdict and what tells runs apart first.
    table = browse(experiment_url(server, pairs[0][0]), out, "runs-table", window="1600,900")
    (out / "runs-table.txt").write_text(table)
    (out / "compare-runs.txt").write_text(text)
    # Each row's cells in the order shown (verdict, model, precision, backend, bench):
    # the header cells' order in the page is not the one shown.
    for model, precision in (("mc_dropout", "f32"), ("toy", "f32"), ("mlp", "f64"), ("mlp", "f32")):
        verdict = "failed" if model == "mc_dropout" else "passed"
        assert f" {verdict} {model} {precision} cpu quick " in table, (model, precision)
    keep = os.environ.get("VMAPCHECK_SCREENSHOT_DIR")
    if keep:  # a small PNG for docs/: 64 colours
        from PIL import Image

        Path(keep).mkdir(parents=True, exist_ok=True)
        for name in ("compare-runs", "runs-table"):
            with Image.open(out / f"{name}.png") as image:
                small = image.convert("RGB").quantize(colors=64)
                small.save(Path(keep) / f"{name}.png", optimize=True)


def test_the_last_run_carries_its_summary_description_source_and_timeline(project):
    from mlflow.tracking import MlflowClient

    layout, tracks = project
    client = MlflowClient(tracking_uri=_uri(layout))
    track = tracks[2]  # the toy run's: every stage ran for it
    run_ = client.get_run(track["run_id"])
    tags, metrics = run_.data.tags, run_.data.metrics
    assert metrics["_summary/passed"] == 1.0
    worst = max(v for k, v in metrics.items() if k.startswith("agree/") and k.endswith("max_rel"))
    assert metrics["_summary/worst_max_rel"] == worst
    assert metrics["_summary/invalid_refused"] == metrics["_summary/invalid_total"] > 0
    assert "_summary/vmap_over_loop_at_b0008" in metrics
    # Zero-padded batch labels in every metric name that has one.
    assert "latency_ms/vmap_jit/b0008/p50" in metrics and "speedup/b0008/vmap_over_loop" in metrics
    assert not [k for k in metrics if "/b8/" in k or k.endswith("/b8")]
    assert tags[NOTE_TAG].startswith("**PASSED**") and "worst agreement" in tags[NOTE_TAG]
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"] == str(layout.root / "dvc.yaml")
    assert tags["bench"] in run_.info.run_name
    stages = track["stages"]
    assert list(stages) == list(STAGES)  # oldest start first
    assert run_.info.start_time == int(1000 * stages["prepare"]["start"])
    assert run_.info.end_time >= int(1000 * stages["track"]["start"])
    for stage in STAGES:
        assert metrics[f"timeline/{stage}_s"] >= 0
    assert stages["track"]["exit_code"] == 0 and stages["track"]["wall_s"] > 0
    experiment = client.get_experiment(run_.info.experiment_id)
    # One experiment for every model (tracking.experiment_per_model false).
    assert experiment.name == "vmapcheck" and "every model" in experiment.tags[NOTE_TAG]
    view = json.loads(experiment.tags["mlflow.sharedViewState.vmapcheck-summary"])
    assert view["name"] == "vmapcheck summary"
    columns = json.loads(view["state"])["selectedColumns"]
    # The verdict and what tells runs apart first.
    assert columns[:8] == [
        "tags.`verdict`",
        "tags.`model`",
        "tags.`precision`",
        "tags.`backend`",
        "tags.`bench`",
        "tags.`perf_verdict`",
        # The figure the verdict is decided by and the tolerance, then the summary.
        "metrics.`_summary/worst_bound_ratio`",
        "metrics.`_summary/tolerance_rtol`",
    ]
    assert columns[8:10] == [
        "metrics.`_summary/tolerance_atol`",
        "metrics.`_summary/worst_max_rel`",
    ]


def test_the_printed_urls_open_the_ml_view_with_the_summary_metrics(
    project, server, tmp_path_factory
):
    _, tracks = project
    track = tracks[2]  # the toy run's
    out = tmp_path_factory.mktemp("mlflow-ui-screenshots")
    # Wide enough for the view's tag columns and the first summary metrics (the table
    # renders only the columns in sight).
    runs_list = browse(
        experiment_url(server, track["experiment_id"]), out, "runs-list", window="2800,1200"
    )
    run_page = browse(run_url(server, track["experiment_id"], track["run_id"]), out, "run-page")
    for text in (runs_list, run_page):
        assert "Model training" in text and " Runs " in text and " Models " in text
        shown = [word for word in GENAI_ONLY if f" {word} " in text]
        assert not shown, f"MLflow's GenAI view is shown: {shown}"
    # The runs table's columns: the saved view vmapcheck stores on the experiment.
    assert "vmapcheck summary" in runs_list  # its name, on the Views menu
    (out / "runs-list.txt").write_text(runs_list)
    # Its first columns: the verdict, then what tells runs apart (the row's cells, in the
    # order shown: the header cells' order in the page is not the one shown).
    assert " passed toy f32 cpu quick " in runs_list
    # Then the figure that decides the verdict, the tolerance and the summary (the table
    # renders only the columns in sight: the speed-ups are further right).
    for name in ("_summary/worst_bound_ratio", "_summary/tolerance_rtol", "_summary/worst_max_rel"):
        assert name in runs_list and name in run_page
    assert "_summary/vmap_over_loop_at_b0008" in run_page
    assert track["run_name"] in run_page and "Created by" in run_page
    assert "dvc.yaml" in run_page and "PASSED" in run_page  # source, description
    for png in ("runs-list.png", "run-page.png"):
        assert (out / png).stat().st_size > 10_000


def test_every_url_vmapcheck_prints_opens_the_page_it_names(project, tmp_path_factory, capsys):
    """`vmapcheck ui` (`make ui`) serves the project's store; each address it, `track`
    ("open the run: ...", also the summary's "open it:") and `vmapcheck compare` print
    opens in headless Chromium on what it names: no "***" from the credential filter, no
    MLflow "does not exist", the run or runs named, the failed run shown failed."""
    from vmapcheck.cli import main
    from vmapcheck.tracking.review import review_url

    layout, tracks = project
    out = tmp_path_factory.mktemp("printed-urls")
    # What track and the summary print, for a local store: made for make ui's port.
    made_for = "http://127.0.0.1:5000"
    # Through the command line, as printed: every line passes the credential filter.
    assert main(["compare", "--root", str(layout.root), "-n", "4", "--width", "200"]) == 0
    line = r"side by side in the MLflow UI: vmapcheck ui, then (\S+)\n"
    compared = re.findall(line, capsys.readouterr().out)
    assert len(compared) == 1
    from vmapcheck.tracking.review import registry_url

    # The version each passing run registered (registry.registered_model is
    # vmapcheck-<model> by default; a failed check registers nothing): track and the
    # summary print its page.
    registered = [t["registry"] for t in tracks[:3]]
    assert "registered_model" not in tracks[3]["registry"] and registry_url(tracks[3]) is None
    version_links = [str(registry_url(t)).removeprefix("vmapcheck ui, then ") for t in tracks[:3]]
    run_links = []
    for track in tracks:
        printed = review_url(track)
        assert printed.startswith(f"vmapcheck ui, then {made_for}/#/"), printed
        run_links.append(printed.removeprefix("vmapcheck ui, then "))
    with vmapcheck_ui(layout.root) as (base, printed):
        listed = re.findall(r"(http://127\.0\.0\.1:\d+/#/\S+)", printed)
        # One address: the experiment's runs table, on the port it listens on.
        assert len(listed) == 1 and listed[0].startswith(f"{base}/#/experiments/"), printed
        pages = {
            "runs-list": listed[0],
            **{f"run-{i}": link for i, link in enumerate(run_links)},
            "compare": compared[0],
            **{f"version-{i}": link for i, link in enumerate(version_links)},
        }
        texts = {}
        for name, url in pages.items():
            assert "***" not in url, (name, url)
            window = "2800,1200" if name == "runs-list" else "1600,1600"
            texts[name] = browse(url.replace(made_for, base), out, name, window=window)
    with capsys.disabled():
        print(f"\nprinted URLs' screenshots: {out}")
    for name, text in texts.items():
        assert "does not exist" not in text and "Page not found" not in text, name
        # The ML view: its switch, and none of the GenAI view's menu entries.
        assert "Model training" in text and " AI Gateway " not in text, f"{name}: GenAI view"
    names = [t["run_name"] for t in tracks]
    # The runs table lists every run, the failed one with its verdict, failed.
    for name in names:
        assert name in texts["runs-list"]
    assert " failed mc_dropout f32 cpu quick " in texts["runs-list"]
    # Each run's page names its run, and shows its status: Failed for the failed check.
    for i, name in enumerate(names):
        assert name in texts[f"run-{i}"]
    assert "Failed" in texts["run-3"] and "FAILED" in texts["run-3"]  # status, description
    assert "Failed" not in texts["run-2"] and "Finished" in texts["run-2"]
    for name in names:
        assert name in texts["compare"]
    # Each registered version's page: its model and version.
    for i, outcome in enumerate(registered):
        text = texts[f"version-{i}"]
        assert outcome["registered_model"] in text, (i, outcome)
        assert f"Version {outcome['version']}" in text, (i, outcome)
