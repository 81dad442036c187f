"""The key stream: every random operation draws its own named subkey from one seed.

The names and their order are fixed here, so adding a consumer never shifts the keys
that existing consumers get (a new name is appended at the end).
"""

from __future__ import annotations

import jax

# "forward": the base key a stochastic model's forwards split one key per row from
# (vmapcheck.core.forms.forward_keys); appended last, so the others keep their keys.
KEY_NAMES = ("data", "split", "init", "batches", "forward")


def named_keys(seed: int) -> dict[str, jax.Array]:
    """Split the root key ``jax.random.key(seed)`` into one typed subkey per name."""
    subkeys = jax.random.split(jax.random.key(seed), len(KEY_NAMES))
    return dict(zip(KEY_NAMES, subkeys, strict=True))
