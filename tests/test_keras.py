"""The Keras 3 wrapper of docs/keras.md (vmapcheck.examples.keras_model) through the real
Python API: a small Keras MLP with BatchNormalization and Dropout passes in inference mode
(training=False), a model without BatchNorm passes at f64 and bf16 too, and the planted
training-mode mistake (training=True: BatchNorm normalizes with the batch's own
statistics, Dropout draws) fails with batching findings. Its refusals name what they
found."""

import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.helpers.config import ROOT
from vmapcheck.errors import ConfigError
from vmapcheck.testing import assert_batching_consistent, check_batching

# Keras is a test dependency (the keras extra, installed by `make setup` and so in CI):
# inside the project's .venv or CI a missing keras is a broken setup and fails here; a
# bare `pytest` elsewhere (vmapcheck installed without the extra) skips with the reason.
_PROJECT_SETUP = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve() or bool(
    os.environ.get("CI")
)
if _PROJECT_SETUP:
    # Set by the wrapper module too; here first, as keras may already be imported.
    os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        import keras
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "tests/test_keras.py: keras is missing from the project's setup, which installs "
            "the keras extra (Makefile, setup): run make setup"
        ) from exc
else:
    keras = pytest.importorskip(
        "keras", reason="keras is not installed: pip install 'vmapcheck[keras]' (make setup has it)"
    )

from vmapcheck.examples.keras_model import NON_TRAINABLE, TRAINABLE, keras_model  # noqa: E402

FEATURES, HIDDEN, OUTPUTS, ROWS = 4, 16, 3, 8


@pytest.fixture(scope="module")
def mlp() -> "keras.Model":
    """Dense(16) -> BatchNormalization -> relu -> Dropout(0.3) -> Dense(3), functional,
    seeded; BatchNorm's moving statistics set away from Keras' 0 and 1, so inference mode
    really reads them (as a trained model's would)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,), name="features")
    h = keras.layers.Dense(HIDDEN, name="dense")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.Dropout(0.3, name="dropout")(h)
    model = keras.Model(inputs, keras.layers.Dense(OUTPUTS, name="head")(h), name="keras_mlp")
    rng = np.random.default_rng(1)
    bn = model.get_layer("bn")
    bn.moving_mean.assign(rng.normal(size=HIDDEN).astype("float32"))
    bn.moving_variance.assign(rng.uniform(0.5, 2.0, size=HIDDEN).astype("float32"))
    return model


@pytest.fixture(scope="module")
def examples() -> np.ndarray:
    return np.random.default_rng(2).normal(size=(ROWS, FEATURES)).astype("float32")


def test_params_are_the_variables_by_path_with_the_state_declared(mlp):
    model = keras_model(mlp)
    params = model.init(None)
    assert list(params[TRAINABLE]) == [v.path for v in mlp.trainable_variables]
    assert list(params[NON_TRAINABLE]) == [v.path for v in mlp.non_trainable_variables]
    # BatchNorm's statistics and Dropout's uint32 seed state: kept, never trained.
    assert {"bn/moving_mean", "bn/moving_variance"} <= set(params[NON_TRAINABLE])
    assert any(p.endswith("seed_generator_state") for p in params[NON_TRAINABLE])
    assert model.state_leaves == (NON_TRAINABLE,)
    assert (model.in_features, model.out_features) == (FEATURES, OUTPUTS)
    np.testing.assert_array_equal(
        params[NON_TRAINABLE]["bn/moving_mean"], np.asarray(mlp.get_layer("bn").moving_mean.value)
    )


def test_inference_mode_passes_every_path(mlp, examples):
    model = keras_model(mlp)
    report = assert_batching_consistent(model, model.init(None), examples)
    assert report.passed and not report.not_run  # direct included: forward_batch given
    assert "direct_jit" in report.paths
    # The gradients reach the trainable variables only (the state is held fixed).
    assert set(report.gradients.leaves) == {f"trainable.{v.path}" for v in mlp.trainable_variables}


@pytest.mark.parametrize(("precision", "dtype"), [("f64", "float64"), ("bf16", "bfloat16")])
def test_another_precision_runs_a_clone_in_its_dtype(examples, precision, dtype):
    """Keras casts the values it is given to its variables' dtype: without the clone an
    f64 or bf16 run (and every float64 oracle) would compute in float32, its outputs
    float32 (a contract failure)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    h = keras.layers.Dropout(0.3)(h)
    model = keras_model(keras.Model(inputs, keras.layers.Dense(OUTPUTS)(h)))
    report = assert_batching_consistent(
        model, model.init(None), examples, precision=precision, gradients=False, bitwise="off"
    )
    assert report.dtype == dtype


def test_keras_on_jax_still_computes_batch_normalization_in_float32():
    """What docs/keras.md says of BatchNormalization at f64: on the JAX backend Keras'
    result_type maps float64 to float32, and BatchNormalization computes in
    result_type(inputs, float32), so a float64 model normalizes in float32. When Keras
    changes this, this test fails: update the page (and try precision="f64" on the MLP)."""
    assert keras.backend.result_type("float64", "float32") == "float32"


def test_training_mode_is_the_planted_mistake_and_fails_on_batching(mlp, examples):
    model = keras_model(mlp, training=True)
    report = check_batching(model, model.init(None), examples, bitwise="off")
    assert not report.passed
    assert report.kinds.get("batching", 0) > 0
    # The loop sees batches of one (BatchNorm's batch statistics: the row itself), the
    # direct path the whole batch: they part, and the direct path depends on the rows
    # around each row.
    assert any("loop_eager-vs-direct_eager" in f for f in report.failures)
    assert any("depend on batch composition" in f for f in report.failures)
    with pytest.raises(AssertionError, match=r"\[batching\]"):
        assert_batching_consistent(model, model.init(None), examples, bitwise="off")


def test_a_subclassed_model_is_refused_naming_why():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="subclassed")
            self.dense = keras.layers.Dense(OUTPUTS)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    # Built by a call, as users do (Keras broadcasts its bias: conftest's strict JAX raises).
    with jax.numpy_rank_promotion("allow"):
        model(np.zeros((1, FEATURES), "float32"))
    with pytest.raises(ConfigError, match="subclassed model is not supported"):
        keras_model(model)


def test_an_input_that_is_not_a_flat_vector_is_refused(mlp):
    images = keras.Input((8, 8, 1))
    flat = keras.layers.Flatten()(images)
    model = keras.Model(images, keras.layers.Dense(OUTPUTS)(flat))
    with pytest.raises(ConfigError, match=r"input: expected one flat tensor .* \(None, 8, 8, 1\)"):
        keras_model(model)
    with pytest.raises(ConfigError, match="training: expected a bool, found 'no'"):
        keras_model(mlp, training="no")
    with pytest.raises(ConfigError, match="output_names: expected 3"):
        keras_model(mlp, output_names=["a"])
