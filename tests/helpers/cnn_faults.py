"""The Flax NNX CNN (vmapcheck.examples.flax_cnn) with one planted fault, as a user's model
factory (``model.factory``), like tests/helpers/faults.py for the built-in MLP.

``batch_statistics``: the hand-batched forward runs both BatchNorms in training mode
(``use_running_average=False``): it normalizes with the mean and variance of its own
batch (over the images and their pixels) instead of the running statistics in the
params. Its input is the CNN's image leaf (``{"image": (batch, 8, 8, 1)}``), as the
healthy model's. ``forward_one`` is the healthy one, so the loop and vmap paths stay
right; the direct paths give a row an output that depends on its batch-mates. A run
configured with :func:`factory_overrides` goes through the real stages with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import jax

from vmapcheck.core.models import Model, Params, Tap, no_tap, recorded
from vmapcheck.examples.flax_cnn import IMAGE, OUTPUT_LAYER, module_loader
from vmapcheck.examples.flax_cnn import make_model as make_cnn

FAULTS = ("none", "batch_statistics")


def make_model(
    fault: str,
    in_features: int,
    out_features: int,
    channels: int,
    pixel_max: float = 16.0,
    output_names: Sequence[str] | None = None,
) -> Model:
    """The example CNN (same params, same ``forward_one``) with ``fault`` planted in its
    hand-batched forward (one of :data:`FAULTS`; "none" is healthy)."""
    cnn = make_cnn(in_features, out_features, channels, pixel_max, list(output_names or []) or None)
    if fault == "none":
        return cnn
    if fault != "batch_statistics":
        raise ValueError(f"unknown fault {fault!r}; planted faults: {', '.join(FAULTS)}")
    module, _ = module_loader(in_features, out_features, channels)

    def forward_batch(params: Params, batch: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
        """batch: {"image": (batch, side, side, 1)} -> (batch, out_features)."""
        # The bug: BatchNorm in training mode, normalizing with the batch's statistics.
        return module(params)(batch[IMAGE], tap, use_running_average=False)

    return replace(
        cnn, forward_batch=forward_batch, activations_batch=recorded(forward_batch, OUTPUT_LAYER)
    )


def factory_overrides(fault: str) -> tuple[str, ...]:
    """Hydra overrides (on top of ``model=flax_cnn``) that make the run's model
    :func:`make_model` with ``fault``, named after it, as ``dvc exp run -S`` would set
    them."""
    return (
        f"model.name=planted_cnn_{fault}",
        "model.factory._target_=tests.helpers.cnn_faults.make_model",
        f"+model.factory.fault={fault}",
    )
