"""The paired verdict (vmapcheck.bench.verdict.paired): its statistics on synthetic rounds, and
its driver with two real worker processes on a tiny project."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vmapcheck.bench.verdict.paired import run_paired
from vmapcheck.bench.verdict.paired_report import format_paired
from vmapcheck.bench.verdict.pairs import (
    BASELINE,
    CURRENT,
    InsufficientRoundsError,
    judge_paired,
    min_pairs,
    process_of_pair,
    schedule,
)
from vmapcheck.bench.verdict.sides import WORKER_MODULES, WorkerError, side_ready, side_spec
from vmapcheck.errors import ConfigError

CELLS = ("direct_jit/b256", "direct_jit/b1024", "vmap_jit/b256", "vmap_jit/b1024")
BASE_MS = {
    "direct_jit/b256": 0.08,
    "direct_jit/b1024": 0.3,
    "vmap_jit/b256": 0.09,
    "vmap_jit/b1024": 0.32,
}


def synthetic_rounds(
    rounds: int,
    seed: int,
    slowdown: dict[str, float] | None = None,
    swing: float = 2.0,
    samples: int = 5,
    jitter: float = 0.05,
    processes: int = 1,
    slow_process: tuple[int, float] | None = None,
) -> tuple[list[str], list[dict[str, list[float]]]]:
    """Rounds in ABBA order on a machine whose load drifts: each pair of adjacent rounds
    shares one factor drawn log-uniformly in [1, ``swing``] (the machine's state then),
    every sample has its own ``jitter`` (lognormal sigma); the current side's cells are
    ``slowdown[cell]`` times slower. ``slow_process=(k, f)``: the current side's process
    ``k`` (of ``processes``, taking turns pair by pair) is ``f`` times slower in every
    cell for the whole comparison, whatever the code."""
    rng = np.random.default_rng(seed)
    order = schedule(rounds)
    taken = []
    for i, side in enumerate(order):
        if i % 2 == 0:
            load = float(np.exp(rng.uniform(0, np.log(swing))))
        factor = (slowdown or {}).get
        process = process_of_pair(i // 2, processes)
        slow = slow_process[1] if slow_process and slow_process[0] == process else 1.0
        taken.append(
            {
                cell: list(
                    BASE_MS[cell]
                    * load
                    * (factor(cell, 1.0) * slow if side == CURRENT else 1.0)
                    * np.exp(rng.normal(0, jitter, samples))
                )
                for cell in CELLS
            }
        )
    return order, taken


def test_schedule_is_abba_and_every_pair_is_one_of_each_side():
    order = schedule(6)
    assert order[:8] == [BASELINE, CURRENT, CURRENT, BASELINE, BASELINE, CURRENT, CURRENT, BASELINE]
    pairs = [tuple(order[i : i + 2]) for i in range(0, len(order), 2)]
    assert all(set(p) == {BASELINE, CURRENT} for p in pairs)
    # Which side goes first alternates: an order effect cancels over the pairs.
    assert sum(p[0] == BASELINE for p in pairs) == sum(p[0] == CURRENT for p in pairs)


def test_aa_with_a_shared_per_round_load_finds_no_regression():
    """Twenty seeds of A/A rounds under 2x load swings: no regression, no improvement,
    every ratio within 5% of 1, and the 95% intervals hold 1 about as often as they should."""
    covered = []
    for seed in range(20):
        order, taken = synthetic_rounds(20, seed)
        result = judge_paired(order, taken, factor=1.1, alpha=0.01)
        assert result["verdict"] == "no regression", (seed, result["regressions"])
        assert result["improvements"] == []
        for cell in result["cells"].values():
            covered.append(cell["ci_low"] <= 1.0 <= cell["ci_high"])
            assert 0.95 < cell["ratio"] < 1.05
    assert np.mean(covered) >= 0.85


def test_a_planted_slowdown_is_found_despite_2x_load_swings():
    """+25% on the direct cells only, the machine's speed swinging 2x from round to
    round (far more than the slowdown): the direct cells regress, the vmap cells do not."""
    planted = {"direct_jit/b256": 1.25, "direct_jit/b1024": 1.25}
    for seed in range(10):
        order, taken = synthetic_rounds(20, seed, slowdown=planted)
        result = judge_paired(order, taken, factor=1.1, alpha=0.01)
        assert result["verdict"] == "regression"
        assert sorted(result["regressions"]) == sorted(planted)
        for cell in planted:
            judged = result["cells"][cell]
            assert judged["ci_low"] < 1.25 < judged["ci_high"]
            assert judged["p_slower_adjusted"] < 0.01
    text = format_paired(
        result
        | {
            "design": {"name": "paired", "rounds_per_side": 20, "samples_per_round": 5},
            "load": {"load_avg_1m_min": 1.0, "load_avg_1m_max": 2.0, "usable_cores": 2},
            "baseline": {"project": "a", "code": "x"},
            "current": {"project": "b", "code": "x"},
            "differences": {},
        }
    )
    assert "REGRESSION" in text and "direct_jit" in text


def test_one_slow_process_is_outvoted_by_the_other_two():
    """A/A where one of the current side's three processes is 1.45x slower all along (as
    measured under load 10-16): judged as one process pair, the pairs would call it a
    regression; with three process pairs the ratio stays near 1 and the majority rule
    holds, while the per-process ratios show the odd one out."""
    for seed in range(10):
        order, taken = synthetic_rounds(21, seed, processes=3, slow_process=(1, 1.45))
        result = judge_paired(order, taken, factor=1.1, alpha=0.01, processes=3)
        assert result["verdict"] == "no regression", (seed, result["regressions"])
        for cell in result["cells"].values():
            slow_one = cell["process_ratios"][1]
            assert 1.3 < slow_one < 1.6 and cell["processes_slower"] == 1
            assert cell["ci_high"] > 1.1  # the odd process widens the interval
    # The same failure with one process a side cannot be told from slower code.
    order, taken = synthetic_rounds(20, 0, processes=1, slow_process=(0, 1.45))
    assert judge_paired(order, taken, factor=1.1, alpha=0.01)["verdict"] == "regression"


def test_a_planted_slowdown_is_found_by_every_process_pair():
    planted = {"direct_jit/b256": 1.25, "direct_jit/b1024": 1.25}
    for seed in range(10):
        order, taken = synthetic_rounds(21, seed, slowdown=planted, processes=3)
        result = judge_paired(order, taken, factor=1.1, alpha=0.01, processes=3)
        assert sorted(result["regressions"]) == sorted(planted)
        assert all(result["cells"][c]["processes_slower"] == 3 for c in planted)


def test_processes_out_of_range_are_refused():
    order, taken = synthetic_rounds(12, 0)
    with pytest.raises(ConfigError, match=r"processes: expected 1 to 12 .*found 13"):
        judge_paired(order, taken, 1.1, 0.01, processes=13)
    with pytest.raises(ConfigError, match=r"processes: expected 1 to 12 .*found 0"):
        judge_paired(order, taken, 1.1, 0.01, processes=0)


def test_a_slowdown_below_the_factor_is_not_a_regression():
    """asv's rule: +5% is significant with these pairs but within the factor 1.1."""
    order, taken = synthetic_rounds(20, 0, slowdown={"vmap_jit/b256": 1.05}, jitter=0.01)
    result = judge_paired(order, taken, factor=1.1, alpha=0.01)
    cell = result["cells"]["vmap_jit/b256"]
    assert cell["p_slower_adjusted"] < 0.01 and 1.03 < cell["ratio"] < 1.07
    assert result["verdict"] == "no regression"
    # Named for what was measured, not "no change"; the untouched cells read so.
    assert cell["status"] == "slower (below the factor)" and cell["ci_low"] > 1.0
    others = [c for name, c in result["cells"].items() if name != "vmap_jit/b256"]
    assert {c["status"] for c in others} == {"no measurable difference"}
    assert all(1.0 < c["min_detectable_ratio"] < 1.1 for c in result["cells"].values())


def test_too_few_rounds_are_refused_with_the_number_needed():
    needed = min_pairs(len(CELLS), 0.01)
    assert needed == 11  # ceil(log2(4 / 0.01)) = 9, plus the margin of two
    order, taken = synthetic_rounds(needed - 1, 0)
    with pytest.raises(
        InsufficientRoundsError, match=r"10 pair\(s\) of rounds for 4 cell\(s\); at least 11"
    ):
        judge_paired(order, taken, 1.1, 0.01)
    order, taken = synthetic_rounds(needed, 0)
    assert judge_paired(order, taken, 1.1, 0.01)["pairs"] == needed


def test_bad_factor_alpha_and_project_are_named(tmp_path):
    order, taken = synthetic_rounds(12, 0)
    with pytest.raises(ConfigError, match=r"bench\.regression\.factor: expected > 1, found 0\.9"):
        judge_paired(order, taken, 0.9, 0.01)
    with pytest.raises(ConfigError, match=r"bench\.regression\.alpha"):
        judge_paired(order, taken, 1.1, 1.5)
    with pytest.raises(ConfigError, match=f"baseline project {tmp_path}: no params.yaml"):
        side_spec(BASELINE, tmp_path)
    (tmp_path / "params.yaml").write_text("{}")
    spec = side_spec(BASELINE, tmp_path)
    with pytest.raises(ConfigError, match=r"unknown batch path\(s\) nope; known: .*vmap_jit"):
        run_paired(spec, spec, ["nope"], [16], 1.1, 0.01)
    # A bad count names itself, not the processes' bound that depends on it.
    with pytest.raises(
        ConfigError, match=r"^rounds: expected a whole number of at least 1, found -1$"
    ):
        run_paired(spec, spec, ["vmap_jit"], [16], 1.1, 0.01, rounds=-1)
    with pytest.raises(
        ConfigError, match=r"^samples: expected a whole number of at least 1, found 0$"
    ):
        run_paired(spec, spec, ["vmap_jit"], [16], 1.1, 0.01, samples=0)


@pytest.mark.stages
def test_two_real_workers_time_one_project_abba(tmp_path):
    """The driver with two worker processes, each holding both sides, on one tiny project
    (A/A): every pair timed, by both processes in turn; the design and the load recorded."""
    from tests.helpers.inprocess import run_stages, write_params

    write_params(tmp_path, "data.n_rows=240", "data.standard_batch=8", "train.steps=0")
    run_stages(tmp_path, "prepare", "train")
    spec = side_spec(BASELINE, tmp_path)
    rounds = min_pairs(2, 0.01)
    result = run_paired(
        spec,
        side_spec(CURRENT, tmp_path),
        ["vmap_jit", "direct_jit"],
        [16],
        factor=1.1,
        alpha=0.01,
        rounds=rounds,
        samples=3,
        warmup=1,
        processes=2,
    )
    assert result["verdict"] in ("no regression", "regression")
    assert sorted(result["cells"]) == ["direct_jit/b16", "vmap_jit/b16"]
    assert all(c["pairs"] == rounds for c in result["cells"].values())
    assert all(len(c["process_ratios"]) == 2 for c in result["cells"].values())
    # Same code, interpreter and config: both sides share each of the two processes.
    assert result["design"]["one_process_for_both"] and result["design"]["why_apart"] is None
    assert result["design"]["processes"] == 2 and result["pairs"] == rounds
    # Never fewer samples a block than asked for, at most 20x. How many more depends on
    # the call's time at warm-up, which the machine's load sets (at load 9 both cells
    # took 3): test_a_fast_call_takes_more_samples_a_block has the rule with fixed times.
    assert all(3 <= n <= 60 for n in result["design"]["block_samples"].values())
    assert result["baseline"]["jax_version"] == result["current"]["jax_version"]
    assert result["differences"] == {}
    assert result["load"]["load_avg_1m_max"] >= result["load"]["load_avg_1m_min"] >= 0
    assert "paired benchmark verdict" in format_paired(result)


@pytest.mark.parametrize("worker", WORKER_MODULES)
def test_a_side_with_its_own_src_runs_the_worker_its_revision_has(tmp_path, worker):
    """A baseline checkout of an older revision keeps its worker where that revision put
    it (bench/worker.py before the split by job); the side starts that module on its
    own src/. Without a src/, the driver's code and this revision's worker."""
    import vmapcheck

    (tmp_path / "params.yaml").write_text("{}")
    driver = side_spec(BASELINE, tmp_path)
    assert driver.pythonpath == str(Path(vmapcheck.__file__).resolve().parents[1])
    assert (driver.own_code, driver.worker_module) == (False, WORKER_MODULES[0])
    module = tmp_path / "src" / Path(*worker.split("."))
    module.parent.mkdir(parents=True)
    module.with_suffix(".py").write_text("")
    own = side_spec(BASELINE, tmp_path)
    assert (own.own_code, own.pythonpath, own.worker_module) == (
        True,
        str(tmp_path / "src"),
        worker,
    )
    assert own.describe()["worker"] == worker


def test_sides_share_a_process_only_with_the_same_code_and_settings(tmp_path):
    from dataclasses import replace

    from tests.helpers.inprocess import write_params
    from vmapcheck.bench.verdict.sides import why_not_one_process

    a, b, c = (tmp_path / n for n in "abc")
    for folder in (a, b, c):
        folder.mkdir()
    write_params(a, "model=mlp")
    write_params(b, "model=mlp_slow")  # a model of vmapcheck's own: one process holds both
    write_params(c, "model=mlp", "precision=f64")
    base = side_spec(BASELINE, a)
    assert why_not_one_process(base, side_spec(CURRENT, b)) is None
    assert why_not_one_process(base, side_spec(CURRENT, c)) == (
        "precision differs (set once per process)"
    )
    other_code = replace(side_spec(CURRENT, b), pythonpath=str(tmp_path / "src"))
    assert why_not_one_process(base, other_code) == "the sides run different interpreters or code"


def _fake_trained(folder, width: int) -> None:
    """The files a paired verdict reads before starting a worker: params.yaml, and
    data/params (its contract.json) and data/cases as `dvc repro train` leaves them."""
    import json

    from tests.helpers.inprocess import write_params
    from vmapcheck.layout import Layout

    folder.mkdir()
    write_params(folder, "model=mlp")
    layout = Layout(folder)
    layout.params.mkdir(parents=True)
    layout.cases.mkdir(parents=True)
    # contract.json as train writes it (vmapcheck.params_io.ModelContract: read back
    # typed), the networks differing in one params leaf's shape.
    contract = {
        "model": "mlp",
        "description": f"an MLP of width {width}",
        "params": {"layer0/w": {"shape": [8, width], "dtype": "float32"}},
        "state_leaves": [],
        "inputs": {
            "features": [f"f{i}" for i in range(8)],
            "n_features": 8,
            "batch_axis": 0,
            "unbatched": "forward_one takes one vector of shape (8,)",
        },
        "outputs": {"names": ["y0", "y1"], "n_outputs": 2, "meaning": "two targets"},
        "batched_forward": False,
    }
    layout.contract.write_text(json.dumps(contract))


def test_sides_of_other_networks_are_not_comparable_before_any_worker_starts(tmp_path):
    """Another model contract is read from the files: `not comparable`, nothing timed,
    no worker started (run_paired returns before starting one)."""
    _fake_trained(tmp_path / "a", 32)
    _fake_trained(tmp_path / "b", 64)
    result = run_paired(
        side_spec(BASELINE, tmp_path / "a"),
        side_spec(CURRENT, tmp_path / "b"),
        ["vmap_jit"],
        [16],
        1.1,
        0.01,
    )
    assert result["verdict"] == "not comparable" and result["timed"] is False
    assert "model contracts (params, inputs or outputs) differ" in result["why"]
    assert "nothing timed" in format_paired(result)


def test_a_project_without_its_trained_params_is_named_before_any_worker_starts(tmp_path):
    from tests.helpers.inprocess import write_params

    _fake_trained(tmp_path / "a", 32)
    (tmp_path / "empty").mkdir()
    write_params(tmp_path / "empty", "model=mlp")
    with pytest.raises(ConfigError, match=r"nothing to time: no data/params, data/cases \(run"):
        run_paired(
            side_spec(BASELINE, tmp_path / "empty"),
            side_spec(CURRENT, tmp_path / "a"),
            ["vmap_jit"],
            [16],
            1.1,
            0.01,
        )


def test_a_fast_call_takes_more_samples_a_block():
    """A cell timed alone takes samples enough to last MIN_BLOCK_MS (another tenant's
    time slice then lands on a minority of them), at least the samples asked for and at
    most 20x: the rule with fixed call times, whatever the machine's load."""
    from vmapcheck.bench.verdict.paired import MIN_BLOCK_MS
    from vmapcheck.bench.verdict.worker import samples_per_block

    assert samples_per_block(3, 1, 2e-3, MIN_BLOCK_MS) == 7  # 25 ms / (2 x 2 ms) = 6.25
    assert samples_per_block(3, 1, 1e-6, MIN_BLOCK_MS) == 60  # capped at 20x
    assert samples_per_block(3, 1, 0.05, MIN_BLOCK_MS) == 3  # a slow call: as asked
    assert samples_per_block(10, 0, 1e-3, MIN_BLOCK_MS) == 25


def test_a_ready_message_of_another_shape_is_refused_naming_the_worker_and_the_key():
    """A worker's ready answer crosses a process boundary: side_ready keeps its typed
    keys, and refuses one of another protocol (a worker of another vmapcheck) by name."""
    answer = {"event": "ready", "context": {"dtype": "float32"}, "cells": ["vmap_jit/b8"]}
    ready = side_ready({**answer, "skipped": {}, "block_samples": {"vmap_jit/b8": 3}}, "w")
    assert ready == {
        "context": {"dtype": "float32"},
        "cells": ["vmap_jit/b8"],
        "skipped": {},
        "block_samples": {"vmap_jit/b8": 3},
    }
    with pytest.raises(WorkerError, match=r"baseline worker: its ready message's 'skipped': "):
        side_ready(answer, "baseline worker")
    with pytest.raises(WorkerError, match=r"'cells': expected a list, found str"):
        side_ready({**answer, "cells": "vmap_jit/b8", "skipped": {}}, "current worker")
