"""`make compare`: runs side by side, read from a real sqlite MLflow store."""

from __future__ import annotations

import re
import time

import pytest
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from tests.helpers.config import ROOT
from vmapcheck.cli import main
from vmapcheck.compose import compose_yaml
from vmapcheck.tracking.runs import CompareError, compare_rows, format_compare, select_runs
from vmapcheck.tracking.ui import compare_url

T0 = int(time.time() * 1000) - 3_600_000


def _log(client, experiment_id, name, minute, tags, metrics):
    run = client.create_run(experiment_id, start_time=T0 + minute * 60_000, run_name=name)
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, T0, 0) for k, v in metrics.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    client.set_tag(run.info.run_id, "pipeline_complete", "true")  # as track's last writes
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def _tags(model, verdict="passed", precision="f32", jaxlib="0.11.2", dirty="false"):
    return {
        "model": model,
        "verdict": verdict,
        "perf_verdict": "no baseline",
        "jax_version": "0.11.2",
        "jaxlib_version": jaxlib,
        "backend": "cpu",
        "device_kind": "cpu",
        "precision": precision,
        "git_commit": "abcdef0123456789" + "0" * 24,
        "git_dirty": dirty,
        "tolerance.rtol": "1e-05",
        "tolerance.atol": "1e-06",
    }


def _metrics(agree, batches=(1, 8, 128), reference=None, padded=False):
    """A run's metrics; ``padded``: as logged now (``b0008``, ``_summary/*``), else as
    runs logged before (``b8``, no summary)."""
    metrics = {
        "agree/standard/loop_eager-vs-vmap_jit/max_rel": agree / 2,
        "agree/boundary/vmap_jit-vs-direct_jit/max_rel": agree,
        "agree/boundary/vmap_jit-vs-direct_jit/max_abs": 99.0,  # not a max_rel
        "agree/standard/passed": 1.0,
        "oracle/standard/vmap_jit/max_rel": 2e-7,
    }
    if reference is not None:
        metrics["reference/standard/vmap_jit/max_rel"] = reference
    for b in batches:
        label = f"b{b:04d}" if padded else f"b{b}"
        metrics[f"latency_ms/vmap_jit/{label}/p50"] = 0.01 * b
        metrics[f"latency_ms/direct_jit/{label}/p50"] = 0.009 * b
        metrics[f"speedup/{label}/vmap_over_loop"] = float(b)
        metrics[f"speedup/{label}/vmap_over_direct"] = b / 10
    if padded:  # the summary a run carries now (vmapcheck.report.headline)
        metrics["_summary/worst_max_rel"] = agree
        # Each case's worst bound ratio; the summary's may be another pair's.
        metrics["agree/standard/bound_ratio"] = agree * 0.5
        metrics["agree/boundary/bound_ratio"] = agree * 6.4 if agree > 0.1 else agree / 1.2e-6
        metrics["_summary/worst_bound_ratio"] = 0.1
        metrics["_summary/worst_vs_f64_max_rel"] = 2e-7
        if reference is not None:
            metrics["_summary/worst_vs_reference_max_rel"] = reference
    return metrics


@pytest.fixture(scope="module")
def store(tmp_path_factory, empty_mlflow_store):
    """One store for the module (creating a sqlite store takes seconds); read only."""
    tmp_path = tmp_path_factory.mktemp("store")
    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    ids = {
        name: client.create_experiment(name, artifact_location=(tmp_path / name).as_uri())
        for name in ("vmapcheck-mlp", "vmapcheck-toy", "vmapcheck", "vmapcheckers", "other")
    }
    runs = {
        "old-shared": _log(client, ids["vmapcheck"], "old-shared", 0, _tags("mlp"), _metrics(1e-7)),
        "mlp-f32": _log(
            client,
            ids["vmapcheck-mlp"],
            "mlp-f32",
            1,
            _tags("mlp"),
            _metrics(3e-7, reference=5e-6, padded=True),
        ),
        "toy-f64": _log(
            client,
            ids["vmapcheck-toy"],
            "toy-f64",
            2,
            _tags("toy", precision="f64", jaxlib="0.11.1", dirty="true"),
            _metrics(1e-15, batches=(1, 8, 64)),
        ),
        "mlp-bad": _log(
            client,
            ids["vmapcheck-mlp"],
            "mlp-bad",
            3,
            _tags("mlp", "failed"),
            _metrics(0.5, padded=True),
        ),
        "elsewhere": _log(client, ids["other"], "elsewhere", 4, _tags("mlp"), _metrics(1.0)),
        "lookalike": _log(client, ids["vmapcheckers"], "lookalike", 5, _tags("mlp"), _metrics(1.0)),
    }
    return uri, runs


def _names(selection):
    return [r.info.run_name for r in selection.runs]


def test_the_last_runs_of_every_model_newest_first(store):
    uri, _ = store
    selection = select_runs(uri, n=10, prefix="vmapcheck")
    # Neither "other" nor "vmapcheckers" (a longer name, not "vmapcheck-<model>").
    assert _names(selection) == ["mlp-bad", "toy-f64", "mlp-f32", "old-shared"]
    assert selection.experiments == ["vmapcheck", "vmapcheck-mlp", "vmapcheck-toy"]
    assert _names(select_runs(uri, n=2, prefix="vmapcheck")) == ["mlp-bad", "toy-f64"]
    assert _names(select_runs(uri, n=10, prefix=None))[:2] == ["lookalike", "elsewhere"]
    assert _names(select_runs(uri, n=10, experiment="vmapcheck-toy")) == ["toy-f64"]


def test_a_filter_string_picks_the_runs(store):
    uri, _ = store
    picked = select_runs(uri, n=10, filter_string="tags.model = 'mlp'", prefix="vmapcheck")
    assert _names(picked) == ["mlp-bad", "mlp-f32", "old-shared"]
    passed = "tags.verdict = 'passed' and metrics.`latency_ms/vmap_jit/b0128/p50` > 0"
    assert _names(select_runs(uri, filter_string=passed, prefix="vmapcheck")) == ["mlp-f32"]


def test_the_columns_side_by_side(store):
    uri, _ = store
    rows, batch = compare_rows(select_runs(uri, n=10, prefix="vmapcheck").runs)
    assert batch == 8  # toy-f64 has no b128: the largest batch every run measured
    by_run = {row["run"]: row for row in rows}
    bad, toy, mlp = by_run["mlp-bad"], by_run["toy-f64"], by_run["mlp-f32"]
    assert bad["verdict"] == "FAILED" and bad["agree max_rel"] == "0.5"
    assert mlp["verdict"] == "PASSED" and mlp["rtol"] == "1e-05" and mlp["atol"] == "1e-06"
    # The deciding figure: the largest case's bound ratio, the summary's for older runs.
    assert bad["bound ratio"] == "3.2" and mlp["bound ratio"] == "0.25"
    assert toy["bound ratio"] == "-" and toy["rtol"] == "1e-05"
    assert mlp["agree max_rel"] == "3e-07" and mlp["ref max_rel"] == "5e-06"
    assert bad["ref max_rel"] == "-" and bad["f64 max_rel"] == "2e-07"
    assert toy["jax"] == "0.11.2/0.11.1" and mlp["jax"] == "0.11.2"
    assert toy["precision"] == "f64" and toy["backend/device"] == "cpu/cpu"
    assert toy["commit"] == "abcdef0*" and mlp["commit"] == "abcdef0"
    assert mlp["vmap_jit p50 ms"] == "0.08" and mlp["direct_jit p50 ms"] == "0.072"
    assert mlp["vmap/loop"] == "8" and mlp["vmap/direct"] == "0.8"
    # An older run (unpadded labels, no summary metrics) reads the same way.
    assert toy["vmap/loop"] == "8" and toy["vmap_jit p50 ms"] == "0.08"
    assert mlp["perf"] == "no baseline"
    # The verdict and the figure that decided it (with the tolerance) first, then the
    # summary.
    assert list(mlp)[:10] == [
        "run",
        "verdict",
        "bound ratio",
        "rtol",
        "atol",
        "agree max_rel",
        "ref max_rel",
        "f64 max_rel",
        "vmap/loop",
        "vmap/direct",
    ]
    rows, batch = compare_rows(select_runs(uri, n=1, experiment="vmapcheck-mlp").runs)
    assert batch == 128 and rows[0]["vmap_jit p50 ms"] == "1.28"


def test_the_table_text(store):
    uri, _ = store
    text = format_compare(select_runs(uri, n=3, prefix="vmapcheck"), width=220)
    assert "3 run(s), newest first, from vmapcheck, vmapcheck-mlp, vmapcheck-toy" in text
    # Two-line headings: "agree" over "max_rel", "vmap/" over "loop".
    for heading in ("verdict", "agree", "max_rel", "vmap_jit", "p50", "loop", "commit"):
        assert heading in text
    assert "mlp-bad" in text and "old-shared" not in text
    assert "at batch 8 (the largest every listed run measured)" in text


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_table_fits_the_width(store, width):
    uri, _ = store
    selection = select_runs(uri, n=10, prefix="vmapcheck")
    text = format_compare(selection, width=width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text  # nothing cut short
    assert "mlp-bad" in text and "toy-f64" in text
    assert "agree" in text and "max_rel" in text and "vmap/" in text
    if width < 120:
        assert "left out to fit" in text.replace("\n", " ")
    wide = format_compare(selection, width=400)
    assert "left out" not in wide and "started" in wide


def test_nothing_to_compare_is_said_plainly(tmp_path, store):
    missing = tmp_path / "none" / "mlflow.db"
    with pytest.raises(CompareError, match=r"no MLflow store at .*nothing logged yet"):
        select_runs(f"sqlite:///{missing}", prefix="vmapcheck")
    assert not missing.exists()  # looking did not create a store
    uri, _ = store
    with pytest.raises(CompareError, match="no experiment 'nope' or 'nope-<model>' in"):
        select_runs(uri, prefix="nope")
    with pytest.raises(CompareError, match="no experiment 'vmapcheck-flax' in"):
        select_runs(uri, experiment="vmapcheck-flax")
    no_run = re.escape("no run matching \"tags.model = 'x'\" in experiment")
    with pytest.raises(CompareError, match=no_run):
        select_runs(uri, filter_string="tags.model = 'x'", prefix="vmapcheck")
    refused = re.escape("--filter 'tags.model ==== 1': MLflow refused it")
    with pytest.raises(CompareError, match=refused):
        select_runs(uri, filter_string="tags.model ==== 1", prefix="vmapcheck")
    with pytest.raises(CompareError, match="-n: expected a number of runs from 1 to 1000, got 0"):
        select_runs(uri, n=0)


def test_the_command_line(tmp_path, store, capsys):
    uri, _ = store
    (tmp_path / "params.yaml").write_text(
        compose_yaml(ROOT / "conf", [f"tracking.tracking_uri={uri}"])
    )
    assert main(["compare", "--root", str(tmp_path), "-n", "2", "--width", "220"]) == 0
    out = capsys.readouterr().out
    assert "mlp-bad" in out and "toy-f64" in out and "mlp-f32" not in out
    # Then the same runs in MLflow's compare view, in its ML mode (the local store: after
    # `vmapcheck ui`).
    shown = select_runs(uri, n=2, prefix="vmapcheck").runs
    pairs = [(r.info.experiment_id, r.info.run_id) for r in shown]
    url = compare_url("http://127.0.0.1:5000", pairs)
    assert f"these runs side by side in the MLflow UI: vmapcheck ui, then {url}\n" in out
    assert url.endswith("&workflowType=machine_learning")
    assert main(["compare", "--root", str(tmp_path), "--filter", "tags.precision = 'f64'"]) == 0
    assert "1 run(s)" in capsys.readouterr().out
    assert main(["compare", "--root", str(tmp_path), "--all", "-n", "1", "--width", "220"]) == 0
    assert "lookalike" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "params.yaml").write_text(compose_yaml(ROOT / "conf"))
    assert main(["compare", "--root", str(empty)]) == 2
    assert "compare: no MLflow store at sqlite:///" in capsys.readouterr().err
    assert not (empty / "mlflow.db").exists()


def test_the_verdict_is_coloured_on_a_terminal_only(store, monkeypatch, capsys, tmp_path):
    uri, _ = store
    selection = select_runs(uri, n=3, prefix="vmapcheck")
    coloured = format_compare(selection, width=220, color=True)
    # rich's standard colours: 31 red, 32 green, bold 1.
    assert re.search(r"\x1b\[1;31mFAILED *\x1b\[0m", coloured), coloured
    assert re.search(r"\x1b\[1;32mPASSED *\x1b\[0m", coloured), coloured
    assert "\x1b[" not in format_compare(selection, width=220)
    # Piped (capsys is not a terminal), or NO_COLOR on a terminal: no colour codes.
    (tmp_path / "params.yaml").write_text(
        compose_yaml(ROOT / "conf", [f"tracking.tracking_uri={uri}"])
    )
    assert main(["compare", "--root", str(tmp_path), "-n", "3", "--width", "220"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" in out and "\x1b[" not in out
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setenv("NO_COLOR", "1")
    from vmapcheck.tracking.runs import use_color

    assert not use_color()
    monkeypatch.delenv("NO_COLOR")
    assert use_color()
