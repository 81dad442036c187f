"""A model's outputs against its contract, before any work (issue 34, case 5): train
used to stop with a traceback from the loss (a tuple, a wrong shape), or run the whole
pipeline on int32 outputs and fail at the end; a NaN in training now names the model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.config import TrainConfig
from vmapcheck.core.contract import output_contract_problem
from vmapcheck.core.models import Model
from vmapcheck.core.training import fit
from vmapcheck.errors import NonFiniteOutputError


def _model(one, batch=None) -> Model:
    return Model(
        name="user_model",
        in_features=4,
        out_features=3,
        forward_one=one,
        forward_batch=batch,
        init=lambda key: {"W": jax.random.normal(key, (4, 3), jnp.float32)},
    )


PARAMS = {"W": jnp.ones((4, 3), jnp.float32)}
BATCH = np.ones((5, 4), np.float32)


def test_a_model_within_its_contract_has_no_problem():
    good = _model(lambda p, x: x @ p["W"], lambda p, x: x @ p["W"])
    assert output_contract_problem(good, PARAMS, BATCH) is None


def _first_two(p, x):
    return (x @ p["W"])[:2]


def _as_int(p, x):
    return (x @ p["W"]).astype(jnp.int32)


@pytest.mark.parametrize(
    ("one", "batch", "expected"),
    [
        (
            lambda p, x: (x @ p["W"], x),
            None,
            "forward_one returns a tuple, expected one array of shape (3,)",
        ),
        (_first_two, None, "forward_one returns shape (2,) for one example, expected (3,)"),
        (_as_int, None, "forward_one returns dtype int32, expected a float array"),
        (
            lambda p, x: x @ p["W"].T,
            None,
            "forward_one fails on one example of its input contract: TypeError",
        ),
    ],
)
def test_an_output_off_its_contract_is_named(one, batch, expected):
    problem = output_contract_problem(_model(one, batch), PARAMS, BATCH)
    assert problem is not None and problem.startswith(expected), problem


def test_a_hand_batched_forward_off_its_shape_is_left_to_the_check():
    """The check finds a broken forward_batch and the diagnosis locates it: not refused
    up front (tests/test_diagnosis.py plants a wrong broadcast there)."""
    summed = _model(lambda p, x: x @ p["W"], lambda p, x: (x @ p["W"]).sum(axis=0))
    assert output_contract_problem(summed, PARAMS, BATCH) is None


def test_a_nan_in_training_names_the_model_and_the_step():
    """A model whose forward gives NaN at init (tests/test_diagnosis.py plants one for the
    diagnosis to locate) is refused only once training evaluates it."""
    config = TrainConfig.model_validate(
        {
            "optimizer": "adam",
            "learning_rate": 1e-3,
            "steps": 4,
            "batch_size": 4,
            "eval_every": 2,
            "params_file": None,
            "params_sha256": None,
            "params_source": None,
        }
    )
    splits = {name: (BATCH, np.zeros((5, 3), np.float32)) for name in ("train", "val", "test")}
    nan_model = _model(lambda p, x: x @ p["W"] * jnp.nan)
    # Read at the first evaluation step (2), named at the step it appeared (1).
    expected = (
        r"'user_model': training step 1: the training loss is nan \(the gradient of "
        r"params leaf 'W' too\): the forward gives NaN or Inf"
    )
    with pytest.raises(NonFiniteOutputError, match=expected):
        fit(nan_model, PARAMS, splits, config, jax.random.key(0))
    untrained = TrainConfig.model_validate(config.model_dump() | {"steps": 0})
    _, metrics = fit(nan_model, PARAMS, splits, untrained, jax.random.key(0))
    assert not metrics["trained"]


def test_the_python_api_names_an_output_off_the_contract():
    from vmapcheck.errors import ConfigError
    from vmapcheck.testing import assert_batching_consistent

    tupled = _model(lambda p, x: (x @ p["W"], x))
    with pytest.raises(ConfigError, match="forward_one returns a tuple"):
        assert_batching_consistent(tupled, PARAMS, BATCH)
