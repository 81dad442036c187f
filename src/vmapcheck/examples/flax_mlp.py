"""A Flax NNX MLP plugged into vmapcheck (``conf/model/flax_mlp.yaml``).

Flax NNX modules are stateful Python objects; the harness needs pure functions of a params
pytree. The bridge is Flax's functional API:

- ``nnx.split(module)`` separates the module into a static ``GraphDef`` (its structure and
  settings) and a ``State`` (its arrays). The GraphDef is built once, here, from an
  abstract module (``nnx.eval_shape``: shapes only, no computation).
- Params are ``nnx.to_pure_dict(state)``: nested dicts of plain arrays, with the
  integer-keyed level of ``nnx.List`` turned into a Python list so leaf names read
  ``layers[0].kernel``, ``layers[0].bias``, ... (as the built-in mlp's ``layers[0].W``).
- ``forward_one`` / ``forward_batch`` rebuild a module from the GraphDef and the params
  (``nnx.replace_by_pure_dict`` on a fresh copy of the abstract State, then ``nnx.merge``)
  and call it. Nothing outside the call is mutated, so both are pure and work under
  ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

``nnx.Linear`` maps the last axis, so the same module applies to one vector
``(in_features,)`` and to a batch ``(batch, in_features)``: this example provides the
hand-batched ``direct`` path.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vmapcheck.core.models import Model


class MLP(nnx.Module):
    """relu(Linear) for each hidden width, then a linear output layer."""

    def __init__(self, widths: list[int], *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List(
            [
                nnx.Linear(fan_in, fan_out, param_dtype=jnp.float32, rngs=rngs)
                for fan_in, fan_out in pairwise(widths)
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        *inner, last = self.layers
        for layer in inner:
            x = jax.nn.relu(layer(x))
        return last(x)


def _lists_from_int_keys(tree: Any) -> Any:
    """``{0: a, 1: b}`` levels (how a pure dict spells an ``nnx.List``) -> ``[a, b]``."""
    if isinstance(tree, dict):
        if tree and all(isinstance(key, int) for key in tree):
            return [_lists_from_int_keys(tree[i]) for i in range(len(tree))]
        return {key: _lists_from_int_keys(value) for key, value in tree.items()}
    return tree


def _int_keys_from_lists(tree: Any) -> Any:
    """The inverse of :func:`_lists_from_int_keys`: the pure dict Flax expects."""
    if isinstance(tree, list | tuple):
        return {i: _int_keys_from_lists(value) for i, value in enumerate(tree)}
    if isinstance(tree, dict):
        return {key: _int_keys_from_lists(value) for key, value in tree.items()}
    return tree


def make_model(in_features: int, hidden: list[int], out_features: int) -> Model:
    """An NNX MLP ``in_features -> hidden... -> out_features`` as a vmapcheck Model.

    Params: ``{"layers": [{"kernel": (fan_in, fan_out), "bias": (fan_out,)}, ...]}``,
    float32 (Flax's default initializers: LeCun-normal kernels, zero biases).
    """
    widths = [in_features, *hidden, out_features]
    # Structure only: a module of ShapeDtypeStructs, never computed; its GraphDef is static.
    abstract = nnx.eval_shape(lambda: MLP(widths, rngs=nnx.Rngs(params=0)))
    graphdef, abstract_state = nnx.split(abstract)

    def init(key: jax.Array) -> Any:
        # nnx.Rngs derives one fresh key per parameter from `key` (fold-in of a counter).
        _, state = nnx.split(MLP(widths, rngs=nnx.Rngs(params=key)))
        return _lists_from_int_keys(nnx.to_pure_dict(state))

    def module(params: Any) -> MLP:
        # A fresh State each call (tree_map copies the Variables): replace_by_pure_dict
        # updates it in place, and the abstract template must stay untouched.
        state = jax.tree_util.tree_map(lambda leaf: leaf, abstract_state)
        nnx.replace_by_pure_dict(state, _int_keys_from_lists(params))
        return nnx.merge(graphdef, state)

    def forward_one(params: Any, x: jax.Array) -> jax.Array:
        """x: (in_features,) -> (out_features,)."""
        return module(params)(x)

    def forward_batch(params: Any, batch: jax.Array) -> jax.Array:
        """batch: (batch, in_features), batch axis 0 -> (batch, out_features)."""
        return module(params)(batch)

    return Model(
        name="flax_mlp",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        output_names=tuple(f"y{i}" for i in range(out_features)),
        description=(
            f"Flax NNX MLP {widths}: relu hidden layers, linear output (regression); "
            "direct path = the same nnx.Module applied to the whole batch"
        ),
    )
