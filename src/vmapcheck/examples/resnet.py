"""A ResNet-style CNN on 32x32 colour images, in plain JAX: the shipped real-size model
(``conf/model/resnet.yaml``, on ``data=images32``, benchmarked with ``bench=big``).

It exists to show what the check and the benchmark cost on a model of a few million
parameters at thousands of rows (docs/real-size-model.md), so it needs no extra
framework and its params are fixed at init (``trainable=False``: nothing to train).

The input contract is one image leaf (:class:`vmapcheck.core.contract.InputSpec`):
``{"image": (side, side, channels_in) float}``, channels last, taking the table's
``side * side * channels_in`` feature columns row-major (3,072 for 32x32x3).
``forward_one(params, {"image": (side, side, c)})`` -> ``(out_features,)``;
``forward_batch(params, {"image": (batch, side, side, c)})`` (batch axis 0) -> ``(batch,
out_features)`` convolves the whole batch at once (the hand-batched form, the ``direct``
path). The network (widths ``w1, w2, w3``, default 16, 32, 64)::

    stem   conv 3x3 stride 2, c -> w1                       (side/2, side/2, w1)
    block1 residual: x + conv(relu(norm(conv(relu(norm(x))))))
    down2  conv 3x3 stride 2, w1 -> w2                      (side/4, side/4, w2)
    block2 residual
    down3  conv 3x3 stride 2, w2 -> w3                      (side/8, side/8, w3)
    block3 residual
    hidden flatten -> dense -> relu                         (hidden,)
    head   dense -> out_features

Most parameters are in ``hidden`` (``(side/8)^2 * w3 * hidden``: 1024 x 3072 by default,
3.1 M of the 3.3 M), most arithmetic in the convolutions: about 15 MFLOP per row, so
4,096 rows stay in seconds on a two-core CPU.

**Per-example normalization only.** ``norm`` centres each example over all its
positions and channels and divides by its mean absolute deviation, then applies a
per-channel scale and bias. It uses no batch statistics, so a row's output depends on
that row alone (the batch-composition check holds the direct form to it), and no
squares: the regression set's large-magnitude rows (sqrt of float32's max in every
element) would overflow a variance to inf, while a mean absolute deviation stays finite.

**Fixed init.** ``init(key)`` draws He-normal convolutions and dense weights (the second
convolution of each residual block scaled by :data:`RESIDUAL_SCALE`, so the residual
stream grows slowly), unit norm scales and zero biases, all float32, one subkey per
layer, each used once.

Each layer's output is tapped under the name of its params subtree (``stem``,
``block1``, ``down2``, ..., ``hidden``; the output is ``head``), so the diagnosis can
walk the layers and name the leaves feeding the first one that diverges. Activations
keep their image shape: ``(h, w, channels)`` for one example, with a leading batch axis
0 for a batch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.models import Model, Params, Tap, no_tap, recorded

# The name of the one input leaf: {"image": (side, side, channels_in)}.
IMAGE = "image"
# The layers, in computation order: (name, kind); the last one is the output.
LAYERS = (
    ("stem", "down"),
    ("block1", "block"),
    ("down2", "down"),
    ("block2", "block"),
    ("down3", "down"),
    ("block3", "block"),
    ("hidden", "dense"),
    ("head", "dense"),
)
OUTPUT_LAYER = LAYERS[-1][0]
# Three stride-2 convolutions (stem, down2, down3): the side must divide by 2**3.
DOWNSAMPLING = 8
# The second convolution of a residual block starts at this fraction of He's scale.
RESIDUAL_SCALE = 0.5
# Added to the mean absolute deviation: an all-zero (or constant) example stays finite.
NORM_EPS = 1e-5
# Channels last; the kernel is (height, width, in, out).
DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def _he(key: jax.Array, shape: tuple[int, ...], fan_in: int, scale: float = 1.0) -> jax.Array:
    std = jnp.asarray(scale * math.sqrt(2.0 / fan_in), dtype=jnp.float32)
    return jax.random.normal(key, shape, dtype=jnp.float32) * std


def _conv_params(key: jax.Array, c_in: int, c_out: int, scale: float = 1.0) -> Params:
    return {
        "W": _he(key, (3, 3, c_in, c_out), 9 * c_in, scale),
        "b": jnp.zeros((c_out,), jnp.float32),
    }


def _norm_params(channels: int) -> Params:
    return {
        "scale": jnp.ones((channels,), jnp.float32),
        "bias": jnp.zeros((channels,), jnp.float32),
    }


def init(
    key: jax.Array,
    side: int,
    channels_in: int,
    widths: tuple[int, int, int],
    hidden: int,
    out_features: int,
) -> Params:
    """The fixed params: float32 leaves, one subkey per convolution or dense layer."""
    keys = iter(jax.random.split(key, 3 + 2 * 3 + 2))
    w1, w2, w3 = widths
    flat = (side // DOWNSAMPLING) ** 2 * w3

    def block(channels: int) -> Params:
        return {
            "norm1": _norm_params(channels),
            "conv1": _conv_params(next(keys), channels, channels),
            "norm2": _norm_params(channels),
            "conv2": _conv_params(next(keys), channels, channels, RESIDUAL_SCALE),
        }

    def dense(fan_in: int, fan_out: int) -> Params:
        return {
            "W": _he(next(keys), (fan_in, fan_out), fan_in),
            "b": jnp.zeros((fan_out,), jnp.float32),
        }

    return {
        "stem": _conv_params(next(keys), channels_in, w1),
        "block1": block(w1),
        "down2": _conv_params(next(keys), w1, w2),
        "block2": block(w2),
        "down3": _conv_params(next(keys), w2, w3),
        "block3": block(w3),
        "hidden": dense(flat, hidden),
        "head": dense(hidden, out_features),
    }


def _conv(layer: Params, x: jax.Array, stride: int) -> jax.Array:
    """A 3x3 convolution, SAME padding, of ``x`` (batch, h, w, c_in), batch axis 0 ->
    (batch, h / stride, w / stride, c_out)."""
    y = jax.lax.conv_general_dilated(
        x, layer["W"], (stride, stride), "SAME", dimension_numbers=DIMENSIONS
    )
    return y + layer["b"][None, None, None, :]


def _norm(layer: Params, x: jax.Array) -> jax.Array:
    """Each example of ``x`` (batch, h, w, c) centred over its own positions and
    channels (axes 1-3) and divided by its own mean absolute deviation, then scaled
    and shifted per channel. Nothing crosses axis 0: a row never sees its batch-mates."""
    centred = x - jnp.mean(x, axis=(1, 2, 3), keepdims=True)
    spread = jnp.mean(jnp.abs(centred), axis=(1, 2, 3), keepdims=True)
    scale, bias = layer["scale"][None, None, None, :], layer["bias"][None, None, None, :]
    return centred / (spread + NORM_EPS) * scale + bias


def _block(layer: Params, x: jax.Array) -> jax.Array:
    """Pre-activation residual block on (batch, h, w, c): x + conv2(relu(norm2(conv1(
    relu(norm1(x))))))."""
    h = _conv(layer["conv1"], jax.nn.relu(_norm(layer["norm1"], x)), 1)
    h = _conv(layer["conv2"], jax.nn.relu(_norm(layer["norm2"], h)), 1)
    return x + h


def _network(params: Params, images: jax.Array, tap: Tap) -> jax.Array:
    """The network on a batch of images (batch, side, side, c), batch axis 0 ->
    (batch, out_features); every layer but the last tapped as (batch, ...)."""
    x = images
    for name, kind in LAYERS:
        if kind == "down":
            x = _conv(params[name], x, 2)
        elif kind == "block":
            x = _block(params[name], x)
        elif name == OUTPUT_LAYER:
            return x @ params[name]["W"] + params[name]["b"][None, :]
        else:
            flat = x.reshape((x.shape[0], -1))
            x = jax.nn.relu(flat @ params[name]["W"] + params[name]["b"][None, :])
        x = tap(name, x)
    raise AssertionError("LAYERS ends with OUTPUT_LAYER")  # pragma: no cover


def forward_one(params: Params, example: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
    """One image: ``{"image": (side, side, c)}`` -> ``(out_features,)``.

    The convolutions take a batch, so the image runs as a batch of one (a leading axis
    added here and dropped from every activation and the output): the harness batches
    this function itself (loop, vmap), never through that axis.
    """

    def unbatched(name: str, value: jax.Array) -> jax.Array:
        return tap(name, value[0])[None]

    return _network(params, example[IMAGE][None], unbatched)[0]


def forward_batch(params: Params, batch: dict[str, jax.Array], tap: Tap = no_tap) -> jax.Array:
    """A batch of images, batch axis 0: ``{"image": (n, side, side, c)}`` -> ``(n,
    out_features)``; the hand-written batched form (the ``direct`` path)."""
    return _network(params, batch[IMAGE], tap)


def parameter_count(params: Params) -> int:
    """The number of scalars in ``params``."""
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params))


def make_model(
    side: int,
    channels_in: int,
    widths: list[int],
    hidden: int,
    out_features: int,
    output_names: list[str] | None = None,
) -> Model:
    """The ResNet-style CNN; ``in_features`` is the table columns one image takes.

    Raises:
        ValueError: ``side`` does not divide by 8 (three stride-2 convolutions), or
            ``widths`` is not three channel counts.
    """
    if side % DOWNSAMPLING:
        raise ValueError(f"side={side}: expected a multiple of {DOWNSAMPLING}")
    if len(widths) != 3:
        raise ValueError(f"widths={widths}: expected three channel counts (one per stage)")
    w = (int(widths[0]), int(widths[1]), int(widths[2]))
    return Model(
        name="resnet",
        in_features=side * side * channels_in,
        out_features=out_features,
        forward_one=forward_one,
        forward_batch=forward_batch,
        init=lambda key: init(key, side, channels_in, w, hidden, out_features),
        trainable=False,
        output_names=tuple(output_names or ()),
        description=f"ResNet-style CNN on {side}x{side}x{channels_in} images: stride-2 "
        f"stem and downsamplings, residual blocks of {w[0]}, {w[1]}, {w[2]} channels with "
        f"per-example normalization, dense {hidden} relu, linear head -> {out_features}; "
        "fixed init",
        activations_one=recorded(forward_one, OUTPUT_LAYER),
        activations_batch=recorded(forward_batch, OUTPUT_LAYER),
        inputs=InputSpec(
            (Leaf(IMAGE, (side, side, channels_in), "float", meaning="one colour image"),)
        ),
    )
