"""The regression verdict: a slowdown is reported only when significant AND beyond the factor."""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from vmapcheck.bench.verdict import labels
from vmapcheck.bench.verdict.baseline import (
    CONTEXT,
    CONTEXT_KEYS,
    OPTIONAL_KEYS,
    BenchRecord,
    read_bench_file,
    record_from_details,
)
from vmapcheck.bench.verdict.labels import FASTER, NO_DIFFERENCE, REGRESSION, UNDERPOWERED
from vmapcheck.bench.verdict.records import PerfVerdict
from vmapcheck.bench.verdict.regression import (
    NOT_COMPARABLE,
    compare,
    format_table,
    judge_control,
    round_index,
)
from vmapcheck.cli import main as cli_main
from vmapcheck.errors import ArtifactError, ConfigError
from vmapcheck.io import atomic_write_json, read_json_typed
from vmapcheck.layout import Layout
from vmapcheck.tracking.baselines import resolve_baseline


def _lognormal(median_ms: float, n: int, seed: int, sigma: float = 0.1) -> np.ndarray:
    """Latencies as machines produce them: right-skewed around ``median_ms``."""
    return median_ms * np.random.default_rng(seed).lognormal(0.0, sigma, size=n)


def _record(samples: dict[str, dict[str, np.ndarray]], **context) -> BenchRecord:
    return BenchRecord("test", samples, {"model": "mlp", **context})


def test_the_same_distribution_is_no_regression():
    base = _record({"vmap_jit": {"b16": _lognormal(1.0, 100, 0)}})
    cur = _record({"vmap_jit": {"b16": _lognormal(1.0, 100, 1)}})
    result = compare(base, cur, factor=1.1, alpha=0.01)
    cell = result["cells"]["vmap_jit"]["b16"]
    assert result["verdict"] == "no regression" and cell["status"] == NO_DIFFERENCE
    assert cell["ci_low"] < 1.0 < cell["ci_high"] < 1.1
    # Its own spread: a slowdown of a few percent would show (not the factor's 10%).
    assert 1.0 < cell["min_detectable_ratio"] < 1.1


def test_a_30_percent_slowdown_is_reported_with_ratio_ci_and_p_value():
    base = _record({"direct_jit": {"b16": _lognormal(1.0, 60, 0)}})
    cur = _record({"direct_jit": {"b16": _lognormal(1.3, 60, 1)}})
    result = compare(base, cur, factor=1.1, alpha=0.01)
    cell = result["cells"]["direct_jit"]["b16"]
    assert result["verdict"] == "regression"
    assert result["regressions"] == ["direct_jit/b16"]
    assert 1.2 < cell["ratio"] < 1.4 and cell["ci_low"] > 1.1
    # Every current block slower than every baseline block: the exact test's floor,
    # 1 / C(20, 10), for 10 blocks a side.
    assert cell["blocks_baseline"] == cell["blocks_current"] == 10
    assert cell["p_slower_adjusted"] == pytest.approx(1 / 184756)


def test_a_spell_of_interference_in_one_run_is_not_a_regression():
    # Measured on this machine: two back-to-back runs of the same code, one of them hit
    # by a stretch of interference, differed by 16-35% in some cells with per-sample
    # Mann-Whitney p < 1e-3. Here 40 consecutive samples of the current run's 100 are
    # 60% slower: the median moves past the factor, but only four blocks of ten do.
    base = _lognormal(1.0, 100, 0, sigma=0.15)
    cur = _lognormal(1.0, 100, 100, sigma=0.15)
    cur[30:70] *= 1.6
    result = compare(
        _record({"vmap_jit": {"b16": base}}), _record({"vmap_jit": {"b16": cur}}), 1.1, 0.01
    )
    cell = result["cells"]["vmap_jit"]["b16"]
    assert cell["ratio"] > 1.1
    per_sample = stats.mannwhitneyu(cur, base, alternative="greater").pvalue
    assert per_sample < 1e-4  # what the per-sample test would have said
    # Beyond the factor but not significant: this run cannot rule out a regression.
    assert cell["p_slower"] > 0.01 and cell["status"] == UNDERPOWERED
    assert result["verdict"] == "no regression"


def test_a_significant_but_small_slowdown_stays_below_the_factor_and_is_named():
    # With many samples a 4% shift is very significant; asv's rule does not fail a build
    # for it, and the label says what was measured (it used to read "no change").
    base = _record({"vmap_jit": {"b16": _lognormal(1.0, 2000, 0, sigma=0.02)}})
    cur = _record({"vmap_jit": {"b16": _lognormal(1.04, 2000, 1, sigma=0.02)}})
    cell = compare(base, cur, factor=1.1, alpha=0.01)["cells"]["vmap_jit"]["b16"]
    assert cell["p_slower_adjusted"] < 1e-5 and cell["status"] == labels.SLOWER
    assert cell["ci_low"] > 1.0 and cell["ratio"] < 1.1


def test_a_large_but_noisy_difference_is_not_significant():
    base = _record({"vmap_jit": {"b16": np.array([1.0, 5.0, 1.2, 4.0, 1.1])}})
    cur = _record({"vmap_jit": {"b16": np.array([1.4, 1.3, 5.5, 1.5, 4.4])}})
    cell = compare(base, cur, factor=1.1, alpha=0.01)["cells"]["vmap_jit"]["b16"]
    assert cell["ratio"] > 1.1 and cell["status"] == UNDERPOWERED
    assert cell["min_detectable_ratio"] > 1.5  # five noisy samples cannot show 10%


def test_only_the_slowed_path_is_flagged_and_a_speedup_is_an_improvement():
    base = _record(
        {
            "vmap_jit": {"b1": _lognormal(1.0, 80, 0), "b128": _lognormal(2.0, 80, 1)},
            "direct_jit": {"b1": _lognormal(1.0, 80, 2), "b128": _lognormal(2.0, 80, 3)},
        }
    )
    cur = _record(
        {
            "vmap_jit": {"b1": _lognormal(1.0, 80, 4), "b128": _lognormal(1.5, 80, 5)},
            "direct_jit": {"b1": _lognormal(1.0, 80, 6), "b128": _lognormal(2.5, 80, 7)},
        },
        jax_version="0.12.0",
    )
    result = compare(base, cur, factor=1.1, alpha=0.01)
    assert result["regressions"] == ["direct_jit/b128"]
    assert result["improvements"] == ["vmap_jit/b128"]
    assert result["cells"]["vmap_jit"]["b128"]["status"] == FASTER
    assert result["cells"]["direct_jit"]["b128"]["status"] == REGRESSION
    assert result["differences"] == {"jax_version": [None, "0.12.0"]}


def _sized(medians: dict[int, float], seed: int) -> dict[str, np.ndarray]:
    return {f"b{rows}": _lognormal(ms, 80, seed + rows, sigma=0.05) for rows, ms in medians.items()}


def test_a_mixed_result_is_headlined_as_such():
    """Issue 35 (3): slower at 256 and 1,024 rows, faster at 4,096: the headline says
    both, in the words the console, the HTML report and the MLflow description share."""
    base = _record(
        {
            "vmap_jit": _sized({256: 1.0, 1024: 2.0, 4096: 8.0}, 0),
            "direct_jit": _sized({256: 1.0, 1024: 2.0, 4096: 8.0}, 10),
        }
    )
    cur = _record(
        {
            "vmap_jit": _sized({256: 1.4, 1024: 2.8, 4096: 6.0}, 20),
            "direct_jit": _sized({256: 1.4, 1024: 2.8, 4096: 6.0}, 30),
        }
    )
    result = compare(base, cur, factor=1.1, alpha=0.01)
    assert result["verdict"] == "regression"
    headline = labels.verdict_headline(result)
    assert headline == "REGRESSION at 256 and 1,024 rows; faster at 4,096 rows"
    assert format_table(result).startswith(f"benchmark verdict: {headline}")


def test_a_headline_names_the_paths_where_a_size_is_split():
    cells = {
        "vmap_jit": {"b256": {"status": REGRESSION}, "b1024": {"status": NO_DIFFERENCE}},
        "direct_jit": {"b256": {"status": REGRESSION}, "b1024": {"status": REGRESSION}},
    }
    assert labels.verdict_headline({"verdict": "regression", "cells": cells}) == (
        "REGRESSION at 256 rows and 1,024 rows in direct_jit"
    )
    # The paired verdict's flat cells; an inconclusive verdict says what it withheld.
    flat = {"vmap_jit/b256": {"status": REGRESSION}, "vmap_jit/b1024": {"status": labels.SLOWER}}
    assert labels.verdict_headline({"verdict": "inconclusive", "cells": flat}) == (
        "INCONCLUSIVE: slower beyond the factor at 256 rows, withheld; "
        "slower (below the factor) at 1,024 rows"
    )
    # Beyond three paths at a size, their count (seen: all 10 jit paths of a run, named
    # one by one, made a headline of 300 characters); one row is a row.
    many = {f"path{i}": {"b1": {"status": FASTER if i < 5 else NO_DIFFERENCE}} for i in range(10)}
    assert labels.verdict_headline({"verdict": "no regression", "cells": many}) == (
        "NO REGRESSION; faster at 1 row in 5 of 10 paths"
    )
    # No direction found, or no cells at all: the word alone.
    quiet = {"vmap_jit": {"b256": {"status": UNDERPOWERED}}}
    assert labels.verdict_headline({"verdict": "no regression", "cells": quiet}) == "NO REGRESSION"
    assert labels.verdict_headline({"verdict": "bench not rerun"}) == "BENCH NOT RERUN"


def test_cells_in_one_run_only_are_listed_not_compared():
    base = _record({"loop_jit": {"b1": _lognormal(1.0, 20, 0)}})
    cur = _record({"loop_jit": {"b1": _lognormal(1.0, 20, 1), "b256": _lognormal(9.0, 20, 2)}})
    result = compare(base, cur, factor=1.1, alpha=0.01)
    assert result["only_in_current"] == ["loop_jit/b256"]
    assert set(result["cells"]["loop_jit"]) == {"b1"}


@pytest.mark.parametrize(
    ("factor", "alpha", "key"), [(1.0, 0.01, "factor"), (1.2, 0.0, "alpha"), (1.2, 1.5, "alpha")]
)
def test_impossible_thresholds_are_refused(factor, alpha, key):
    base = _record({"vmap_jit": {"b1": _lognormal(1.0, 20, 0)}})
    with pytest.raises(ConfigError, match=f"bench.regression.{key}"):
        compare(base, base, factor=factor, alpha=alpha)


def test_a_malformed_bench_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "bench_details.json"
    path.write_text(json.dumps({"samples_ms": {"vmap_jit": {"b16": [1.0, "x", 2.0]}}}))
    with pytest.raises(ArtifactError, match=r"bench_details.json: samples_ms.vmap_jit.b16"):
        read_bench_file(path)
    with pytest.raises(ArtifactError, match="at least 5 latencies"):
        record_from_details({"samples_ms": {"vmap_jit": {"b16": [1.0]}}}, "x")
    with pytest.raises(ArtifactError, match="finite positive"):
        record_from_details({"samples_ms": {"vmap_jit": {"b16": [1.0] * 4 + [float("nan")]}}}, "x")
    with pytest.raises(ArtifactError, match="'samples_ms' mapping"):
        record_from_details({"latency_ms": {}}, "x")


def test_an_unknown_baseline_says_what_it_expected(tmp_path):
    with pytest.raises(ConfigError, match="32 hex digits"):
        resolve_baseline("yesterday", tracking_uri=f"sqlite:///{tmp_path}/m.db")


def _details(median_ms: float, seed: int, model: str = "mlp") -> dict:
    return {
        "model": model,
        "dtype": "float32",
        "runtime": {"backend": "cpu", "device_kind": "cpu", "jax_version": "0.11.2"},
        "samples_ms": {"direct_jit": {"b16": _lognormal(median_ms, 50, seed).tolist()}},
        "machine": {"noisy": False, "before": {"cpu_model": "test cpu"}},
    }


def test_last_verified_is_the_newest_passed_run_of_the_same_model(tmp_path, empty_mlflow_store):
    """A real MLflow store: a failed run and another model's run are never the baseline."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("vmapcheck", artifact_location=tmp_path.as_uri())
    ids = {}
    for name, verdict, model, median in (
        ("old", "passed", "mlp", 1.0),
        ("newer", "passed", "mlp", 2.0),
        ("other-model", "passed", "toy", 3.0),
        ("failed", "failed", "mlp", 4.0),
    ):
        run = client.create_run(experiment, tags={"verdict": verdict, "model": model})
        path = tmp_path / name / "bench_details.json"
        path.parent.mkdir()
        path.write_text(json.dumps(_details(median, len(ids), model)))
        client.log_artifact(run.info.run_id, str(path))
        client.set_tag(run.info.run_id, "pipeline_complete", "true")  # a complete run
        client.set_terminated(run.info.run_id)
        ids[name] = run.info.run_id
    mlflow.set_tracking_uri(None)

    found = resolve_baseline("last-verified", uri, "vmapcheck", {"model": "mlp"})
    assert found.source == f"run {ids['newer']}"
    assert np.median(found.samples_ms["direct_jit"]["b16"]) == pytest.approx(2.0, rel=0.1)
    skipped = resolve_baseline(
        "last-verified", uri, "vmapcheck", {"model": "mlp"}, exclude=ids["newer"]
    )
    assert skipped.source == f"run {ids['old']}"
    by_id = resolve_baseline(ids["other-model"], uri, "vmapcheck", {"model": "mlp"})
    assert by_id.context["model"] == "toy"
    with pytest.raises(ArtifactError, match="no complete passed run with model=equinox_mlp"):
        resolve_baseline("last-verified", uri, "vmapcheck", {"model": "equinox_mlp"})
    with pytest.raises(ArtifactError, match="not found"):
        resolve_baseline("0" * 32, uri, "vmapcheck", {})


def test_last_verified_finds_runs_in_the_old_per_model_experiment_too(tmp_path, empty_mlflow_store):
    """Runs logged when every model had its own experiment (vmapcheck-mlp) stay baselines
    after the move to one experiment for all (vmapcheck): the newest of either wins."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tests.helpers.config import compose_config
    from vmapcheck.tracking.store import model_experiments

    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    names = model_experiments(compose_config("model=mlp"))
    assert names == ["vmapcheck", "vmapcheck-mlp"]

    def logged(experiment: str, name: str, median: float) -> str:
        found = client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id
            if found
            else client.create_experiment(experiment, artifact_location=tmp_path.as_uri())
        )
        run = client.create_run(experiment_id, tags={"verdict": "passed", "model": "mlp"})
        path = tmp_path / name / "bench_details.json"
        path.parent.mkdir()
        path.write_text(json.dumps(_details(median, 0)))
        client.log_artifact(run.info.run_id, str(path))
        client.set_tag(run.info.run_id, "pipeline_complete", "true")
        client.set_terminated(run.info.run_id)
        return run.info.run_id

    old = logged("vmapcheck-mlp", "old-layout", 1.0)
    mlflow.set_tracking_uri(None)
    assert resolve_baseline("last-verified", uri, names, {"model": "mlp"}).source == f"run {old}"
    new = logged("vmapcheck", "new-layout", 2.0)
    assert resolve_baseline("last-verified", uri, names, {"model": "mlp"}).source == f"run {new}"
    with pytest.raises(ArtifactError, match="in experiment 'vmapcheck' or 'vmapcheck-mlp'"):
        resolve_baseline("last-verified", uri, names, {"model": "toy"})


def test_the_verdict_command_exits_1_on_a_regression(tmp_path, root, capsys):
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    base, same, slow = (tmp_path / f"{n}.json" for n in ("base", "same", "slow"))
    base.write_text(json.dumps(_details(1.0, 0)))
    same.write_text(json.dumps(_details(1.0, 1)))
    slow.write_text(json.dumps(_details(1.3, 2, model="mlp_slow")))
    args = ["verdict", "--root", str(tmp_path), "--baseline", str(base)]
    assert cli_main([*args, "--current", str(same)]) == 0
    assert "NO REGRESSION" in capsys.readouterr().out
    out = tmp_path / "verdict.json"
    assert cli_main([*args, "--current", str(slow), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "REGRESSION" in printed and "direct_jit" in printed
    # A model change is what the verdict judges: compared, and the difference noted.
    assert "model differs (compared): baseline 'mlp', current 'mlp_slow'" in printed
    assert json.loads(out.read_text())["regressions"] == ["direct_jit/b16"]


def _control(median_ms: float, seed: int, size: int = 512) -> dict:
    """The control fields of a BenchRecord: ``size``^3 float32 matmul samples (ms)."""
    return {
        "control_ms": _lognormal(median_ms, 50, seed, sigma=0.03),
        "control_size": size,
        "control_dtype": "float32",
    }


SLOWER = {"vmap_jit": {"b16": _lognormal(1.5, 60, 1)}}
SAME = {"vmap_jit": {"b16": _lognormal(1.0, 60, 0)}}


def test_a_slowdown_of_the_machine_itself_makes_the_verdict_inconclusive():
    """The matmul control was 2x slower in the current run: the code is not to blame."""
    base = BenchRecord("base", SAME, {}, **_control(2.0, 3))
    steady = compare(base, BenchRecord("cur", SLOWER, {}, **_control(2.02, 4)), 1.1, 0.01)
    assert steady["verdict"] == "regression" and not steady["machine_slower"]
    assert "not a slowdown of the machine" in format_table(steady)
    loaded = compare(base, BenchRecord("cur", SLOWER, {}, **_control(4.0, 4)), 1.1, 0.01)
    assert loaded["verdict"] == "inconclusive" and loaded["machine_slower"]
    assert 1.9 < loaded["machine_slowdown"] < 2.1 and loaded["control"]["p_slower"] < 0.01
    assert loaded["regressions"] == ["vmap_jit/b16"]  # still listed, never hidden
    assert loaded["reasons"] == [
        "the machine itself was slower: the control matmul took "
        f"{loaded['machine_slowdown']:.2f}x the baseline's time, beyond the factor"
    ]
    assert "INCONCLUSIVE (the machine itself was slower" in format_table(loaded)
    noisy = compare(base, BenchRecord("cur", SLOWER, {}, noisy=True, **_control(2.0, 4)), 1.1, 0.01)
    assert noisy["verdict"] == "inconclusive"
    assert noisy["reasons"] == ["the current run was noisy (load above the core count)"]
    both = BenchRecord("base", SAME, {}, noisy=True, **_control(2.0, 3))
    assert compare(both, BenchRecord("cur", SLOWER, {}, noisy=True), 1.1, 0.01)["reasons"] == [
        "the baseline and the current run were noisy (load above the core count)"
    ]


def test_a_faster_machine_withholds_nothing():
    """issue 14: a control at 0.62x (a faster machine) turned a regression into
    "inconclusive". A faster machine cannot explain a slower cell: the verdict stands."""
    base = BenchRecord("base", SAME, {}, **_control(2.0, 3))
    faster = compare(base, BenchRecord("cur", SLOWER, {}, **_control(1.24, 4)), 1.1, 0.01)
    assert faster["control"]["compared"] and faster["machine_slowdown"] < 0.7
    assert faster["verdict"] == "regression" and faster["reasons"] == []
    assert "a faster machine withholds nothing" in format_table(faster)


def test_a_control_beyond_the_factor_but_not_significant_withholds_nothing():
    """The machine is judged by the cells' own rule: a control whose median moved past
    the factor in a few rounds only (a spell, not a slower machine) is no slowdown."""
    base_ms = _lognormal(2.0, 50, 3, sigma=0.15)
    cur_ms = _lognormal(2.0, 50, 4, sigma=0.15)
    cur_ms[15:40] *= 1.8  # rounds 4-8 of 10 slowed
    base = BenchRecord("base", SAME, {}, control_ms=base_ms, control_size=512, control_dtype="f")
    cur = BenchRecord("cur", SLOWER, {}, control_ms=cur_ms, control_size=512, control_dtype="f")
    control = judge_control(base, cur, 1.1, 0.01)
    assert control["ratio"] > 1.1 and control["p_slower"] > 0.01 and not control["slower"]
    assert compare(base, cur, 1.1, 0.01)["verdict"] == "regression"


@pytest.mark.parametrize(
    ("base_size", "cur_size", "base_dtype", "cur_dtype", "why"),
    [
        (512, 1024, "float32", "float32", "matmul sizes differ (512^3 vs 1024^3)"),
        (512, 512, "float32", "float64", "matmul dtypes differ (float32 vs float64)"),
        (None, 512, "float32", "float32", "matmul size is not recorded in the baseline"),
    ],
)
def test_a_control_of_another_size_or_dtype_is_not_compared(
    base_size, cur_size, base_dtype, cur_dtype, why
):
    """issue 13: a 512^3 matmul (bench=quick) was compared with a 1024^3 one (bench=full):
    "the same matmul took 6.57x". Only like is compared with like, or nothing, saying why."""
    base = BenchRecord(
        "base", SAME, {}, **{**_control(2.0, 3, base_size), "control_dtype": base_dtype}
    )
    cur = BenchRecord(
        "cur", SLOWER, {}, **{**_control(16.0, 4, cur_size), "control_dtype": cur_dtype}
    )
    result = compare(base, cur, 1.1, 0.01)
    assert not result["control"]["compared"] and why in result["control"]["why"]
    assert result["machine_slowdown"] is None and not result["machine_slower"]
    # The cells still are judged: a regression the control cannot vouch for is reported.
    assert result["verdict"] == "regression"
    assert f"control: not compared: {result['control']['why']}" in format_table(result)


def test_the_same_size_control_is_compared():
    base = BenchRecord("base", SAME, {}, **_control(2.0, 3, size=1024))
    cur = BenchRecord("cur", SAME, {}, **_control(2.1, 4, size=1024))
    control = compare(base, cur, 1.1, 0.01)["control"]
    assert control["compared"] and control["size"] == [1024, 1024]
    assert 1.0 < control["ratio"] < 1.1 and control["ci_low"] < control["ratio"]


def test_the_control_timed_in_every_round_outranks_the_single_peak_figure():
    samples = {"vmap_jit": {"b16": _lognormal(1.0, 60, 0)}}
    slower = {"vmap_jit": {"b16": _lognormal(1.5, 60, 1)}}
    details = {"samples_ms": samples, "peak": {"gflops": 100.0, "size": 512}, "dtype": "float32"}
    details["peak"]["samples_ms"] = _lognormal(2.0, 50, 3).tolist()
    base = record_from_details(
        {
            **details,
            "samples_ms": {p: {b: v.tolist() for b, v in c.items()} for p, c in samples.items()},
        },
        "base",
    )
    assert base.control_ms is not None and base.control_ms.size == 50
    assert (base.control_size, base.control_dtype) == (512, "float32")
    # Its peak figure says the machine halved its speed; its samples (the control timed
    # with the cells) say it did not: the samples decide.
    cur = BenchRecord("cur", slower, {}, peak_gflops=50.0, **_control(2.0, 4))
    result = compare(base, cur, 1.1, 0.01)
    assert result["verdict"] == "regression" and 0.9 < result["machine_slowdown"] < 1.1
    bad = {**details, "peak": {"gflops": 1.0, "samples_ms": [1.0, -2.0]}}
    with pytest.raises(ArtifactError, match=r"peak\.samples_ms"):
        record_from_details({**bad, "samples_ms": {"vmap_jit": {"b16": [1.0] * 10}}}, "f.json")


def test_runs_from_before_the_rounds_compare_their_throughput_figures():
    """One GFLOP/s figure a run, no samples: the ratio alone (no test is possible), and
    only a slower machine withholds."""
    base = BenchRecord("base", SAME, {}, peak_gflops=100.0, control_size=512, control_dtype="f")
    slow = BenchRecord("cur", SLOWER, {}, peak_gflops=50.0, control_size=512, control_dtype="f")
    fast = BenchRecord("cur", SLOWER, {}, peak_gflops=200.0, control_size=512, control_dtype="f")
    assert compare(base, slow, 1.1, 0.01)["verdict"] == "inconclusive"
    assert compare(base, slow, 1.1, 0.01)["machine_slowdown"] == 2.0
    assert compare(base, fast, 1.1, 0.01)["verdict"] == "regression"


def _full_context(**changes) -> dict:
    """A run's context as record_from_details reads it (quick profile, this machine)."""
    context = {
        "bench": "quick",
        "batch_sizes": [1, 16, 128],
        "warmup": 3,
        "repeats": 50,
        "cpu_model": "Intel(R) Xeon(R) Processor",
        "usable_cores": 2,
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 2,
        "matmul_precision": "highest",
        "jax_version": "0.11.2",
        "jaxlib_version": "0.11.2",
        "dtype": "float32",
        "model": "mlp",
        "model_contract": "a" * 64,
    }
    assert set(changes) <= set(context)
    return context | changes


# Every required context key, the other value, and how the verdict names the difference.
REQUIRED = [
    ("bench", "full", "bench profiles differ (quick vs full)"),
    ("batch_sizes", [1, 16, 256], "batch sizes differ ([1, 16, 128] vs [1, 16, 256])"),
    ("warmup", 5, "warm-up calls differ (3 vs 5)"),
    ("repeats", 100, "samples per cell differ (50 vs 100)"),
    ("cpu_model", "AMD EPYC 7B13", "machines (CPU model) differ (Intel(R) Xeon(R) Processor vs "),
    ("usable_cores", 4, "usable cores differ (2 vs 4)"),
    ("backend", "gpu", "backends differ (cpu vs gpu)"),
    ("device_kind", "NVIDIA H200", "device kinds differ (cpu vs NVIDIA H200)"),
    ("device_count", 1, "device counts differ (2 vs 1)"),
    ("dtype", "float64", "dtypes differ (float32 vs float64)"),
    ("matmul_precision", "tensorfloat32", "matmul precisions differ (highest vs tensorfloat32)"),
    (
        "model_contract",
        "b" * 64,
        f"model contracts (params, inputs or outputs) differ ({'a' * 64} vs {'b' * 64})",
    ),
]


def test_every_required_context_key_is_covered():
    assert [key for key, _, _ in REQUIRED] == [k.name for k in CONTEXT if k.required]
    assert set(OPTIONAL_KEYS) == {"jax_version", "jaxlib_version", "model"}
    # The CLI offers exactly the optional keys.
    from vmapcheck.cli import build_parser

    action = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["verdict"]._actions
        if a.dest == "require_same"
    )
    assert tuple(action.choices) == OPTIONAL_KEYS


@pytest.mark.parametrize("changes", [{}, {"bench": "full"}], ids=["compared", "not comparable"])
def test_the_verdict_written_reads_back_as_its_type(tmp_path, changes):
    """perf_verdict.json as track writes it holds every key PerfVerdict requires, and
    each compared cell every key of a CellComparison (read_json_typed checks both)."""
    base = BenchRecord("base.json", SAME, _full_context(), **_control(2.0, 3))
    cur = BenchRecord("cur.json", SLOWER, _full_context(**changes), **_control(2.0, 4))
    atomic_write_json(tmp_path / "perf_verdict.json", compare(base, cur, 1.1, 0.01))
    read = read_json_typed(tmp_path / "perf_verdict.json", PerfVerdict)
    compared = not changes
    assert read["comparable"] is compared and ("cells" in read) is compared
    if compared:
        assert read["cells"]["vmap_jit"]["b16"]["status"] == REGRESSION


@pytest.mark.parametrize(("key", "value", "named"), REQUIRED, ids=[k for k, _, _ in REQUIRED])
def test_a_run_that_differs_in_a_required_key_is_not_comparable(key, value, named):
    base = BenchRecord("base.json", SAME, _full_context(), **_control(2.0, 3))
    cur = BenchRecord("cur.json", SLOWER, _full_context(**{key: value}), **_control(2.0, 4))
    result = compare(base, cur, 1.1, 0.01)
    assert result["verdict"] == NOT_COMPARABLE and not result["comparable"]
    assert len(result["reasons"]) == 1 and result["reasons"][0].startswith(named)
    # Nothing compared: no cell, no regression, no control.
    assert "cells" not in result and result["regressions"] == []
    assert result["machine_slowdown"] is None
    assert result["differences"] == {key: [_full_context()[key], value]}
    text = format_table(result)
    assert text.startswith(f"benchmark verdict: NOT COMPARABLE: {named}")
    assert "nothing compared" in text


def test_quick_against_full_names_every_difference():
    full = _full_context(bench="full", batch_sizes=[1, 16, 256, 1024, 4096], warmup=5, repeats=100)
    base = BenchRecord("base", SAME, _full_context(), **_control(2.0, 3, size=512))
    cur = BenchRecord("cur", SLOWER, full, **_control(16.0, 4, size=1024))
    result = compare(base, cur, 1.1, 0.01)
    assert result["reasons"] == [
        "bench profiles differ (quick vs full)",
        "batch sizes differ ([1, 16, 128] vs [1, 16, 256, 1024, 4096])",
        "warm-up calls differ (3 vs 5)",
        "samples per cell differ (50 vs 100)",
    ]
    assert format_table(result).startswith(
        "benchmark verdict: NOT COMPARABLE: bench profiles differ (quick vs full); batch sizes"
    )


@pytest.mark.parametrize(
    ("key", "value"), [("jax_version", "0.12.0"), ("jaxlib_version", "0.12.0"), ("model", "m2")]
)
def test_an_optional_key_is_compared_unless_asked_for(key, value):
    base = BenchRecord("base", SAME, _full_context(), **_control(2.0, 3))
    cur = BenchRecord("cur", SLOWER, _full_context(**{key: value}), **_control(2.0, 4))
    compared = compare(base, cur, 1.1, 0.01)
    assert compared["verdict"] == "regression" and compared["differences"] == {
        key: [_full_context()[key], value]
    }
    asked = compare(base, cur, 1.1, 0.01, require_same=[key])
    assert asked["verdict"] == NOT_COMPARABLE and key in asked["required_same"]
    assert asked["reasons"][0].endswith(f"differ ({_full_context()[key]} vs {value})")


def test_a_key_asked_for_must_be_recorded_and_known():
    base = BenchRecord("base", SAME, {**_full_context(), "jax_version": None})
    cur = BenchRecord("cur", SAME, _full_context())
    # Not recorded in an older file: noted, compared ...
    assert compare(base, cur, 1.1, 0.01)["verdict"] == "no regression"
    # ... unless the caller asked for it.
    asked = compare(base, cur, 1.1, 0.01, require_same=["jax_version"])
    assert asked["reasons"] == ["JAX versions not recorded in the baseline"]
    with pytest.raises(ConfigError, match=r"unknown context key\(s\) jax;"):
        compare(base, cur, 1.1, 0.01, require_same=["jax"])


def test_context_is_read_from_a_real_bench_details_layout():
    details = _details(1.0, 0)
    details["bench"] = {"name": "full", "batch_sizes": [1, 16], "warmup": 5, "repeats": 100}
    details["runtime"] |= {"device_count": 1, "matmul_precision": "highest"}
    details["runtime"]["jaxlib_version"] = "0.11.2"
    details["machine"]["before"]["usable_cores"] = 2
    details["peak"] = {"size": 1024, "gflops": 90.0}
    details["model_contract"] = "a" * 64
    record = record_from_details(details, "x")
    assert record.context == {
        "bench": "full",
        "batch_sizes": [1, 16],
        "warmup": 5,
        "repeats": 100,
        "cpu_model": "test cpu",
        "usable_cores": 2,
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "matmul_precision": "highest",
        "jax_version": "0.11.2",
        "jaxlib_version": "0.11.2",
        "dtype": "float32",
        "model": "mlp",
        "model_contract": "a" * 64,
    }
    assert set(record.context) == set(CONTEXT_KEYS)
    assert (record.control_size, record.control_dtype) == (1024, "float32")


def test_make_verdict_against_another_profile_says_not_comparable_and_exits_0(
    tmp_path, root, capsys
):
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    quick, full = _details(1.0, 0), _details(1.5, 1)
    quick["bench"] = {"name": "quick", "batch_sizes": [1, 16, 128], "warmup": 3, "repeats": 50}
    full["bench"] = {"name": "full", "batch_sizes": [1, 16, 256], "warmup": 5, "repeats": 100}
    base, cur = tmp_path / "quick.json", tmp_path / "full.json"
    base.write_text(json.dumps(quick))
    cur.write_text(json.dumps(full))
    out = tmp_path / "verdict.json"
    args = ["verdict", "--root", str(tmp_path), "--baseline", str(base), "--current", str(cur)]
    assert cli_main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "NOT COMPARABLE: bench profiles differ (quick vs full)" in printed
    written = json.loads(out.read_text())
    assert written["verdict"] == "not comparable" and written["why"].startswith(
        "not comparable: bench profiles differ (quick vs full)"
    )
    # A same-version comparison asked for, on runs of two JAX versions: named too.
    full["bench"] = quick["bench"]
    full["runtime"]["jax_version"] = "0.12.0"
    cur.write_text(json.dumps(full))
    assert cli_main([*args, "--require-same", "jax_version"]) == 0
    assert "NOT COMPARABLE: JAX versions differ (0.11.2 vs 0.12.0)" in capsys.readouterr().out


def test_round_index_finds_the_round_that_slowed_every_cell():
    # Round 4 (samples 30-39) of every cell ran 1.8x slower; one cell is slower in
    # every round (a code change): the index marks round 4 only.
    cells = {f"p{i}": {"b1": _lognormal(1.0 + 0.1 * i, 100, i, sigma=0.02)} for i in range(5)}
    for by_batch in cells.values():
        by_batch["b1"][30:40] *= 1.8
    cells["p0"]["b1"] *= 1.5
    index = round_index(_record(cells))
    assert index.shape == (10,) and 1.7 < index[3] < 1.9
    assert np.all(np.abs(np.delete(index, 3) - 1.0) < 0.05)
    # Divided out, that round no longer stands apart in the comparison.
    base = _record(
        {k: {"b1": _lognormal(1.0, 100, 50 + i, sigma=0.02)} for i, k in enumerate(cells)}
    )
    plain = compare(base, _record(cells), 1.1, 0.01)
    normalized = compare(base, _record(cells), 1.1, 0.01, normalize_rounds=True)
    assert normalized["round_index"]["current"][3] == pytest.approx(index[3])
    assert normalized["cells"]["p0"]["b1"]["status"] == "regression"
    assert plain["round_index"]["current"] is None
    assert round_index(_record({"a": {"b1": _lognormal(1.0, 100, 0)}})) is None  # < 3 cells


def test_a_missing_current_report_is_named_as_such(tmp_path, root, capsys):
    # Before the pipeline ran: the message names the current run's file, not a baseline.
    (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
    missing = tmp_path / "reports" / "bench_details.json"
    args = ["--root", str(tmp_path), "--baseline", "last-verified", "--current", str(missing)]
    assert cli_main(["verdict", *args]) == 2
    err = capsys.readouterr().err
    assert f"current run '{missing}': no such file" in err and "run the pipeline first" in err


def _complete_run(client, experiment: str, details: dict, start_time: int, verdict="passed"):
    """A complete run (FINISHED, pipeline_complete=true, a verdict tag) of model mlp on cpu
    in f32, as params.yaml configures, with ``details`` as its bench_details.json."""
    run = client.create_run(
        experiment,
        start_time=start_time,
        tags={"verdict": verdict, "model": "mlp", "backend": "cpu", "precision": "f32"},
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_details.json"
        path.write_text(json.dumps(details))
        client.log_artifact(run.info.run_id, str(path))
    if "bench" in details:  # as track logs the config: bench.name among the params
        client.log_param(run.info.run_id, "bench.name", details["bench"]["name"])
    client.set_tag(run.info.run_id, "pipeline_complete", "true")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_the_run_that_logged_a_timing_is_found_by_its_span_and_its_artifact(
    tmp_path, empty_mlflow_store
):
    """A track rerun without bench (issue 35) names the run whose timing it holds: DVC
    removed reports/track.json before track ran, so the run is looked for in the store,
    a complete run whose span holds the bench's start and whose artifact is the file."""
    from mlflow.tracking import MlflowClient

    from vmapcheck.tracking.baselines import run_of_timing

    assert run_of_timing(f"sqlite:///{tmp_path / 'none.db'}", ["x"], tmp_path, 1.0) is None
    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(
        "vmapcheck", artifact_location=(tmp_path / "mlartifacts").as_uri()
    )
    older, timing = _details(1.0, 0), _details(1.0, 1)
    first = _complete_run(client, experiment, older, start_time=1_000)
    second = _complete_run(client, experiment, timing, start_time=2_000)  # both end now
    details = tmp_path / "bench_details.json"
    details.write_text(json.dumps(timing))
    # Both spans hold 2.5 s: the artifact tells them apart.
    assert run_of_timing(uri, ["vmapcheck", "absent"], details, made_at=2.5) == second
    details.write_text(json.dumps(older))
    assert run_of_timing(uri, ["vmapcheck"], details, made_at=2.5) == first
    assert run_of_timing(uri, ["vmapcheck"], details, made_at=0.5) is None  # before any run


def test_last_verified_is_a_run_of_the_judged_runs_bench_profile(
    tmp_path, root, empty_mlflow_store, monkeypatch, capsys
):
    """A newer verified run of another profile would only be "not comparable": make
    verdict's last-verified takes the newest run of the same profile, or says none is."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")  # sqlite:///mlflow.db
    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(
        "vmapcheck-mlp", artifact_location=(tmp_path / "mlartifacts").as_uri()
    )
    quick, full = _details(1.0, 0), _details(1.0, 1)
    quick["bench"] = {"name": "quick", "batch_sizes": [1, 16, 128], "warmup": 3, "repeats": 50}
    full["bench"] = {"name": "full", "batch_sizes": [1, 16, 256], "warmup": 5, "repeats": 100}
    current = tmp_path / "current.json"
    current.write_text(json.dumps(quick | {"samples_ms": _details(1.0, 2)["samples_ms"]}))
    verdict = ["verdict", "--root", str(tmp_path), "--baseline", "last-verified"]
    newest_full = _complete_run(client, experiment, full, start_time=2_000)
    assert cli_main([*verdict, "--current", str(current)]) == 0
    printed = capsys.readouterr().out
    assert "no baseline to judge against" in printed and "bench.name=quick" in printed
    assert newest_full not in printed
    older_quick = _complete_run(client, experiment, quick, start_time=1_000)
    assert cli_main([*verdict, "--current", str(current)]) == 0
    printed = capsys.readouterr().out
    assert "NO REGRESSION" in printed and f"baseline: run {older_quick}" in printed


def test_make_verdict_judges_the_reports_against_the_verified_run_before_theirs(
    tmp_path, root, empty_mlflow_store, monkeypatch, capsys
):
    """`make verdict` (BASELINE=last-verified) on the reports of a logged run: never that
    run itself (reports/track.json names it); none other: said, exit 0."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")  # sqlite:///mlflow.db
    uri = empty_mlflow_store(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(
        "vmapcheck-mlp", artifact_location=(tmp_path / "mlartifacts").as_uri()
    )
    layout = Layout(tmp_path)
    layout.reports.mkdir()
    reports = _details(1.0, 0)
    layout.bench_details.write_text(json.dumps(reports))
    ours = _complete_run(client, experiment, reports, start_time=2_000)
    track = {
        "run_id": ours,
        "run_name": "ours",
        "experiment": "vmapcheck-mlp",
        "experiment_id": experiment,
        "tracking_uri": uri,
        "verdict": "passed",
        "forward_outputs_sha256": None,
        "git_commit": "unknown",
        "git_dirty": "unknown",
    }
    layout.track_report.write_text(json.dumps(track))
    verdict = ["verdict", "--root", str(tmp_path), "--baseline", "last-verified"]

    # Only the run that logged the reports: nothing to compare them with.
    out = tmp_path / "verdict.json"
    assert cli_main([*verdict, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no baseline to judge against" in printed and f"other than run {ours}" in printed
    assert json.loads(out.read_text())["verdict"] == "no baseline"

    # An earlier verified run (and a newer failed one): that earlier run is the baseline.
    earlier = _complete_run(client, experiment, _details(1.0, 1), start_time=1_000)
    _complete_run(client, experiment, _details(5.0, 2), start_time=3_000, verdict="failed")
    assert cli_main(verdict) == 0
    printed = capsys.readouterr().out
    assert "NO REGRESSION" in printed and f"baseline: run {earlier}" in printed

    # The benchmark ran again since track logged `ours` (30% slower now): track.json still
    # names `ours`, but it did not log these reports, so it is their baseline.
    layout.bench_details.write_text(json.dumps(_details(1.3, 3)))
    assert cli_main(verdict) == 1
    printed = capsys.readouterr().out
    assert "REGRESSION" in printed and f"baseline: run {ours}" in printed


def test_two_networks_of_one_name_are_not_comparable():
    """Same name, same bench, another width: the contract digests differ, and a forced
    comparison says so instead of comparing them."""
    rng = np.random.default_rng(0)
    samples = {"vmap_jit": {"b16": rng.lognormal(0, 0.05, 50)}}
    context = {"bench": "quick", "model": "mlp", "dtype": "float32"}
    narrow = BenchRecord("narrow", samples, {**context, "model_contract": "a" * 64})
    wide = BenchRecord("wide", samples, {**context, "model_contract": "b" * 64})
    result = compare(narrow, wide, 1.1, 0.01)
    assert result["verdict"] == NOT_COMPARABLE
    assert "model contracts (params, inputs or outputs) differ" in result["why"]
    assert result["regressions"] == []


def test_the_contract_digest_is_what_the_network_is_not_its_name():
    import jax

    from vmapcheck.config import ModelConfig
    from vmapcheck.core.models import build_model
    from vmapcheck.params_io import contract_digest, model_contract

    def digest(hidden, features, name="mlp"):
        model = build_model(ModelConfig(name="mlp", in_features=3, hidden=hidden, out_features=2))
        contract = model_contract(model, model.init(jax.random.key(0)), features)
        return contract_digest({**contract, "model": name})

    base = digest([4], ["a", "b", "c"])
    assert digest([4], ["x", "y", "z"]) == base  # the table's column names aside
    assert digest([4], ["a", "b", "c"], name="renamed") == base
    assert digest([5], ["a", "b", "c"]) != base  # another width: another network


# --- rounds of unequal number (early stopping) and older records ------------------------


def _rounds(median_ms: float, sizes: list[int], seed: int) -> np.ndarray:
    """Samples in rounds of ``sizes``, each round with its own machine state."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [median_ms * rng.lognormal(0.0, 0.03) * rng.lognormal(0.0, 0.05, n) for n in sizes]
    )


def test_an_older_record_without_rounds_is_cut_into_ten_rounds_and_compared_with_fewer():
    """A baseline logged before early stopping (no round_sizes: 10 rounds of 5 samples)
    against a current run whose cell stopped after 7 rounds: rounds are compared with
    rounds (10 medians against 7), and the verdict says that the current run has fewer."""
    older = {
        "model": "mlp",
        "dtype": "float32",
        "samples_ms": {"direct_jit": {"b16": _rounds(1.0, [5] * 10, 1).tolist()}},
        "machine": {"noisy": False, "before": {"cpu_model": "test cpu"}},
    }
    newer = {
        **older,
        "samples_ms": {"direct_jit": {"b16": _rounds(1.4, [5] * 7, 2).tolist()}},
        "round_sizes": {"direct_jit": {"b16": [5] * 7}},
    }
    base, cur = record_from_details(older, "old run"), record_from_details(newer, "new run")
    assert base.round_sizes is None and cur.rounds_of("direct_jit", "b16") == [5] * 7
    result = compare(base, cur, factor=1.1, alpha=0.01)
    cell = result["cells"]["direct_jit"]["b16"]
    assert (cell["blocks_baseline"], cell["blocks_current"]) == (10, 7)
    assert cell["n_current"] == 35 and cell["status"] == REGRESSION
    assert cell["smallest_p"] == pytest.approx(1 / 19448)  # 1 / C(17, 7)
    assert result["rounds"]["current_fewer"] == ["direct_jit/b16"]
    assert "the current run has fewer rounds than the baseline in 1 cell(s)" in format_table(result)


def test_a_cell_with_too_few_rounds_to_reach_alpha_alone_is_named():
    """Five rounds a side cannot give p below alpha / cells: said, not hidden."""
    samples = {f"p{i}": {"b16": _rounds(1.0, [5] * 5, i)} for i in range(30)}
    sizes = {path: {"b16": [5] * 5} for path in samples}
    base = BenchRecord("b", samples, {"model": "mlp"}, round_sizes=sizes)
    cur = BenchRecord("c", samples, {"model": "mlp"}, round_sizes=sizes)
    result = compare(base, cur, factor=1.1, alpha=0.01)
    assert len(result["rounds"]["cannot_reach_alpha_alone"]) == 30
    assert "too few rounds to be a regression alone" in format_table(result)


def test_malformed_round_sizes_name_the_key():
    details = {
        "samples_ms": {"vmap_jit": {"b16": [1.0] * 10}},
        "round_sizes": {"vmap_jit": {"b16": [5, 4]}},
    }
    with pytest.raises(ArtifactError, match=r"x: round_sizes.vmap_jit.b16: expected .* 10 samples"):
        record_from_details(details, "x")
    details["round_sizes"] = {"vmap_jit": {}}
    with pytest.raises(ArtifactError, match=r"round_sizes.vmap_jit.b16: missing"):
        record_from_details(details, "x")


def test_no_store_means_no_baseline_at_once_and_no_store_is_made(tmp_path):
    from vmapcheck.tracking.baselines import NoBaselineError

    store = tmp_path / "mlflow.db"
    with pytest.raises(NoBaselineError, match=f"no MLflow store at {store}"):
        resolve_baseline("last-verified", tracking_uri=f"sqlite:///{store}")
    with pytest.raises(ArtifactError, match="no MLflow store"):
        resolve_baseline("0" * 32, tracking_uri=f"sqlite:///{store}")
    assert not store.exists()


def test_direction_labels_need_the_adjusted_significance_and_below_means_wholly_below():
    """Seen in A/A (2026-12-06): cells labelled `faster` or `slower (below the factor)` at
    adjusted p 0.027-0.19, and one `below the factor` whose interval reached 1.103."""
    from vmapcheck.bench.verdict.labels import (
        FASTER,
        NO_DIFFERENCE,
        SLOWER,
        UNDERPOWERED,
        cell_label,
    )

    def cell(ratio, low, high, p_slower=0.5, p_faster=0.5):
        return {
            "ratio": ratio,
            "ci_low": low,
            "ci_high": high,
            "p_slower_adjusted": p_slower,
            "p_faster_adjusted": p_faster,
        }

    alpha, factor = 0.01, 1.1
    assert cell_label(cell(1.04, 1.01, 1.07, p_slower=0.19), factor, False, False, alpha) == (
        NO_DIFFERENCE
    )
    assert cell_label(cell(1.04, 1.01, 1.07, p_slower=0.001), factor, False, False, alpha) == (
        SLOWER
    )
    # Significant, but the interval reaches the factor: a slowdown of the factor's size
    # is not ruled out.
    assert cell_label(cell(1.05, 1.01, 1.103, p_slower=0.001), factor, False, False, alpha) == (
        UNDERPOWERED
    )
    assert cell_label(cell(0.96, 0.93, 0.99, p_faster=0.027), factor, False, False, alpha) == (
        NO_DIFFERENCE
    )
    assert cell_label(cell(0.96, 0.93, 0.99, p_faster=0.002), factor, False, False, alpha) == (
        FASTER
    )
