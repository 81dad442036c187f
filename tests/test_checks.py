"""The check report fails honestly: disagreement, contract, oracle, reference, refusals.

The checks run under the default rule (``precision.tolerance.scale: terms``), with the
terms' magnitude of the toy model's real outputs (vmapcheck.core.magnitude): every
planted disagreement must still fail under it.
"""

import jax
import numpy as np
import pytest

from tests.helpers.config import compose_config
from vmapcheck.check.checks import run_checks
from vmapcheck.config import VerdictConfig
from vmapcheck.core.magnitude import case_magnitudes
from vmapcheck.core.models import build_model
from vmapcheck.core.paths import path_names

# The toy model (relu(x @ W + b), W = arange(6).reshape(3, 2) / 10, b = [0.1, -0.2]) on
# two rows: its outputs are OUT, the terms' magnitude of each output element is S_TERMS.
X = np.array([[0.5, -1.0, 1.0], [1.0, 1.0, -0.5]], dtype=np.float32)
TOY = build_model(compose_config("model=toy").model)
TOY_PARAMS = TOY.init(jax.random.key(0))
OUT = np.asarray(jax.vmap(TOY.forward_one, in_axes=(None, 0))(TOY_PARAMS, X))
with jax.enable_x64(True):
    MAGNITUDES = case_magnitudes(
        TOY.forward_one,
        TOY_PARAMS,
        {
            "standard": {"kind": "batch", "x": X},
            "single": {"kind": "batch", "x": X[:1]},
            "single_vector": {"kind": "vector", "x": X[0]},
        },
        np.float32,
    )
RUNTIME = {
    "backend": "cpu",
    "device_kind": "cpu",
    "jax_version": "0.11.2",
    "jaxlib_version": "0.11.2",
}


def _ok(shape):
    return {"refused": False, "shape": shape, "dtype": "float32"}


def _refused(message):
    return {"refused": True, "error": "InvalidInputError", "message": message}


@pytest.fixture
def inputs():
    config = compose_config("model=toy")
    manifest = {
        "cases": {
            "standard": {"kind": "batch", "shape": [2, 3]},
            "single": {"kind": "batch", "shape": [1, 3]},
            "single_vector": {"kind": "vector", "shape": [3]},
            "invalid_features": {
                "kind": "invalid",
                "shape": [2, 4],
                "runs_on": "batch",
                "expect": ["expected 3 features, got 4"],
            },
        }
    }
    outputs = {f"standard.{p}": OUT.copy() for p in path_names("batch")}
    outputs |= {f"single.{p}": OUT[:1].copy() for p in path_names("batch")}
    outputs |= {f"single_vector.{p}": OUT[0].copy() for p in path_names("vector")}
    record = {
        "runtime": RUNTIME,
        "reference": {"status": "ok"},
        "cases": {
            "standard": {p: _ok([2, 2]) for p in path_names("batch")},
            "single": {p: _ok([1, 2]) for p in path_names("batch")},
            "single_vector": {p: _ok([2]) for p in path_names("vector")},
            "invalid_features": {
                p: _refused("expected 3 features, got 4") for p in path_names("batch")
            },
        },
    }
    reference = {
        "status": "ok",
        "meta": {
            "runtime": {**RUNTIME, "jax_version": "0.10.0"},
            "dtype": "float32",
            "created_at": "2026-11-30T00:00:00+00:00",
            "reason": "test",
            "cross_run_tolerance": {"rtol": 1e-4, "atol": 1e-5},
            "cases": {"standard": {"kind": "batch"}},
            "losses": {"standard": 0.0},
        },
        "stored": {f"standard.{p}": OUT.copy() for p in path_names("batch")},
        "current": {f"standard.{p}": OUT.copy() for p in path_names("batch")},
        "cases": {"standard": {"kind": "batch", "x": X.copy(), "y": OUT.copy()}},
        "magnitudes": {"standard": MAGNITUDES["standard"]},
    }
    oracle = {
        "standard": OUT.astype(np.float64),
        "single": OUT[:1].astype(np.float64),
        "single_vector": OUT[0].astype(np.float64),
    }
    return config, manifest, outputs, record, reference, oracle


def check(inputs, **changes):
    config, manifest, outputs, record, reference, oracle = inputs
    kwargs = {"oracle": oracle, "reference": reference, "magnitudes": MAGNITUDES} | changes
    return run_checks(config, manifest, outputs, record, **kwargs)


def test_agreeing_outputs_pass(inputs):
    report = check(inputs)
    assert report["passed"], report["failures"]
    # n batched paths: n(n-1)/2 pairs for each of the two batch cases; the vector case:
    # its 2 paths against each other, and each against the batch of one on n paths.
    n = len(path_names("batch"))
    n_pairs = sum(len(c["pairs"]) for c in report["cases"].values())
    assert n_pairs == 2 * (n * (n - 1) // 2) + 1 + 2 * n
    refused = report["negative"]["invalid_features"]["paths"].values()
    assert sum(p["refused"] for p in refused) == n
    assert report["reference"]["made_with"]["jax_version"] == "0.10.0"
    assert "compared with jax 0.11.2" in report["reference"]["message"]


def pairs_with(path: str) -> set[str]:
    """Every standard-case pair that includes ``path``, named in registry order."""
    names = path_names("batch")
    i = names.index(path)
    return {f"standard/{p}-vs-{path}" for p in names[:i]} | {
        f"standard/{path}-vs-{p}" for p in names[i + 1 :]
    }


def test_one_path_off_by_more_than_the_tolerance_fails_the_check(inputs):
    inputs[2]["standard.vmap_jit"] = inputs[2]["standard.vmap_jit"] + np.float32(1e-3)
    report = check(inputs)
    assert not report["passed"]
    pairs = {f.split(":")[0] for f in report["failures"] if "oracle" not in f}
    assert pairs == pairs_with("vmap_jit")
    assert "standard/vmap_jit vs float64 oracle" in " ".join(report["failures"])
    # One path off: a batching fault, never a numerical finding (the loop is close to
    # float64).
    assert {f["kind"] for f in report["findings"]} == {"batching"}


def test_all_paths_wrong_the_same_way_is_caught_by_the_oracle(inputs):
    for p in path_names("batch"):
        inputs[2][f"standard.{p}"] = OUT + np.float32(0.01)
    report = check(inputs)
    assert report["cases"]["standard"]["max_abs"] == 0.0  # the paths agree...
    assert not report["passed"]  # ...but all of them are wrong
    # One numerical finding for the case, naming how many paths and that they agree
    # bitwise: never a batching fault.
    n = len(path_names("batch"))
    assert [f["kind"] for f in report["findings"]] == ["numerical"]
    assert report["failures"][0].startswith(
        f"standard: all {n} paths far from the float64 oracle (the paths agree with each "
        "other: bitwise); worst "
    )


def test_a_numerical_finding_left_out_of_fail_on_is_reported_not_failed(inputs):
    for p in path_names("batch"):
        inputs[2][f"standard.{p}"] = OUT + np.float32(0.01)
    config = inputs[0].model_copy(
        update={"verdict": VerdictConfig(fail_on=["batching", "model", "contract"])}
    )
    report = check((config, *inputs[1:]))
    assert report["passed"] and report["failures"] == []
    assert report["cases"]["standard"]["passed"]
    assert [(f["kind"], f["fails"]) for f in report["findings"]] == [("numerical", False)]


def test_vector_path_disagreeing_with_the_batch_of_one_fails(inputs):
    inputs[2]["single_vector.one_jit"] = OUT[0] + np.float32(0.5)
    report = check(inputs)
    assert any(
        f.startswith("single_vector/one_jit-vs-single.loop_eager") for f in report["failures"]
    )


def test_nan_output_on_one_path_is_a_batching_fault_on_its_row(inputs):
    inputs[2]["standard.direct_eager"][0, 0] = np.nan
    report = check(inputs)
    line = "standard/direct_eager: non-finite output on row 0, where other paths are finite"
    assert {"kind": "batching", "line": line, "fails": True} in report["findings"]
    assert report["cases"]["standard"]["non_finite_rows"] == {"direct_eager": [0]}


def test_a_row_non_finite_on_every_path_is_a_model_fault_and_the_others_are_compared(inputs):
    for p in path_names("batch"):
        inputs[2][f"standard.{p}"][1, 0] = np.inf
    inputs[2]["standard.vmap_jit"][0, 1] += np.float32(1e-3)  # row 0 still compared
    report = check(inputs)
    case = report["cases"]["standard"]
    model = [f for f in report["findings"] if f["kind"] == "model"]
    assert [f["line"] for f in model] == [
        "standard: non-finite output on row 1 on every path: the model computes it, not "
        "the batching (the other rows are compared)"
    ]
    assert case["max_abs"] == pytest.approx(1e-3, rel=1e-3)  # row 0's figure is shown
    pair = case["pairs"]["loop_eager-vs-vmap_jit"]
    assert pair["same_non_finite_rows"] == [1] and pair["element"] == [0, 1]


def test_wrong_output_shape_breaks_the_contract(inputs):
    inputs[3]["cases"]["standard"]["loop_jit"]["shape"] = [2, 3]
    assert "standard/loop_jit: expected shape [2, 2], got [2, 3]" in check(inputs)["failures"]


def test_invalid_input_that_produces_an_output_fails(inputs):
    inputs[3]["cases"]["invalid_features"]["direct_jit"] = _ok([2, 2])
    report = check(inputs)
    assert report["negative"]["invalid_features"]["paths"]["direct_jit"]["passed"] is False
    assert any("direct_jit: expected InvalidInputError" in f for f in report["failures"])


def test_a_refusal_with_the_wrong_message_or_type_fails(inputs):
    cases = inputs[3]["cases"]["invalid_features"]
    cases["loop_eager"] = _refused("something else went wrong")
    cases["vmap_jit"] = {
        "refused": False,
        "crashed": True,
        "error": "TypeError",
        "message": "expected 3 features, got 4",
    }
    failing = {f.split(":")[0] for f in check(inputs)["failures"]}
    assert failing == {"invalid_features/loop_eager", "invalid_features/vmap_jit"}


def test_a_reference_value_changed_beyond_tolerance_names_case_and_path(inputs):
    inputs[4]["stored"]["standard.vmap_eager"][1, 0] += np.float32(0.01)
    report = check(inputs)
    assert not report["passed"]
    assert [f.split(":")[0] for f in report["failures"]] == ["reference/standard/vmap_eager"]
    assert report["reference"]["cases"]["standard"]["vmap_eager"]["passed"] is False


def test_cross_run_tolerance_is_the_looser_of_both_runs(inputs):
    inputs[4]["meta"]["cross_run_tolerance"] = {"rtol": 0.05, "atol": 0.0}
    report = check(inputs)
    assert report["reference"]["tolerance_used"] == {"rtol": 0.05, "atol": 1e-5, "scale": "terms"}


def test_missing_reference_fails_only_when_required(inputs):
    """Required (the nightly job's -S reference.required=true), a missing reference fails;
    not required (conf/config.yaml's default: a new model's first run), it is reported."""
    required = compose_config("model=toy", "reference.required=true")
    report = check(
        [required, *inputs[1:]], reference={"status": "missing", "message": "no reference"}
    )
    assert report["failures"] == ["reference: missing: no reference"]
    config = compose_config("model=toy", "reference.required=false")
    relaxed = run_checks(
        config,
        *inputs[1:4],
        oracle=inputs[5],
        reference={"status": "missing", "message": "no reference"},
        magnitudes=MAGNITUDES,
    )
    assert relaxed["passed"] and relaxed["reference"]["status"] == "missing"


def test_losses_are_reported_for_cases_with_targets(inputs):
    report = check(inputs, targets={"standard": OUT.astype(np.float64) + 1.0})
    assert report["cases"]["standard"]["loss"]["vmap_jit"] == pytest.approx(1.0)
    assert report["reference"]["losses"]["standard"]["passed"]


def _gradient_inputs(inputs, batch_grad=1.0, per_example=1.0, probe_loss_finite=False):
    record = inputs[3]
    record["gradients"] = {
        "loss": 0.5,
        "loss_finite": True,
        "grads_finite": True,
        "per_example_finite": True,
        "nan_probe": {"planted": "NaN", "loss_finite": probe_loss_finite, "grads_finite": True},
    }
    return {
        "batch_grad.W": np.full((3, 2), batch_grad, np.float32),
        "per_example_mean.W": np.full((3, 2), per_example, np.float32),
    }


def test_gradients_pass_when_finite_detected_and_equal(inputs):
    report = check(inputs, gradients=_gradient_inputs(inputs))
    assert report["gradients"]["passed"], report["failures"]


def test_a_finite_loss_on_a_nan_target_means_something_masks_nan(inputs):
    report = check(inputs, gradients=_gradient_inputs(inputs, probe_loss_finite=True))
    assert any(f.startswith("gradients/nan_probe") for f in report["failures"])


def test_per_example_gradients_disagreeing_with_the_batch_gradient_fail(inputs):
    report = check(inputs, gradients=_gradient_inputs(inputs, per_example=1.01))
    assert any(f.startswith("gradients/W: mean of per-example") for f in report["failures"])


def test_a_reference_older_than_the_sharded_path_compares_it_with_stored_vmap_jit(inputs):
    stored = inputs[4]["stored"]
    del stored["standard.sharded_jit"]  # made before sharded_jit existed
    report = check(inputs)
    assert report["passed"], report["failures"]
    result = report["reference"]["cases"]["standard"]["sharded_jit"]
    assert result["stored_path"] == "vmap_jit" and result["max_abs"] == 0.0
    assert "stored_path" not in report["reference"]["cases"]["standard"]["vmap_jit"]
    # ...and a sharded output off that stored vmap_jit by more than the tolerance fails.
    inputs[4]["current"]["standard.sharded_jit"] = OUT + np.float32(0.01)
    failures = check(inputs)["failures"]
    assert [f.split(":")[0] for f in failures] == ["reference/standard/sharded_jit"]


def test_a_sharded_output_off_the_one_device_paths_fails_its_pairs(inputs):
    inputs[2]["standard.sharded_jit"] = OUT + np.float32(1e-3)
    report = check(inputs)
    pairs = {f.split(":")[0] for f in report["failures"] if "oracle" not in f}
    # Each pair is named in registry order: the paths before sharded_jit, then after it.
    names = path_names("batch")
    at = names.index("sharded_jit")
    assert pairs == {f"standard/{p}-vs-sharded_jit" for p in names[:at]} | {
        f"standard/sharded_jit-vs-{p}" for p in names[at + 1 :]
    }


def test_a_sharded_path_that_accepts_invalid_input_fails(inputs):
    inputs[3]["cases"]["invalid_features"]["sharded_jit"] = _ok([2, 2])
    report = check(inputs)
    assert report["negative"]["invalid_features"]["paths"]["sharded_jit"]["passed"] is False
    assert any("sharded_jit: expected InvalidInputError" in f for f in report["failures"])


def test_the_report_records_the_sharded_paths_mesh(inputs):
    mesh = {"devices": 2, "mesh_shape": {"data": 2}}
    inputs[3]["sharded"] = mesh
    assert check(inputs)["sharded"] == mesh


def test_the_toy_outputs_and_their_terms_magnitude():
    # relu([0.5, -1, 1] @ W + b) = relu([0.2, 0.25] + [0.1, -0.2]); the terms of the
    # first element: |0.5 * 0| + |-1 * 0.2| + |1 * 0.4| + |0.1| = 0.7.
    np.testing.assert_allclose(OUT[0], [0.3, 0.05], rtol=1e-6)
    np.testing.assert_allclose(MAGNITUDES["single_vector"]["scale"], [0.7, 1.05], rtol=1e-7)
    assert MAGNITUDES["standard"]["scale"].shape == OUT.shape
    assert MAGNITUDES["standard"]["fallbacks"] == []


def test_the_report_records_the_rule_the_fallbacks_and_s_at_the_worst_element(inputs):
    # On the live units only: a clearly dead relu unit (S = 0) must be exactly 0.
    inputs[2]["standard.vmap_jit"] = np.where(OUT > 0, OUT + np.float32(2e-6), OUT)
    report = check(inputs)
    case = report["cases"]["standard"]
    assert case["rule"] == "terms" and case["fallbacks"] == []
    assert case["worst_pair"].endswith("vmap_jit") or case["worst_pair"].startswith("vmap_jit")
    pair = case["pairs"][case["worst_pair"]]
    assert pair["rule"] == "terms" and case["bound_ratio"] == pair["bound_ratio"] <= 1.0
    assert case["scale_at_worst"] == MAGNITUDES["standard"]["scale"][tuple(pair["element"])]
    assert {r["rule"] for r in case["oracle"].values()} == {"terms"}
    assert report["reference"]["rules"]["standard"] == {"rule": "terms", "fallbacks": []}
    assert report["tolerance"]["scale"] == "terms"


def test_rounding_in_a_cancelling_sum_passes_by_the_terms_and_fails_by_the_output(inputs):
    # Outputs that cancelled (|y| <= 0.3) out of terms of magnitude 100: a difference of
    # 5e-5 is rounding there (rtol * S = 1e-3), far beyond atol + rtol * |y| (4e-6).
    big = {name: {**m, "scale": np.full_like(m["scale"], 100.0)} for name, m in MAGNITUDES.items()}
    inputs[2]["standard.vmap_jit"] = OUT + np.float32(5e-5)
    report = check(inputs, magnitudes=big)
    assert report["passed"], report["failures"]
    config = compose_config("model=toy", "precision.tolerance.scale=output")
    by_output = run_checks(config, *inputs[1:4], oracle=inputs[5], magnitudes=big)
    assert not by_output["passed"]
    assert by_output["cases"]["standard"]["rule"] == "output"
    assert any("rule 'output'" in f for f in by_output["failures"])


def test_without_a_terms_magnitude_a_case_is_judged_by_its_output(inputs):
    report = check(inputs, magnitudes=None)
    case = report["cases"]["standard"]
    assert report["passed"] and case["rule"] == "output"
    assert {r["rule"] for r in case["pairs"].values()} == {"output"}


def test_a_path_off_by_a_planted_error_fails_under_the_terms_rule_too(inputs):
    inputs[2]["standard.direct_jit"] = OUT * np.float32(1.001)
    report = check(inputs)
    failing = {f.split(":")[0] for f in report["failures"] if "oracle" not in f}
    assert failing == pairs_with("direct_jit")
    assert all("rule 'terms'" in f for f in report["failures"])


def test_a_case_without_a_usable_magnitude_is_judged_by_its_output_and_says_why(inputs):
    failed = {**MAGNITUDES, "standard": {"scale": None, "fallbacks": [], "error": "TypeError: x"}}
    inputs[2]["standard.vmap_jit"] = OUT + np.float32(5e-5)
    report = check(inputs, magnitudes=failed)
    case = report["cases"]["standard"]
    assert case["rule"] == "output" and case["magnitude_error"] == "TypeError: x"
    assert not report["passed"]


def test_a_case_whose_paths_gave_one_output_compares_nothing_and_never_passes(inputs):
    """Only one path's output of the standard case (the others absent): nothing was
    compared, which says so and fails, even with batching left out of fail_on."""
    outputs = inputs[2]
    for p in path_names("batch")[1:]:
        del outputs[f"standard.{p}"]
    report = check(inputs)
    assert not report["passed"]
    assert not report["cases"]["standard"]["passed"]
    assert any("standard: no pair of paths to compare (1 path(s)" in f for f in report["failures"])
    lenient = inputs[0].model_copy(update={"verdict": VerdictConfig(fail_on=["contract"])})
    report = check((lenient, *inputs[1:]))
    assert not report["passed"] and not report["cases"]["standard"]["passed"]


def test_every_stored_reference_reads_back_typed_and_a_missing_key_is_named(tmp_path):
    """meta.json is read through read_reference_meta: every reference kept in git fits
    ReferenceMeta (the type states what make_reference writes), and one missing a key
    (an older or hand-edited file) is refused with the file and the key's path."""
    import json
    import shutil
    from pathlib import Path

    from vmapcheck.check.reference import load_reference
    from vmapcheck.check.schema import read_reference_meta
    from vmapcheck.errors import ArtifactError

    stored = sorted((Path(__file__).parents[1] / "data" / "reference").glob("*/meta.json"))
    assert stored, "no reference in data/reference"
    for meta in stored:
        assert read_reference_meta(meta)["model"] == meta.parent.name
    folder = tmp_path / "toy"
    shutil.copytree(stored[0].parent, folder)
    reference = load_reference(folder)
    assert reference is not None and set(reference["cases"]) == set(reference["meta"]["cases"])
    broken = json.loads((folder / "meta.json").read_text())
    del broken["cases"]["standard"]["kind"]
    (folder / "meta.json").write_text(json.dumps(broken))
    with pytest.raises(ArtifactError, match=r"meta\.json: .*missing cases\.standard\.kind"):
        load_reference(folder)
