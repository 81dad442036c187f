"""A forward that samples: an MLP with Monte Carlo dropout, one PRNG key per example.

MC dropout keeps dropout on at inference: each forward draws a fresh mask over the
hidden units, and the spread of the outputs over many draws estimates the model's
uncertainty. Under vmap the draws must differ row by row: the classic bug shares one key
by every row of a batch, so every example gets the same mask (and duplicated inputs the
same "random" output). Here ``forward_one(params, x, key)`` takes its example's key and
``forward_batch(params, X, keys)`` one key per row (``keys`` ``(batch,)``), row ``i``
drawing its mask from ``keys[i]`` exactly as the loop does: the model is
``Model(stochastic=True)`` (docs/own-model.md, "A forward that samples").

``shared_key=True`` plants the bug for the tests: ``forward_batch`` draws every row's mask
from ``keys[0]``. The loop and vmap still give row ``i`` its own key, so the paths
disagree, and duplicated rows come out equal on the direct paths.

The mask is drawn as ``jax.random.bernoulli(key, keep, shape)`` with ``keep`` a float32
array: the draw takes 32 bits whatever ``jax_enable_x64`` says, so the float64 oracle
draws the same masks from the same keys and judges the model (a draw whose dtype follows
the default float would take 64 bits there: not judged).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vmapcheck.core.models import Model, Params, Tap, mlp_init, mlp_output_layer, no_tap, recorded
from vmapcheck.errors import ConfigError


def _mask(key: jax.Array, keep: jax.Array, units: int, dtype: jnp.dtype) -> jax.Array:
    """A keep-mask (units,) of 0 and 1/keep (inverted dropout) in ``dtype`` (the
    activations' dtype: float32, bfloat16, or float64 in the oracle)."""
    kept = jax.random.bernoulli(key, keep, (units,))
    return kept.astype(dtype) / keep.astype(dtype)


def make_model(
    in_features: int,
    hidden: list[int],
    out_features: int,
    rate: float = 0.1,
    shared_key: bool = False,
) -> Model:
    """The MLP ``[in_features, *hidden, out_features]`` with dropout of ``rate`` after
    every hidden layer, on at inference (MC dropout).

    Args:
        rate: share of hidden units dropped per draw (0 <= rate < 1).
        shared_key: plant the shared-key bug in ``forward_batch`` (tests only).
    """
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"model.factory.rate: expected 0 <= rate < 1, found {rate}")
    if not hidden:
        raise ConfigError("model.factory.hidden: MC dropout needs at least one hidden layer")
    widths = [in_features, *hidden, out_features]
    keep = jnp.float32(1.0 - rate)

    def forward_one(params: Params, x: jax.Array, key: jax.Array, tap: Tap = no_tap) -> jax.Array:
        """x (in_features,), key a scalar typed key -> (out_features,); one mask per
        hidden layer, each from its own subkey of ``key``."""
        *inner, last = params["layers"]
        layer_keys = jax.random.split(key, len(inner))
        hidden_out = x
        for i, (layer, layer_key) in enumerate(zip(inner, layer_keys, strict=True)):
            units = layer["b"].shape[0]
            dense = jax.nn.relu(hidden_out @ layer["W"] + layer["b"])
            hidden_out = tap(f"layers[{i}]", dense * _mask(layer_key, keep, units, dense.dtype))
        return hidden_out @ last["W"] + last["b"]

    def forward_batch(
        params: Params, batch: jax.Array, keys: jax.Array, tap: Tap = no_tap
    ) -> jax.Array:
        """(n, in_features), keys (n,) -> (n, out_features), batch axis 0; row i's masks
        from keys[i] (split as forward_one splits its key)."""
        *inner, last = params["layers"]
        if shared_key:  # the planted bug: one key for the whole batch
            keys = jnp.broadcast_to(keys[0], keys.shape)
        layer_keys = jax.vmap(lambda k: jax.random.split(k, len(inner)))(keys)  # (n, layers)
        hidden_out = batch
        for i, layer in enumerate(inner):
            units, dtype = layer["b"].shape[0], hidden_out.dtype
            draw = lambda k, units=units, dtype=dtype: _mask(k, keep, units, dtype)  # noqa: E731
            masks = jax.vmap(draw)(layer_keys[:, i])
            dense = jax.nn.relu(hidden_out @ layer["W"] + layer["b"][None, :])
            hidden_out = tap(f"layers[{i}]", dense * masks)
        return hidden_out @ last["W"] + last["b"][None, :]

    output = mlp_output_layer(widths)
    return Model(
        name="mc_dropout" if not shared_key else "mc_dropout_shared_key",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=lambda key: mlp_init(key, widths),
        activations_one=recorded(forward_one, output),
        activations_batch=recorded(forward_batch, output),
        stochastic=True,
        description=(
            f"MLP {widths} with MC dropout (rate {rate}) at inference, one key per example"
            + (" [planted: forward_batch shares keys[0] by every row]" if shared_key else "")
        ),
    )
