"""A model whose example is a dict of two leaves, in plain JAX: docs/own-model.md's worked
example of a pytree input (``conf/model/two_tower.yaml``, on ``data=diabetes``).

One example is ``{"body": (n_body,) float, "serum": (n_serum,) float}``: a patient's body
measurements (bmi, blood pressure) and six blood serum measurements, taken from the
table's feature columns in that order. Each leaf goes through its own tower (a dense relu
layer), the two towers' outputs are concatenated and a linear head gives the
``out_features`` outputs::

    body  (n_body,)  -> body_tower  (relu, hidden) \\
                                                    concat (2*hidden,) -> head (out_features,)
    serum (n_serum,) -> serum_tower (relu, hidden) /

``forward_batch`` is the same network written for a batch: every leaf with a leading
batch axis 0, ``{"body": (batch, n_body), "serum": (batch, n_serum)}`` -> ``(batch,
out_features)``. Each layer's output is tapped under the name of its params subtree, so
the diagnosis names the layer (and its leaves) that diverges first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model, Params, Tap, no_tap, recorded

TOWERS = ("body_tower", "serum_tower")
HEAD = "head"


def init(key: jax.Array, n_body: int, n_serum: int, hidden: int, out_features: int) -> Params:
    """He-normal weights, zero biases; one subkey per layer, each used once."""
    body_key, serum_key, head_key = jax.random.split(key, 3)

    def dense(k: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
        scale = jnp.sqrt(2.0 / fan_in).astype(jnp.float32)
        weight = jax.random.normal(k, (fan_in, fan_out), dtype=jnp.float32) * scale
        return {"W": weight, "b": jnp.zeros((fan_out,), dtype=jnp.float32)}

    return {
        "body_tower": dense(body_key, n_body, hidden),
        "serum_tower": dense(serum_key, n_serum, hidden),
        "head": dense(head_key, 2 * hidden, out_features),
    }


def forward_one(params: Params, example: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
    """One patient: ``{"body": (n_body,), "serum": (n_serum,)}`` -> ``(out_features,)``."""
    towers = [
        tap(name, jax.nn.relu(example[leaf] @ params[name]["W"] + params[name]["b"]))
        for name, leaf in zip(TOWERS, ("body", "serum"), strict=True)
    ]
    both = jnp.concatenate(towers)
    return both @ params[HEAD]["W"] + params[HEAD]["b"]


def forward_batch(params: Params, batch: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
    """A batch, batch axis 0 on every leaf: ``{"body": (n, n_body), "serum": (n,
    n_serum)}`` -> ``(n, out_features)``."""
    towers = [
        tap(name, jax.nn.relu(batch[leaf] @ params[name]["W"] + params[name]["b"][None, :]))
        for name, leaf in zip(TOWERS, ("body", "serum"), strict=True)
    ]
    both = jnp.concatenate(towers, axis=1)
    return both @ params[HEAD]["W"] + params[HEAD]["b"][None, :]


def make_model(
    n_body: int, n_serum: int, hidden: int, out_features: int, output_names: list[str] | None = None
) -> Model:
    """The two-tower model; ``in_features`` is the table columns both leaves take."""
    return Model(
        name="two_tower",
        in_features=n_body + n_serum,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=lambda key: init(key, n_body, n_serum, hidden, out_features),
        output_names=tuple(output_names or ()),
        description=f"two towers (body {n_body}, serum {n_serum} -> {hidden} relu each), "
        f"concatenated, linear head -> {out_features}",
        activations_one=recorded(forward_one, HEAD),
        activations_batch=recorded(forward_batch, HEAD),
        inputs=InputSpec(
            (
                Leaf("body", (n_body,), "float", meaning="bmi and blood pressure"),
                Leaf("serum", (n_serum,), "float", meaning="six blood serum measurements"),
            )
        ),
    )
