"""The Flax NNX transformer encoder (vmapcheck.examples.flax_transformer) with one planted
batching mistake, as a user's model factory (``model.factory``), like
tests/helpers/cnn_faults.py for the CNN.

Each fault replaces one step of the hand-batched forward (a field of
:class:`~vmapcheck.examples.flax_transformer.BatchedSteps`); ``forward_one`` and the params
are the healthy model's, so the loop and vmap paths stay right and only the direct paths
go wrong. The batched form keeps the healthy layer names (``embed``, ``attn``, ``ln1``,
``ff``, ``ln2``, ``pool``, ``head``), so the diagnosis can name the layer where it first
diverges. Three of them are an axis that was right in code written for one vector and
became the batch axis once the code was batched by hand:

- ``softmax_over_batch``: the attention softmax taken over axis 0, the batch, instead of
  the keys (``axis=0`` was the keys for one query's score vector). A row's weights then
  depend on its batch-mates' scores, and a padded key gets weight too. First diverges at
  ``attn``; the outputs depend on batch composition.
- ``mask_wrong_axis``: the padding mask broadcast along the query axis, ``(batch, 1,
  queries, 1)``, instead of the key axis, ``(batch, 1, 1, keys)``: padded *queries* are
  masked (harmlessly: the pool leaves them out) and padded *keys* are not, so every real
  position attends to the padding. Row-local (no batch composition effect), shows on any
  sequence with padding; first diverges at ``attn``.
- ``layernorm_over_batch``: both LayerNorms take their mean and variance over axis 0, the
  batch (each position and feature normalized across the batch, as a BatchNorm), instead
  of over each position's features. First diverges at ``ln1``; the outputs depend on
  batch composition (a batch of one normalizes everything to the bias).
- ``ids_as_float``: the ids go through float. The hand-batched path treats the id leaf
  like the pixel leaves it scales, ``u = ids / vocab`` in [0, 1), and the embedding turns
  it back into rows with ``round(u * (vocab - 1))``: scaled by the largest id instead of
  the number of ids, the ``vocab`` / ``vocab - 1`` off-by-one that a float round trip
  hides (on int ids, used as indices directly, there is no scale to get wrong). Id ``i``
  lands on row ``round(i - i / vocab)``: ``i`` for ``i < vocab / 2``, ``i - 1`` above,
  so with the digit tokens' vocab of 17, ids 0..8 are right and 9..16 (the darker ink)
  take the row below. The plain casts that lose ids do not show here: float32 holds every
  whole number up to 2**24 exactly, and bfloat16 up to 256, far above 16, so a cast to
  float and back would be a no-op for this vocabulary. Row-local; first diverges at
  ``embed``.

A run configured with :func:`factory_overrides` (on top of ``model=flax_transformer
data=digit_tokens``) goes through the real stages with the fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import jax
import jax.numpy as jnp
from flax import nnx

from vmapcheck.core.models import Model, recorded
from vmapcheck.examples.flax_transformer import (
    HEALTHY,
    MASKED,
    OUTPUT_LAYER,
    BatchedSteps,
    Embeddings,
    batched_forward,
    embed_batch,
    module_loader,
)
from vmapcheck.examples.flax_transformer import make_model as make_transformer

FAULTS = ("none", "softmax_over_batch", "mask_wrong_axis", "layernorm_over_batch", "ids_as_float")


def softmax_over_batch(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """scores (batch, heads, queries, keys): padded keys masked, softmax over ... axis 0."""
    keys = mask[:, None, None, :]
    # The bug: axis 0 is the batch once the scores have a batch axis.
    return jax.nn.softmax(jnp.where(keys, scores, MASKED), axis=0)


def mask_wrong_axis(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """scores (batch, heads, queries, keys): the mask on the queries, softmax over keys."""
    # The bug: (batch, 1, queries, 1) masks the padded queries' rows, not the padded keys.
    queries = mask[:, None, :, None]
    return jax.nn.softmax(jnp.where(queries, scores, MASKED), axis=-1)


def layernorm_over_batch(norm: nnx.LayerNorm, h: jax.Array) -> jax.Array:
    """h (batch, T, d): LayerNorm with its statistics over axis 0 (the batch)."""
    # The bug: axis 0 was the features of one (d,) vector; here it is the batch.
    mean = jnp.mean(h, axis=0, keepdims=True)
    var = jnp.var(h, axis=0, keepdims=True)
    scale = norm.scale[...][None, None, :]
    bias = norm.bias[...][None, None, :]
    return (h - mean) * jax.lax.rsqrt(var + norm.epsilon) * scale + bias


def ids_as_float(embed: Embeddings, tokens: jax.Array) -> jax.Array:
    """tokens (batch, T) int32 -> (batch, T, d), the ids round-tripped through float."""
    vocab = embed.tokens.num_embeddings
    # The bug: ids scaled to [0, 1) by the vocab size, like pixels ...
    unit = tokens.astype(jnp.float32) / vocab
    # ... and back to rows by the largest id, vocab - 1: ids >= vocab / 2 land one row low.
    rows = jnp.round(unit * (vocab - 1)).astype(jnp.int32)
    return embed_batch(embed, rows)


PLANTED = {
    "none": HEALTHY,
    "softmax_over_batch": replace(HEALTHY, attention_weights=softmax_over_batch),
    "mask_wrong_axis": replace(HEALTHY, attention_weights=mask_wrong_axis),
    "layernorm_over_batch": replace(HEALTHY, layer_norm=layernorm_over_batch),
    "ids_as_float": replace(HEALTHY, embed=ids_as_float),
}


def steps(fault: str) -> BatchedSteps:
    """The batched form's steps with ``fault`` planted (one of :data:`FAULTS`)."""
    if fault not in PLANTED:
        raise ValueError(f"unknown fault {fault!r}; planted faults: {', '.join(FAULTS)}")
    return PLANTED[fault]


def make_model(
    fault: str,
    vocab: int,
    seq_len: int,
    d_model: int,
    heads: int,
    ff: int,
    out_features: int,
    output_names: Sequence[str] | None = None,
) -> Model:
    """The example transformer (same params, same ``forward_one``) with ``fault`` planted
    in its hand-batched forward (one of :data:`FAULTS`; "none" is healthy)."""
    planted = steps(fault)
    names = list(output_names or []) or None
    model = make_transformer(vocab, seq_len, d_model, heads, ff, out_features, names)
    if fault == "none":
        return model
    module, _ = module_loader(vocab, seq_len, d_model, heads, ff, out_features)
    forward_batch = batched_forward(module, planted)
    return replace(
        model,
        forward_batch=forward_batch,
        activations_batch=recorded(forward_batch, OUTPUT_LAYER),
    )


def factory_overrides(fault: str) -> tuple[str, ...]:
    """Hydra overrides (on top of ``model=flax_transformer data=digit_tokens``) that make
    the run's model :func:`make_model` with ``fault``, named after it, as ``dvc exp run
    -S`` would set them."""
    return (
        f"model.name=planted_transformer_{fault}",
        "model.factory._target_=tests.helpers.transformer_faults.make_model",
        f"+model.factory.fault={fault}",
    )
