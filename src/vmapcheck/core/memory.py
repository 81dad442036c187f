"""Memory pre-flight: a stage whose arrays cannot fit is refused at its start, with both
figures, instead of being killed by the system minutes later (issue 34, case 6:
``model.hidden=[200000000]`` killed train after 90 s with no message, and
``data.n_rows=10000000000`` aborted prepare in native code).

The estimates are lower bounds of what the stage allocates, from shapes alone
(``jax.eval_shape``, no compute), compared with the memory the system says is
available now (:func:`psutil.virtual_memory`): a refusal is certain to be right, and a
stage that passes may still need more (activations, XLA's buffers).
"""

from __future__ import annotations

import math
from typing import Any

import psutil

from vmapcheck.errors import ResourceError

# train holds the params, their gradients, Adam's two moments and the best params so far:
# five float32 copies of every trainable leaf (core/training.py).
TRAIN_COPIES = 5
# prepare holds the generated table (float64), its anonymized copy and the splits.
TABLE_COPIES = 3


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"


def available_bytes() -> int:
    """Memory the system can give this process now without swapping."""
    return int(psutil.virtual_memory().available)


def require_memory(needed: float, what: str, settings: str) -> None:
    """Refuse ``what`` (a stage's work) needing ``needed`` bytes when fewer are available.

    Raises:
        ResourceError: naming what, both figures and ``settings`` (the keys that size it).
    """
    free = available_bytes()
    if needed > free:
        raise ResourceError(
            f"{what} needs at least {gib(needed)} of memory, and {gib(free)} is available "
            f"on this machine now ({settings}); lower them, or run on a machine with more "
            "memory"
        )


def params_bytes(model: Any) -> tuple[int, int]:
    """(leaves' element count, bytes as float32) of ``model.init``'s params, from shapes."""
    import jax

    shapes = jax.eval_shape(model.init, jax.random.key(0))
    count = sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(shapes))
    return count, 4 * count


def check_train_memory(model: Any, settings: str) -> None:
    """train's pre-flight: :data:`TRAIN_COPIES` float32 copies of the params."""
    count, size = params_bytes(model)
    require_memory(
        TRAIN_COPIES * size,
        f"training model {model.name!r} ({count:,} parameters, {TRAIN_COPIES} float32 "
        "copies: params, gradients, Adam's moments, the best so far)",
        settings,
    )


def check_table_memory(rows: int, columns: int, settings: str) -> None:
    """prepare's pre-flight for a generated table: :data:`TABLE_COPIES` float64 copies."""
    require_memory(
        TABLE_COPIES * 8 * rows * columns,
        f"generating a table of {rows:,} rows x {columns} columns ({TABLE_COPIES} float64 "
        "copies: generated, anonymized, split)",
        settings,
    )
