"""Randomness under vmap: MC dropout whose rows share one key, so every row of a batch
gets the same noise.

These models are stochastic (``Model(..., stochastic=True)``, the contract of issue 42,
item 3): ``forward_one(params, x, key)`` takes the typed PRNG key of its example and
``forward_batch(params, X, keys)`` takes ``keys`` of shape ``(batch,)``, row i's key the
one the loop gives row i. Building them needs that feature (``requires``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.models import Model

RATE = 0.5  # the dropout rate: half the hidden units dropped
HIDDEN = 8


def _init(key: jax.Array) -> dict[str, jax.Array]:
    """A 3 -> 8 -> 2 MLP, float32."""
    k1, k2 = jax.random.split(key)
    return {
        "W1": jax.random.normal(k1, (3, HIDDEN), jnp.float32),
        "W2": jax.random.normal(k2, (HIDDEN, 2), jnp.float32) / jnp.sqrt(HIDDEN),
    }


def _keep(key: jax.Array) -> jax.Array:
    """One example's dropout keep-mask (HIDDEN,) from its key."""
    return jax.random.bernoulli(key, 1.0 - RATE, (HIDDEN,))


def _dropout_mlp(params: Any, x: jax.Array, keep: jax.Array) -> jax.Array:
    """tanh layer, inverted dropout with ``keep`` ((..., HIDDEN), broadcast over rows),
    linear output: x (..., 3) -> (..., 2)."""
    hidden = jnp.tanh(x @ params["W1"])
    keep = jnp.broadcast_to(keep, hidden.shape)  # one mask for every row: the bugs' case
    dropped = jnp.where(keep, hidden / (1.0 - RATE), 0.0)
    return dropped @ params["W2"]


def _model(forward_one: Any, forward_batch: Any) -> Model:
    return Model(
        name="mc_dropout",
        in_features=3,
        out_features=2,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_init,
        trainable=False,
        stochastic=True,
    )


def _examples() -> np.ndarray:
    """4 rows, two of them identical, (4, 3), batch axis 0: identical inputs with
    different keys must get different noise."""
    rows = np.random.default_rng(7).normal(size=(3, 3)).astype(np.float32)
    return np.concatenate([rows, rows[:1]])


def _nnx_model(per_row_keys: bool) -> Case:
    """flax#4195: the module draws from the key it holds, one for the whole batch."""
    held = jax.random.key(1234)  # the module's own Rngs, not split across the batch

    def forward_one(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return _dropout_mlp(params, x, _keep(key if per_row_keys else held))

    def forward_batch(params: Any, x: jax.Array, keys: jax.Array) -> jax.Array:
        # x (n, 3), keys (n,) -> (n, 2)
        if per_row_keys:
            return _dropout_mlp(params, x, jax.vmap(_keep)(keys))
        return _dropout_mlp(params, x, _keep(held))

    return _model(forward_one, forward_batch), _init(jax.random.key(0)), _examples()


def _linen_model(per_row_keys: bool) -> Case:
    """flax#4973: the batched forward draws every row's mask from one key (not split)."""

    def forward_one(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:  # (3,) -> (2,)
        return _dropout_mlp(params, x, _keep(key))

    def forward_batch(params: Any, x: jax.Array, keys: jax.Array) -> jax.Array:
        # x (n, 3), keys (n,) -> (n, 2)
        keep = jax.vmap(_keep)(keys) if per_row_keys else _keep(keys[0])
        return _dropout_mlp(params, x, keep)

    return _model(forward_one, forward_batch), _init(jax.random.key(1)), _examples()


BUGS = (
    RealBug(
        name="nnx_vmap_shared_rng_key",
        kind="randomness under vmap",
        source=Source(
            repo="google/flax",
            number=4195,
            title="`nnx.vmap` use the same random key `rngs` inside nnx.Module across "
            "vectorization.",
            fixed_by=(
                "maintainer (cgarciae): RNG state is ordinary state in NNX; split it per "
                "row with nnx.split_rngs (or StateAxes({RngState: 0})) before nnx.vmap"
            ),
        ),
        what="Under nnx.vmap every example uses the same random key, so a stochastic "
        "model (MC dropout) gives every row of the batch the same noise.",
        bug=lambda: _nnx_model(per_row_keys=False),
        fix=lambda: _nnx_model(per_row_keys=True),
        # Loop and batched paths agree (all rows share the noise): only the stochastic
        # check that different keys give different outputs can see it.
        caught_by=CaughtBy("batching", "the rows share their randomness"),
        requires=("stochastic",),
    ),
    RealBug(
        name="linen_vmap_rng_not_split",
        kind="randomness under vmap",
        source=Source(
            repo="google/flax",
            number=4973,
            title="Lifted `vmap` in linen does not split rng_key when single key is passed "
            "to `apply`",
            fixed_by=(
                "maintainer (vfdev-5): a bare key becomes rngs={'params': key}, so "
                "split_rngs={'dropout': True} never applies; pass the dropout stream by name"
            ),
        ),
        what="With nn.vmap and split_rngs={'dropout': True}, a single key passed to apply "
        "is not split: every vmapped row draws the same dropout mask.",
        bug=lambda: _linen_model(per_row_keys=False),
        fix=lambda: _linen_model(per_row_keys=True),
        caught_by=CaughtBy("batching", "-vs-direct"),
        requires=("stochastic",),
    ),
)
