"""The built-in MLP with one planted fault, as a user's model factory (``model.factory``).

A run configured with ``model.factory._target_=tests.helpers.faults.make_model`` and
``fault=<name>`` (see :func:`factory_overrides`) goes through the real stages with a
model that is wrong in one known place, so the check must fail and the diagnosis must
name that place. Every fault keeps the model dtype-generic (the check's float64 oracle
runs ``forward_one`` in float64) and explicit about broadcasting (strict JAX).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.config import ModelConfig
from vmapcheck.core.models import (
    Model,
    Params,
    Tap,
    build_model,
    mlp_forward_batch,
    mlp_forward_one,
    mlp_output_layer,
    no_tap,
    recorded,
)

LayerOp = Callable[[int, jax.Array, jax.Array, jax.Array], jax.Array]


def _relu_layer(i: int, h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jax.nn.relu(h @ w + b[None, :])


def _transposed(i: int, h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    # layers[1].W is square (32 x 32): W.T has the right shape and the wrong values.
    return jax.nn.relu(h @ (w.T if i == 1 else w) + b[None, :])


def _bias_as_column(i: int, h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    # The bias of layers[0] broadcast as a column: (rows, 32) + (32, 1). On one row it
    # silently makes a (32, 32) activation; on 8 rows it cannot broadcast at all.
    return jax.nn.relu(h @ w + (b[:, None] if i == 0 else b[None, :]))


def _bf16_layer(i: int, h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    if i != 1:
        return _relu_layer(i, h, w, b)
    low = (h.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(h.dtype)
    return jax.nn.relu(low + b[None, :])  # back to the input's dtype: the dtype looks right


def _batch_statistics(i: int, h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    # layers[1] centred with the batch's own mean (a BatchNorm in training mode without
    # its scale): each row's output depends on its batch-mates. forward_one has no batch,
    # so the loop and vmap paths compute the layer uncentred.
    if i != 1:
        return _relu_layer(i, h, w, b)
    pre = h @ w + b[None, :]
    return jax.nn.relu(pre - jnp.mean(pre, axis=0, keepdims=True))


def _hand_batched(layer_op: LayerOp):
    """The MLP's hand-batched forward with ``layer_op(i, hidden, W, b)`` for each hidden
    layer i (the correct one is relu(hidden @ W + b[None, :]))."""

    def forward_batch(params: Params, batch: jax.Array, tap: Tap = no_tap) -> jax.Array:
        hidden = batch
        *inner, last = params["layers"]
        for i, layer in enumerate(inner):
            hidden = tap(f"layers[{i}]", layer_op(i, hidden, layer["W"], layer["b"]))
        return hidden @ last["W"] + last["b"][None, :]

    return forward_batch


def _sqrt_at_layer_one(params: Params, x: jax.Array, tap: Tap = no_tap) -> jax.Array:
    """One row or a batch (broadcasting explicitly, the same code serves both)."""
    hidden = x
    *inner, last = params["layers"]
    for i, layer in enumerate(inner):
        pre = hidden @ layer["W"]
        pre = pre + jnp.broadcast_to(layer["b"], pre.shape)
        # The bug: sqrt where relu belongs; a negative pre-activation gives NaN.
        hidden = tap(f"layers[{i}]", jnp.sqrt(pre) if i == 1 else jax.nn.relu(pre))
    out = hidden @ last["W"]
    return out + jnp.broadcast_to(last["b"], out.shape)


def _reused_key_init(widths: list[int]) -> Callable[[jax.Array], Params]:
    def init(key: jax.Array) -> Params:
        layers = []
        for fan_in, fan_out in pairwise(widths):
            # The bug: the same derived key for every layer. Each fold_in makes a new
            # key object, so jax_debug_key_reuse sees nothing; the draws repeat.
            layer_key = jax.random.fold_in(key, 0)
            scale = jnp.sqrt(2.0 / fan_in).astype(jnp.float32)
            weight = jax.random.normal(layer_key, (fan_in, fan_out), dtype=jnp.float32)
            layers.append({"W": weight * scale, "b": jnp.zeros((fan_out,), jnp.float32)})
        return {"layers": layers}

    return init


def _standardized(
    mlp: Model, output: str, mean: Sequence[float], std: Sequence[float], twice: bool
) -> Model:
    """The MLP behind an input standardization with the statistics ``mean``, ``std``."""
    mean_, std_ = np.asarray(mean, np.float32), np.asarray(std, np.float32)

    def standardize(x: jax.Array) -> jax.Array:  # one row (n,) or a batch (rows, n)
        m = jnp.broadcast_to(jnp.asarray(mean_, x.dtype), x.shape)
        s = jnp.broadcast_to(jnp.asarray(std_, x.dtype), x.shape)
        return (x - m) / s

    def forward_one(params: Params, x: jax.Array, tap: Tap = no_tap) -> jax.Array:
        return mlp_forward_one(params, tap("standardize", standardize(x)), tap)

    def forward_batch(params: Params, batch: jax.Array, tap: Tap = no_tap) -> jax.Array:
        z = standardize(batch)
        if twice:  # the bug: the batched path standardizes what is already standardized
            z = standardize(z)
        return mlp_forward_batch(params, tap("standardize", z), tap)

    return replace(
        mlp,
        forward_one=forward_one,
        forward_batch=forward_batch,
        activations_one=recorded(forward_one, output),
        activations_batch=recorded(forward_batch, output),
        preprocessing=("standardize",),
    )


# The faults of the hand-batched forward: fault -> its hidden layers' operation.
HAND_BATCHED: dict[str, LayerOp] = {
    "transposed_weight": _transposed,
    "bias_as_column": _bias_as_column,
    "bf16_layer": _bf16_layer,
    "batch_statistics": _batch_statistics,
}
FAULTS = (
    "none",
    *HAND_BATCHED,
    "reused_key",
    "nan_at_layer",
    "standardized",  # healthy: the same standardization in every path
    "standardized_twice",
)


def make_model(
    fault: str,
    in_features: int,
    hidden: Sequence[int],
    out_features: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Model:
    """The built-in MLP ``[in_features, *hidden, out_features]`` with ``fault`` planted
    (one of :data:`FAULTS`; "none" and "standardized" are healthy). ``mean``, ``std``:
    the input statistics of the standardized faults."""
    config = ModelConfig(
        name="mlp", in_features=in_features, hidden=list(hidden), out_features=out_features
    )
    mlp = build_model(config)
    output = mlp_output_layer([in_features, *hidden, out_features])
    if fault == "none":
        return mlp
    if fault in HAND_BATCHED:
        forward_batch = _hand_batched(HAND_BATCHED[fault])
        return replace(
            mlp, forward_batch=forward_batch, activations_batch=recorded(forward_batch, output)
        )
    if fault == "reused_key":
        return replace(mlp, init=_reused_key_init([in_features, *hidden, out_features]))
    if fault == "nan_at_layer":
        return replace(
            mlp,
            forward_one=_sqrt_at_layer_one,
            forward_batch=_sqrt_at_layer_one,
            activations_one=recorded(_sqrt_at_layer_one, output),
            activations_batch=recorded(_sqrt_at_layer_one, output),
        )
    if fault in ("standardized", "standardized_twice"):
        if mean is None or std is None:
            raise ValueError(f"fault {fault!r} needs mean and std")
        return _standardized(mlp, output, mean, std, twice=fault == "standardized_twice")
    raise ValueError(f"unknown fault {fault!r}; planted faults: {', '.join(FAULTS)}")


def _floats(values: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


def factory_overrides(fault: str, **options: Sequence[float]) -> tuple[str, ...]:
    """Hydra overrides that make the run's model :func:`make_model` with ``fault``
    (``options``: its lists of floats, e.g. ``mean``), as ``dvc exp run -S`` would set
    them: a user's model, named after its fault, built by ``model.factory``."""
    return (
        f"model.name=planted_{fault}",
        "+model.factory._target_=tests.helpers.faults.make_model",
        f"+model.factory.fault={fault}",
        "+model.factory.in_features=${model.in_features}",
        "+model.factory.hidden=${model.hidden}",
        "+model.factory.out_features=${model.out_features}",
        *(f"+model.factory.{key}={_floats(values)}" for key, values in options.items()),
    )
