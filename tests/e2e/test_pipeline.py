"""End to end: the real pipeline (DVC + Hydra + JAX + MLflow) in a temporary copy.

The steps share one copy of the repository and run in file order, as a user would:
repro, repro again, read metrics and plots, change a tolerance, ask for a missing
backend, plant a fault, change the reference and the params. Nothing is mocked.
Experiments with -S overrides run in a copy of their own (tests/e2e/test_experiments.py),
so that the two files run side by side on two test workers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.config import ROOT
from tests.helpers.project import (
    BF16_HIDDEN_LAYER,
    FAST_RUN,
    TWO_BATCH_SIZES,
    commit_all,
    compose_params,
    copy_project,
    planted,
    run,
)
from tests.helpers.project import stages_run as project_stages_run

pytestmark = pytest.mark.e2e

# Small enough to run the whole pipeline in ~30 s on two cores; every stage still runs.
TINY = [
    "data.n_rows=200",
    "data.standard_batch=8",
    *FAST_RUN,
    # The plots' curves and the per-size figures this file reads need two sizes.
    TWO_BATCH_SIZES,
]


def compose(project: Path, *overrides: str) -> None:
    compose_params(project, *TINY, *overrides)


def stages_run(result: subprocess.CompletedProcess) -> set[str]:
    """The stages DVC ran, less the code stage, which always runs (helpers.project)."""
    return project_stages_run(result.stdout + result.stderr)


def mlflow_client(project: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    dest = copy_project(tmp_path_factory.mktemp("vmapcheck") / "repo")
    compose(dest)
    commit_all(dest)
    return dest


@pytest.fixture(scope="module")
def first_run(project) -> subprocess.CompletedProcess:
    """The project's first `dvc repro` (every stage), run once for the tests that read it."""
    return run(project, "dvc", "repro")


# What was added after the names in tests/data/mlflow_names.json were recorded: paths
# and a case kind (registered), config keys, the batch composition check (its metrics),
# the run's process tags. A name the old run lacks must match one of these patterns.
ADDED_SINCE = (
    "vmap_of_jit",
    "denormal",
    "duplicate_rows",  # and its rule's metrics, rule/...
    "rule/",
    "scan_jit",
    "tolerance.scale",
    "composition/",
    # The per-row loop as lax.map (map_jit, not vmap_jit) and vmap's speed-up over it.
    r"(?<!v)map_jit",
    "vmap_over_map",
    # The input contract's key (null for a flat vector).
    "model.inputs",
    # The process tags of a run (who may settle it if it is left RUNNING).
    r"vmapcheck\.track_",
    # MLflow at a glance (issue 13): the summary figures, the per-stage timeline, the
    # verdict as the run's description, who ran it and from where, the bench profile.
    r"^_summary/",
    r"^timeline/",
    r"^mlflow\.(note\.content|user|source\.name|source\.type)$",
    r"^bench$",
    # Which of the pipeline's own outputs tracked in git the run rewrote (issue 23).
    r"^git_outputs_rewritten$",
    # What the model is, for the verdict's baseline (issue 24).
    r"^model_contract_sha256$",
    # The bench profile sets the guard replay's size (issue 23).
    r"^bench\.replay_requests$",
    # The deployment target, whose passing runs move alias verified (issue 25).
    r"^registry\.target\.",
    # The device's count, memory and runtime versions (issue 32; libtpu_version and the
    # CUDA plugins' only on those backends, device_memory_gib not on CPU).
    r"^(device_count|device_memory_gib|platform_version)$",
    r"^(libtpu|jax_(cuda|rocm)|nvidia_)\w*_version$",
    # The kinds of finding that failed the check (issue 42).
    r"^verdict_kinds$",
    # The mesh paths (issue 46): each one's parallelism and mesh, its figures; and the
    # forward stage's processes.
    r"^mesh\.",
    r"tensor_parallel_jit",
    r"data_model_jit",
    r"^backend\.processes$",
)


def _assert_same_params_and_tags_as_before_the_move(params, tags) -> None:
    """The run logs every tag name the run before the one-house move logged (same
    config), and new names only for what was registered since. Params are the compared
    config keys only (issue 25; the whole config is the artifact params.yaml), every one
    among the names logged then or registered since. Metrics are no longer one per pair
    of paths (issue 23): collect_metrics' docstring lists them."""
    from vmapcheck.tracking.log import COMPARED_IF_PRESENT, COMPARED_PARAMS

    before = json.loads((ROOT / "tests" / "data" / "mlflow_names.json").read_text())
    assert sorted(params) == sorted([*COMPARED_PARAMS, *COMPARED_IF_PRESENT])
    added = [
        n
        for n in set(params) - set(before["params"])
        if not any(re.search(a, n) for a in ADDED_SINCE)
    ]
    assert not added, f"new params: {added}"
    old, new = set(before["tags"]), set(tags)
    assert not old - new, f"tags no longer logged: {sorted(old - new)}"
    unexplained = [n for n in new - old if not any(re.search(a, n) for a in ADDED_SINCE)]
    assert not unexplained, f"new tags: {unexplained}"


def test_repro_runs_every_stage_and_logs_a_complete_mlflow_run(project, first_run):
    assert stages_run(first_run) == {"prepare", "train", "forward", "check", "bench", "track"}
    import json

    import jax

    track = json.loads((project / "reports" / "track.json").read_text())
    assert track["verdict"] == "passed"
    run_ = mlflow_client(project).get_run(track["run_id"])
    params, metrics, tags = run_.data.params, run_.data.metrics, run_.data.tags
    _assert_same_params_and_tags_as_before_the_move(params, tags)
    # A few hundred metrics at most: the per-case worst figures and each path's own
    # figures (213 with 15 paths, 2026-12-07), never one per pair of paths (that would
    # grow as the square of the registry: over 100 pairs per case).
    from vmapcheck.core.paths import PATHS

    assert len(metrics) <= 16 * len(PATHS), (len(metrics), len(PATHS))
    assert not [k for k in metrics if "-vs-" in k], "a per-pair figure logged as a metric"
    assert params["model.name"] == "mlp"
    assert params["precision.tolerance.rtol"] == "1e-05"
    assert params["bench.batch_sizes"] == "[1, 8]"
    assert metrics["check/passed"] == 1.0
    assert metrics["agree/standard/max_abs"] < 1e-5 and "agree/boundary/max_rel" in metrics
    assert 0 <= metrics["agree/standard/bound_ratio"] <= 1
    assert metrics["negative/refused"] == metrics["negative/cases"] > 0
    # The data-parallel path: checked and benchmarked like every path, over 2 emulated
    # CPU devices (backend=cpu's default), against the stored reference's vmap_jit.
    details = json.loads((project / "reports" / "check_details.json").read_text())
    assert "vmap_jit-vs-sharded_jit" in details["cases"]["standard"]["pairs"]
    assert "sharded_jit" in details["reference"]["cases"]["standard"]
    assert metrics["latency_ms/sharded_jit/b0008/p50"] > 0
    assert tags["sharded.devices"] == "2" and tags["sharded.mesh_shape"] == "data=2"
    assert details["negative"]["invalid_vector"]["passed"]
    assert metrics["reference/passed"] == 1.0
    assert "reference/standard/max_rel" in metrics
    assert "oracle/boundary/max_rel" in metrics
    assert tags["reference.status"] == "ok" and tags["reference.jax_version"] == jax.__version__
    assert metrics["latency_ms/vmap_jit/b0008/p50"] > 0
    assert metrics["latency_ms/loop_eager/b0001/p99"] >= metrics["latency_ms/loop_eager/b0001/p50"]
    assert tags["jax_version"] == jax.__version__ and tags["jaxlib_version"] == jax.__version__
    assert tags["python_version"] == sys.version.split()[0]
    assert tags["backend"] == "cpu" and tags["device_kind"] == "cpu"
    assert tags["tolerance.rtol"] == "1e-05" and tags["tolerance.atol"] == "1e-06"
    assert tags["verdict"] == "passed"
    assert len(tags["git_commit"]) == 40
    artifacts = {a.path for a in mlflow_client(project).list_artifacts(track["run_id"])}
    assert {"check.json", "bench.json", "params.yaml", "plots", "params", "report.html"} <= (
        artifacts
    )
    plots = {a.path for a in mlflow_client(project).list_artifacts(track["run_id"], "plots")}
    assert "plots/latency.png" in plots
    _assert_the_run_is_organized_and_complete(project, track, run_)
    # A fresh store has no earlier verified run to judge the benchmark against.
    assert track["perf_verdict"] == "no baseline" and tags["perf_verdict"] == "no baseline"
    summary = run(project, sys.executable, "-m", "vmapcheck", "summary").stdout
    assert summary.startswith("verdict: PASSED")
    assert f"MLflow run: {track['run_id']}" in summary


def _assert_the_run_reads_at_a_glance(project, run_):
    """Summary metrics, description, user and source, a run spanning every stage, the
    per-stage timeline, and an experiment that says what it holds (issue 13 item 1)."""
    from vmapcheck.tracking.experiment import NOTE_TAG

    tags, metrics = run_.data.tags, run_.data.metrics
    assert metrics["_summary/passed"] == 1.0
    assert metrics["_summary/worst_max_rel"] == max(
        v for k, v in metrics.items() if k.startswith("agree/") and k.endswith("/max_rel")
    )
    assert metrics["_summary/worst_vs_reference_max_rel"] >= 0
    assert metrics["_summary/invalid_refused"] == metrics["_summary/invalid_total"] > 0
    assert any(re.fullmatch(r"_summary/vmap_over_loop_at_b\d{4}", k) for k in metrics)
    assert tags[NOTE_TAG].startswith("**PASSED**")
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"].endswith("dvc.yaml")
    assert tags["mlflow.source.git.commit"] == tags["git_commit"]
    stages = {
        p.stem: json.loads(p.read_text()) for p in (project / "reports" / "stages").glob("*.json")
    }
    assert set(stages) == {"prepare", "train", "forward", "check", "bench", "track"}
    assert all(r["exit_code"] == 0 and r["wall_s"] > 0 for r in stages.values())
    # The run starts when the first stage did, and ends after the last one started.
    assert run_.info.start_time == int(1000 * stages["prepare"]["start"])
    assert run_.info.end_time >= int(1000 * stages["track"]["start"])
    for stage in stages:
        assert metrics[f"timeline/{stage}_s"] > 0
    client = mlflow_client(project)
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id)}
    assert "timeline.json" in artifacts
    experiment = client.get_experiment(run_.info.experiment_id)
    assert "every model" in experiment.tags[NOTE_TAG]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def _assert_the_run_is_organized_and_complete(project, track, run_):
    """One experiment for every model, provenance tags, datasets and the artifacts that make the run
    reviewable without this machine (issue 6, items 1 and 2)."""
    import hashlib
    import tempfile

    from vmapcheck.data.regression import SPLITS, load_cases
    from vmapcheck.tracking.run_inputs import array_digest

    client = mlflow_client(project)
    tags, run_id = run_.data.tags, run_.info.run_id
    assert client.get_experiment(run_.info.experiment_id).name == "vmapcheck"
    assert track["experiment"] == "vmapcheck"
    # Unique, and names the bench profile (no DVC experiment under a plain dvc repro).
    assert re.fullmatch(
        rf"mlp-cpu-f32-{tags['bench']}-jax{re.escape(tags['jax_version'])}-"
        rf"{tags['git_commit'][:7]}-\d{{4}}T\d{{6}}",
        run_.info.run_name,
    ), run_.info.run_name
    _assert_the_run_reads_at_a_glance(project, run_)
    # A run of a committed tree is clean, though it rewrote dvc.lock and the metrics kept
    # in git: those are listed apart.
    assert tags["git_dirty"] == "false", tags
    assert "dvc.lock" in tags["git_outputs_rewritten"].split(","), tags
    assert "dvc_exp_name" not in tags  # a plain dvc repro, not dvc exp run
    assert tags["environment.matches_lock"] == "true"  # .venv is installed from the lock
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"environment", "dvc.lock", "params.yaml", "manifest.json", "contract.json"} <= artifacts
    assert {"params/params.safetensors", "params/manifest.json"} <= {
        a.path for a in client.list_artifacts(run_id, "params")
    }
    assert {a.path for a in client.list_artifacts(run_id, "environment")} == {
        "environment/requirements.lock",
        "environment/pip-freeze.txt",
        "environment/lock-mismatches.txt",
    }
    with tempfile.TemporaryDirectory() as tmp:
        lock = client.download_artifacts(run_id, "dvc.lock", tmp)
        # The digest names the dvc.lock logged with the run.
        assert tags["dvc_lock_sha256"] == hashlib.sha256(Path(lock).read_bytes()).hexdigest()
    # Inputs: every regression case and split, digested over all of its bytes.
    inputs = {d.dataset.name: d for d in run_.inputs.dataset_inputs}
    cases = load_cases(project / "data" / "cases")
    assert set(inputs) == {f"cases/{c}" for c in cases} | {f"splits/{s}" for s in SPLITS}
    for name, case in cases.items():
        arrays = {"features": case["x"], **({"targets": case["y"]} if "y" in case else {})}
        input_tags = {t.key: t.value for t in inputs[f"cases/{name}"].tags}
        assert input_tags["sha256"] == array_digest(arrays), name
        assert input_tags["mlflow.data.context"] == "regression"
    split_tags = {t.key: t.value for t in inputs["splits/train"].tags}
    assert split_tags["mlflow.data.context"] == "train" and len(split_tags["sha256"]) == 64


def test_html_report_of_the_run_renders_in_chromium(project, first_run, tmp_path):
    """The report of the real run, as logged to MLflow, opened in headless Chromium."""
    import json

    from tests.helpers.chromium import render

    page = project / "reports" / "report.html"
    track = json.loads((project / "reports" / "track.json").read_text())
    logged = mlflow_client(project).download_artifacts(track["run_id"], "report.html", tmp_path)
    assert Path(logged).read_bytes() == page.read_bytes()
    shown = render(page, tmp_path / "chromium")
    print(f"screenshot: {shown['screenshot']}")
    probe = shown["probe"]
    assert probe["verdict"]["text"].startswith("PASSED") and probe["verdict"]["height"] > 40
    assert probe["title"].startswith("vmapcheck PASSED: mlp on cpu (cpu), float32")
    assert [i["id"] for i in probe["images"]] == ["plot-latency", "plot-speedup"]
    for image in probe["images"]:  # decoded by the browser and laid out on the page
        assert image["src_scheme"] == "data" and image["natural_width"] > 300, image
        assert image["shown_width"] > 300, image
    assert probe["fetched"] == []
    details = json.loads((project / "reports" / "check_details.json").read_text())
    for case, report in details["cases"].items():
        table = re.search(rf'<table id="pairs-{case}">.*?</table>', shown["dom"], re.S)
        assert table is not None, case
        assert table.group(0).count('<tr class="pair pass">') == len(report["pairs"]), case
    assert shown["dom"].count('<tr class="negative pass">') == len(details["negative"])
    assert shown["screenshot"].stat().st_size > 50_000


def test_second_repro_runs_no_stage(project, first_run):
    result = run(project, "dvc", "repro")
    assert stages_run(result) == set()
    for stage in ("prepare", "train", "forward", "check", "bench", "track"):
        assert f"Stage '{stage}' didn't change, skipping" in result.stdout, result.stdout
    # code kept its records (persist): it says nothing changed, not that all is new.
    assert re.search(r"^code: vmapcheck \S+; no change$", result.stdout, re.M), result.stdout
    assert "gate: the check PASSED; worst_bound_ratio " in result.stdout


def test_an_unknown_key_alone_is_refused_by_the_first_stage(project, first_run):
    # `-S +foo=1` changes no stage's declared params: code, the first stage and always
    # run, validates the whole params.yaml and refuses the key before any work. Written
    # into params.yaml as DVC's -S writes it (`vmapcheck params +foo=1` refuses it itself).
    params = project / "params.yaml"
    before = params.read_text()
    params.write_text(before + "foo: 1\n")
    try:
        result = run(project, "dvc", "repro", check=False)
    finally:
        params.write_text(before)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and stages_run(result) == set(), output
    assert "code: error: invalid configuration in" in output
    assert "  foo: unknown key (found value 1)" in output


def test_metrics_and_plots_show(project, tmp_path):
    """DVC metrics hold the headline only; the plots are log-log, nothing unmeasured."""
    shown = run(project, "dvc", "metrics", "show").stdout
    # The loop is timed up to bench.loop_max_batch=8: the headline batch (TINY).
    for name in ("worst_max_rel", "invalid_refused", "vmap_over_loop@b0008", "val_loss"):
        assert name in shown
    for detail in ("latency_ms", "agreement", "peak_gflops"):  # in *_details.json only
        assert detail not in shown
    out = tmp_path / "plots"
    run(project, "dvc", "plots", "show", "-o", str(out))
    html = (out / "index.html").read_text()
    assert "latency_p50_ms_vs_batch_size" in html and "vmap_jit.csv" in html
    # Each path in its registry colour (vmapcheck.core.paths.series_colours).
    from vmapcheck.core.paths import series_colours

    assert '"type": "log"' in html and f'"{series_colours()["vmap_jit"]}"' in html
    # No unmeasured cell: the loop has no row (nor a ratio over it) past 8 rows.
    assert '"ratio": ""' not in html and '"p50_ms": ""' not in html
    loop = (project / "reports" / "plots" / "loop_jit.csv").read_text().split()
    assert [row.split(",")[0] for row in loop] == ["batch_size", "1", "8"]


def test_changing_only_a_tolerance_reruns_check_and_track(project):
    compose(project, "precision.tolerance.rtol=2e-05")
    result = run(project, "dvc", "repro")
    assert stages_run(result) == {"check", "track"}
    # bench did not rerun: its latencies are the run before's, so no new verdict (issue
    # 35: this run used to be judged "no regression", every ratio 1.000, against itself).
    import json

    track = json.loads((project / "reports" / "track.json").read_text())
    assert track["perf_verdict"] == "bench not rerun"
    assert "track: bench not rerun: timing from run " in result.stdout
    assert "benchmark verdict:" not in result.stdout
    run_ = mlflow_client(project).get_run(track["run_id"])
    assert not any(name.startswith("perf/") for name in run_.data.metrics)
    assert run_.data.tags["perf_verdict"] == "bench not rerun"
    assert run_.data.tags["perf_baseline"].startswith("bench not rerun: timing from run ")
    assert "benchmark vs baseline: BENCH NOT RERUN" in run_.data.tags["mlflow.note.content"]
    perf = json.loads((project / "reports" / "perf_verdict.json").read_text())
    assert perf["verdict"] == "bench not rerun" and "cells" not in perf
    verdict = run(
        project, sys.executable, "-m", "vmapcheck", "verdict", "--baseline", "last-verified"
    )
    assert "benchmark verdict: NO REGRESSION" in verdict.stdout


def test_missing_gpu_fails_with_the_backends_that_exist(project):
    compose(project, "backend=gpu")
    try:
        result = run(project, "dvc", "repro", check=False)
    finally:
        compose(project)
    output = result.stdout + result.stderr
    if "Backends present" not in output and result.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert result.returncode != 0
    assert "forward: error: backend.name='gpu' (JAX platform 'cuda') is not available" in output
    assert "Backends present: cpu" in output


def test_planted_fault_is_diagnosed_and_logged_as_failed_before_the_pipeline_fails(project):
    with planted(project / "src" / "vmapcheck" / "core" / "models.py", *BF16_HIDDEN_LAYER):
        result = run(project, "dvc", "repro", check=False)
    assert result.returncode != 0
    assert "track: the check FAILED" in result.stdout
    assert "check: diagnosis" in result.stdout, result.stdout + result.stderr
    import json

    # The diagnosis written by check names the stage, the layer and the path.
    diagnosis = json.loads((project / "reports" / "diagnosis.json").read_text())
    first = diagnosis["first_divergence"]
    assert (first["stage"], first["layer"], first["paths"]) == (
        "forward",
        "layers[1]",
        ["direct_eager"],
    ), diagnosis["summary"]
    assert [s["stage"] for s in diagnosis["ruled_out"]] == ["data", "key_stream", "shapes"]
    assert diagnosis["trigger"].startswith("the check failed")
    text = (project / "reports" / "diagnosis.txt").read_text()
    assert "FIRST DIVERGENCE: stage forward, layer layers[1]" in text

    # The failing run is logged, with its diagnosis, before the pipeline fails.
    track = json.loads((project / "reports" / "track.json").read_text())
    client = mlflow_client(project)
    run_ = client.get_run(track["run_id"])
    assert run_.data.tags["verdict"] == "failed"
    # Ended FAILED (a red cross in MLflow's runs list), and complete: logged once.
    assert run_.info.status == "FAILED" and run_.data.tags["pipeline_complete"] == "true"
    assert run_.data.metrics["check/passed"] == 0.0
    assert run_.data.tags["diagnosis.stage"] == "forward"
    assert run_.data.tags["diagnosis.layer"] == "layers[1]"
    assert run_.data.tags["diagnosis.paths"] == "direct_eager"
    pairs = json.loads((project / "reports" / "check_details.json").read_text())["cases"]
    assert pairs["standard"]["pairs"]["loop_eager-vs-vmap_jit"]["passed"]
    assert not pairs["standard"]["pairs"]["vmap_jit-vs-direct_jit"]["passed"]
    assert run_.data.metrics["agree/standard/max_abs"] > 0
    # The HTML report of the failed run says so and names the failing pairs.
    report = (project / "reports" / "report.html").read_text()
    assert 'data-verdict="failed"' in report and "vmap_jit-vs-direct_jit" in report
    # And the diagnosis, in the banner and its own section (issue 43).
    assert "First divergence: stage forward" in report and 'id="diagnosis-stages"' in report
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id)}
    assert {"report.html", "diagnosis.json", "diagnosis.txt"} <= artifacts

    # The fault removed: the check passes and the diagnosis says it was not needed.
    run(project, "dvc", "repro")
    assert json.loads((project / "reports" / "diagnosis.json").read_text())["status"] == (
        "not needed"
    )
    healthy = client.get_run(json.loads((project / "reports" / "track.json").read_text())["run_id"])
    assert healthy.data.tags["diagnosis.status"] == "not needed"

    # On demand (make diagnose): the whole protocol on the current outputs, all ruled out.
    demand = run(project, sys.executable, "-m", "vmapcheck", "diagnose", check=False)
    assert demand.returncode == 0, demand.stdout + demand.stderr
    on_demand = json.loads((project / "reports" / "diagnosis-on-demand.json").read_text())
    assert on_demand["status"] == "no divergence found", on_demand["summary"]
    assert on_demand["trigger"] == "on demand (the last check PASSED)"
    assert "reference" not in on_demand["not_reached"]


def _details(project: Path) -> dict:
    import json

    return json.loads((project / "reports" / "check_details.json").read_text())


def test_check_covers_every_case_kind_and_compares_with_the_reference(project):
    import jax

    details = _details(project)
    assert set(details["cases"]) == {
        "standard",
        "single",
        "single_vector",
        "zeros",
        "boundary",
        "large_magnitude",
        "denormal",
        "duplicate_rows",
    }
    assert set(details["negative"]) == {
        "invalid_features",
        "invalid_rank",
        "invalid_dtype",
        "invalid_nan",
        "invalid_inf",
        "invalid_empty",
        "invalid_vector",
    }
    assert all(n["passed"] for n in details["negative"].values())
    assert details["cases"]["standard"]["oracle"]["vmap_jit"]["passed"]
    reference = details["reference"]
    assert reference["status"] == "ok" and reference["passed"], reference
    assert reference["made_with"]["jax_version"] == jax.__version__
    assert "compared with jax" in reference["message"]


def _plant_reference_change(project: Path, keep_meta_consistent: bool) -> None:
    import json

    from vmapcheck.io import atomic_save_npz, load_npz, sha256_file

    folder = project / "data" / "reference" / "mlp"
    outputs = load_npz(folder / "outputs.npz")
    outputs["boundary.direct_jit"][0, 0] += 1.0
    atomic_save_npz(folder / "outputs.npz", outputs)
    if keep_meta_consistent:  # as if another run had stored a different value
        meta = json.loads((folder / "meta.json").read_text())
        meta["sha256"]["outputs.npz"] = sha256_file(folder / "outputs.npz")
        (folder / "meta.json").write_text(json.dumps(meta))


def test_a_changed_reference_fails_the_check(project):
    try:
        # As if another run had stored a different value: the value itself is judged,
        # and the case and path are named.
        _plant_reference_change(project, keep_meta_consistent=True)
        result = run(project, "dvc", "repro", check=False)
        assert result.returncode != 0
        assert stages_run(result) >= {"forward", "check", "track"}
        failures = _details(project)["failures"]
        assert [f.split(":")[0] for f in failures] == ["reference/boundary/direct_jit"]
        # An edit outside `make reference` is caught by the sha256 in meta.json.
        _plant_reference_change(project, keep_meta_consistent=False)
        result = run(project, "dvc", "repro", check=False)
        assert result.returncode != 0
        assert stages_run(result) >= {"forward", "check", "track"}
        failures = _details(project)["failures"]
        assert len(failures) == 1 and "sha256 check failed" in failures[0]
    finally:
        run(project, "git", "checkout", "--", "data/reference")
    run(project, "dvc", "repro")


def test_make_reference_records_when_from_which_run_and_why(project):
    import json

    track = json.loads((project / "reports" / "track.json").read_text())
    run(project, sys.executable, "-m", "vmapcheck", "reference", "make", "--reason", "e2e check")
    meta = json.loads((project / "data" / "reference" / "mlp" / "meta.json").read_text())
    assert meta["reason"] == "e2e check" and meta["from_run"] == track["run_id"]
    assert meta["replaces"]["reason"] and meta["created_at"].startswith("20")
    result = run(project, "dvc", "repro")  # the reference is a dependency, not an output
    assert stages_run(result) == {"forward", "check", "track"}
    assert _details(project)["reference"]["passed"]
    refused = run(
        project,
        sys.executable,
        "-m",
        "vmapcheck",
        "reference",
        "make",
        "--reason",
        "",
        check=False,
    )
    assert refused.returncode == 2 and "needs a reason" in refused.stderr
    run(project, "git", "checkout", "--", "data/reference")
    run(project, "dvc", "repro")


def test_tampered_params_stop_forward(project):
    import json

    from safetensors.numpy import load_file, save_file

    from vmapcheck.io import sha256_file

    folder = project / "data" / "params"
    params_file, manifest_file = folder / "params.safetensors", folder / "manifest.json"
    original, manifest = params_file.read_bytes(), manifest_file.read_text()
    try:
        flipped = bytearray(original)
        flipped[-3] ^= 0x01
        params_file.write_bytes(bytes(flipped))
        result = run(project, sys.executable, "-m", "vmapcheck.stages.forward", check=False)
        assert result.returncode == 2
        assert "forward: error:" in result.stderr and "sha256 check failed" in result.stderr
        # A consistent file (digest updated) with one leaf of the wrong shape.
        params_file.write_bytes(original)
        arrays = load_file(str(params_file))
        arrays["layers[1].W"] = arrays["layers[1].W"][:, :31].copy()
        save_file(arrays, str(params_file))
        edited = json.loads(manifest)
        edited["sha256"] = sha256_file(params_file)
        manifest_file.write_text(json.dumps(edited))
        result = run(project, sys.executable, "-m", "vmapcheck.stages.forward", check=False)
        assert result.returncode == 2
        assert "leaf layers[1].W: expected shape [32, 32] dtype float32, found shape [32, 31]" in (
            result.stderr
        )
    finally:
        params_file.write_bytes(original)
        manifest_file.write_text(manifest)
    assert stages_run(run(project, "dvc", "repro")) <= {"forward", "check", "track"}


def test_users_own_params_file_is_verified_and_used(project):
    import json

    from vmapcheck.io import sha256_file

    mine = project / "data" / "raw" / "mine.safetensors"
    mine.write_bytes((project / "data" / "params" / "params.safetensors").read_bytes())
    digest = sha256_file(mine)
    try:
        compose(
            project, "train.params_file=data/raw/mine.safetensors", f"train.params_sha256={digest}"
        )
        result = run(project, "dvc", "repro")
        assert "train" in stages_run(result)
        manifest = json.loads((project / "data" / "params" / "manifest.json").read_text())
        assert manifest["source"] == {
            "params_file": "data/raw/mine.safetensors",
            "params_sha256": digest,
        }
        assert manifest["sha256"] == digest  # the same bytes, verified and kept
        compose(
            project,
            "train.params_file=data/raw/mine.safetensors",
            f"train.params_sha256={'0' * 64}",
        )
        refused = run(project, "dvc", "repro", check=False)
        assert refused.returncode != 0
        assert "train: error:" in refused.stderr and "sha256 check failed" in refused.stderr
    finally:
        mine.unlink()
        compose(project)
    run(project, "dvc", "repro")
