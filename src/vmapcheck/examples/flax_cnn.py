"""A Flax NNX convolutional network with BatchNorm in inference mode, plugged into vmapcheck
(``conf/model/flax_cnn.yaml``, for the digits images: ``data=digits``).

The input contract is one image leaf (:class:`vmapcheck.core.contract.InputSpec`):
``{"image": (side, side, 1) float}``, channels last, taking the table's ``in_features =
side * side`` pixel columns row-major (64 for the 8x8 digits). ``forward_one(params,
{"image": (side, side, 1)})`` -> ``(out_features,)``; ``forward_batch(params, {"image":
(batch, side, side, 1)})`` (batch axis 0) -> ``(batch, out_features)`` convolves the whole
batch at once (the hand-batched form, the ``direct`` path). Nothing is reshaped from a
flat vector: the harness builds the image leaf from the table's columns. The network::

    conv1 (3x3, 1 -> channels) -> bn1 -> relu -> conv2 (3x3) -> bn2 -> relu
    -> pool (mean over 2x2 blocks: (side/2, side/2, channels)) -> flatten
    -> head (Linear -> out_features)

The bridge to pure functions is the one of :mod:`vmapcheck.examples.flax_mlp`: a static
``GraphDef`` built once from an abstract module, params ``nnx.to_pure_dict(state)``, and a
module rebuilt from them on every call. Two things are particular to BatchNorm:

- **Inference mode.** Both BatchNorms run with ``use_running_average=True``: they
  normalize with their running mean and variance, so a row's output depends on that row
  alone, whatever batch it is in. The running statistics are leaves of the params
  (``bn1.mean``, ``bn1.var``, ...; Flax's ``BatchStat`` variables), saved and loaded
  with the rest (safetensors), next to the trained ``scale`` and ``bias``.
- **Set at init, never trained.** ``init`` sets them from a calibration pass: the
  per-channel mean and variance of each convolution's output over a batch of random
  images drawn from the key (pixels uniform in ``[0, pixel_max]``, the digits' range), as
  a BatchNorm in training mode would have gathered them. They are therefore distinct per
  channel and not the statistics of any batch of digits the check runs, so a forward
  that normalized with its batch's own statistics would show. The model declares them
  state (``Model.state_leaves``: every ``nnx.BatchStat`` leaf, found by Flax's own
  filter), so training neither differentiates nor steps them and leaves them exactly as
  set, as Flax's own training keeps ``batch_stats`` apart from the optimizer
  (docs/state-leaves.md).

Each layer's output is tapped under the name of its params subtree (``conv1``, ``bn1``
(after its relu), ``conv2``, ``bn2``, ``pool``, ``head``), so the diagnosis can walk the
layers and name the leaves that feed the first one that diverges. Activations keep their
image shape: ``(side, side, channels)`` for one example, with a leading batch axis for a
batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from vmapcheck.core.contract import InputSpec
from vmapcheck.core.models import Model, Params, Tap, no_tap, recorded
from vmapcheck.examples.images import CALIBRATION_IMAGES, IMAGE, POOL, image_leaf, image_side

# The layers whose output is tapped, in computation order; the last is the output.
LAYERS = ("conv1", "bn1", "conv2", "bn2", "pool", "head")
OUTPUT_LAYER = LAYERS[-1]


class CNN(nnx.Module):
    """Two 3x3 convolutions (SAME padding), each followed by BatchNorm and relu, a mean
    over each POOL x POOL block, and a linear head on the flattened blocks. Channels-last
    images: ``(side, side, 1)`` or ``(batch, side, side, 1)``."""

    def __init__(self, side: int, channels: int, out_features: int, *, rngs: nnx.Rngs) -> None:
        f32 = jnp.float32

        def batch_norm() -> nnx.BatchNorm:
            return nnx.BatchNorm(channels, use_running_average=True, param_dtype=f32, rngs=rngs)

        self.conv1 = nnx.Conv(1, channels, (3, 3), padding="SAME", param_dtype=f32, rngs=rngs)
        self.bn1 = batch_norm()
        self.conv2 = nnx.Conv(
            channels, channels, (3, 3), padding="SAME", param_dtype=f32, rngs=rngs
        )
        self.bn2 = batch_norm()
        flat = (side // POOL) * (side // POOL) * channels  # the pooled image, flattened
        self.head = nnx.Linear(flat, out_features, param_dtype=f32, rngs=rngs)

    def __call__(
        self, images: jax.Array, tap: Tap = no_tap, *, use_running_average: bool | None = None
    ) -> jax.Array:
        """images ``(..., side, side, 1)`` -> ``(..., out_features)``.

        ``use_running_average`` is handed to both BatchNorms (None: their own setting,
        True); it exists so that a test can plant the training-mode bug.
        """
        h = tap("conv1", self.conv1(images))
        h = tap("bn1", jax.nn.relu(self.bn1(h, use_running_average)))
        h = tap("conv2", self.conv2(h))
        h = tap("bn2", jax.nn.relu(self.bn2(h, use_running_average)))
        lead, (height, width, channels) = h.shape[:-3], h.shape[-3:]
        blocks = (*lead, height // POOL, POOL, width // POOL, POOL, channels)
        pooled = tap("pool", jnp.mean(jnp.reshape(h, blocks), axis=(-4, -2)))
        return self.head(jnp.reshape(pooled, (*lead, -1)))  # (..., out_features)


def _set_statistics(norm: nnx.BatchNorm, h: jax.Array) -> None:
    """``norm``'s running mean and variance: those of ``h`` over every axis but channels."""
    axes = tuple(range(h.ndim - 1))
    norm.mean[...] = jnp.mean(h, axis=axes)
    norm.var[...] = jnp.var(h, axis=axes)


def module_loader(
    in_features: int, out_features: int, channels: int
) -> tuple[Callable[[Params], CNN], Callable[[jax.Array, float], Params]]:
    """``(module, init)``: ``module(params)`` is a fresh :class:`CNN` holding ``params``;
    ``init(key, pixel_max)`` the params.

    Shared by :func:`make_model` and the tests that plant faults in a forward.
    """
    side = image_side(in_features)
    abstract = nnx.eval_shape(lambda: CNN(side, channels, out_features, rngs=nnx.Rngs(params=0)))
    graphdef, abstract_state = nnx.split(abstract)

    def module(params: Params) -> CNN:
        # A fresh State each call (tree_map copies the Variables): replace_by_pure_dict
        # updates it in place, and the abstract template must stay untouched.
        state = jax.tree_util.tree_map(lambda leaf: leaf, abstract_state)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(graphdef, state)

    def init(key: jax.Array, pixel_max: float) -> Params:
        params_key, images_key = jax.random.split(key)
        # nnx.Rngs derives one fresh key per parameter from params_key (a counter).
        cnn = CNN(side, channels, out_features, rngs=nnx.Rngs(params=params_key))
        images = jax.random.uniform(
            images_key, (CALIBRATION_IMAGES, side, side, 1), jnp.float32, 0.0, pixel_max
        )
        h = cnn.conv1(images)
        _set_statistics(cnn.bn1, h)
        h = cnn.conv2(jax.nn.relu(cnn.bn1(h)))
        _set_statistics(cnn.bn2, h)
        _, state = nnx.split(cnn)
        return nnx.to_pure_dict(state)

    return module, init


def statistics_leaves(in_features: int, out_features: int, channels: int) -> tuple[str, ...]:
    """The params paths of every BatchNorm running statistic (Flax's ``nnx.BatchStat``
    variables: ``("bn1.mean", "bn1.var", "bn2.mean", "bn2.var")``): the model's state."""
    side = image_side(in_features)
    abstract = nnx.eval_shape(lambda: CNN(side, channels, out_features, rngs=nnx.Rngs(params=0)))
    statistics = nnx.to_pure_dict(nnx.state(abstract, nnx.BatchStat))
    return tuple(f"{layer}.{name}" for layer, leaves in statistics.items() for name in leaves)


def make_model(
    in_features: int = 64,
    out_features: int = 10,
    channels: int = 8,
    pixel_max: float = 16.0,
    output_names: list[str] | None = None,
) -> Model:
    """The NNX CNN on ``in_features`` pixels (a square image) as a vmapcheck Model, its
    input contract ``{"image": (side, side, 1) float}`` (``side * side = in_features``).

    ``channels``: of both convolutions; ``pixel_max``: the pixel range of the calibration
    images that set the running statistics (16 for the digits' ink counts);
    ``output_names``: one per output (default ``y0``, ``y1``, ...). Params:
    ``{"conv1": {"kernel": (3, 3, 1, channels), "bias"}, "bn1": {"scale", "bias", "mean",
    "var"}, "conv2": {...}, "bn2": {...}, "head": {"kernel": ((side / 2)^2 * channels,
    out_features), "bias"}}``, float32.
    """
    side = image_side(in_features)
    module, init_with = module_loader(in_features, out_features, channels)
    names = tuple(output_names) if output_names else tuple(f"y{i}" for i in range(out_features))
    if len(names) != out_features:
        raise ValueError(f"{len(names)} output_names for out_features={out_features}")

    def init(key: jax.Array) -> Params:
        return init_with(key, pixel_max)

    def forward_one(params: Params, example: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
        """example: {"image": (side, side, 1)} -> (out_features,)."""
        return module(params)(example[IMAGE], tap)

    def forward_batch(params: Params, batch: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
        """batch: {"image": (batch, side, side, 1)}, batch axis 0 -> (batch, out_features):
        the convolutions run on the whole batch of images at once."""
        return module(params)(batch[IMAGE], tap)

    return Model(
        name="flax_cnn",
        in_features=in_features,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=init,
        output_names=names,
        description=(
            f"Flax NNX CNN on {side}x{side} images: 2 x (3x3 conv, {channels} channels -> "
            f"BatchNorm in inference mode (running statistics) -> relu) -> {POOL}x{POOL} "
            f"mean-pool -> linear, {out_features} outputs (scores fitted by MSE); direct "
            "path = the convolutions on the whole batch of images"
        ),
        activations_one=recorded(forward_one, OUTPUT_LAYER),
        activations_batch=recorded(forward_batch, OUTPUT_LAYER),
        inputs=InputSpec((image_leaf(side),)),
        # Kept in the params, never trained: BatchNorm's running mean and variance.
        state_leaves=statistics_leaves(in_features, out_features, channels),
    )
