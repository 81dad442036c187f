"""Built programs kept for a model across calls in one process (the Python API's reuse).

``jax.jit`` keeps a function's compiled programs in the jitted object and in caches
keyed by the function's identity, so a program is compiled once only if the *same*
function object is called again. The forms, the gradient probe and the magnitude
program are closures made per call (``jax.vmap(model.forward_one)`` is a new function
each time), so without this module a second ``check_batching`` of the same model in one
process traced and compiled every path again (issue 44: 18-46x a hand-written check).

:func:`cached` returns the value made for ``(model, what, key)`` the first time, so the
same jitted objects are called again and JAX's own caches hit. The entry is keyed by:

- the model's identity (``id``; :class:`~vmapcheck.core.models.Model` is frozen, so its
  functions cannot change under the same object). The entry holds the model itself, so
  its ``id`` cannot be reused by another object while the entry exists, and a lookup
  checks ``entry.model is model`` besides;
- ``what`` and ``key``: what was built and everything it was built from besides the
  model (dtype, mesh, base key, params structure), each hashable;
- the JAX settings a build reads at trace time: x64, the default matmul precision and
  the default device (:func:`settings`), so a float64 or ``bf16`` call is never served
  a program traced under other numerics.

At most :data:`MAX_ENTRIES` entries are kept (least recently used first out): a pytest
session checking many models keeps the last ones' programs, not all of them.
:func:`clear` empties it (a test that counts compiles starts from nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

# Enough for the paths, probe, oracle and magnitude programs of several models at once
# (one check stores about 6 entries per model); each holds small compiled programs.
MAX_ENTRIES = 64

_ENTRIES: OrderedDict[tuple[Hashable, ...], tuple[Any, Any]] = OrderedDict()
_COUNTS = {"hits": 0, "misses": 0}


def settings() -> tuple[Hashable, ...]:
    """The JAX settings a traced program depends on besides its arguments: x64, the
    default matmul precision and the default device (each as set in this thread,
    context managers included)."""
    import jax

    device = jax.config.jax_default_device
    return (
        bool(jax.config.jax_enable_x64),
        jax.config.jax_default_matmul_precision,
        None if device is None else str(device),
    )


def cached(model: Any, what: str, key: Hashable, make: Callable[[], T]) -> T:
    """``make()`` for ``model``, ``what`` and ``key`` under the current :func:`settings`,
    made once and returned again on the next call with the same ones (the same object:
    a jitted function keeps its compiled programs).

    ``key``: everything ``make`` builds from besides ``model`` and the settings, hashable
    (a dtype's name, a mesh, a tuple of shapes); two calls whose ``key`` compares equal
    must build the same thing.
    """
    full = (id(model), what, key, settings())
    entry = _ENTRIES.get(full)
    if entry is not None and entry[0] is model:
        _ENTRIES.move_to_end(full)
        _COUNTS["hits"] += 1
        return entry[1]
    value = make()
    _COUNTS["misses"] += 1
    _ENTRIES[full] = (model, value)
    while len(_ENTRIES) > MAX_ENTRIES:
        _ENTRIES.popitem(last=False)
    return value


def clear() -> None:
    """Forget every entry (their programs are compiled again on next use)."""
    _ENTRIES.clear()
    _COUNTS.update(hits=0, misses=0)


def stats() -> dict[str, int]:
    """``{"entries", "hits", "misses"}`` since the last :func:`clear`."""
    return {"entries": len(_ENTRIES), **_COUNTS}


def key_bytes(key: Any) -> bytes | None:
    """A PRNG key's data as bytes (hashable), None for None: the part of a cache key
    that says which base key a stochastic model's paths were built with."""
    if key is None:
        return None
    import jax
    import numpy as np

    return bytes(np.asarray(jax.random.key_data(key)).tobytes())
