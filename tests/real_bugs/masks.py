"""Masks and padding: an attention mask broadcast over the batch axis, and a -inf mask
that turns a fully padded row into NaN."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model


def _qkv_init(key: jax.Array) -> dict[str, jax.Array]:
    """One scalar weight each for query, key and value of a single head, float32 (1,)."""
    k_q, k_k, k_v = jax.random.split(key, 3)
    return {
        "wq": jax.random.normal(k_q, (1,), jnp.float32),
        "wk": jax.random.normal(k_k, (1,), jnp.float32),
        "wv": jax.random.normal(k_v, (1,), jnp.float32) + 1.0,
    }


def _inputs(positions: int) -> InputSpec:
    return InputSpec(
        (
            Leaf("x", (positions,), "float", meaning="one scalar feature per position"),
            Leaf(
                "mask", (positions,), "bool", meaning="true for real positions, false for padding"
            ),
        )
    )


# --- transformers#8790: the mask laid out as (1, 1, batch, keys) ------------------------

POSITIONS = 2  # the broadcast is silent when the batch is 1 or POSITIONS rows


def _flaxbert_model(broadcast_on_batch: bool) -> Case:
    """Self-attention over 2 positions with a padding mask, written as FlaxBert did.

    Scores are (batch, heads=1, queries, keys). The fix expands the (batch, keys) mask to
    (batch, 1, 1, keys); the bug reshaped it to (1, 1, batch, keys), which lines the
    batch up with the queries: silent when the batch has 1 or ``POSITIONS`` rows.
    """
    big_negative = -1e9  # masked scores are replaced, never added to: see the next entry

    def attend(params: Any, x: jax.Array, mask: jax.Array) -> jax.Array:
        # x (batch, T), mask broadcastable to (batch, 1, T, T) -> (batch, T)
        q, k, v = (x * params[name][0] for name in ("wq", "wk", "wv"))
        scores = (q[:, :, None] * k[:, None, :])[:, None]  # (batch, 1, T, T)
        probs = jax.nn.softmax(jnp.where(mask, scores, big_negative), axis=-1)
        return jnp.einsum("bhqk,bk->bq", probs, v)

    def forward_one(params: Any, example: dict[str, jax.Array]) -> jax.Array:  # (T,) -> (T,)
        return attend(params, example["x"][None], example["mask"][None, None, None, :])[0]

    def forward_batch(params: Any, batch: dict[str, jax.Array]) -> jax.Array:  # (n, T)
        mask = batch["mask"]
        n = mask.shape[0]
        expanded = (
            mask.reshape(1, 1, n, POSITIONS) if broadcast_on_batch else mask[:, None, None, :]
        )
        return attend(params, batch["x"], expanded)

    model = Model(
        name="flaxbert_mask",
        in_features=2 * POSITIONS,
        out_features=POSITIONS,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_qkv_init,
        trainable=False,
        inputs=_inputs(POSITIONS),
    )
    examples = {
        "x": np.array([[0.5, -1.5], [2.0, 0.7]], np.float32),
        "mask": np.array([[True, True], [True, False]]),  # row 1 pads its last position
    }
    return model, _qkv_init(jax.random.key(0)), examples


# --- equinox#274: -inf for masked scores, NaN on a fully masked row --------------------

KEYS = 3


def _eqx_attention_model(smallest_float: bool) -> Case:
    """Self-attention over 3 positions whose masked scores are replaced by -inf (the bug)
    or by the dtype's smallest float (the fix, equinox#274). A row whose every position is
    padding has every score masked: softmax of all -inf is NaN, of all finfo.min uniform.
    """

    def attend(params: Any, x: jax.Array, mask: jax.Array) -> jax.Array:
        # x (..., T), mask (..., T) -> (..., T); the batch axis, if any, leads.
        q, k, v = (x * params[name][0] for name in ("wq", "wk", "wv"))
        scores = q[..., :, None] * k[..., None, :]  # (..., T, T)
        fill = jnp.finfo(scores.dtype).min if smallest_float else -jnp.inf
        masked = jnp.where(mask[..., None, :], scores, fill)
        return jnp.einsum("...qk,...k->...q", jax.nn.softmax(masked, axis=-1), v)

    def forward_one(params: Any, example: dict[str, jax.Array]) -> jax.Array:  # (T,) -> (T,)
        return attend(params, example["x"], example["mask"])

    def forward_batch(params: Any, batch: dict[str, jax.Array]) -> jax.Array:  # (n, T)
        return attend(params, batch["x"], batch["mask"])

    model = Model(
        name="eqx_attention",
        in_features=2 * KEYS,
        out_features=KEYS,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_qkv_init,
        trainable=False,
        inputs=_inputs(KEYS),
    )
    examples = {
        "x": np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0], [-2.0, 0.3, 1.1]], np.float32),
        # The last row is all padding, as a padded batch's empty sequence is.
        "mask": np.array([[True, True, False], [True, True, True], [False, False, False]]),
    }
    return model, _qkv_init(jax.random.key(1)), examples


BUGS = (
    RealBug(
        name="flaxbert_mask_broadcast_on_batch",
        kind="masks and padding",
        source=Source(
            repo="huggingface/transformers",
            number=8790,
            title="[FlaxBert] Non-broadcastable attention mask in batched forward-pass",
            fixed_by=(
                "PR #8791 '[FlaxBert] Fix non-broadcastable attention mask for batched "
                "forward-passes' expands the mask on its own batch axis (merged)"
            ),
        ),
        what="Feeding several sentences to FlaxBertModel fails or mixes rows: the (batch, "
        "seq) mask is laid out as (1, 1, batch, seq), so the batch lines up with the queries.",
        bug=lambda: _flaxbert_model(broadcast_on_batch=True),
        fix=lambda: _flaxbert_model(broadcast_on_batch=False),
        caught_by=CaughtBy("batching", "-vs-direct"),
    ),
    RealBug(
        name="equinox_attention_neg_inf_mask",
        kind="masks and padding",
        source=Source(
            repo="patrick-kidger/equinox",
            number=274,
            url="https://github.com/patrick-kidger/equinox/pull/274",
            title="Changes attention so that (1) the scaling is applied to the query bef…",
            fixed_by=(
                "merged: masked scores take the dtype's smallest float instead of -inf, "
                "which the PR's MWE showed gives a NaN row when a whole row is masked"
            ),
        ),
        what="MultiheadAttention returns a row of NaN when every position of a row is "
        "masked, because the masked scores are -inf.",
        bug=lambda: _eqx_attention_model(smallest_float=False),
        fix=lambda: _eqx_attention_model(smallest_float=True),
        caught_by=CaughtBy("model", "non-finite"),
    ),
)
