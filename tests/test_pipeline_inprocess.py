"""Every stage body in this process: prepare, train, forward, check, bench and track run
(``vmapcheck.pipeline.<stage>.run``) on a temporary project, and each writes its files.

The same stages as ``dvc repro``, without DVC and without a process per stage: a stage's
failure here keeps its traceback, and the test process's strict JAX settings
(tests/conftest.py) hold in every stage. The project root holds what the stages read:
params.yaml (composed from conf/ with small sizes), data/reference (check compares the
run with the stored verified run of its model), dvc.yaml (track keys its run on the
track stage's deps), requirements.lock (logged with the run's environment), a git
commit of these (the run's provenance), and the MLflow store the config names
(sqlite:///mlflow.db, relative to the root).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import pytest

from tests.helpers.inprocess import STAGES, inputs_repository, run_stage, write_params
from tests.helpers.project import FAST_RUN, TWO_BATCH_SIZES, commit_all, run
from vmapcheck.bench.timing.records import BenchDetails, read_bench_details
from vmapcheck.check.schema import (
    CheckDetails,
    read_check_details,
    read_diagnosis,
    read_record,
)
from vmapcheck.config import load_config
from vmapcheck.core.paths import batch_paths
from vmapcheck.errors import ArtifactError
from vmapcheck.io import missing_keys, read_json
from vmapcheck.layout import Layout
from vmapcheck.pipeline.bench import dvc_metrics as dvc_metrics_of_bench
from vmapcheck.pipeline.check import dvc_metrics as dvc_metrics_of_check
from vmapcheck.report.headline import HEADLINE_SPEEDUPS, batch_label, headline_batch
from vmapcheck.tracking.records import read_track_report
from vmapcheck.tracking.store import is_complete, tracking_uri

OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    # The emulated CPU devices of this process (tests/conftest.py): JAX has started, so
    # configure_jax cannot create others.
    "backend.num_devices=2",
    *FAST_RUN,
    TWO_BATCH_SIZES,  # every batch path timed at one row too
)


@dataclass(frozen=True)
class Project:
    layout: Layout
    codes: dict[str, int]  # each stage's exit code
    commit: str  # the commit of the project's inputs
    before: tuple[str, str | None]  # MLflow's tracking URI and its variable, before


pytestmark = pytest.mark.stages


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """A temporary project (a git repository of its inputs) after every stage ran."""
    import mlflow

    root = tmp_path_factory.mktemp("inprocess")
    inputs_repository(root)
    write_params(root, *OVERRIDES)
    commit_all(root, "in-process inputs")
    commit = run(root, "git", "rev-parse", "HEAD").stdout.strip()
    before = (mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI"))
    codes = {name: run_stage(root, name) for name in STAGES}
    return Project(Layout(root), codes, commit, before)


def test_every_stage_exited_zero(project):
    assert project.codes == dict.fromkeys(STAGES, 0)


def test_prepare_and_train_wrote_the_data_and_params(project):
    layout = project.layout
    for name in ("train", "val", "test"):
        assert (layout.prepared / f"{name}.npz").is_file()
    manifest = read_json(layout.cases_manifest)
    assert (
        manifest["cases"]["standard"]["rows"] == 8
        if "rows" in manifest["cases"]["standard"]
        else True
    )
    assert (layout.params / "params.safetensors").is_file()
    assert read_json(layout.params_manifest)["model"] == "mlp"
    assert read_json(layout.contract)["inputs"]["n_features"] == 8
    train = read_json(layout.train_report)
    assert train["trained"] and train["best_step"] <= 30


def test_forward_wrote_every_paths_outputs(project):
    layout = project.layout
    files = (layout.outputs, layout.composition, layout.record, layout.gradients)
    for path in (*files, layout.reference_outputs):
        assert path.is_file(), path
    record = read_json(layout.record)
    assert record["runtime"]["device_count"] == 2
    # Every batch path also ran on the standard batch permuted and split in halves.
    regrouped = record["composition"]["cases"]["standard"]
    assert regrouped["rows"] == 8 and regrouped["paths"] == [p.name for p in batch_paths()]
    assert record["reference"]["status"] == "ok", record["reference"]


def test_check_passed_and_needs_no_diagnosis(project):
    layout = project.layout
    check = read_json(layout.check_details)
    assert check["passed"], check["failures"]
    composition = check["composition"]["standard"]
    assert set(composition) == {p.name for p in batch_paths()}
    assert all(r["passed"] for r in composition.values())
    assert read_json(layout.check_report) == dvc_metrics_of_check(check)
    assert read_json(layout.diagnosis)["status"] == "not needed"
    assert layout.diagnosis_text.is_file()


def test_bench_timed_every_batch_path_at_batch_size_one(project):
    layout = project.layout
    bench = read_json(layout.bench_details)
    for path in batch_paths():
        stats = bench["latency_ms"][path.name]["b1"]
        assert stats["p50"] > 0, path.name
    # bench.json: vmap's speed-ups at the headline batch only (the figures: details),
    # that batch the profile's (written from the details, which hold it), every key.
    metrics = read_json(layout.bench_report)
    assert metrics == dvc_metrics_of_bench(bench)
    batch = batch_label(headline_batch(bench))
    assert set(metrics) == {f"{name}@{batch}" for name in HEADLINE_SPEEDUPS}
    assert (layout.plots / "latency.png").is_file()


def test_track_logged_one_passed_run_to_the_store_in_the_root(project):
    from mlflow.tracking import MlflowClient

    layout = project.layout
    info = read_track_report(layout.track_report)  # every key TrackReport requires
    assert info["verdict"] == "passed"
    assert info["registry"]["status"] == "registered"
    assert (layout.root / "mlflow.db").is_file()
    uri = tracking_uri(load_config(layout.params_yaml).tracking, layout.root)
    assert info["tracking_uri"] == uri
    run = MlflowClient(tracking_uri=uri).get_run(info["run_id"])
    assert run.data.tags["verdict"] == "passed"
    # Complete (pipeline_complete, then FINISHED: track's last writes), and owned by this
    # process, the one that ran track.
    assert is_complete(run) and run.info.status == "FINISHED"
    assert run.data.tags["vmapcheck.track_pid"] == str(os.getpid())
    assert run.data.tags["model"] == "mlp"
    assert (info["git_commit"], info["git_dirty"]) == (project.commit, "true")  # outputs
    assert layout.html_report.is_file()
    assert read_json(layout.perf_verdict)["verdict"]


def test_the_stages_left_the_process_as_they_found_it(project):
    import jax
    import mlflow

    assert not jax.config.jax_enable_x64
    assert not jax.config.jax_debug_key_reuse
    assert jax.config.jax_default_matmul_precision is None
    assert jax.device_count() == 2
    assert (mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")) == project.before


def test_a_rerun_of_track_moves_the_alias_a_dead_track_left_pending(project, capsys):
    from mlflow.tracking import MlflowClient

    from vmapcheck.tracking.registry import TAG_ALIAS_PENDING, VERIFIED

    layout = project.layout
    info = read_json(layout.track_report)
    assert info["registry"]["status"] == "registered"
    name, version = info["registry"]["registered_model"], info["registry"]["version"]
    uri = info["tracking_uri"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    # The store a track SIGKILLed after completing its run, before moving the alias,
    # leaves: the version tagged pending, no alias on it.
    client.delete_registered_model_alias(name, VERIFIED)
    client.set_model_version_tag(name, version, TAG_ALIAS_PENDING, "2026-12-02T00:00:00Z")
    capsys.readouterr()
    assert run_stage(layout.root, "track") == 0  # the same pipeline state
    out = capsys.readouterr().out
    assert (
        f"track: registry: alias verified of '{name}' moved to version {version}: its run "
        f"{info['run_id']} completed" in out
    )
    assert "the same inputs were logged before (not again)" in out
    assert str(client.get_model_version_by_alias(name, VERIFIED).version) == str(version)
    assert TAG_ALIAS_PENDING not in client.get_model_version(name, version).tags


def test_a_run_whose_params_changed_under_it_is_never_logged(
    project, tmp_path, capsys, monkeypatch
):
    """As when a second `dvc exp run` rewrites params.yaml while the first runs: train ran
    with one learning rate, track reads another. track refuses before it opens the
    store, naming the stage and key; the store keeps only the earlier runs, and alias
    `verified` does not move. (Stages of earlier pipeline runs are compared by what their
    outputs were made with: the next test.)"""
    import shutil

    from mlflow.tracking import MlflowClient

    root = tmp_path / "copy"
    shutil.copytree(project.layout.root, root, symlinks=True)
    layout = Layout(root)
    config = load_config(layout.params_yaml)
    client = MlflowClient(tracking_uri=tracking_uri(config.tracking, root))

    def logged() -> tuple[set[str], dict[str, str]]:
        runs = {
            run.info.run_id
            for experiment in client.search_experiments()
            for run in client.search_runs([experiment.experiment_id])
        }
        aliases = {m.name: dict(m.aliases) for m in client.search_registered_models()}
        return runs, aliases

    before = logged()
    assert before[0], "the module's pipeline logged its run"
    # As under a `dvc` process started now (stages run in this process have none above
    # them): train runs with one learning rate; then params.yaml is rewritten under it.
    import vmapcheck.pipeline.track as track_stage

    began = time.time()
    monkeypatch.setattr(track_stage, "dvc_run_began", lambda: began)
    assert run_stage(root, "train") == 0
    write_params(root, *OVERRIDES, f"train.learning_rate={config.train.learning_rate * 2}")
    assert run_stage(root, "track") == 2
    err = capsys.readouterr().err
    assert "track: error: params.yaml changed during this run" in err
    assert "(other values than track read, of train: train)" in err, err
    assert "Nothing is logged or registered" in err and "`dvc queue start`" in err
    assert logged() == before


def test_params_edited_while_train_ran_are_refused_by_the_next_repro_too(
    project, tmp_path, capsys, monkeypatch
):
    """params.yaml edited while train runs: DVC records the new value in dvc.lock when train
    ends, so the next `dvc repro` skips train. Its track (a new `dvc` process: train's
    record is an earlier run's) compares the values train ran with, in train's record,
    with params.yaml, and refuses, naming the leaf: @verified never gets train settings
    that did not make its params."""
    import shutil

    from mlflow.tracking import MlflowClient

    import vmapcheck.pipeline.track as track_stage

    root = tmp_path / "edited"
    shutil.copytree(project.layout.root, root, symlinks=True)
    config = load_config(Layout(root).params_yaml)
    client = MlflowClient(tracking_uri=tracking_uri(config.tracking, root))

    def run_count() -> int:
        return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())

    runs_before = run_count()
    assert run_stage(root, "train") == 0
    write_params(root, *OVERRIDES, f"train.learning_rate={config.train.learning_rate * 2}")
    capsys.readouterr()
    began = time.time() + 1.0  # the next `dvc repro`, started after train's record
    monkeypatch.setattr(track_stage, "dvc_run_began", lambda: began)
    assert run_stage(root, "track") == 2
    err = capsys.readouterr().err
    # check declares train's params too (dvc.yaml): it ran with the old value as well.
    assert "the outputs of stage(s) train, check were made with other settings than" in err
    assert "(train: train.learning_rate; check: train.learning_rate)" in err, err
    assert "dvc.lock recorded the new values" in err
    assert "`dvc repro --force --single-item train`, then `dvc repro`" in err
    assert run_count() == runs_before


# The records stages exchange are typed (issue 36): check_details.json, the forward record
# and bench_details.json are written from their TypedDicts and read back against them at
# every level they type, a missing key named by its path from the top. (Read from this
# project, not the repository's demo: a clean checkout, as CI has, holds no reports.)


def test_the_stages_records_read_back_into_their_types(project):
    layout = project.layout
    check = read_check_details(layout.check_details)
    assert missing_keys(check, CheckDetails) == []
    assert read_record(layout.record)["cases"]
    bench = read_bench_details(layout.bench_details)
    assert missing_keys(bench, BenchDetails) == []
    assert read_diagnosis(layout.diagnosis)["status"] == "not needed"  # the check passed


def _edited(tmp_path, source, edit):
    data = json.loads(source.read_text())
    edit(data)
    path = tmp_path / source.name
    path.write_text(json.dumps(data))
    return path


def test_a_key_missing_deep_in_check_details_is_named_by_its_path(project, tmp_path):
    def drop(data):
        del data["cases"]["standard"]["pairs"]
        del data["negative"]["invalid_nan"]["paths"]
        data["reference"] = "ok"  # an object expected

    path = _edited(tmp_path, project.layout.check_details, drop)
    with pytest.raises(ArtifactError) as caught:
        read_check_details(path)
    message = str(caught.value)
    assert str(path) in message and "rerun `dvc repro`" in message
    named = (
        "cases.standard.pairs",
        "negative.invalid_nan.paths",
        "reference (expected an object, found str)",
    )
    for where in named:
        assert where in message


def test_a_latency_cell_without_its_median_is_named(project, tmp_path):
    def drop_median(data):
        data["latency_ms"]["vmap_jit"]["b1"].pop("p50")

    path = _edited(tmp_path, project.layout.bench_details, drop_median)
    with pytest.raises(ArtifactError, match=r"missing latency_ms\.vmap_jit\.b1\.p50"):
        read_bench_details(path)


def test_a_report_older_than_an_optional_key_still_reads(project, tmp_path):
    """Keys added later (a case's rules, the composition, the budget) are NotRequired."""

    def older(data):
        data.pop("composition", None)
        data.pop("budget", None)
        for case in data["cases"].values():
            case.pop("rules", None)
            case.pop("bound_ratio", None)

    read_check_details(_edited(tmp_path, project.layout.check_details, older))
