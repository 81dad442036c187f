"""The diagnosis names the first stage, layer and leaf that diverge, on planted faults.

Each fault is planted alone into an otherwise healthy run built here with the library
(prepare's steps on a small synthetic table, the built-in MLP, the real forward paths
and the real checks): the check must fail, and the diagnosis must name the stage and
layer where the fault was planted, having ruled out every stage before it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import ROOT, compose_config
from vmapcheck.check.checks import run_checks
from vmapcheck.check.diagnosis import (
    STAGE_NAMES,
    DataSources,
    StoredRun,
    Subject,
    diagnose,
    key_stream_stage,
    not_needed,
    on_demand,
    probes_for,
    write_report,
)
from vmapcheck.core.compare import measure, ulp_distance
from vmapcheck.core.forms import data_mesh
from vmapcheck.core.forward import run_forward
from vmapcheck.core.gradients import gradient_probe
from vmapcheck.core.keys import named_keys
from vmapcheck.core.models import (
    Model,
    build_model,
    mlp_forward_batch,
    mlp_forward_one,
    no_tap,
    recorded,
)
from vmapcheck.core.training import make_optimizer
from vmapcheck.data.anonymize import anonymize
from vmapcheck.data.regression import regression_cases, write_cases
from vmapcheck.data.splits import anonymize_policy, load_raw, split_indices, write_splits
from vmapcheck.io import atomic_save_npz, load_npz, read_json, sha256_file
from vmapcheck.layout import Layout

OVERRIDES = ("data.n_rows=240", "data.standard_batch=8", "reference.required=false")
OUT = "layers[2]"  # the MLP [8, 32, 32, 2]'s output layer


@pytest.fixture(scope="module")
def config():
    return compose_config(*OVERRIDES)


@pytest.fixture(scope="module")
def project(tmp_path_factory, config) -> Path:
    """data/prepared and data/cases as the prepare stage writes them (same steps)."""
    root = tmp_path_factory.mktemp("project")
    keys = named_keys(config.seed)
    table = anonymize(load_raw(config.data, keys["data"], ROOT), anonymize_policy(config.data))
    parts = split_indices(keys["split"], table.group_ids, config.data)
    write_splits(root / "prepared", table, parts)
    cases = regression_cases(
        table.features[parts["train"]],
        table.features[parts["test"]],
        table.targets[parts["test"]],
        config.data.standard_batch,
    )
    write_cases(root / "cases", cases, list(table.feature_names))
    return root


@pytest.fixture(scope="module")
def mlp(config) -> Model:
    return build_model(config.model)


@pytest.fixture(scope="module")
def params(config, mlp):
    return mlp.init(named_keys(config.seed)["init"])


def _cases(project: Path) -> tuple[dict, dict]:
    manifest = read_json(project / "cases" / "manifest.json")
    cases = {
        name: {**entry, **load_npz(project / "cases" / entry["file"])}
        for name, entry in manifest["cases"].items()
    }
    return manifest, cases


def run_and_diagnose(
    config, project: Path, model: Model, params, stored_as=None
) -> tuple[dict, dict]:
    """The check on the real forward outputs of ``model``, then the diagnosis.
    ``stored_as(outputs)``: what the run stored instead (as another backend would)."""
    manifest, cases = _cases(project)
    dtype = jnp.float32
    outputs, per_case = run_forward(model, params, cases, dtype, data_mesh())
    if stored_as is not None:
        outputs = stored_as(outputs)
    standard = cases["standard"]
    grad_arrays, grad_record = gradient_probe(
        model, params, jnp.asarray(standard["x"]), jnp.asarray(standard["y"])
    )
    record = {
        "runtime": {
            "backend": "cpu",
            "platform": "cpu",
            "device_kind": jax.devices()[0].device_kind,
            "jax_version": jax.__version__,
            "jaxlib_version": jax.__version__,
        },
        "not_provided": {},
        "reference": {"status": "missing", "message": "none in this test"},
        "gradients": grad_record,
        "cases": per_case,
    }
    key_stream = key_stream_stage(model, config.seed)
    check = run_checks(
        config,
        manifest,
        outputs,
        record,
        targets={n: c["y"] for n, c in cases.items() if "y" in c},
        reference={"status": "missing", "message": "none in this test"},
        gradients=grad_arrays,
        inputs={"key_stream": key_stream},
    )
    valid = {n: c for n, c in cases.items() if c["kind"] in ("batch", "vector")}
    subject = Subject(
        model=model,
        params=params,
        dtype=dtype,
        tolerance=config.precision.tolerance,
        cross_run_tolerance=config.precision.cross_run_tolerance,
        probes=probes_for(manifest, valid, check),
        optimizer=make_optimizer(config.train),
        seed=config.seed,
    )
    stored = StoredRun(
        outputs=outputs,
        record=record,
        cases={n: valid[n]["x"] for n in ("standard", "single_vector")},
    )
    sources = DataSources(
        cases=project / "cases",
        prepared=project / "prepared",
        config=config.data,
        seed=config.seed,
        root=ROOT,
    )
    report = diagnose(subject, sources=sources, stored=stored, check=check, key_stream=key_stream)
    return check, report


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


def test_a_healthy_run_passes_and_the_diagnosis_rules_out_every_stage(config, project, mlp, params):
    check, report = run_and_diagnose(config, project, mlp, params)
    assert check["passed"], check["failures"]
    assert check["inputs"]["passed"]
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
    assert read_json(tmp_path / "diagnosis.json")["status"] == "not needed"
    assert "not needed" in text.read_text()


def test_on_demand_without_a_project_is_an_error_not_a_report(tmp_path, capsys):
    out = Layout(tmp_path).report("diagnosis-on-demand.json")
    assert on_demand(Layout(tmp_path), out) == 2
    assert capsys.readouterr().err.startswith("diagnosis: error: ")
    assert not out.exists()


# --- the planted faults ---------------------------------------------------------------


def _hand_batched(layer_op):
    """The MLP's hand-batched forward with ``layer_op(i, hidden, W, b)`` for each hidden
    layer i (the correct one is relu(hidden @ W + b[None, :]))."""

    def forward_batch(params, batch, tap=no_tap):
        hidden = batch
        *inner, last = params["layers"]
        for i, layer in enumerate(inner):
            hidden = tap(f"layers[{i}]", layer_op(i, hidden, layer["W"], layer["b"]))
        return hidden @ last["W"] + last["b"][None, :]

    return forward_batch


def _with_batch(model: Model, forward_batch) -> Model:
    return replace(
        model, forward_batch=forward_batch, activations_batch=recorded(forward_batch, OUT)
    )


def test_wrong_transpose_in_the_hand_batched_forward(config, project, mlp, params):
    # layers[1].W is square (32 x 32): W.T has the right shape and the wrong values.
    model = _with_batch(
        mlp,
        _hand_batched(lambda i, h, w, b: jax.nn.relu(h @ (w.T if i == 1 else w) + b[None, :])),
    )
    check, report = run_and_diagnose(config, project, model, params)
    assert not check["passed"]
    assert any("direct_eager" in f for f in check["failures"])
    assert_localized(report, "forward", "layers[1]", paths=["direct_eager"])
    first = report["first_divergence"]
    assert first["input"].startswith("minimal input")  # one row suffices
    assert first["params_leaves"] == ["layers[1].W", "layers[1].b"]
    assert first["pair"] == "loop_eager-vs-direct_eager"
    assert first["max_ulp"] > 1000 and first["tolerance"]["from"] == "precision.tolerance"


def test_wrong_broadcast_in_the_hand_batched_forward(config, project, mlp, params):
    # The bias of layers[0] broadcast as a column: (rows, 32) + (32, 1). On one row it
    # silently makes a (32, 32) activation; on 8 rows it cannot broadcast at all.
    model = _with_batch(
        mlp,
        _hand_batched(
            lambda i, h, w, b: jax.nn.relu(h @ w + (b[:, None] if i == 0 else b[None, :]))
        ),
    )
    check, report = run_and_diagnose(config, project, model, params)
    assert not check["passed"]
    assert any("direct_eager" in f and "shape" in f for f in check["failures"])
    # A shape that differs is found by the shapes stage, before any value is compared.
    assert_localized(report, "shapes", "layers[0]", paths=["direct_eager"])
    first = report["first_divergence"]
    assert first["found"]["shape"] == [32, 32] and first["expected"]["shape"] == [1, 32]


def test_one_layer_in_lower_precision_in_one_path(config, project, mlp, params):
    def bf16_layer(i, h, w, b):
        if i != 1:
            return jax.nn.relu(h @ w + b[None, :])
        low = (h.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32)
        return jax.nn.relu(low + b[None, :])  # back to float32: the dtype looks right

    model = _with_batch(mlp, _hand_batched(bf16_layer))
    check, report = run_and_diagnose(config, project, model, params)
    assert not check["passed"]
    assert_localized(report, "forward", "layers[1]", paths=["direct_eager"])
    forward = next(s for s in report["stages"] if s["stage"] == "forward")
    layer0 = [e for e in forward["evidence"] if e["what"].startswith("layers[0]")]
    assert layer0 and all(e["passed"] for e in layer0)  # the layer before it agrees
    # bfloat16 keeps 8 of float32's 24 significand bits: errors of ~2**15 float32 ULP.
    assert report["first_divergence"]["max_ulp"] > 2**10


def test_reused_prng_key(config, project, mlp, params):
    widths = [8, 32, 32, 2]

    def init(key):
        layers = []
        for fan_in, fan_out in pairwise(widths):
            # The bug: the same derived key for every layer. Each fold_in makes a new
            # key object, so jax_debug_key_reuse sees nothing; the draws repeat.
            layer_key = jax.random.fold_in(key, 0)
            scale = jnp.sqrt(2.0 / fan_in).astype(jnp.float32)
            weight = jax.random.normal(layer_key, (fan_in, fan_out), dtype=jnp.float32)
            layers.append({"W": weight * scale, "b": jnp.zeros((fan_out,), jnp.float32)})
        return {"layers": layers}

    model = replace(mlp, init=init)
    faulty_params = init(named_keys(config.seed)["init"])
    check, report = run_and_diagnose(config, project, model, faulty_params)
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


def _standardized(mlp: Model, mean: np.ndarray, std: np.ndarray, twice: bool) -> Model:
    """The MLP behind an input standardization with the train split's statistics."""

    def standardize(x):  # one row (n,) or a batch (rows, n): broadcast explicitly
        return (x - np.broadcast_to(mean, x.shape)) / np.broadcast_to(std, x.shape)

    def forward_one(params, x, tap=no_tap):
        return mlp_forward_one(params, tap("standardize", standardize(x)), tap)

    def forward_batch(params, batch, tap=no_tap):
        z = standardize(batch)
        if twice:  # the bug: the batched path standardizes what is already standardized
            z = standardize(z)
        return mlp_forward_batch(params, tap("standardize", z), tap)

    return replace(
        mlp,
        forward_one=forward_one,
        forward_batch=forward_batch,
        activations_one=recorded(forward_one, OUT),
        activations_batch=recorded(forward_batch, OUT),
        preprocessing=("standardize",),
    )


def test_preprocessing_applied_twice(config, project, mlp, params):
    train = load_npz(project / "prepared" / "train.npz")["features"]
    # Statistics off (0, 1) (the train split's, shifted and widened), so standardizing
    # twice changes the values.
    mean, std = train.mean(axis=0) + 0.5, train.std(axis=0) * 2.0
    healthy = _standardized(mlp, mean, std, twice=False)
    check, report = run_and_diagnose(config, project, healthy, params)
    assert check["passed"], check["failures"]
    assert report["status"] == "no divergence found", report["summary"]
    assert "standardize agrees in every path" in report["ruled_out"][0]["evidence"]

    check, report = run_and_diagnose(config, project, _standardized(mlp, mean, std, True), params)
    assert not check["passed"]
    assert_localized(report, "data", "standardize", paths=["direct_eager"])
    assert "preprocessing step standardize diverges" in report["first_divergence"]["message"]


def test_nan_entering_at_one_layer(config, project, mlp, params):
    def sqrt_layer(params_, x, tap=no_tap, batched=False):
        hidden = x
        *inner, last = params_["layers"]
        for i, layer in enumerate(inner):
            pre = hidden @ layer["W"]
            pre = pre + jnp.broadcast_to(layer["b"], pre.shape)
            # The bug: sqrt where relu belongs; a negative pre-activation gives NaN.
            hidden = tap(f"layers[{i}]", jnp.sqrt(pre) if i == 1 else jax.nn.relu(pre))
        out = hidden @ last["W"]
        return out + jnp.broadcast_to(last["b"], out.shape)

    def one(p, x, tap=no_tap):
        return sqrt_layer(p, x, tap)

    model = replace(
        mlp,
        forward_one=one,
        forward_batch=one,  # broadcasting explicitly, the same code serves a batch
        activations_one=recorded(one, OUT),
        activations_batch=recorded(one, OUT),
    )
    check, report = run_and_diagnose(config, project, model, params)
    assert not check["passed"]
    assert any("non-finite output" in f for f in check["failures"])
    assert_localized(
        report, "forward", "layers[1]", paths=["loop_eager", "vmap_eager", "direct_eager"]
    )
    first = report["first_divergence"]
    assert first["what"] == "non-finite activation" and "NaN" in first["message"]


def test_stored_cases_changed_after_prepare_are_found_by_the_data_stage(
    config, project, mlp, params, tmp_path
):
    # As if a unit conversion of feature x3 ran once more over the standard case after
    # prepare built it, with the manifest rewritten to match: the sha256 gate cannot see it.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    case = load_npz(copy / "cases" / "standard.npz")
    case["x"][:, 3] *= np.float32(1000.0)
    atomic_save_npz(copy / "cases" / "standard.npz", case)
    manifest = read_json(copy / "cases" / "manifest.json")
    manifest["cases"]["standard"]["sha256"] = sha256_file(copy / "cases" / "standard.npz")
    (copy / "cases" / "manifest.json").write_text(json.dumps(manifest))
    _, report = run_and_diagnose(config, copy, mlp, params)
    assert_localized(report, "data", "cases.standard.x")
    assert report["first_divergence"]["feature"] == "x3"


@pytest.mark.parametrize(("path", "stage"), [("vmap_jit", "backend"), ("sharded_jit", "sharding")])
def test_a_divergence_only_in_the_runs_stored_outputs_is_the_backends(
    config, project, mlp, params, path, stage
):
    # Everything recomputed here agrees; the run's stored output of one path differs,
    # as a backend computing it differently would make it.
    def stored_as(outputs):
        key = f"standard.{path}"
        return {**outputs, key: outputs[key] * np.float32(1.001)}

    check, report = run_and_diagnose(config, project, mlp, params, stored_as)
    assert not check["passed"]
    assert_localized(report, stage, "output", paths=[path])
    assert report["first_divergence"]["input"] == "case standard"


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
        probes=probes_for({"cases": {"standard": {}}}, {"standard": {"x": rows}}, check=None),
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
