"""The image input contract the CNN examples share (:mod:`vmapcheck.examples.flax_cnn`,
:mod:`vmapcheck.examples.haiku_cnn`), framework-free so that neither example imports the
other's framework: one input leaf ``{"image": (side, side, 1)}`` float, channels last,
taking a table's ``side * side`` pixel columns row-major, mean-pooled in POOL x POOL blocks.
"""

from __future__ import annotations

import math

from vmapcheck.core.contract import Leaf

# The name of the one input leaf: {"image": (side, side, 1)}.
IMAGE = "image"
# The mean-pool's window: POOL x POOL blocks of the image, averaged.
POOL = 2
# Images of the calibration pass that sets the running statistics at init.
CALIBRATION_IMAGES = 256


def image_side(in_features: int) -> int:
    """The side of a square one-channel image of ``in_features`` pixels (8 for 64)."""
    side = math.isqrt(in_features)
    if side * side != in_features or side % POOL:
        raise ValueError(
            f"in_features={in_features} is not the square of a multiple of {POOL}: the CNN "
            f"takes one example as a (side, side, 1) image of in_features pixel columns and "
            f"mean-pools {POOL}x{POOL} blocks of it"
        )
    return side


def image_leaf(side: int) -> Leaf:
    """The CNN's one input leaf: ``image``, ``(side, side, 1)`` float."""
    return Leaf(
        IMAGE,
        (side, side, 1),
        "float",
        meaning=f"one {side}x{side} grayscale image, channels last: ink counts row-major",
    )
