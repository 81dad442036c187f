"""An Equinox MLP plugged into vmapcheck (``conf/model/equinox_mlp.yaml``).

An Equinox module is itself a pytree whose leaves are its arrays plus non-array fields
(activation functions, sizes). The harness wants params to be arrays only, so:

- ``params, static = eqx.partition(module, eqx.is_array)``: ``params`` keeps the weights
  and biases (``None`` elsewhere), ``static`` the rest. ``static`` is built once, in
  :func:`make_model`, from a fixed key; ``init(key)`` builds a module from ``key`` and
  returns its array part, which has exactly the same tree structure (checked).
- ``forward_one(params, x) = eqx.combine(params, static)(x)``: pure, so it works under
  ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

Leaf names read ``layers[0].weight`` (shape ``(fan_out, fan_in)``: Equinox stores
``W @ x``), ``layers[0].bias``, ...

Equinox layers are written for ONE vector ``(in_features,)``; batching is ``jax.vmap``'s
job. So this example provides no hand-batched ``forward_batch``: the harness reports the
``direct`` paths as not provided, and compares loop and vmap (eager and jit).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from vmapcheck.core.models import Model


class LayeredMLP(eqx.Module):
    """An MLP with hidden layers of different widths (``eqx.nn.MLP`` has one width)."""

    layers: tuple[eqx.nn.Linear, ...]

    def __init__(self, widths: list[int], *, key: jax.Array) -> None:
        keys = jax.random.split(key, len(widths) - 1)  # one subkey per layer, used once
        self.layers = tuple(
            eqx.nn.Linear(fan_in, fan_out, dtype=jnp.float32, key=layer_key)
            for layer_key, fan_in, fan_out in zip(keys, widths[:-1], widths[1:], strict=True)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        *inner, last = self.layers
        for layer in inner:
            x = jax.nn.relu(layer(x))
        return last(x)


def build_module(
    in_features: int, hidden: list[int], out_features: int, key: jax.Array
) -> eqx.Module:
    """``eqx.nn.MLP`` when every hidden layer has one width, else :class:`LayeredMLP`."""
    if len(set(hidden)) <= 1:
        return eqx.nn.MLP(
            in_size=in_features,
            out_size=out_features,
            width_size=hidden[0] if hidden else out_features,  # unused when depth is 0
            depth=len(hidden),
            activation=jax.nn.relu,
            final_activation=lambda x: x,
            # Explicit: Equinox would otherwise follow JAX's x64 mode (float64 params).
            dtype=jnp.float32,
            key=key,
        )
    return LayeredMLP([in_features, *hidden, out_features], key=key)


def make_model(in_features: int, hidden: list[int], out_features: int) -> Model:
    """An Equinox MLP ``in_features -> hidden... -> out_features`` as a vmapcheck Model.

    Params: the module's array leaves (``eqx.partition(module, eqx.is_array)[0]``),
    float32, Equinox's default (uniform fan-in) initialization.
    """
    widths = [in_features, *hidden, out_features]
    template, static = eqx.partition(
        build_module(in_features, hidden, out_features, jax.random.key(0)), eqx.is_array
    )
    structure = jax.tree_util.tree_structure(template)

    def init(key: jax.Array) -> Any:
        params, _ = eqx.partition(
            build_module(in_features, hidden, out_features, key), eqx.is_array
        )
        found = jax.tree_util.tree_structure(params)
        # jaxlib's PyTreeDef comes from a compiled module without a stub: mypy sees no
        # __ne__ on it (it has one, structural).
        if found != structure:  # type: ignore[operator]  # combine() would fail later
            raise ValueError(f"init built params of structure {found}, expected {structure}")
        return params

    def forward_one(params: Any, x: jax.Array) -> jax.Array:
        """x: (in_features,) -> (out_features,)."""
        return eqx.combine(params, static)(x)

    return Model(
        name="equinox_mlp",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=None,  # Equinox modules take one vector: no hand-batched forward
        init=init,
        output_names=tuple(f"y{i}" for i in range(out_features)),
        description=(
            f"Equinox MLP {widths}: relu hidden layers, linear output (regression); "
            "written for one vector, so batched by vmap only (no direct path)"
        ),
    )
