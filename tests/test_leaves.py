"""Params leaves by name and the refusal of a non-finite one (:mod:`vmapcheck.core.leaves`),
what the params artifact and training both check."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from vmapcheck.core.leaves import check_finite, leaf_paths
from vmapcheck.errors import ArtifactError


def test_leaves_are_named_by_their_path_in_tree_order():
    params = {"layer_0": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}, "scale": jnp.ones(())}
    named = leaf_paths(params)
    assert list(named) == ["layer_0.b", "layer_0.w", "scale"]
    assert named["layer_0.w"].shape == (3, 2)


def test_two_leaves_of_one_name_are_refused():
    # "a.b" as one key and as a path: both would be stored as the leaf "a.b".
    with pytest.raises(ArtifactError, match="two params leaves share one name"):
        leaf_paths({"a.b": jnp.zeros(1), "a": {"b": jnp.zeros(1)}})


@pytest.mark.parametrize(("value", "what"), [(np.nan, "NaN"), (np.inf, "Inf"), (-np.inf, "Inf")])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_non_finite_float_leaf_is_refused_naming_it_and_the_first_index(value, what, dtype):
    bad = jnp.zeros((2, 3), dtype).at[1, 2].set(value).at[1, 0].set(value)
    with pytest.raises(ArtifactError) as caught:
        check_finite({"ok": jnp.ones(2), "w": bad}, "params.safetensors")
    message = str(caught.value)
    assert message.startswith(f"params.safetensors: leaf w: expected finite values, found {what}")
    assert "in 2 element(s) (first at index (1, 0))" in message


def test_finite_and_integer_leaves_pass():
    # An int leaf (a step counter) holds no NaN: it is not a float and is skipped.
    check_finite({"w": jnp.ones((2, 2)), "step": np.array([3], np.int32)}, "train")
