"""The image input contract the CNN examples share (:mod:`vmapcheck.examples.images`):
a table's ``side * side`` pixel columns as one ``(side, side, 1)`` image, mean-pooled in
``POOL x POOL`` blocks, so the side must be a multiple of ``POOL``."""

from __future__ import annotations

import pytest

from vmapcheck.examples.images import IMAGE, POOL, image_leaf, image_side


@pytest.mark.parametrize(("in_features", "side"), [(64, 8), (36, 6), (4, 2)])
def test_the_side_of_a_square_image_of_the_pixel_columns(in_features, side):
    assert image_side(in_features) == side


# 63: no square; 49: a side of 7, which POOL x POOL blocks do not tile.
@pytest.mark.parametrize("in_features", [63, 49, 2])
def test_pixel_columns_no_pooled_square_takes_are_refused_naming_them(in_features):
    with pytest.raises(
        ValueError, match=rf"in_features={in_features} is not the square of a multiple of {POOL}"
    ):
        image_side(in_features)


def test_the_input_leaf_is_one_channel_last_float_image():
    leaf = image_leaf(8)
    assert (leaf.name, leaf.shape, leaf.dtype) == (IMAGE, (8, 8, 1), "float")
