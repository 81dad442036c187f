"""Batch composition: a path whose outputs change when its batch is permuted or split is
flagged, "outputs depend on batch composition".

The loop and vmap forms never see a row's batch-mates; a hand-batched form may. The
forward functions run every batch path on each regrouped batch
(vmapcheck.core.composition), the check compares each with the path's own outputs on
the batch as it is. Unit tests here run them on the built-in MLP in this process; one
run of the real stages (prepare, train, forward, check, in process as
tests/test_diagnosis.py runs them) plants the fault ``batch_statistics``
(tests/helpers/faults.py): the hand-batched forward centres a hidden layer with the
batch's own mean.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.faults import factory_overrides, make_model
from tests.helpers.inprocess import run_stages, write_params
from vmapcheck.check.checks import run_checks
from vmapcheck.core.composition import REGROUPINGS, applies, composition_key, permutation
from vmapcheck.core.forward import build_all, run_composition, run_forward
from vmapcheck.core.magnitude import case_magnitudes
from vmapcheck.core.models import Model, build_model, no_tap
from vmapcheck.core.paths import PATHS, batch_paths
from vmapcheck.io import load_npz, read_json
from vmapcheck.layout import Layout
from vmapcheck.tracking.log import collect_metrics

CONFIG = compose_config("reference.required=false", "backend.num_devices=2")
MLP = build_model(CONFIG.model)
PARAMS = MLP.init(jax.random.key(0))
RUNTIME = {"backend": "cpu", "device_kind": "cpu", "jax_version": "0", "jaxlib_version": "0"}
DIRECT = {p.name for p in PATHS.values() if p.form == "direct"}  # the hand-batched paths


def _cases() -> dict[str, dict]:
    """A batch of 5 rows (odd: halves of 2 and 3, the sharded path pads them), a batch of
    one (not regrouped: it has no batch-mates) and one unbatched example."""
    rows = np.random.default_rng(0).normal(size=(5, MLP.in_features)).astype(np.float32)
    return {
        "standard": {"kind": "batch", "x": rows, "shape": list(rows.shape)},
        "single": {"kind": "batch", "x": rows[:1], "shape": [1, MLP.in_features]},
        "single_vector": {"kind": "vector", "x": rows[0], "shape": [MLP.in_features]},
    }


def judge(model: Model, cases: dict[str, dict], drop: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Forward (original and regrouped batches) and check on ``cases``, in this process:
    (the check's report, the forward's composition record). ``drop``: regrouped outputs
    to lose before the check."""
    built = build_all(model, jnp.float32)
    outputs, record = run_forward(model, PARAMS, cases, jnp.float32, built=built)
    regrouped, composition = run_composition(
        model, PARAMS, cases, jnp.float32, outputs, built=built
    )
    with jax.enable_x64(True):
        magnitudes = case_magnitudes(model.forward_one, PARAMS, cases, jnp.float32)
    forward_record = {
        "runtime": RUNTIME,
        "reference": {"status": "missing", "message": "none"},
        "cases": record,
        "composition": composition,
    }
    manifest = {
        "cases": {name: {k: v for k, v in c.items() if k != "x"} for name, c in cases.items()}
    }
    report = run_checks(
        CONFIG,
        manifest,
        outputs,
        forward_record,
        magnitudes=magnitudes,
        composition={k: v for k, v in regrouped.items() if k not in drop},
    )
    return report, composition


def _composition_failures(report: dict) -> list[str]:
    return [f for f in report["failures"] if "outputs depend on batch composition" in f]


def test_the_regroupings_are_fixed_and_apply_to_batches_of_two_or_more_rows():
    assert permutation(4).tolist() == [3, 2, 1, 0]
    assert set(REGROUPINGS) == {"permuted", "split"}
    assert applies({"kind": "batch", "shape": [2, 8]})
    assert applies({"kind": "denormal", "shape": [4, 8]})
    assert not applies({"kind": "batch", "shape": [1, 8]})
    assert not applies({"kind": "vector", "shape": [8]})
    assert not applies({"kind": "invalid", "shape": [4, 9], "runs_on": "batch"})
    assert composition_key("standard", "vmap_jit", "split") == "standard.vmap_jit.split"


def test_a_healthy_model_passes_on_every_path_and_regrouping():
    report, record = judge(MLP, _cases())
    assert report["passed"], report["failures"]
    by_path = report["composition"]["standard"]
    assert set(by_path) == {p.name for p in batch_paths()}  # sharded_jit too
    for path, result in by_path.items():
        assert result["passed"], (path, result)
        assert all(result[g]["max_abs"] is not None for g in REGROUPINGS)
    assert set(report["composition"]) == {"standard"}  # one row has no batch-mates
    # What was run is recorded: the permutation, the halves, the paths.
    case = record["cases"]["standard"]
    assert case["rows"] == 5 and case["permuted"] == {"order": [4, 3, 2, 1, 0]}
    assert case["split"] == {"halves": [[0, 2], [2, 5]]}
    assert case["paths"] == [p.name for p in batch_paths()] and case["raised"] == {}


def test_a_path_whose_rows_depend_on_their_position_fails_naming_permuted():
    def forward_batch(params, x, tap=no_tap):  # row i gets i/100 added: order-dependent
        out = MLP.forward_batch(params, x, tap)
        return out + 0.01 * jnp.arange(x.shape[0], dtype=out.dtype)[:, None]

    report, _ = judge(replace(MLP, forward_batch=forward_batch), _cases())
    assert not report["passed"]
    failing = _composition_failures(report)
    assert failing, report["failures"]
    assert {f.split(":")[0] for f in failing} == {f"standard/{p}" for p in DIRECT}
    for path in DIRECT:
        assert any(
            f.startswith(f"standard/{path}: outputs depend on batch composition (permuted: ")
            for f in failing
        ), failing
        assert not report["composition"]["standard"][path]["passed"]
    passed = {p for p, r in report["composition"]["standard"].items() if r["passed"]}
    assert passed == {p.name for p in batch_paths()} - DIRECT
    metrics = collect_metrics(report, {"latency_ms": {}, "speedup": {}}, {})
    # Per case, the worst over the paths (each path's figures are in check_details.json).
    assert metrics["composition/standard/passed"] == 0.0
    assert metrics["composition/standard/max_abs"] >= 0.01


def test_a_regrouped_output_missing_fails_too():
    key = composition_key("standard", "vmap_jit", "split")
    report, _ = judge(MLP, _cases(), drop=(key,))
    assert _composition_failures(report) == [
        "standard/vmap_jit: outputs depend on batch composition "
        "(split: no output (not run by the forward stage))"
    ]


# --- the planted fault, through the real stages ---------------------------------------

OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    "reference.required=false",
    "train.steps=0",
    "backend.num_devices=2",
)


@pytest.mark.stages
def test_batch_statistics_in_the_hand_batched_forward(tmp_path: Path):
    root = tmp_path / "p"
    root.mkdir()
    write_params(root, *OVERRIDES, *factory_overrides("batch_statistics"))
    run_stages(root, "prepare", "train", "forward", "check")
    layout = Layout(root)
    check = read_json(layout.check_details)
    assert not check["passed"]
    failing = _composition_failures(check)
    # Centring with the batch mean is blind to the rows' order, not to their grouping.
    assert any(": outputs depend on batch composition (split: " in f for f in failing)
    assert {f.split("/")[1].split(":")[0] for f in failing} == DIRECT, failing
    for case, by_path in check["composition"].items():
        for path, result in by_path.items():  # every path that never sees batch-mates
            assert result["passed"] or path in DIRECT, (case, path, result)
    assert not any(check["composition"]["standard"][path]["passed"] for path in DIRECT)
    # The forward stage stored the regrouped outputs and recorded what it ran.
    stored = load_npz(layout.composition)
    assert composition_key("standard", "sharded_jit", "split") in stored
    record = read_json(layout.record)["composition"]
    assert record["cases"]["standard"]["permuted"]["order"] == list(range(8))[::-1]
    # The DVC metrics say the check failed; the composition figures are in the details.
    assert read_json(layout.check_report)["passed"] is False
    print(next(f for f in failing if f.startswith("standard/")))


def test_the_planted_fault_keeps_forward_one():
    # The planted model's forward_one is the MLP's: the loop and vmap paths are healthy.
    model = make_model("batch_statistics", MLP.in_features, [32, 32], MLP.out_features)
    x = _cases()["standard"]["x"]
    np.testing.assert_array_equal(
        np.asarray(model.forward_one(PARAMS, x[0])), np.asarray(MLP.forward_one(PARAMS, x[0]))
    )
