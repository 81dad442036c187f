"""A dm-haiku ConvNet with ``hk.BatchNorm`` in inference mode, plugged into vmapcheck
(``conf/model/haiku_cnn.yaml``, for the digit images: ``data=digits``; needs ``pip install
-e '.[haiku]'``).

The input contract is the one of :mod:`vmapcheck.examples.flax_cnn` (both take it from
:mod:`vmapcheck.examples.images`): ``{"image": (side, side, 1) float}``, channels last,
taking the table's ``side * side`` pixel columns row-major. ``forward_one(params,
{"image": (side, side, 1)})`` -> ``(out_features,)``; ``forward_batch(params, {"image":
(batch, side, side, 1)})`` (batch axis 0) -> ``(batch, out_features)`` convolves the
whole batch at once (the ``direct`` path). The network::

    conv1 (3x3, 1 -> channels) -> bn1 -> relu -> conv2 (3x3) -> bn2 -> relu
    -> pool (mean over 2x2 blocks) -> flatten -> head (Linear -> out_features)

**Haiku's state, folded into the params and declared.** ``hk.transform_with_state`` gives
two pytrees: ``params`` (the weights: ``w``, ``b``, BatchNorm's ``scale`` and ``offset``)
and ``state`` (BatchNorm's moving averages: per EMA an ``average``, a ``hidden`` and an
int32 ``counter`` of updates). vmapcheck's params are one pytree shared by every row, so
the model's params are both, side by side::

    {"params": {"conv1": {"w", "b"}, "bn1": {"scale", "offset"}, ..., "head": {"w", "b"}},
     "state": {"bn1/~/mean_ema": {"average", "counter", "hidden"}, "bn1/~/var_ema": ...}}

and the model declares the whole ``state`` subtree non-trainable (``Model.state_leaves =
("state",)``, docs/state-leaves.md). One artifact then holds everything the forward
reads (the params file, its contract, the reference and the registry keep the state
too), while training differentiates and steps only ``params``: the int32 ``counter``
would crash ``jax.grad``, and the running statistics are not weights.

- **Inference mode.** The forward calls BatchNorm with ``is_training=False``: it
  normalizes with the moving averages, so a row's output depends on that row alone. The
  state Haiku's ``apply`` returns is discarded: in inference mode it is the state it was
  given.
- **Statistics set at init.** ``init`` runs one training-mode step on a batch of random
  calibration images drawn from the key (pixels uniform in ``[0, pixel_max]``), so the
  averages are that batch's per-channel statistics (Haiku's EMAs are zero-debiased) and
  the counters are non-zero: distinct per channel, and not the statistics of any batch
  the check runs.
- **Leaf names** are Haiku's module names under ``params.`` and ``state.``:
  ``params.conv1.w`` ``(3, 3, 1, channels)``, ``params.bn1.scale`` ``(1, 1, 1,
  channels)``, ``state.bn1/~/mean_ema.counter`` ``()`` int32, ...
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from vmapcheck.core.contract import InputSpec
from vmapcheck.core.models import Model, Params
from vmapcheck.examples.images import CALIBRATION_IMAGES, IMAGE, POOL, image_leaf, image_side

# Haiku's moving-average decay; with zero-debiasing one step gives the batch's statistics.
DECAY = 0.9
# The params subtrees: Haiku's params (trained) and Haiku's state (declared, kept).
WEIGHTS, STATE = "params", "state"


def network(channels: int, out_features: int) -> hk.TransformedWithState:
    """``hk.transform_with_state`` of the ConvNet: ``apply(params, state, None, images
    (batch, side, side, 1), is_training)`` -> ``((batch, out_features), state)``."""

    def forward(images: jax.Array, is_training: bool) -> jax.Array:
        def batch_norm(name: str) -> hk.BatchNorm:
            return hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=DECAY, name=name)

        h = hk.Conv2D(channels, (3, 3), padding="SAME", name="conv1")(images)
        h = jax.nn.relu(batch_norm("bn1")(h, is_training))
        h = hk.Conv2D(channels, (3, 3), padding="SAME", name="conv2")(h)
        h = jax.nn.relu(batch_norm("bn2")(h, is_training))
        n, height, width, depth = h.shape
        blocks = (n, height // POOL, POOL, width // POOL, POOL, depth)
        pooled = jnp.mean(jnp.reshape(h, blocks), axis=(2, 4))
        return hk.Linear(out_features, name="head")(jnp.reshape(pooled, (n, -1)))

    return hk.transform_with_state(forward)


def make_model(
    in_features: int = 64,
    out_features: int = 10,
    channels: int = 8,
    pixel_max: float = 16.0,
    output_names: list[str] | None = None,
) -> Model:
    """The Haiku ConvNet on ``in_features`` pixels (a square image) as a vmapcheck Model,
    its input contract ``{"image": (side, side, 1) float}``, its Haiku state declared
    (``state_leaves=("state",)``).

    ``channels``: of both convolutions; ``pixel_max``: the pixel range of the calibration
    images that set the moving averages; ``output_names``: one per output (default
    ``y0``, ``y1``, ...).
    """
    side = image_side(in_features)
    transformed = network(channels, out_features)
    names = tuple(output_names) if output_names else tuple(f"y{i}" for i in range(out_features))
    if len(names) != out_features:
        raise ValueError(f"{len(names)} output_names for out_features={out_features}")

    def init(key: jax.Array) -> Params:
        params_key, images_key = jax.random.split(key)
        images = jax.random.uniform(
            images_key, (CALIBRATION_IMAGES, side, side, 1), jnp.float32, 0.0, pixel_max
        )
        # Haiku's EMA update mixes Python floats with its int32 counter (decay ** counter):
        # standard promotion inside Haiku only, whatever the caller set.
        with jax.numpy_dtype_promotion("standard"):
            weights, state = transformed.init(params_key, images, is_training=True)
            _, state = transformed.apply(weights, state, None, images, is_training=True)
        return {WEIGHTS: weights, STATE: state}

    def forward_batch(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        """batch: {"image": (batch, side, side, 1)}, batch axis 0 -> (batch, out_features):
        BatchNorm in inference mode; the returned (unchanged) state is discarded."""
        out, _ = transformed.apply(
            params[WEIGHTS], params[STATE], None, batch[IMAGE], is_training=False
        )
        return out

    def forward_one(params: Params, example: dict[str, jax.Array]) -> jax.Array:
        """example: {"image": (side, side, 1)} -> (out_features,): Haiku's Conv2D takes a
        batch, so the one image is a batch of one."""
        return forward_batch(params, {IMAGE: example[IMAGE][None]})[0]

    return Model(
        name="haiku_cnn",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        output_names=names,
        description=(
            f"dm-haiku CNN on {side}x{side} images: 2 x (3x3 conv, {channels} channels -> "
            f"hk.BatchNorm in inference mode (moving averages, Haiku state) -> relu) -> "
            f"{POOL}x{POOL} mean-pool -> linear, {out_features} outputs (scores fitted by "
            "MSE); direct path = the convolutions on the whole batch of images"
        ),
        inputs=InputSpec((image_leaf(side),)),
        # Haiku's whole state (moving averages and their int32 counters): kept, not trained.
        state_leaves=(STATE,),
    )
