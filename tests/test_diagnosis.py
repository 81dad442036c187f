"""The diagnosis names the first stage, layer and leaf that diverge, on planted faults.

Each fault is planted alone into an otherwise healthy run of the real stages, in this
process (tests/helpers/inprocess.py): one temporary project is prepared by the prepare
stage (a small synthetic table); each fault's run is a copy of it whose params.yaml
builds the built-in MLP with that fault (a user's model factory,
tests/helpers/faults.py), then train (train.steps=0: the model's init params), forward
and check run. The check must fail, and the diagnosis it writes (reports/diagnosis.json)
must name the stage and layer where the fault was planted, having ruled out every stage
before it. A fault in what a run stored (its outputs, its cases) is planted in the
files the stages wrote, between two stages.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import compose_config
from tests.helpers.faults import factory_overrides
from tests.helpers.inprocess import run_stages, stage_process, write_params
from tests.helpers.mesh_faults import factory_overrides as mesh_factory_overrides
from vmapcheck.check.diagnosis import (
    STAGE_NAMES,
    Subject,
    diagnose,
    key_stream_stage,
    not_needed,
    on_demand,
    probes_for,
    write_report,
)
from vmapcheck.check.diagnosis.numerics import forward_stage, gradients_stage, loss_stage
from vmapcheck.check.diagnosis.subject import Probe, make_finding, stage_result
from vmapcheck.check.schema import (
    CheckDetails,
    DiagnosisReport,
    read_check_details,
    read_diagnosis,
)
from vmapcheck.core.compare import measure, ulp_distance
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import Model, build_model
from vmapcheck.core.paths import batch_paths
from vmapcheck.errors import ArtifactError
from vmapcheck.io import atomic_save_npz, atomic_write_json, load_npz, read_json, sha256_file
from vmapcheck.layout import Layout

OVERRIDES = (
    "data.n_rows=240",
    "data.standard_batch=8",
    "reference.required=false",
    # Train evaluates the model's init params (no step): the params the faults are
    # planted against, the same for every model whose init is the MLP's.
    "train.steps=0",
    # The emulated CPU devices of this process (tests/conftest.py).
    "backend.num_devices=2",
)


@pytest.fixture(scope="module")
def config():
    return compose_config(*OVERRIDES)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A project root with data/prepared and data/cases, written by the prepare stage."""
    root = tmp_path_factory.mktemp("prepared")
    write_params(root, *OVERRIDES)
    run_stages(root, "prepare")
    return root


def copy_of(project: Path, dest: Path, *overrides: str) -> Layout:
    """A copy of ``project`` at ``dest`` whose params.yaml adds ``overrides``."""
    shutil.copytree(project, dest)
    write_params(dest, *OVERRIDES, *overrides)
    return Layout(dest)


def run_check(layout: Layout, *stages: str) -> tuple[CheckDetails, DiagnosisReport]:
    """``stages`` then check, in this process: the check's details and its diagnosis,
    each read back against its type (every stage's finding included)."""
    run_stages(layout.root, *stages, "check")
    return read_check_details(layout.check_details), read_diagnosis(layout.diagnosis)


def run_with(prepared: Path, dest: Path, *overrides: str) -> tuple[CheckDetails, DiagnosisReport]:
    """train, forward and check on a copy of ``prepared`` configured with ``overrides``."""
    return run_check(copy_of(prepared, dest, *overrides), "train", "forward")


def diagnose_on_demand(layout: Layout) -> DiagnosisReport:
    """``vmapcheck diagnose`` (the protocol run even when the check passed)."""
    out = layout.report("diagnosis-on-demand.json")
    with stage_process():
        code = on_demand(layout, out)
    report = read_diagnosis(out)
    assert code == (1 if report["status"] == "diverged" else 0), report["summary"]
    return report


@pytest.fixture(scope="module")
def healthy(prepared, tmp_path_factory) -> Layout:
    """The built-in MLP's run: train, forward and check."""
    layout = copy_of(prepared, tmp_path_factory.mktemp("healthy") / "project")
    run_stages(layout.root, "train", "forward", "check")
    return layout


@pytest.fixture(scope="module")
def mlp(config) -> Model:
    return build_model(config.model)


def assert_localized(report: dict, stage: str, layer: str | None, paths=None, leaf=None):
    first = report["first_divergence"]
    assert report["status"] == "diverged", report["summary"]
    assert (first["stage"], first["layer"]) == (stage, layer), report["summary"]
    if paths is not None:
        assert first["paths"] == paths, report["summary"]
    if leaf is not None:
        assert first["leaf"] == leaf, report["summary"]
    before = STAGE_NAMES[: STAGE_NAMES.index(stage)]
    assert [s["stage"] for s in report["ruled_out"]] == list(before), report["summary"]
    assert report["not_reached"] == list(STAGE_NAMES[STAGE_NAMES.index(stage) + 1 :])
    json.dumps(report)  # what reports/diagnosis.json holds


# --- a healthy run --------------------------------------------------------------------


@pytest.mark.stages
def test_a_healthy_run_passes_and_the_diagnosis_rules_out_every_stage(healthy):
    check = read_json(healthy.check_details)
    assert check["passed"], check["failures"]
    assert check["inputs"]["passed"]
    assert read_json(healthy.diagnosis)["status"] == "not needed"
    report = diagnose_on_demand(healthy)
    assert report["status"] == "no divergence found", report["summary"]
    assert [s["stage"] for s in report["ruled_out"]] == list(STAGE_NAMES[:-1])
    assert report["skipped"] == [{"stage": "reference", "why": "reference missing"}]
    forward = next(s for s in report["stages"] if s["stage"] == "forward")
    compared = {(e["what"].split(" on ")[0], e["pair"]) for e in forward["evidence"]}
    assert ("layers[1]", "loop_eager-vs-direct_eager") in compared
    assert all(e["tolerance"]["from"] == "precision.tolerance" for e in forward["evidence"])
    assert "layer by layer" in report["activations"]


def test_not_needed_when_the_check_passed(tmp_path):
    report = not_needed({"passed": True})
    text = write_report(report, tmp_path / "diagnosis.json")
    assert read_diagnosis(tmp_path / "diagnosis.json")["status"] == "not needed"
    assert "not needed" in text.read_text()


def _written(path: Path, data: dict) -> Path:
    atomic_write_json(path, data)
    return path


def test_a_finding_missing_a_key_in_a_listed_stage_is_named_by_its_index(tmp_path):
    finding = make_finding("forward", "layers[1] diverges", what="activation", layer="layers[1]")
    report = {
        **not_needed({"passed": False}),
        "status": "diverged",
        "first_divergence": finding,
        "stages": [
            stage_result("data", [], summary="the stored data agree"),
            stage_result("forward", [], finding),
        ],
    }
    assert read_diagnosis(_written(tmp_path / "whole.json", report))["stages"][1]["finding"]
    del finding["stage"]  # the first divergence is the forward stage's finding
    del report["stages"][0]["title"]
    with pytest.raises(ArtifactError) as caught:
        read_diagnosis(_written(tmp_path / "cut.json", report))
    named = "missing first_divergence.stage, stages.0.title, stages.1.finding.stage"
    assert named in str(caught.value)


def test_on_demand_without_a_project_is_an_error_not_a_report(tmp_path, capsys):
    out = Layout(tmp_path).report("diagnosis-on-demand.json")
    assert on_demand(Layout(tmp_path), out) == 2
    assert capsys.readouterr().err.startswith("diagnosis: error: ")
    assert not out.exists()


# --- the planted faults ---------------------------------------------------------------


@pytest.mark.stages
def test_wrong_transpose_in_the_hand_batched_forward(prepared, tmp_path):
    check, report = run_with(prepared, tmp_path / "p", *factory_overrides("transposed_weight"))
    assert not check["passed"]
    assert any("direct_eager" in f for f in check["failures"])
    assert_localized(report, "forward", "layers[1]", paths=["direct_eager"])
    first = report["first_divergence"]
    assert first["input"].startswith("minimal input")  # one row suffices
    assert first["params_leaves"] == ["layers[1].W", "layers[1].b"]
    assert first["pair"] == "loop_eager-vs-direct_eager"
    assert first["max_ulp"] > 1000 and first["tolerance"]["from"] == "precision.tolerance"
    assert first["bound_ratio"] > 1  # the deciding figure: over its bound


@pytest.mark.stages
def test_wrong_broadcast_in_the_hand_batched_forward(prepared, tmp_path):
    # The bias of layers[0] broadcast as a column: (rows, 32) + (32, 1). On one row it
    # silently makes a (32, 32) activation; on 8 rows it cannot broadcast at all.
    check, report = run_with(prepared, tmp_path / "p", *factory_overrides("bias_as_column"))
    assert not check["passed"]
    assert any("direct_eager" in f and "shape" in f for f in check["failures"])
    # A shape that differs is found by the shapes stage, before any value is compared.
    assert_localized(report, "shapes", "layers[0]", paths=["direct_eager"])
    first = report["first_divergence"]
    assert first["found"]["shape"] == [32, 32] and first["expected"]["shape"] == [1, 32]


@pytest.mark.stages
def test_one_layer_in_lower_precision_in_one_path(prepared, tmp_path):
    check, report = run_with(prepared, tmp_path / "p", *factory_overrides("bf16_layer"))
    assert not check["passed"]
    assert_localized(report, "forward", "layers[1]", paths=["direct_eager"])
    forward = next(s for s in report["stages"] if s["stage"] == "forward")
    layer0 = [e for e in forward["evidence"] if e["what"].startswith("layers[0]")]
    assert layer0 and all(e["passed"] for e in layer0)  # the layer before it agrees
    # bfloat16 keeps 8 of float32's 24 significand bits: errors of ~2**15 float32 ULP.
    assert report["first_divergence"]["max_ulp"] > 2**10


@pytest.mark.stages
def test_reused_prng_key(prepared, tmp_path):
    # The same derived key for every layer's draw (tests/helpers/faults.py): train
    # writes the init params it draws, and the check's key-stream stage finds the repeat.
    check, report = run_with(prepared, tmp_path / "p", *factory_overrides("reused_key"))
    assert not check["passed"]
    assert check["failures"][-1].startswith("inputs/key_stream: init draws layers[1].W")
    assert_localized(report, "key_stream", "layers[1]", leaf="layers[1].W")
    assert report["first_divergence"]["params_leaves"] == ["layers[0].W", "layers[1].W"]


def test_a_key_consumed_twice_is_caught_by_the_reuse_checker(config, mlp):
    def init(key):  # the same key object for two draws
        w0 = jax.random.normal(key, (8, 32), dtype=jnp.float32)
        w1 = jax.random.normal(key, (32, 32), dtype=jnp.float32)
        w2 = jax.random.normal(jax.random.fold_in(key, 2), (32, 2), dtype=jnp.float32)
        zeros = [jnp.zeros((n,), jnp.float32) for n in (32, 32, 2)]
        return {"layers": [{"W": w, "b": b} for w, b in zip((w0, w1, w2), zeros, strict=True)]}

    stage = key_stream_stage(replace(mlp, init=init), config.seed)
    assert stage["status"] == "diverged"
    assert stage["finding"]["leaf"] == "layers[1].W"
    assert "reuse checker also saw it" in stage["finding"]["message"]
    assert "KeyReuseError" in stage["finding"]["message"]


def test_leaves_the_key_does_not_move_are_no_draws(config, mlp):
    def init(key):  # two identity-initialized layers: equal values, but no key behind them
        k0, k1 = jax.random.split(key)
        eye = jnp.eye(32, dtype=jnp.float32)
        return {
            "layers": [
                {"W": jax.random.normal(k0, (8, 32)), "b": jnp.zeros(32)},
                {"W": eye, "b": jnp.zeros(32)},
                {"W": jax.random.normal(k1, (32, 2)), "b": jnp.zeros(2)},
            ],
            "extra": eye,
        }

    stage = key_stream_stage(replace(mlp, init=init), config.seed)
    assert stage["status"] == "ruled_out", stage["summary"]
    assert "across 2 random leaves" in stage["summary"]


@pytest.mark.stages
def test_preprocessing_applied_twice(prepared, tmp_path):
    train = load_npz(Layout(prepared).prepared / "train.npz")["features"]
    # Statistics off (0, 1) (the train split's, shifted and widened), so standardizing
    # twice changes the values.
    stats = {"mean": train.mean(axis=0) + 0.5, "std": train.std(axis=0) * 2.0}
    layout = copy_of(prepared, tmp_path / "healthy", *factory_overrides("standardized", **stats))
    check, _ = run_check(layout, "train", "forward")
    assert check["passed"], check["failures"]
    report = diagnose_on_demand(layout)
    assert report["status"] == "no divergence found", report["summary"]
    assert "standardize agrees in every path" in report["ruled_out"][0]["evidence"]

    overrides = factory_overrides("standardized_twice", **stats)
    check, report = run_with(prepared, tmp_path / "twice", *overrides)
    assert not check["passed"]
    assert_localized(report, "data", "standardize", paths=["direct_eager"])
    assert "preprocessing step standardize diverges" in report["first_divergence"]["message"]


@pytest.mark.stages
def test_nan_entering_at_one_layer(prepared, tmp_path):
    # sqrt where relu belongs at layers[1], in forward_one and forward_batch alike.
    check, report = run_with(prepared, tmp_path / "p", *factory_overrides("nan_at_layer"))
    assert not check["passed"]
    assert any("non-finite output" in f for f in check["failures"])
    # Every eager path: the first the forward stage compares, layer by layer.
    eager = [p.name for p in batch_paths() if not p.jit]
    assert_localized(report, "forward", "layers[1]", paths=eager)
    first = report["first_divergence"]
    assert first["what"] == "non-finite activation" and "NaN" in first["message"]


@pytest.mark.stages
def test_stored_cases_changed_after_prepare_are_found_by_the_data_stage(healthy, tmp_path):
    # As if a unit conversion of feature x3 ran once more over the standard case after
    # prepare built it, with the manifest rewritten to match: the sha256 gate cannot see it.
    copy = copy_of(healthy.root, tmp_path / "p")
    case = load_npz(copy.cases / "standard.npz")
    case["x"][:, 3] *= np.float32(1000.0)
    atomic_save_npz(copy.cases / "standard.npz", case)
    manifest = read_json(copy.cases_manifest)
    manifest["cases"]["standard"]["sha256"] = sha256_file(copy.cases / "standard.npz")
    copy.cases_manifest.write_text(json.dumps(manifest))
    check, report = run_check(copy, "forward")  # the stages that read the cases
    # Every path agrees on the changed case, so the check passes (the forward and check
    # cannot know what prepare wrote): the protocol run on demand finds it.
    assert check["passed"], check["failures"]
    assert report["status"] == "not needed"
    report = diagnose_on_demand(copy)
    assert_localized(report, "data", "cases.standard.x")
    assert report["first_divergence"]["feature"] == "x3"


@pytest.mark.parametrize(
    ("path", "stage"),
    [
        ("vmap_jit", "backend"),
        ("sharded_jit", "sharding"),
        ("tensor_parallel_jit", "sharding"),
        ("data_model_jit", "sharding"),
    ],
)
@pytest.mark.stages
def test_a_divergence_only_in_the_runs_stored_outputs_is_the_backends(
    healthy, tmp_path, path, stage
):
    # Everything recomputed here agrees; the run's stored output of one path differs,
    # as a backend computing it differently would make it: forward's outputs.npz is
    # changed before check reads it.
    copy = copy_of(healthy.root, tmp_path / "p")
    outputs = load_npz(copy.outputs)
    key = f"standard.{path}"
    atomic_save_npz(copy.outputs, {**outputs, key: outputs[key] * np.float32(1.001)})
    check, report = run_check(copy)
    assert not check["passed"]
    assert_localized(report, stage, "output", paths=[path])
    first = report["first_divergence"]
    assert first["input"] == "case standard"
    # The figures line leads with the deciding figure, the fraction of its bound.
    assert first["bound_ratio"] > 1
    assert f"{first['bound_ratio']:.3g} of its bound, max_rel" in report["summary"]
    if stage == "sharding":  # the mesh axis it diverges on, and which parallelism (not vmap)
        assert "not vmap) differs from vmap_jit" in first["message"]
        assert "it diverges on mesh axis '" in first["message"]


@pytest.mark.parametrize("fault", ["forgot_psum", "local_norm"])
@pytest.mark.stages
def test_a_sharding_mistake_is_found_by_the_sharding_stage_naming_the_mesh_axis(
    prepared, tmp_path, fault
):
    # tests/helpers/mesh_faults.py: a hand-written tensor-parallel body that is right on
    # one device and wrong on the "model" axis of this process's two devices.
    check, report = run_with(prepared, tmp_path / "p", *mesh_factory_overrides(fault))
    assert not check["passed"]
    assert_localized(report, "sharding", "output", paths=["tensor_parallel_jit"])
    message = report["first_divergence"]["message"]
    assert "tensor_parallel_jit (tensor-parallel over mesh model=2, not vmap)" in message
    assert message.endswith("it diverges on mesh axis 'model' (2 devices)")


def test_a_plug_in_without_activations_is_compared_on_its_outputs(config):
    pytest.importorskip("flax", reason="flax is not installed: pip install -e '.[flax]'")
    model = build_model(compose_config("model=flax_mlp").model)
    params = model.init(named_keys(config.seed)["init"])
    wrong = replace(model, forward_batch=lambda p, x: model.forward_batch(p, x) * 1.001)
    rows = np.random.default_rng(0).normal(size=(4, model.in_features)).astype(np.float32)
    subject = Subject(
        model=wrong,
        params=params,
        dtype=jnp.float32,
        tolerance=config.precision.tolerance,
        cross_run_tolerance=config.precision.cross_run_tolerance,
        probes=probes_for(
            {"cases": {"standard": {"kind": "batch"}}}, {"standard": {"x": rows}}, check=None
        ),
        seed=config.seed,
    )
    report = diagnose(subject)
    assert "exposes no activations" in report["activations"]
    assert report["skipped"][0]["stage"] == "data"  # no stored data given
    first = report["first_divergence"]
    assert (first["stage"], first["layer"], first["paths"]) == (
        "forward",
        "output",
        ["direct_eager"],
    )


def test_summaries_name_only_the_forms_the_model_has(config, mlp):
    """A model without forward_batch (as an Equinox module) is not said to agree
    through a direct path it does not have."""
    params = mlp.init(named_keys(config.seed)["init"])
    rng = np.random.default_rng(0)
    probe = Probe(
        "4 random rows",
        rng.normal(size=(4, mlp.in_features)).astype(np.float32),
        rng.normal(size=(4, mlp.out_features)).astype(np.float32),
    )

    def summaries(model: Model) -> list[str]:
        subject = Subject(
            model=model,
            params=params,
            dtype=jnp.float32,
            tolerance=config.precision.tolerance,
            cross_run_tolerance=config.precision.cross_run_tolerance,
            probes=(probe,),
        )
        stages = [forward_stage(subject), loss_stage(subject), gradients_stage(subject)]
        assert [s["status"] for s in stages] == ["ruled_out"] * 3, stages
        return [s["summary"] for s in stages]

    forward, loss, gradients = summaries(mlp)
    assert forward.startswith("loop, vmap, vmap_of_jit and direct agree eagerly")
    assert loss.startswith("loop, vmap and direct losses agree on 4 random rows")
    assert "agree (loop mean, vmap, direct) on" in gradients
    forward, loss, gradients = summaries(replace(mlp, forward_batch=None))
    assert forward.startswith("loop, vmap and vmap_of_jit agree eagerly")
    assert loss.startswith("loop and vmap losses agree on 4 random rows")
    assert "agree (loop mean, vmap) on" in gradients
    assert not any("direct" in text for text in (forward, loss, gradients))


# --- the comparison figures -----------------------------------------------------------


def test_ulp_distance_counts_representable_floats_between():
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2.0))
    assert ulp_distance(np.array([one]), np.array([up]))[0] == 1
    assert ulp_distance(np.array([np.float32(0.0)]), np.array([np.float32(-0.0)]))[0] == 0
    tiny = np.nextafter(np.float32(0.0), np.float32(1.0))
    assert ulp_distance(np.array([tiny]), np.array([-tiny]))[0] == 2  # across zero
    a = np.array([1.0], np.float32)
    b = np.array([1.0 + 2**-10], np.float32)
    assert ulp_distance(a, b)[0] == 2**13  # 2**-10 / 2**-23
    assert ulp_distance(a, b, jnp.bfloat16)[0] == 0  # not representable apart in bf16
    big = np.array([3.0e38], np.float32)
    assert ulp_distance(big, -big)[0] == 2 * int(big.view(np.int32)[0])


def test_measure_reports_errors_ulp_and_locates_non_finite_values():
    tol = compose_config().precision.tolerance
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = a.copy()
    b[1, 0] = np.nextafter(b[1, 0], np.float32(10.0))
    same = measure(a, b, tol, "precision.tolerance")
    assert same["passed"] and same["max_ulp"] == 1 and same["max_abs"] == float(b[1, 0] - 3)
    b[0, 1] = 2.5
    off = measure(a, b, tol, "precision.tolerance")
    assert not off["passed"] and off["max_abs"] == 0.5 and off["element"] == [0, 1]
    assert off["tolerance"] == {"rtol": tol.rtol, "atol": tol.atol, "from": "precision.tolerance"}
    b[1, 1] = np.nan
    nan = measure(a, b, tol, "precision.tolerance")
    assert not nan["passed"] and nan["non_finite"] == {"a": 0, "b": 1}
    assert nan["element"] == [1, 1] and nan["max_abs"] == 0.5  # figures over finite values
