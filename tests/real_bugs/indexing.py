"""Scatter/gather batching rules: an indexed update and an indexed read that are right
for one example and wrong for a batch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.real_bugs import Case, CaughtBy, RealBug, Source
from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model

# --- jax#16655: x.at[i].apply(f) under vmap ---------------------------------------------

INDEX = 2  # the updated position


def _minus_one(a: jax.Array) -> jax.Array:
    return a - 1


def _scatter_init(key: jax.Array) -> dict[str, jax.Array]:
    """One dense layer 3 -> 4, float32."""
    return {"W": jax.random.normal(key, (3, 4), jnp.float32)}


def _scatter_model(batching_rule_bug: bool) -> Case:
    """h = x @ W, then h.at[INDEX].apply(a - 1): (3,) -> (4,).

    Before jax PR #16672 the scatter batching rule rebuilt scatter_apply's update as a
    plain scatter's, and vmap wrote the placeholder update (0) where the loop wrote
    h[INDEX] - 1 (the report: ``[1 2 3 0 5 6]`` for ``[1 2 3 3 5 6]``). The bug's
    hand-batched form writes what that rule wrote; the fix applies f per row.
    """

    def forward_one(params: Any, x: jax.Array) -> jax.Array:  # (3,) -> (4,)
        return (x @ params["W"]).at[INDEX].apply(_minus_one)

    def forward_batch(params: Any, x: jax.Array) -> jax.Array:  # (n, 3) -> (n, 4)
        h = x @ params["W"]
        if batching_rule_bug:
            return h.at[:, INDEX].set(0.0)
        return h.at[:, INDEX].apply(_minus_one)

    model = Model(
        name="at_apply",
        in_features=3,
        out_features=4,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_scatter_init,
        trainable=False,
    )
    examples = np.random.default_rng(5).normal(size=(4, 3)).astype(np.float32)
    return model, _scatter_init(jax.random.key(0)), examples


# --- jax-mps#60: take_along_axis with batched indices reads batch row 0 -------------------

CLASSES = 5


def _gather_init(key: jax.Array) -> dict[str, jax.Array]:
    """Logits of a 3 -> 5 classifier, float32."""
    return {"W": jax.random.normal(key, (3, CLASSES), jnp.float32)}


def _gather_model(row_zero_for_all: bool) -> Case:
    """The probability of each example's label: softmax(x @ W)[label], a categorical's
    likelihood as numpyro's CategoricalProbs computes it. Example: {x (3,), label (1,)}.
    """

    def forward_one(params: Any, example: dict[str, jax.Array]) -> jax.Array:  # -> (1,)
        probs = jax.nn.softmax(example["x"] @ params["W"])
        return probs[example["label"]]

    def forward_batch(params: Any, batch: dict[str, jax.Array]) -> jax.Array:  # (n, 1)
        probs = jax.nn.softmax(batch["x"] @ params["W"], axis=-1)  # (n, CLASSES)
        if row_zero_for_all:
            # What the MPS gather did: every row's index read from batch row 0's probs.
            return probs[0][batch["label"]]
        return jnp.take_along_axis(probs, batch["label"], axis=1)

    model = Model(
        name="categorical_probs",
        in_features=3 + 1,
        out_features=1,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=_gather_init,
        trainable=False,
        inputs=InputSpec(
            (
                Leaf("x", (3,), "float", meaning="features"),
                Leaf("label", (1,), "int32", vocab=CLASSES, meaning="the observed class"),
            )
        ),
    )
    examples = {
        "x": np.random.default_rng(6).normal(size=(3, 3)).astype(np.float32),
        "label": np.array([[2], [3], [3]], np.int32),  # the report's indices
    }
    return model, _gather_init(jax.random.key(1)), examples


BUGS = (
    RealBug(
        name="at_apply_scatter_batching_rule",
        kind="scatter/gather batching rules",
        source=Source(
            repo="jax-ml/jax",
            number=16655,
            title="Different result while using ``at[].apply`` inside jax.vmap",
            fixed_by=(
                "PR #16672 'Fix scatter batching rule for scatter_apply' (jakevdp): the "
                "rule re-uses the input's update_jaxpr instead of regenerating it"
            ),
        ),
        what="a.at[val].apply(lambda a: a - 1) gives the expected result alone and under "
        "jit, but a different one inside jax.vmap.",
        bug=lambda: _scatter_model(batching_rule_bug=True),
        fix=lambda: _scatter_model(batching_rule_bug=False),
        caught_by=CaughtBy("batching", "-vs-direct"),
        # scatter_apply has no JVP rule in JAX, so the model has no gradient: its
        # inference is what the thread is about (with gradients on, both sides would also
        # show the model finding "the loss cannot be differentiated").
        check_kwargs={"gradients": False},
    ),
    RealBug(
        name="take_along_axis_batch_row_zero",
        kind="scatter/gather batching rules",
        source=Source(
            repo="tillahoffmann/jax-mps",
            number=60,
            title="Batched gather (take_along_axis) produces incorrect results",
            fixed_by=(
                "open on the MPS plugin (CategoricalProbs tests xfailed there); the "
                "expected result is the CPU backend's per-row gather, modelled as the fix"
            ),
        ),
        what="jnp.take_along_axis with batched indices gathers with the wrong batch "
        "index: every row reads batch row 0.",
        bug=lambda: _gather_model(row_zero_for_all=True),
        fix=lambda: _gather_model(row_zero_for_all=False),
        caught_by=CaughtBy("batching", "-vs-direct"),
    ),
)
