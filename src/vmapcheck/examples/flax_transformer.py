"""A Flax NNX transformer encoder on padded token sequences, plugged into vmapcheck
(``conf/model/flax_transformer.yaml``, for the digits as token sequences:
``data=digit_tokens``).

The input contract is two leaves (:class:`vmapcheck.core.contract.InputSpec`), taking the
table's ``in_features = 2 * seq_len`` feature columns in this order:

- ``tokens``: ``(seq_len,)`` int32, ids in ``[0, vocab)``;
- ``mask``: ``(seq_len,)`` bool, True at a real position, False at padding.

``forward_one(params, {"tokens": (T,), "mask": (T,)})`` -> ``(out_features,)``;
``forward_batch(params, {"tokens": (batch, T), "mask": (batch, T)})`` (batch axis 0 on
every leaf) -> ``(batch, out_features)``. The network (``d`` = ``d_model``, ``H`` =
``heads``, each head ``d / H`` wide)::

    embed: token embedding (vocab, d) + learned position embedding (T, d)   -> (T, d)
    attn:  multi-head self-attention, q/k/v/out projections (d -> d); scores
           q.k / sqrt(d / H), padded keys set to MASKED (a large finite negative),
           softmax over the keys, weighted sum of the values               -> (T, d)
    ln1:   LayerNorm(embed + attn)                                          -> (T, d)
    ff:    Linear(d -> ff) -> relu -> Linear(ff -> d)                       -> (T, d)
    ln2:   LayerNorm(ln1 + ff)                                              -> (T, d)
    pool:  mean of ln2 over the real positions (sum / max(count, 1))        -> (d,)
    head:  Linear(d -> out_features)                                        -> (out_features,)

Safe at both ends: on an all-padding sequence every key is masked with a finite value,
so the softmax is uniform (no 0 / 0), and the pool divides by ``max(count, 1)`` (the
mean of nothing is 0, the output the head's bias); a sequence without padding masks
nothing. A padded position's id reaches no real position (its key is masked, and the
pool leaves it out), so it cannot change the output.

Two implementations, one of the same params: :meth:`Encoder.one` is written for one
sequence (``einsum("qhd,khd->hqk")``) and :meth:`Encoder.batched` for a batch, with the
batch axis explicit in every step (``einsum("bqhd,bkhd->bhqk")``, the mask broadcast
``(batch, 1, 1, keys)``, the pool's count ``(batch, 1)``). ``forward_batch`` is the
latter, never ``vmap`` of the former: it is the hand-batched ``direct`` path that the
check compares with the loop and vmap of ``forward_one``. The steps of it that a batching
mistake typically lives in (the embedding lookup, the masked softmax, the LayerNorm) are
the fields of :class:`BatchedSteps`, so that tests/helpers/transformer_faults.py can plant
one in the batched form alone.

The bridge to pure functions is the one of :mod:`vmapcheck.examples.flax_mlp`: a static
``GraphDef`` built once from an abstract module, params ``nnx.to_pure_dict(state)``, and a
module rebuilt from them on every call. Params::

    embed: {tokens: {embedding: (vocab, d)}, positions: {embedding: (T, d)}}
    attn:  {query, key, value, out: {kernel: (d, d), bias: (d,)}}
    ln1:   {scale: (d,), bias: (d,)}
    ff:    {hidden: {kernel: (d, ff), bias: (ff,)}, out: {kernel: (ff, d), bias: (d,)}}
    ln2:   {scale: (d,), bias: (d,)}
    head:  {kernel: (d, out_features), bias: (out_features,)}

Each layer's output is tapped under the name of its params subtree (:data:`LAYERS`:
``embed``, ``attn``, ``ln1``, ``ff``, ``ln2``, then ``pool``, which has none, and the
output ``head``), so the diagnosis can walk the layers and name the leaves that feed the
first one that diverges. Activations keep their sequence shape: ``(T, d)`` for one
example (``(d,)`` for ``pool``), with a leading batch axis for a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model, Params, Tap, no_tap, recorded

# The names of the two input leaves.
TOKENS = "tokens"
MASK = "mask"
# The layers whose output is tapped, in computation order; the last is the output.
LAYERS = ("embed", "attn", "ln1", "ff", "ln2", "pool", "head")
OUTPUT_LAYER = LAYERS[-1]
# The score a padded key gets before the softmax: large and negative, so it gets no
# weight next to any real key, but finite, so that a row of nothing but padded keys
# comes out uniform instead of NaN (a -inf row would be 0 / 0). Representable in
# bfloat16, float32 and float64 alike.
MASKED = -1e9


class Embeddings(nnx.Module):
    """Token embedding plus learned position embedding: ids ``(..., T)`` -> ``(..., T, d)``."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, *, rngs: nnx.Rngs) -> None:
        self.tokens = nnx.Embed(vocab, d_model, param_dtype=jnp.float32, rngs=rngs)
        self.positions = nnx.Embed(seq_len, d_model, param_dtype=jnp.float32, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Each id's row plus its position's, in the dtype of the params it holds.

        Not ``nnx.Embed.__call__``: that casts to the dtype the module was built with
        (float32), which would drop the float64 oracle's tables back to float32."""
        rows = jnp.take(self.tokens.embedding[...], tokens, axis=0)  # (..., T, d)
        positions = self.positions.embedding[...][: tokens.shape[-1]]  # (T, d)
        return rows + jnp.broadcast_to(positions, rows.shape)


class SelfAttention(nnx.Module):
    """The four projections of multi-head self-attention; the attention itself is written
    out in :meth:`Encoder.one` and :meth:`Encoder.batched`."""

    def __init__(self, d_model: int, heads: int, *, rngs: nnx.Rngs) -> None:
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not a multiple of heads={heads}")
        self.heads = heads

        def projection() -> nnx.Linear:
            return nnx.Linear(d_model, d_model, param_dtype=jnp.float32, rngs=rngs)

        self.query = projection()
        self.key = projection()
        self.value = projection()
        self.out = projection()


class FeedForward(nnx.Module):
    """Linear(d -> ff) -> relu -> Linear(ff -> d) on the last axis."""

    def __init__(self, d_model: int, ff: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(d_model, ff, param_dtype=jnp.float32, rngs=rngs)
        self.out = nnx.Linear(ff, d_model, param_dtype=jnp.float32, rngs=rngs)

    def __call__(self, h: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(h)))


# --- the steps of the batched form (a planted fault replaces one) -------------------------


def embed_batch(embed: Embeddings, tokens: jax.Array) -> jax.Array:
    """tokens ``(batch, T)`` int32 -> ``(batch, T, d)``: each id's row plus its position's."""
    return embed(tokens)  # positions (T, d) broadcast over the batch axis


def attention_weights_batch(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """scores ``(batch, heads, queries, keys)``, mask ``(batch, keys)`` -> the weights of
    each query over the keys: padded keys set to :data:`MASKED`, softmax over the keys."""
    keys = mask[:, None, None, :]  # (batch, 1, 1, keys): every head and query alike
    return jax.nn.softmax(jnp.where(keys, scores, MASKED), axis=-1)


def layer_norm(norm: nnx.LayerNorm, h: jax.Array) -> jax.Array:
    """``norm``'s LayerNorm on ``(..., d)``: statistics over each position's ``d`` features
    (the last axis), then its scale and bias, in the dtype of ``h`` and the params.

    Written out rather than ``nnx.LayerNorm.__call__``: that promotes to at least float32
    with ``jnp.promote_types``, which strict dtype promotion refuses for the float64
    oracle (float64 against float32)."""
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
    if norm.scale is None or norm.bias is None:  # nnx.LayerNorm(use_scale/use_bias=False)
        raise ValueError("this layer norm takes a scale and a bias; the block builds both")
    scale = jnp.broadcast_to(norm.scale[...], h.shape)
    bias = jnp.broadcast_to(norm.bias[...], h.shape)
    eps = jnp.asarray(norm.epsilon, h.dtype)
    normalized = (h - jnp.broadcast_to(mean, h.shape)) * jax.lax.rsqrt(
        jnp.broadcast_to(var, h.shape) + eps
    )
    return normalized * scale + bias


def layer_norm_batch(norm: nnx.LayerNorm, h: jax.Array) -> jax.Array:
    """``norm`` on ``(batch, T, d)``: statistics over each position's ``d`` features."""
    return layer_norm(norm, h)


@dataclass(frozen=True)
class BatchedSteps:
    """The steps of :meth:`Encoder.batched` that a batching mistake typically lives in.

    ``embed(embed, tokens (batch, T)) -> (batch, T, d)``; ``attention_weights(scores
    (batch, heads, T, T), mask (batch, T)) -> (batch, heads, T, T)``; ``layer_norm(norm,
    h (batch, T, d)) -> (batch, T, d)`` (both LayerNorms). The defaults are the healthy
    ones; tests/helpers/transformer_faults.py replaces one to plant a fault.
    """

    embed: Callable[[Embeddings, jax.Array], jax.Array] = embed_batch
    attention_weights: Callable[[jax.Array, jax.Array], jax.Array] = attention_weights_batch
    layer_norm: Callable[[nnx.LayerNorm, jax.Array], jax.Array] = layer_norm_batch


HEALTHY = BatchedSteps()


class Encoder(nnx.Module):
    """Embeddings, one post-LayerNorm encoder block, masked mean-pool, linear head."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        d_model: int,
        heads: int,
        ff: int,
        out_features: int,
        *,
        rngs: nnx.Rngs,
    ) -> None:
        f32 = jnp.float32
        self.embed = Embeddings(vocab, seq_len, d_model, rngs=rngs)
        self.attn = SelfAttention(d_model, heads, rngs=rngs)
        self.ln1 = nnx.LayerNorm(d_model, param_dtype=f32, rngs=rngs)
        self.ff = FeedForward(d_model, ff, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, param_dtype=f32, rngs=rngs)
        self.head = nnx.Linear(d_model, out_features, param_dtype=f32, rngs=rngs)

    def one(self, tokens: jax.Array, mask: jax.Array, tap: Tap = no_tap) -> jax.Array:
        """One sequence: tokens ``(T,)`` int32, mask ``(T,)`` bool -> ``(out_features,)``."""
        (length,) = tokens.shape
        heads = self.attn.heads
        h = tap("embed", self.embed(tokens))
        width = h.shape[-1] // heads

        def split(x: jax.Array) -> jax.Array:  # (T, d) -> (T, heads, d / heads)
            return jnp.reshape(x, (length, heads, width))

        q, k, v = (split(p(h)) for p in (self.attn.query, self.attn.key, self.attn.value))
        scores = jnp.einsum("qhd,khd->hqk", q, k) * (1.0 / math.sqrt(width))
        masked = jnp.where(mask[None, None, :], scores, MASKED)  # padded keys, every query
        weights = jax.nn.softmax(masked, axis=-1)  # over the keys
        context = jnp.einsum("hqk,khd->qhd", weights, v)
        attended = tap("attn", self.attn.out(jnp.reshape(context, (length, heads * width))))
        h = tap("ln1", layer_norm(self.ln1, h + attended))
        h = tap("ln2", layer_norm(self.ln2, h + tap("ff", self.ff(h))))
        real = mask.astype(h.dtype)  # (T,)
        total = jnp.sum(h * real[:, None], axis=0)  # (d,)
        pooled = tap("pool", total / jnp.maximum(jnp.sum(real), 1.0))
        return self.head(pooled)

    def batched(
        self,
        tokens: jax.Array,
        mask: jax.Array,
        tap: Tap = no_tap,
        steps: BatchedSteps = HEALTHY,
    ) -> jax.Array:
        """A batch: tokens ``(batch, T)`` int32, mask ``(batch, T)`` bool, batch axis 0 ->
        ``(batch, out_features)``; ``steps``: the healthy ones unless a test plants a
        fault."""
        batch, length = tokens.shape
        heads = self.attn.heads
        h = tap("embed", steps.embed(self.embed, tokens))  # (batch, T, d)
        width = h.shape[-1] // heads

        def split(x: jax.Array) -> jax.Array:  # (batch, T, d) -> (batch, T, heads, d / heads)
            return jnp.reshape(x, (batch, length, heads, width))

        q, k, v = (split(p(h)) for p in (self.attn.query, self.attn.key, self.attn.value))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(width))
        weights = steps.attention_weights(scores, mask)  # (batch, heads, T, T)
        context = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        flat = jnp.reshape(context, (batch, length, heads * width))
        attended = tap("attn", self.attn.out(flat))
        h = tap("ln1", steps.layer_norm(self.ln1, h + attended))
        h = tap("ln2", steps.layer_norm(self.ln2, h + tap("ff", self.ff(h))))
        real = mask.astype(h.dtype)  # (batch, T)
        total = jnp.sum(h * real[:, :, None], axis=1)  # (batch, d)
        count = jnp.maximum(jnp.sum(real, axis=1), 1.0)  # (batch,)
        pooled = tap("pool", total / count[:, None])
        return self.head(pooled)  # (batch, out_features)


def input_spec(vocab: int, seq_len: int) -> InputSpec:
    """The contract: ``tokens`` ``(seq_len,)`` int32 ids in ``[0, vocab)``, then ``mask``
    ``(seq_len,)`` bool."""
    return InputSpec(
        (
            Leaf(
                TOKENS,
                (seq_len,),
                "int32",
                vocab=vocab,
                meaning=f"the sequence's token ids 0..{vocab - 1}; 0 at padded positions",
            ),
            Leaf(
                MASK,
                (seq_len,),
                "bool",
                meaning="True at a real position, False at padding (ignored by the model)",
            ),
        )
    )


def module_loader(
    vocab: int, seq_len: int, d_model: int, heads: int, ff: int, out_features: int
) -> tuple[Callable[[Params], Encoder], Callable[[jax.Array], Params]]:
    """``(module, init)``: ``module(params)`` is a fresh :class:`Encoder` holding ``params``;
    ``init(key)`` the params (Flax's default initializers, every key derived from ``key``).

    Shared by :func:`make_model` and the tests that plant faults in a forward.
    """

    def build(rngs: nnx.Rngs) -> Encoder:
        return Encoder(vocab, seq_len, d_model, heads, ff, out_features, rngs=rngs)

    abstract = nnx.eval_shape(lambda: build(nnx.Rngs(params=0)))
    graphdef, abstract_state = nnx.split(abstract)

    def module(params: Params) -> Encoder:
        # A fresh State each call (tree_map copies the Variables): replace_by_pure_dict
        # updates it in place, and the abstract template must stay untouched.
        state = jax.tree_util.tree_map(lambda leaf: leaf, abstract_state)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(graphdef, state)

    def init(key: jax.Array) -> Params:
        # nnx.Rngs derives one fresh key per parameter from `key` (a counter).
        _, state = nnx.split(build(nnx.Rngs(params=key)))
        return nnx.to_pure_dict(state)

    return module, init


def batched_forward(
    module: Callable[[Params], Encoder], steps: BatchedSteps = HEALTHY
) -> Callable[..., jax.Array]:
    """``forward_batch(params, {"tokens": (batch, T), "mask": (batch, T)}, tap)`` ->
    ``(batch, out_features)`` with ``steps`` (a planted fault's, or the healthy ones)."""

    def forward_batch(params: Params, batch: dict[str, jax.Array], tap: Tap = no_tap):
        return module(params).batched(batch[TOKENS], batch[MASK], tap, steps)

    return forward_batch


def make_model(
    vocab: int,
    seq_len: int,
    d_model: int,
    heads: int,
    ff: int,
    out_features: int,
    output_names: list[str] | None = None,
) -> Model:
    """The NNX transformer encoder as a vmapcheck Model, its input contract ``{"tokens":
    (seq_len,) int32 in [0, vocab), "mask": (seq_len,) bool}`` (``in_features = 2 *
    seq_len`` table columns: ids, then mask bits).

    ``d_model``: the width of embeddings and attention (a multiple of ``heads``);
    ``heads``: attention heads; ``ff``: the feed-forward hidden width; ``output_names``:
    one per output (default ``y0``, ``y1``, ...). Params: see the module docstring, all
    float32.
    """
    module, init = module_loader(vocab, seq_len, d_model, heads, ff, out_features)
    names = tuple(output_names) if output_names else tuple(f"y{i}" for i in range(out_features))
    if len(names) != out_features:
        raise ValueError(f"{len(names)} output_names for out_features={out_features}")

    def forward_one(params: Params, example: dict[str, jax.Array], tap: Tap = no_tap):
        """example: {"tokens": (T,) int32, "mask": (T,) bool} -> (out_features,)."""
        return module(params).one(example[TOKENS], example[MASK], tap)

    forward_batch = batched_forward(module)
    return Model(
        name="flax_transformer",
        in_features=2 * seq_len,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        output_names=names,
        description=(
            f"Flax NNX transformer encoder on {seq_len} token ids (vocab {vocab}) with a "
            f"padding mask: embeddings + positions -> one block (self-attention, {heads} "
            f"heads of {d_model // heads}, keys masked -> residual + LayerNorm -> relu MLP "
            f"{d_model}->{ff}->{d_model} -> residual + LayerNorm) -> mean over real "
            f"positions -> linear, {out_features} outputs (scores fitted by MSE); direct "
            "path = the attention written with an explicit batch axis"
        ),
        activations_one=recorded(forward_one, OUTPUT_LAYER),
        activations_batch=recorded(forward_batch, OUTPUT_LAYER),
        inputs=input_spec(vocab, seq_len),
    )
