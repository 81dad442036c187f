"""A planted slowdown: the built-in MLP whose hand-batched path does extra work.

Used to validate the benchmark's regression verdict (docs/benchmark.md): the
``direct`` paths run the network on the batch plus a copy of its first
``ceil(extra_work * batch)`` rows and drop those extra outputs, so they do about
``1 + extra_work`` times the arithmetic (XLA's ``cost_analysis`` shows it: the flops of
``direct_jit`` grow by that factor) while every output is unchanged. ``loop`` and
``vmap`` use the untouched ``forward_one``: a verdict that flags them is a false alarm.

Params, init and leaf names are the built-in MLP's, so a run of ``model=mlp_slow`` trains
the very same params as ``model=mlp``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from vmapcheck.core.models import (
    Model,
    Params,
    mlp_forward_batch,
    mlp_forward_one,
    mlp_init,
    mlp_output_layer,
    recorded,
)
from vmapcheck.errors import ConfigError


def make_model(
    in_features: int, hidden: list[int], out_features: int, extra_work: float = 0.25
) -> Model:
    """The MLP ``[in_features, *hidden, out_features]`` with a slower ``direct`` path.

    Args:
        extra_work: share of extra rows the hand-batched forward computes (0 < x <= 1).
    """
    if not 0.0 < extra_work <= 1.0:
        raise ConfigError(f"model.factory.extra_work: expected 0 < x <= 1, found {extra_work}")
    widths = [in_features, *hidden, out_features]

    def padded(batch: jax.Array) -> jax.Array:
        extra = math.ceil(extra_work * batch.shape[0])
        return jnp.concatenate([batch, batch[:extra]], axis=0)

    def forward_batch(params: Params, batch: jax.Array) -> jax.Array:
        """(n, in_features) -> (n, out_features), batch axis 0, on n + ceil(x * n) rows."""
        return mlp_forward_batch(params, padded(batch))[: batch.shape[0]]

    output = mlp_output_layer(widths)

    def activations_batch(params: Params, batch: jax.Array):
        """The built-in MLP's activations on the padded batch, the extra rows dropped."""
        acts = recorded(mlp_forward_batch, output)(params, padded(batch))
        return [(name, value[: batch.shape[0]]) for name, value in acts]

    return Model(
        name="mlp_slow",
        in_features=in_features,
        out_features=out_features,
        forward_one=mlp_forward_one,
        forward_batch=forward_batch,
        init=lambda key: mlp_init(key, widths),
        activations_one=recorded(mlp_forward_one, output),
        activations_batch=activations_batch,
        description=(
            f"MLP {widths} with a planted slowdown: its direct path computes "
            f"{extra_work:.0%} extra rows (for validating the benchmark verdict)"
        ),
    )
