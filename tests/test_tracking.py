"""MLflow metric names: one sortable scheme, always valid for MLflow, the summary first;
what the UI shows of a run (its name, its description) and the per-stage timeline."""

import json
import re

import pytest

from tests.helpers.config import compose_config
from vmapcheck.check.kinds import finding
from vmapcheck.errors import ArtifactError
from vmapcheck.layout import Layout
from vmapcheck.tracking.log import (
    DECIDING_METRICS,
    collect_metrics,
    metric_name,
    run_name,
    verdict_note,
)
from vmapcheck.tracking.records import read_track_report
from vmapcheck.tracking.run_inputs import dvc_exp_name

VALID = re.compile(r"^[\w.\- :/]+$")  # what MLflow accepts in a metric name


def test_leaf_paths_become_valid_metric_names():
    assert metric_name("gradients/layers[0].W/max_abs") == "gradients/layers.0.W/max_abs"
    assert VALID.match(metric_name("odd~name[1]"))


def test_collected_metrics_are_all_valid_names():
    check = {
        "passed": True,
        "failures": [],
        "cases": {
            "standard": {
                "passed": True,
                "pairs": {"loop_eager-vs-vmap_jit": {"max_abs": 0.0, "max_rel": 0.0}},
            }
        },
        "negative": {},
        "reference": {"status": "missing", "passed": False},
        "gradients": {
            "status": "ok",
            "passed": True,
            "loss": 0.5,
            "nan_probe": {"loss_finite": False, "grads_finite": False},
            "per_example_vs_batch": {"layers[0].W": {"max_abs": 1e-8, "max_rel": 1e-7}},
        },
    }
    bench = {"latency_ms": {}, "figures": {}, "speedup": {}}
    metrics = collect_metrics(check, bench, {"val_loss": 0.1})
    assert metrics["gradients/max_rel"] == 1e-7  # the worst leaf; each leaf's in the artifact
    assert metrics["gradients/nan_probe_detected"] == 1.0
    assert all(VALID.match(name) for name in metrics)


def _check_and_bench():
    """A passed check with two cases and a benchmark at b1/b128, as the stages write them."""
    check = {
        "passed": True,
        "failures": [],
        "dtype": "float32",
        "tolerance": {"rtol": 1e-5, "atol": 1e-6},
        "runtime": {
            "backend": "cpu",
            "device_kind": "cpu",
            "jax_version": "0.11.2",
            "jaxlib_version": "0.11.2",
        },
        "cases": {
            "standard": {
                "passed": True,
                "pairs": {
                    "loop_eager-vs-vmap_jit": {"max_abs": 1e-7, "max_rel": 2e-6, "bound_ratio": 0.3}
                },
                "oracle": {"vmap_jit": {"max_abs": 1e-7, "max_rel": 3e-6}},
            },
            "zeros": {
                "passed": True,
                "pairs": {"loop_eager-vs-direct_jit": {"max_abs": 2e-7, "max_rel": 5e-6}},
            },
        },
        "negative": {"invalid_nan": {"passed": True, "paths": {"vmap_jit": {"refused": True}}}},
        "reference": {"status": "ok", "passed": True, "max_rel": 1e-7},
    }
    stats = {"p50": 0.1, "p90": 0.2, "rows_per_s": 1000.0}
    bench = {
        "latency_ms": {"vmap_jit": {"b1": stats, "b128": stats}},
        "figures": {"vmap_jit": {"b128": {"compile_ms": 12.0}}},
        "speedup": {"b1": {"vmap_over_loop": 1.1}, "b128": {"vmap_over_loop": 9.5}},
        "speedup_ci": {"b128": {"vmap_over_loop": [8.0, 11.0]}},
    }
    return check, bench


def test_summary_metrics_come_first_and_batch_labels_are_zero_padded():
    check, bench = _check_and_bench()
    metrics = collect_metrics(check, bench, {})
    assert next(iter(metrics)).startswith("_summary/")
    # The deciding figure and the tolerance first (the compare view's default metric
    # axis is the first one logged), then the other summary figures.
    assert tuple(metrics)[:3] == DECIDING_METRICS
    assert metrics["_summary/worst_bound_ratio"] == 0.3
    assert metrics["_summary/tolerance_rtol"] == 1e-5
    assert metrics["_summary/tolerance_atol"] == 1e-6
    assert metrics["_summary/worst_max_rel"] == 5e-6
    assert metrics["_summary/worst_vs_reference_max_rel"] == 1e-7
    assert metrics["_summary/worst_vs_f64_max_rel"] == 3e-6
    assert metrics["_summary/invalid_refused"] == 1.0
    assert metrics["_summary/vmap_over_loop_at_b0128"] == 9.5  # MLflow refuses "@"
    assert metrics["latency_ms/vmap_jit/b0128/p50"] == 0.1
    # The rest of the distribution and the compile figures are in bench_details.json.
    assert "latency_ms/vmap_jit/b0128/p90" not in metrics
    assert not [k for k in metrics if k.startswith(("throughput", "compile_ms"))]
    assert metrics["speedup/b0001/vmap_over_loop"] == 1.1
    assert not [k for k in metrics if re.search(r"/b(1|128)(/|$)", k)]
    assert all(VALID.match(name) for name in metrics)
    # As text, the batch labels sort in numeric order.
    speedups = [k for k in metrics if k.startswith("speedup/")]
    assert sorted(speedups) == ["speedup/b0001/vmap_over_loop", "speedup/b0128/vmap_over_loop"]


def test_the_verdict_note_reads_like_the_reports_first_screen():
    check, bench = _check_and_bench()
    note = verdict_note(check, bench, {"verdict": "no baseline"})
    # The verdict's sentence is the printed verdict's, written in one place.
    from vmapcheck.report.check_sections import verdict_sentence
    from vmapcheck.report.summary import verdict_line

    sentence = verdict_sentence(check)
    assert note.startswith(f"**PASSED**: {sentence}\n")
    assert verdict_line(check).startswith(f"verdict: PASSED - {sentence}")
    assert "worst agreement: max_rel 5e-06 (loop_eager vs direct_jit, case zeros)" in note
    assert "vs stored reference: max_rel 1e-07" in note
    assert "vs float64: max_rel 3e-06 (vmap_jit, case standard)" in note
    assert "invalid inputs refused by every path: 1/1" in note
    assert "at 128 rows: vmap over loop 9.50x (CI 8.00-11.00)" in note
    assert "benchmark vs baseline: NO BASELINE" in note
    # A mixed result is said as such (issue 35), in the words of the console's headline;
    # a run without fresh timing says where its timing came from.
    mixed = {
        "verdict": "regression",
        "cells": {
            "vmap_jit": {"b256": {"status": "regression"}, "b4096": {"status": "faster"}},
        },
    }
    note = verdict_note(check, bench, mixed)
    assert "benchmark vs baseline: REGRESSION at 256 rows; faster at 4,096 rows" in note
    stale = {"verdict": "bench not rerun", "why": "bench not rerun: timing from run 4d67f809"}
    note = verdict_note(check, bench, stale)
    assert "vs baseline: BENCH NOT RERUN\n  (bench not rerun: timing from run 4d67f809)" in note
    failed = {**check, "passed": False, "failures": [f"failure {i}" for i in range(7)]}
    note = verdict_note(failed, bench)
    assert note.startswith("**FAILED**") and "- failure: failure 4" in note
    assert "failure 5" not in note and "2 more finding(s)" in note
    kinds = [*failed["failures"][:1], "reference/standard/vmap_jit: 4.5 of its bound"]
    with_kinds = {
        **failed,
        "failures": kinds,
        "findings": [finding("batching", kinds[0]), finding("numerical", kinds[1])],
    }
    note = verdict_note(with_kinds, bench)
    assert note.startswith("**FAILED (1 batching fault, 1 numerical finding)**")
    assert "- failure: [numerical] reference/standard/vmap_jit: 4.5 of its bound" in note


def test_the_verdict_note_says_what_the_bench_budget_left_out():
    """Issue 43: a bench its time budget cut says so on every surface, the setting named."""
    check, bench = _check_and_bench()
    assert "caveat" not in verdict_note(check, bench)
    why = "vmap_jit left out at 4096 rows: ... (bench.early_stop.time_budget_s; ...)"
    cut = {**bench, "skipped": {"vmap_jit": {"b4096": why}}}
    assert (
        "- caveat: the benchmark left paths untimed: vmap_jit left out at 4096 rows by its "
        "time budget (raise bench.early_stop.time_budget_s"
    ) in verdict_note(check, cut)


def test_run_names_carry_the_bench_profile_and_the_dvc_experiment(tmp_path):
    import datetime

    from tests.helpers.config import ROOT
    from vmapcheck.compose import compose_yaml
    from vmapcheck.config import load_config

    (tmp_path / "params.yaml").write_text(compose_yaml(ROOT / "conf", ["bench=quick"]))
    config = load_config(tmp_path / "params.yaml")
    runtime = {"jax_version": "0.11.2"}
    git = {"git_commit": "d79d813" + "0" * 33}
    when = datetime.datetime(2026, 12, 1, 21, 45, 1, tzinfo=datetime.UTC)
    assert run_name(config, runtime, git, None, when) == (
        f"{config.model.name}-{config.backend.name}-{config.precision.name}-quick"
        "-jax0.11.2-d79d813-1201T214501"
    )
    assert run_name(config, runtime, git, "exp-3f2a1", when).endswith(
        "-d79d813-exp-3f2a1-1201T214501"
    )
    later = when + datetime.timedelta(seconds=1)
    assert run_name(config, runtime, git, None, later) != run_name(config, runtime, git, None, when)
    assert "-nogit-" in run_name(config, runtime, {"git_commit": "unknown"}, None, when)
    assert dvc_exp_name({"DVC_EXP_NAME": " exp-3f2a1 "}) == "exp-3f2a1"
    assert dvc_exp_name({}) is None


def test_every_stage_records_its_wall_time_and_track_ends_its_own(tmp_path):
    from tests.helpers.config import ROOT
    from vmapcheck.compose import compose_yaml
    from vmapcheck.layout import Layout
    from vmapcheck.pipeline.stage import read_stage_times, run_stage, write_stage_time
    from vmapcheck.tracking.log import timeline, timeline_metrics

    layout = Layout(tmp_path)
    # No params.yaml: refused before any work, so nothing is timed.
    assert run_stage("check", lambda config, layout: 0, tmp_path) == 2
    assert read_stage_times(layout) == {}
    layout.params_yaml.write_text(compose_yaml(ROOT / "conf"))

    def fails(config, layout):
        assert layout.stage_time("check").is_file()  # its start is on disk while it runs
        raise ArtifactError("planted")

    # A stage that fails with a clear error (exit 2) is still timed.
    assert run_stage("check", fails, tmp_path) == 2
    record = read_stage_times(layout)["check"]
    assert record["exit_code"] == 2 and record["end"] >= record["start"]
    assert record["wall_s"] == round(record["end"] - record["start"], 3)
    write_stage_time(layout, "prepare", record["start"] - 10, record["start"] - 4, 0)
    write_stage_time(layout, "track", record["end"] + 1, None, None)  # still running
    stages = read_stage_times(layout)
    assert list(stages) == ["prepare", "check", "track"]  # oldest start first
    ended = timeline(stages, now=record["end"] + 3)
    assert ended["track"]["wall_s"] == 2.0 and ended["prepare"]["wall_s"] == 6.0
    assert timeline_metrics(ended)["timeline/track_s"] == 2.0
    layout.stage_time("train").write_text('{"stage": "train"}')
    with pytest.raises(ArtifactError, match=r"train\.json: expected a stage time record"):
        read_stage_times(layout)


def test_a_run_starts_with_the_first_stage_that_ran_now_not_one_dvc_skipped():
    from vmapcheck.tracking.log import RUN_GAP_S, run_start

    def rec(start, end, code=0):
        return {"start": start, "end": end, "exit_code": code}

    day = 86400.0
    now = 10 * day
    # Every stage one after the other: the run starts with prepare.
    chain = {
        "prepare": rec(now - 100, now - 90),
        "train": rec(now - 88, now - 60),
        "forward": rec(now - 58, now - 40),
        "track": {"start": now - 5, "end": None, "exit_code": None},
    }
    assert run_start(chain, now) == now - 100
    # After a precision edit DVC reruns forward on: prepare and train keep yesterday's times.
    skipped = chain | {"prepare": rec(now - day - 100, now - day - 90)}
    skipped |= {"train": rec(now - day - 88, now - day - 60)}
    assert run_start(skipped, now) == now - 58
    # A pause longer than RUN_GAP_S, or a stage that failed, ends the chain.
    late = {
        "prepare": rec(now - 400, now - 390),
        "forward": rec(now - 388, now - 5 - RUN_GAP_S - 1),
        "track": chain["track"],
    }
    assert run_start(late, now) == now - 5
    assert run_start(late | {"forward": rec(now - 388, now - 5 - RUN_GAP_S + 1)}, now) == now - 400
    failed = chain | {"forward": rec(now - 58, now - 40, code=1)}
    assert run_start(failed, now) == now - 5
    # Without a record of track (its body called directly): now.
    assert run_start({"prepare": rec(now - 100, now - 90)}, now) == now


def test_only_the_compared_config_keys_are_params():
    from tests.helpers.config import compose_config
    from vmapcheck.config import flatten
    from vmapcheck.tracking.log import COMPARED_IF_PRESENT, COMPARED_PARAMS, compared_params

    config = compose_config("model=toy", "precision=f64")
    params = compared_params(config)
    assert list(params) == [*COMPARED_PARAMS, *COMPARED_IF_PRESENT]
    assert len(params) < len(flatten(config)) / 4
    assert params["model.name"] == "toy" and params["precision.name"] == "f64"
    # What last-verified matches on is among them.
    assert "bench.name" in params
    # A table read from a file has no row count to compare: its absence is no error (the
    # two-tower example on the diabetes table stopped track with one before).
    from_file = compared_params(compose_config("model=two_tower", "data=diabetes"))
    assert list(from_file) == list(COMPARED_PARAMS)


def test_one_experiment_for_every_model_and_lookups_cover_the_old_layout():
    from tests.helpers.config import compose_config
    from vmapcheck.tracking.store import experiment_name, model_experiments

    config = compose_config("model=toy")
    assert experiment_name(config) == "vmapcheck"
    assert model_experiments(config) == ["vmapcheck", "vmapcheck-toy"]
    old = compose_config("model=toy", "tracking.experiment_per_model=true")
    assert model_experiments(old) == ["vmapcheck-toy", "vmapcheck"]


def test_the_compare_url_opens_the_ml_mode():
    from urllib.parse import parse_qs, urlsplit

    from vmapcheck.tracking.ui import compare_url

    url = compare_url("http://127.0.0.1:5000/", [("1", "a" * 32), ("2", "b" * 32), ("1", "c")])
    assert url.startswith("http://127.0.0.1:5000/#/compare-runs?")
    query = parse_qs(urlsplit(url.split("#", 1)[1]).query)
    assert query["workflowType"] == ["machine_learning"]
    assert query["runs"] == [f'["{"a" * 32}","{"b" * 32}","c"]']
    assert query["experiments"] == ['["1","2"]']
    with pytest.raises(ValueError, match="no run"):
        compare_url("http://x", [])


def test_a_run_whose_bench_was_not_rerun_gets_no_new_benchmark_verdict(tmp_path):
    """`-S precision.tolerance.rtol=2e-5` reruns code, check and track only: track used to
    judge the old bench_details.json against the run that made it (every ratio 1.000)."""
    from vmapcheck.pipeline.track import NOT_RERUN, bench_not_rerun, judge_performance

    def record(start: float, wall: float) -> dict:
        return {"start": start, "end": start + wall, "wall_s": wall, "exit_code": 0}

    days_ago = 1_700_000_000.0
    fresh = days_ago + 3 * 86400
    stages = {
        "prepare": record(days_ago, 5),
        "train": record(days_ago + 6, 5),
        "forward": record(days_ago + 12, 5),
        "bench": record(days_ago + 18, 20),
        "check": record(fresh, 4),
        "track": {"start": fresh + 5, "end": None, "wall_s": None, "exit_code": None},
    }
    why = bench_not_rerun(stages)
    assert why is not None and why.startswith("bench not rerun: timing made at 2023-11-14")
    assert "(DVC skipped bench: its inputs are unchanged)" in why
    named = bench_not_rerun(stages, timing_run="4d67f809")
    assert (named or "").startswith("bench not rerun: timing from run 4d67f809, made at 2023")
    # The verdict comes before any baseline is looked for: nothing is compared (no
    # reports/track.json here: no run named).
    perf = judge_performance(compose_config(), Layout(tmp_path), {}, stages=stages)
    assert perf == {"verdict": NOT_RERUN, "why": why}
    # Under DVC, the dvc process's start decides: a bench that ended a minute before this
    # run began (a tolerance changed right after a full run) is not this run's, though
    # the chain of stages would take it in.
    soon = {**stages, "bench": record(fresh - 60, 20)}
    assert bench_not_rerun(soon) is None  # outside DVC: the chain (gap under 120 s)
    assert "bench not rerun" in (bench_not_rerun(soon, dvc_began=fresh - 1) or "")
    assert bench_not_rerun({**stages, "bench": record(fresh - 0.5, 0.4)}, fresh - 1) is None
    # bench in this run's chain of stages: its timing is fresh.
    stages["bench"] = record(fresh - 25, 20)
    assert bench_not_rerun(stages) is None
    assert bench_not_rerun({}) is None


def test_a_run_made_with_the_clock_behind_is_filed_after_the_newest_and_listed_first(
    tmp_path, empty_mlflow_store, monkeypatch, capsys
):
    """The clock a year behind (vmapcheck.clock.now, the clock track reads): the run is filed
    1 ms after the newest run in the store, with a warning, so `compare -n 2` ("newest
    first") shows it first; the clock's reading stays in a tag."""
    from mlflow.tracking import MlflowClient

    from vmapcheck import clock as system_clock
    from vmapcheck.tracking import clock
    from vmapcheck.tracking.runs import select_runs

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("vmapcheck", artifact_location=str(tmp_path / "a"))
    start, tags = clock.checked_start_ms(client, None)
    assert tags == {} and capsys.readouterr().err == ""
    first = client.create_run(experiment, start_time=start, run_name="first")
    year_s = 365 * 24 * 3600
    real_now = system_clock.now()
    monkeypatch.setattr(system_clock, "now", lambda: real_now - year_s)
    start, tags = clock.checked_start_ms(client, None)
    assert start == first.info.start_time + 1
    err = capsys.readouterr().err
    assert err.startswith("track: warning: the clock reads ") and "system clock is behind" in err
    assert set(tags) == {clock.CLOCK_TAG}
    second = client.create_run(experiment, start_time=start, run_name="second", tags=tags)
    # A start track computed from stage records a year behind is checked the same way.
    behind_ms = int(1000 * (real_now - year_s))
    third_start, _ = clock.checked_start_ms(client, behind_ms)
    third = client.create_run(experiment, start_time=third_start, run_name="third")
    newest = select_runs(uri, n=2, experiment="vmapcheck").runs
    assert [r.info.run_id for r in newest] == [third.info.run_id, second.info.run_id]
    # A clock that is right again files the next run at its own reading.
    monkeypatch.setattr(system_clock, "now", lambda: real_now + 5)
    assert clock.checked_start_ms(client, None) == (int(1000 * (real_now + 5)), {})


def test_track_refuses_to_start_when_the_dvc_cache_has_no_room_for_its_outputs(tmp_path):
    """DVC caches track's outputs after track ends: with no room there it would fail after
    @verified moved. track refuses first, naming the cache folder and its free space. The
    "full" cache: a sparse report as large as the disk's free space (no block written), so
    its outputs need more than is free."""
    import shutil

    from vmapcheck.pipeline.track import dvc_cache_folder, refuse_full_cache

    layout = Layout(tmp_path)
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[cache]\n    dir = ../shared-cache\n")
    assert dvc_cache_folder(layout).resolve() == (tmp_path / "shared-cache").resolve()
    refuse_full_cache(layout)  # room enough: nothing said
    report = tmp_path / "reports" / "report.html"
    report.parent.mkdir()
    with report.open("wb") as fh:
        fh.truncate(shutil.disk_usage(tmp_path).free)
    with pytest.raises(ArtifactError) as caught:
        refuse_full_cache(layout)
    message = str(caught.value)
    assert message.startswith("the DVC cache ") and "MB free, under the" in message
    assert "nothing is logged or registered" in message


def _track_report(**overrides: object) -> dict:
    """A reports/track.json as track writes it for a run it logged now."""
    return {
        "run_id": "0123abcd",
        "run_name": "mlp-cpu-f32-quick-jax0.11.2-abc1234-1207T120000",
        "experiment": "vmapcheck",
        "experiment_id": "1",
        "tracking_uri": "sqlite:///mlflow.db",
        "verdict": "passed",
        "forward_outputs_sha256": "ab" * 32,
        "git_commit": "abc1234",
        "git_dirty": "false",
        "git_outputs_rewritten": "",
        "perf_verdict": "no regression",
        "registry": {"status": "not registered", "why": "registry.registered_model is null"},
    } | overrides


def test_the_track_report_reads_back_typed_and_a_missing_key_is_named(tmp_path):
    path = tmp_path / "track.json"
    path.write_text(json.dumps(_track_report()))
    report = read_track_report(path)
    assert report["run_id"] == "0123abcd"
    assert report["registry"] == {
        "status": "not registered",
        "why": "registry.registered_model is null",
    }
    # A run of the same state logged before: no registry, no rewritten outputs, said so.
    earlier = _track_report(logged_before=True)
    del earlier["registry"], earlier["git_outputs_rewritten"]
    path.write_text(json.dumps(earlier))
    assert read_track_report(path)["logged_before"] is True
    # A key the report requires, gone: the file and the key are named.
    cut = _track_report()
    del cut["experiment_id"]
    path.write_text(json.dumps(cut))
    with pytest.raises(ArtifactError, match=r"track\.json.*TrackReport.*experiment_id"):
        read_track_report(path)
    # The registry's outcome is typed too: its status is required.
    path.write_text(json.dumps(_track_report(registry={"why": "?"})))
    with pytest.raises(ArtifactError, match=r"registry\.status"):
        read_track_report(path)
