"""The Flax NNX CNN with BatchNorm in inference mode (vmapcheck.examples.flax_cnn) on the
digits images scikit-learn ships (``data=digits model=flax_cnn``).

The model's input is one image leaf: ``forward_one`` takes ``{"image": (8, 8, 1)}``,
``forward_batch`` convolves the whole ``{"image": (batch, 8, 8, 1)}`` batch at once.
Tested here: the digits table (and the same images as token sequences, ``data=digit_tokens``),
the model contract (every form agrees on random input; the BatchNorms normalize with the
running statistics in the params, which training leaves as init set them), the real stages
in this process passing every check against the stored reference (data/reference/flax_cnn)
and registering the params with those statistics as init made them, and a planted
training-mode BatchNorm in the hand-batched form (tests/helpers/cnn_faults.py) caught by
the batch composition check. Skipped when Flax is not installed (``pip install -e
'.[flax]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.config import ROOT, compose_config
from tests.helpers.inprocess import (
    STAGES,
    inputs_repository,
    judge_planted,
    run_stage,
    write_params,
)
from tests.helpers.project import FAST_RUN, commit_all
from vmapcheck.check.reference import reference_dir
from vmapcheck.config import Config
from vmapcheck.core.composition import REGROUPINGS
from vmapcheck.core.models import Model, build_model
from vmapcheck.core.paths import PATHS, batch_paths
from vmapcheck.core.state import grad_of_trainable, partition
from vmapcheck.core.training import fit, make_loss
from vmapcheck.data.builtin import (
    DIGIT_TOKENS_FEATURES,
    DIGIT_TOKENS_IDS,
    DIGIT_TOKENS_MASK,
    DIGIT_TOKENS_SOURCE,
    DIGITS_PIXELS,
    DIGITS_SOURCE,
    DIGITS_TARGETS,
    digit_tokens_crop,
    digit_tokens_raw_table,
    digit_tokens_schema,
    digits_raw_table,
    digits_schema,
)
from vmapcheck.data.regression import SPLITS
from vmapcheck.data.splits import load_raw
from vmapcheck.errors import ConfigError
from vmapcheck.io import load_npz, read_json
from vmapcheck.layout import Layout
from vmapcheck.params_io import leaf_paths

pytest.importorskip("flax", reason="flax is not installed: pip install -e '.[flax]'")

OPTIONS = ("data=digits", "model=flax_cnn")
ROWS = 1797
CHANNELS = 8
LAYERS = ["conv1", "bn1", "conv2", "bn2", "pool", "head"]
STATISTICS = ("bn1.mean", "bn1.var", "bn2.mean", "bn2.var")
DIRECT = {p.name for p in PATHS.values() if p.form == "direct"}  # the hand-batched paths
# Flax's BatchNorm default.
EPSILON = 1e-5


@pytest.fixture(scope="module")
def config() -> Config:
    return compose_config(*OPTIONS)


@pytest.fixture(scope="module")
def model(config) -> Model:
    return build_model(config.model)


@pytest.fixture(scope="module")
def cnn() -> Model:
    """The model as its factory builds it (the config's factory keys), for the tests of
    the model alone: they need no validated config."""
    from vmapcheck.examples.flax_cnn import make_model

    return make_model(64, 10, CHANNELS, 16.0, list(DIGITS_TARGETS))


@pytest.fixture(scope="module")
def params(cnn):
    return cnn.init(jax.random.key(0))


def _images(rows: int, seed: int = 0) -> dict[str, jax.Array]:
    """A batch of random images in the digits' range 0..16: {"image": (rows, 8, 8, 1)}."""
    rng = np.random.default_rng(seed)
    pixels = rng.uniform(0.0, 16.0, size=(rows, 8, 8, 1))
    return {"image": jnp.asarray(pixels, dtype=jnp.float32)}


def _concat(*batches: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {"image": jnp.concatenate([b["image"] for b in batches])}


def _close(a, b, err_msg: str = "") -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=err_msg)


# --- the digits table ------------------------------------------------------------------


def test_the_digits_table_loads_from_the_installed_package_without_network(monkeypatch):
    import socket
    import urllib.request

    from sklearn.datasets import load_digits

    def no_network(*args, **kwargs):
        raise AssertionError("the digits source reached for the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    raw = digits_raw_table(digits_schema({}, DIGITS_PIXELS, DIGITS_TARGETS))
    bunch = load_digits()
    assert raw.n_rows == ROWS and raw.source == DIGITS_SOURCE
    assert raw.features.shape == (ROWS, 64) and raw.features.dtype == np.float32
    np.testing.assert_array_equal(raw.features, bunch.data.astype(np.float32))
    assert raw.features.min() == 0 and raw.features.max() == 16  # unscaled ink counts
    # The label as ten indicator columns: exactly one 1.0 per row, at the digit shown.
    assert raw.targets.shape == (ROWS, 10) and raw.targets.dtype == np.float32
    assert set(np.unique(raw.targets).tolist()) == {0.0, 1.0}
    np.testing.assert_array_equal(raw.targets.sum(axis=1), np.ones(ROWS, np.float32))
    np.testing.assert_array_equal(raw.targets.argmax(axis=1), bunch.target)
    # Nothing personal in the source.
    assert raw.identifiers == {} and raw.quasi_identifiers == {}


def test_conf_data_digits_declares_every_column_once(config):
    data = config.data
    assert data.source == "digits" and data.quasi_identifiers == {}
    assert tuple(data.features) == DIGITS_PIXELS  # row-major: pixel_<row>_<column>
    assert DIGITS_PIXELS[:2] == ("pixel_0_0", "pixel_0_1") and DIGITS_PIXELS[8] == "pixel_1_0"
    assert tuple(data.targets) == DIGITS_TARGETS
    assert (data.n_features, data.n_targets) == (64, 10)
    assert data.anonymize.join_key is None and data.anonymize.group_by is None
    raw = load_raw(data, None, Path("/nonexistent"))  # needs no key and no file
    assert raw.schema.columns == (*DIGITS_PIXELS, *DIGITS_TARGETS)


@pytest.mark.parametrize(
    ("quasi", "features", "targets", "expected"),
    [
        (
            {},
            [*DIGITS_PIXELS[:-1], "pixel_8_0"],
            DIGITS_TARGETS,
            r"data\.features: expected columns of the digits table \(pixel_0_0 \.\. "
            r"pixel_7_7, digit_0 \.\. digit_9\), found 'pixel_8_0'",
        ),
        (
            {},
            DIGITS_PIXELS[:-1],
            DIGITS_TARGETS,
            r"data\.quasi_identifiers, data\.features, data\.targets: expected every column "
            r".* found 'pixel_7_7' in none",
        ),
        ({}, DIGITS_PIXELS, ["digit"], r"data\.targets: .*found 'digit'"),
    ],
)
def test_a_digits_schema_that_does_not_fit_the_table_names_the_key(
    quasi, features, targets, expected
):
    with pytest.raises(ConfigError, match=expected):
        digits_schema(quasi, features, targets)


# --- the digits as token sequences (data=digit_tokens) ---------------------------------


def test_the_digit_tokens_table_is_the_digits_cropped_and_padded_deterministically():
    from sklearn.datasets import load_digits

    raw = digit_tokens_raw_table(digit_tokens_schema({}, DIGIT_TOKENS_FEATURES, DIGITS_TARGETS))
    bunch = load_digits()
    assert raw.n_rows == ROWS and raw.source == DIGIT_TOKENS_SOURCE
    assert raw.features.shape == (ROWS, 128) and raw.features.dtype == np.float32
    tokens, mask = raw.features[:, :64], raw.features[:, 64:]
    # The mask: 1.0 on a prefix of each sequence, 0.0 after it; lengths 16..64 as drawn
    # by the fixed-seed generator (the same table on every call).
    assert set(np.unique(mask).tolist()) == {0.0, 1.0}
    lengths, expected_mask = digit_tokens_crop(ROWS)
    np.testing.assert_array_equal(mask, expected_mask.astype(np.float32))
    np.testing.assert_array_equal(mask.sum(axis=1), lengths)
    assert lengths.min() >= 16 and lengths.max() <= 64 and np.unique(lengths).size > 40
    assert np.all(np.diff(mask, axis=1) <= 0)  # never a real token after padding
    # The ids: the pixels' ink counts where real, 0 in the padding.
    pixels = bunch.data.astype(np.float32)
    np.testing.assert_array_equal(tokens, np.where(expected_mask, pixels, 0.0))
    assert set(np.unique(tokens).tolist()) <= set(range(17))
    assert tokens.max() == 16
    np.testing.assert_array_equal(raw.targets.argmax(axis=1), bunch.target)
    assert raw.identifiers == {} and raw.quasi_identifiers == {}
    again = digit_tokens_raw_table(digit_tokens_schema({}, DIGIT_TOKENS_FEATURES, DIGITS_TARGETS))
    np.testing.assert_array_equal(again.features, raw.features)


def test_conf_data_digit_tokens_declares_tokens_then_masks():
    data = compose_config(
        "data=digit_tokens", "model.in_features=128", "model.out_features=10"
    ).data
    assert data.source == "digit_tokens" and data.quasi_identifiers == {}
    assert tuple(data.features) == DIGIT_TOKENS_IDS + DIGIT_TOKENS_MASK == DIGIT_TOKENS_FEATURES
    assert DIGIT_TOKENS_FEATURES[:2] == ("token_0", "token_1")
    assert DIGIT_TOKENS_FEATURES[64] == "mask_0"
    assert tuple(data.targets) == DIGITS_TARGETS
    assert data.anonymize.join_key is None and data.anonymize.group_by is None
    raw = load_raw(data, None, Path("/nonexistent"))  # needs no key and no file
    assert raw.schema.columns == (*DIGIT_TOKENS_FEATURES, *DIGITS_TARGETS)
    with pytest.raises(
        ConfigError,
        match=r"data\.features: expected columns of the "
        r"digit_tokens table \(token_0 \.\. token_63, mask_0",
    ):
        digit_tokens_schema({}, [*DIGIT_TOKENS_FEATURES[:-1], "mask_64"], DIGITS_TARGETS)


# --- the model contract ----------------------------------------------------------------


def test_the_config_builds_the_cnn_with_its_own_reference_and_registered_model(config, model):
    assert model.name == "flax_cnn"
    assert (model.in_features, model.out_features) == (64, 10)
    assert model.outputs() == DIGITS_TARGETS  # one score per indicator target
    assert model.forward_batch is not None and model.trainable
    assert model.activations_one is not None and model.activations_batch is not None
    assert reference_dir(config, Layout(ROOT)) == ROOT / "data" / "reference" / "flax_cnn"
    assert config.registry.registered_model == "vmapcheck-flax_cnn"


def test_params_are_named_float32_arrays_with_running_statistics(cnn, params):
    shapes = {name: leaf.shape for name, leaf in leaf_paths(params).items()}
    c = CHANNELS
    assert shapes == {
        "conv1.kernel": (3, 3, 1, c),
        "conv1.bias": (c,),
        "bn1.scale": (c,),
        "bn1.bias": (c,),
        "bn1.mean": (c,),
        "bn1.var": (c,),
        "conv2.kernel": (3, 3, c, c),
        "conv2.bias": (c,),
        "bn2.scale": (c,),
        "bn2.bias": (c,),
        "bn2.mean": (c,),
        "bn2.var": (c,),
        "head.kernel": (4 * 4 * c, 10),  # the 2x2 mean-pooled (4, 4, c) image, flattened
        "head.bias": (10,),
    }
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    # init is traceable (the template the params file is loaded against) and deterministic.
    template = jax.eval_shape(cnn.init, jax.random.key(0))
    assert jax.tree.structure(template) == jax.tree.structure(params)
    again = leaf_paths(cnn.init(jax.random.key(0)))
    for name, leaf in leaf_paths(params).items():
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(again[name]), err_msg=name)
    other = leaf_paths(cnn.init(jax.random.key(1)))
    assert not np.array_equal(np.asarray(other["bn1.mean"]), np.asarray(params["bn1"]["mean"]))
    # The running statistics are the calibration's, not BatchNorm's fresh 0 and 1: distinct
    # per channel, so normalizing with any other statistics changes the outputs.
    for name in STATISTICS:
        values = np.asarray(leaf_paths(params)[name])
        assert np.unique(values).size == c, name
        assert not np.allclose(values, 0.0) and not np.allclose(values, 1.0), name
    assert np.all(np.asarray(params["bn1"]["var"]) > 0.1)
    assert np.all(np.asarray(params["bn2"]["var"]) > 0.1)


def test_the_input_contract_is_one_image_leaf_taking_the_64_pixel_columns(cnn):
    assert cnn.inputs is not None and cnn.inputs.names == ("image",)
    (leaf,) = cnn.inputs.leaves
    assert (leaf.shape, leaf.dtype, leaf.vocab) == ((8, 8, 1), "float", None)
    assert cnn.inputs.size == cnn.in_features == 64
    # Row-major: column pixel_<r>_<c> is image[r, c, 0].
    table = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    images = cnn.inputs.from_table(table, DIGITS_PIXELS)["image"]
    assert images.shape == (2, 8, 8, 1) and images[1, 2, 3, 0] == 64 + 2 * 8 + 3


def test_every_form_agrees_on_random_images(cnn, params):
    x = _images(7)
    one = np.stack([np.asarray(cnn.forward_one(params, {"image": image})) for image in x["image"]])
    assert one.shape == (7, 10)
    forms = {
        "vmap": jax.vmap(cnn.forward_one, in_axes=(None, 0))(params, x),
        "jit(vmap)": jax.jit(jax.vmap(cnn.forward_one, in_axes=(None, 0)))(params, x),
        "forward_batch": cnn.forward_batch(params, x),
        "jit(forward_batch)": jax.jit(cnn.forward_batch)(params, x),
    }
    for name, out in forms.items():
        assert out.shape == (7, 10), name
        _close(out, one, name)


def test_activations_walk_the_layers_and_end_at_the_output(cnn, params):
    x = _images(3)
    first = {"image": x["image"][0]}
    one = cnn.activations_one(params, first)
    batch = cnn.activations_batch(params, x)
    assert [name for name, _ in one] == LAYERS == [name for name, _ in batch]
    shapes = [a.shape for _, a in one]
    assert shapes == [(8, 8, CHANNELS)] * 4 + [(4, 4, CHANNELS), (10,)]
    assert [a.shape for _, a in batch] == [(3, *s) for s in shapes]
    _close(one[-1][1], cnn.forward_one(params, first))
    _close(batch[-1][1], cnn.forward_batch(params, x))
    for (name, a), (_, b) in zip(one, batch, strict=True):
        _close(b[0], a, name)  # row 0 of the batch is the single image, layer by layer


def test_batchnorm_normalizes_with_the_running_statistics(cnn, params):
    x = _images(5)
    layers = dict(cnn.activations_batch(params, x))
    bn = {k: np.asarray(v).reshape(1, 1, 1, -1) for k, v in params["bn1"].items()}
    conv1 = np.asarray(layers["conv1"])
    normalized = (conv1 - bn["mean"]) / np.sqrt(bn["var"] + EPSILON) * bn["scale"] + bn["bias"]
    expected = np.maximum(normalized, 0.0)  # relu
    _close(layers["bn1"], expected)
    # A row's output depends on that row alone: the same image in other batches.
    first = {"image": x["image"][:1]}
    alone = cnn.forward_batch(params, first)
    with_others = cnn.forward_batch(params, _concat(first, _images(9, seed=1)))
    _close(with_others[:1], alone)
    _close(cnn.forward_batch(params, x)[:1], alone)
    # ... and the statistics in the params are what it normalizes with.
    moved = {**params, "bn1": {**params["bn1"], "mean": params["bn1"]["mean"] + 1.0}}
    shifted = np.asarray(cnn.forward_batch(moved, x))
    assert not np.allclose(shifted, np.asarray(cnn.forward_batch(params, x)), atol=1e-3)


def test_training_leaves_the_running_statistics_as_init_set_them(config, model, params):
    # Declared state (Model.state_leaves): never differentiated, never stepped.
    assert set(model.state_leaves) == set(STATISTICS)
    leaves = partition(model, params)
    assert set(leaves.state_names) == set(STATISTICS)
    x, rng = _images(16), np.random.default_rng(2)
    y = jnp.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 16)])
    grads = grad_of_trainable(make_loss(model), leaves)(params, x, y)
    assert not set(STATISTICS) & set(grads)
    assert np.any(np.asarray(grads["bn1.scale"])) and np.any(np.asarray(grads["conv1.kernel"]))
    splits = {name: (x, y) for name in SPLITS}
    train = config.train.model_copy(update={"steps": 3, "eval_every": 1})
    trained, _ = fit(model, params, splits, train, jax.random.key(3))
    before, after = leaf_paths(params), leaf_paths(trained)
    for name in STATISTICS:
        np.testing.assert_array_equal(np.asarray(after[name]), np.asarray(before[name]), name)
    assert not np.array_equal(np.asarray(after["conv1.kernel"]), np.asarray(before["conv1.kernel"]))


def test_the_planted_fault_keeps_forward_one_and_breaks_only_the_batched_form(params):
    from tests.helpers.cnn_faults import make_model

    healthy = make_model("none", 64, 10, CHANNELS)
    planted = make_model("batch_statistics", 64, 10, CHANNELS)
    x = _images(6)
    first = {"image": x["image"][0]}
    _close(planted.forward_one(params, first), healthy.forward_one(params, first))
    wrong = np.asarray(planted.forward_batch(params, x))
    assert not np.allclose(wrong, np.asarray(healthy.forward_batch(params, x)), atol=1e-3)
    # The same rows, grouped otherwise, come out otherwise: batch composition.
    halves = np.concatenate(
        [
            np.asarray(planted.forward_batch(params, {"image": half}))
            for half in (x["image"][:3], x["image"][3:])
        ]
    )
    assert not np.allclose(halves, wrong, atol=1e-3)


# --- the real stages, in this process --------------------------------------------------

PIPELINE = (
    *OPTIONS,
    "data.standard_batch=8",
    # The emulated CPU devices of this process (tests/conftest.py).
    "backend.num_devices=2",
    *FAST_RUN,
    # A project that deploys this model (`vmapcheck init --model flax_cnn`): its passing
    # run moves alias verified.
    "registry.target.model=flax_cnn",
    "registry.target.hidden=null",
)


@dataclass(frozen=True)
class Project:
    layout: Layout
    codes: dict[str, int]  # each stage's exit code


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """A temporary project (a git repository of its inputs) after every stage ran with
    ``data=digits model=flax_cnn``; its data/reference is the repository's (check compares
    the run with the stored reference of flax_cnn)."""
    root = tmp_path_factory.mktemp("cnn")
    inputs_repository(root)
    write_params(root, *PIPELINE)
    commit_all(root, "flax_cnn inputs")
    codes = {name: run_stage(root, name) for name in STAGES}
    return Project(Layout(root), codes)


@pytest.mark.stages
def test_every_stage_exited_zero(project):
    assert project.codes == dict.fromkeys(STAGES, 0)


@pytest.mark.stages
def test_the_params_are_registered_with_the_running_statistics_as_init_made_them(project):
    """Its declared state leaves (the BatchNorms' running statistics) stored in the params
    file and registered bit for bit as the model's init made them, while the weights are
    trained. (tests/e2e/test_state_leaves.py: the Haiku CNN, whose state holds int32
    counters too, through `dvc repro`.)"""
    from safetensors.numpy import load_file

    from vmapcheck.config import load_config
    from vmapcheck.core.keys import named_keys

    layout = project.layout
    track = read_json(layout.track_report)
    assert track["verdict"] == "passed"
    assert track["registry"]["status"] == "registered", track["registry"]
    assert track["registry"]["version"] == "1" and track["registry"]["verified_alias"] == "moved"
    config = load_config(layout.params_yaml)
    model = build_model(config.model)
    # The params train started from: the same key stream as the train stage.
    initial = leaf_paths(model.init(named_keys(config.seed)["init"]))
    state = partition(model, initial).state_names
    assert set(state) == set(STATISTICS)
    assert read_json(layout.params / "contract.json")["state_leaves"] == list(state)
    assert read_json(layout.params_manifest)["source"]["trained"]
    saved = load_file(str(layout.params / "params.safetensors"))
    assert set(saved) == set(initial)  # every leaf stored, state included
    for leaf in STATISTICS:
        assert saved[leaf].dtype == initial[leaf].dtype and saved[leaf].shape == initial[leaf].shape
        np.testing.assert_array_equal(saved[leaf], np.asarray(initial[leaf]), leaf)
    trained = [leaf for leaf in initial if leaf not in STATISTICS]
    assert any(not np.array_equal(saved[leaf], np.asarray(initial[leaf])) for leaf in trained)


@pytest.mark.stages
def test_prepare_split_the_images_disjointly_and_recorded_no_personal_column(project):
    layout = project.layout
    manifest = read_json(layout.prepared / "manifest.json")
    assert manifest["source"] == "digits"
    assert manifest["features"] == list(DIGITS_PIXELS)
    assert manifest["targets"] == list(DIGITS_TARGETS)
    assert manifest["anonymization"]["personal_columns"] == []
    assert {c["role"] for c in manifest["columns"]} == {"feature", "target"}
    rows = [load_npz(layout.prepared / f"{name}.npz")["row"] for name in SPLITS]
    every = np.concatenate(rows)
    assert every.size == ROWS and np.array_equal(np.sort(every), np.arange(ROWS))
    assert sum(manifest["rows"].values()) == ROWS


@pytest.mark.stages
def test_check_passed_on_every_path_and_against_the_stored_reference(project):
    layout = project.layout
    check = read_json(layout.check_details)
    assert check["passed"], check["failures"]
    assert not check["not_provided"]  # direct_eager and direct_jit exist
    standard = check["cases"]["standard"]
    paths = {p.name for p in batch_paths()}
    assert set(standard["finite"]) == paths and all(standard["finite"].values())
    assert all(pair["passed"] for pair in standard["pairs"].values())
    for case, by_path in check["composition"].items():
        assert set(by_path) == paths, case
        for path, result in by_path.items():
            assert result["passed"], (case, path, result)
            assert all(result[g]["max_abs"] is not None for g in REGROUPINGS)
    # Compared with data/reference/flax_cnn: the stored params on the stored inputs.
    assert check["reference"]["status"] == "ok", check["reference"]
    assert read_json(layout.diagnosis)["status"] == "not needed"
    assert read_json(layout.params_manifest)["model"] == "flax_cnn"


@pytest.mark.stages
def test_bench_timed_every_path(project):
    bench = read_json(project.layout.bench_details)
    for path in batch_paths():
        assert bench["latency_ms"][path.name]["b8"]["p50"] > 0, path.name  # FAST_RUN's size


# --- the planted fault, through the real stages ---------------------------------------


@pytest.mark.stages
def test_batchnorm_with_batch_statistics_in_the_hand_batched_form_is_caught(tmp_path):
    from tests.helpers.cnn_faults import factory_overrides

    layout = judge_planted(tmp_path / "p", *OPTIONS, *factory_overrides("batch_statistics"))
    check = read_json(layout.check_details)
    assert not check["passed"]
    failing = [f for f in check["failures"] if "outputs depend on batch composition" in f]
    # Batch statistics are blind to the rows' order, not to their grouping.
    assert any(": outputs depend on batch composition (split: " in f for f in failing)
    assert {f.split("/")[1].split(":")[0] for f in failing} == DIRECT, failing
    for case, by_path in check["composition"].items():
        for path, result in by_path.items():  # every path that never sees batch-mates
            assert result["passed"] or path in DIRECT, (case, path, result)
    # (All-zero rows have the same statistics however they are grouped: only cases of
    # distinct rows show it.)
    assert not any(check["composition"]["standard"][path]["passed"] for path in DIRECT)
    # The hand-batched paths also disagree with the loop on the batch as it is.
    pairs = check["cases"]["standard"]["pairs"]
    assert not pairs["loop_eager-vs-direct_eager"]["passed"]
    assert pairs["loop_eager-vs-vmap_eager"]["passed"]
    diagnosis = read_json(layout.diagnosis)["first_divergence"]
    assert diagnosis["layer"] == "bn1", diagnosis
    print(next(f for f in failing if f.startswith("standard/")))
