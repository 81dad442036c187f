"""Params leaves by name, and the refusal of a non-finite one: what the params artifact
(:mod:`vmapcheck.params_io`) and training (:mod:`vmapcheck.core.training`) both check.

No JAX at import: the track stage reads params manifests without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vmapcheck.errors import ArtifactError


def leaf_paths(params: Any) -> dict[str, Any]:
    """Map leaf names (see :func:`vmapcheck.core.state.leaf_name`) to leaves, in tree
    order."""
    import jax

    from vmapcheck.core.state import leaf_name

    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    named = {leaf_name(path): leaf for path, leaf in flat}
    if len(named) != len(flat):
        raise ArtifactError("two params leaves share one name; rename the pytree's keys")
    return named


def check_finite(arrays: dict[str, Any], where: str) -> None:
    """Refuse a float leaf holding NaN or Inf, naming ``where``, the leaf, the count and the
    first index (never a value).

    Raises:
        ArtifactError: the first such leaf, in ``arrays``' order.
    """
    # jnp's float test: it counts bfloat16 as floating, numpy's does not.
    import jax.numpy as jnp

    for name, leaf in arrays.items():
        host = np.asarray(leaf)
        if not jnp.issubdtype(host.dtype, jnp.floating):
            continue
        for what, bad in (("NaN", np.isnan(host)), ("Inf", np.isinf(host))):
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ArtifactError(
                    f"{where}: leaf {name}: expected finite values, found {what} in "
                    f"{int(bad.sum())} element(s) (first at index {first}); params must be "
                    "finite"
                )
