"""Statistics over the batch: BatchNorm that normalizes with the batch's own statistics at
inference, so a row's output depends on the rows beside it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model

EPS = 1e-5
FEATURES = 3


def _examples() -> np.ndarray:
    """4 rows of 3 features, (4, 3), batch axis 0: off the running statistics on purpose,
    so batch statistics and running statistics differ."""
    return (np.random.default_rng(42).normal(size=(4, FEATURES)) * 2.0 + 1.0).astype(np.float32)


def _init(key: jax.Array) -> dict[str, Any]:
    """Running statistics (state) and one dense layer 3 -> 2, float32."""
    k_mean, k_var, k_w = jax.random.split(key, 3)
    return {
        "bn": {
            "mean": jax.random.normal(k_mean, (FEATURES,), jnp.float32) * 0.1,
            "var": 1.0 + jax.random.uniform(k_var, (FEATURES,), jnp.float32),
        },
        "dense": {
            "W": jax.random.normal(k_w, (FEATURES, 2), jnp.float32),
            "b": jnp.zeros((2,), jnp.float32),
        },
    }


def _rowwise(v: jax.Array, x: jax.Array) -> jax.Array:
    """A per-feature vector v (k,) laid out to broadcast over x's leading (batch) axes."""
    return v.reshape((1,) * (x.ndim - 1) + v.shape)


def _dense(params: dict[str, Any], z: jax.Array) -> jax.Array:
    """z (..., 3) @ W + b -> (..., 2)."""
    out = z @ params["dense"]["W"]
    return out + _rowwise(params["dense"]["b"], out)


def _normalize_running(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """Inference-mode BatchNorm with the running statistics: x (..., 3) -> (..., 3)."""
    mean, var = _rowwise(params["bn"]["mean"], x), _rowwise(params["bn"]["var"], x)
    return (x - mean) / jnp.sqrt(var + EPS)


def _normalize_batch(x: jax.Array) -> jax.Array:
    """Training-mode BatchNorm: the statistics of the batch itself, X (batch, 3), axis 0."""
    mean = jnp.mean(x, axis=0, keepdims=True)
    var = jnp.var(x, axis=0, keepdims=True)
    return (x - mean) / jnp.sqrt(var + EPS)


def _stax_model(batch_stats: bool) -> Case:
    """BatchNorm then a dense layer: stax's BatchNorm had no running averages (jax#139)."""

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return _dense(params, _normalize_running(params, x))

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 3) -> (n, 2)
        return _dense(params, _normalize_batch(x) if batch_stats else _normalize_running(params, x))

    model = Model(
        name="stax_batchnorm",
        in_features=FEATURES,
        out_features=2,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
        trainable=False,
        state_leaves=("bn",),
    )
    return model, _init(jax.random.key(0)), _examples()


def _keras_model(training: bool) -> Case:
    """Dense, BatchNorm, relu, dense: the BatchNorm layer called with training=True at
    predict time (keras#3078) normalizes each batch by its own statistics."""

    def init(key: jax.Array) -> dict[str, Any]:
        k_in, k_rest = jax.random.split(key)
        params = _init(k_rest)
        params["inner"] = jax.random.normal(k_in, (FEATURES, FEATURES), jnp.float32)
        return params

    def head(params: Any, z: jax.Array) -> jax.Array:
        return _dense(params, jax.nn.relu(z))

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return head(params, _normalize_running(params, x @ params["inner"]))

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 3) -> (n, 2)
        h = x @ params["inner"]
        return head(params, _normalize_batch(h) if training else _normalize_running(params, h))

    model = Model(
        name="keras_batchnorm",
        in_features=FEATURES,
        out_features=2,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        trainable=False,
        state_leaves=("bn",),
    )
    return model, init(jax.random.key(1)), _examples()


BATCH_DEPENDENT = CaughtBy("batching", "outputs depend on batch composition")

BUGS = (
    RealBug(
        name="stax_batchnorm_batch_stats_at_test",
        kind="statistics over the batch",
        source=Source(
            repo="jax-ml/jax",
            number=139,
            title="Batch norm layer in stax does not compute moving averages for test-time",
            fixed_by=(
                "labelled a bug: stax's BatchNorm kept using batch statistics at test time "
                "'and people won't notice'; the fix is running averages used at inference"
            ),
        ),
        what="At test time the BatchNorm layer normalizes with the batch's own mean and "
        "variance, so a row's prediction changes with the rows batched beside it.",
        bug=lambda: _stax_model(batch_stats=True),
        fix=lambda: _stax_model(batch_stats=False),
        caught_by=BATCH_DEPENDENT,
    ),
    RealBug(
        name="keras_batchnorm_training_true_at_predict",
        kind="statistics over the batch",
        source=Source(
            repo="keras-team/keras",
            number=3078,
            title="Why batch normalization layers's output depend on batch_size while testing",
            fixed_by=(
                "answered in the thread: call the layer with training=False at test time, "
                "so it uses the population (running) statistics, not the batch's"
            ),
        ),
        what="model.predict(x) and model.predict(x[1:]) give different outputs for the same "
        "rows, because BatchNormalization normalizes by the batch's statistics.",
        bug=lambda: _keras_model(training=True),
        fix=lambda: _keras_model(training=False),
        caught_by=BATCH_DEPENDENT,
    ),
)
