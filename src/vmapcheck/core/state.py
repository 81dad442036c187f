"""Which params leaves training differentiates, and which are the model's state.

A model's params pytree may hold leaves that are not weights: BatchNorm running
statistics, step counters (Haiku's int32 ``counter``), RNG state. The model declares them
in ``Model.state_leaves`` (docs/state-leaves.md), each entry a leaf path as the params file
names it (``bn1.mean``, :func:`leaf_name`) or the path of a subtree,
covering every leaf under it (``state``, ``bn1``). Declared leaves, of any dtype and
shape, stay in the params: the forward reads them, the params file, the contract, the
reference and the registry keep them. Training leaves them bit-identical: they are not
differentiated, and optax never sees them.

Every other leaf is trained, so it must be a float array: :func:`partition` refuses,
before any training, a leaf of another dtype (an int counter, a bool flag) that is not
declared, naming the leaf, its dtype and how to declare it; and a declared entry that
covers no leaf (a typo would silently train the leaf it meant).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.errors import ConfigError


def leaf_name(path: tuple[Any, ...]) -> str:
    """A leaf's path as a reader writes it: ``layers[1].W`` (keys dotted, indices bracketed)."""
    name = ""
    for key in path:
        if isinstance(key, jax.tree_util.SequenceKey):
            name += f"[{key.idx}]"
        elif isinstance(key, jax.tree_util.DictKey):
            name += f".{key.key}" if name else str(key.key)
        elif isinstance(key, jax.tree_util.GetAttrKey):
            name += f".{key.name}" if name else key.name
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            name += f"[{key.key}]"
        else:  # a custom pytree's own key type
            name += f".{key}" if name else str(key)
    return name or "<root>"


# Where a user reads how to declare state leaves; named in every refusal.
STATE_LEAVES_DOC = "docs/state-leaves.md"


def covers(entry: str, name: str) -> bool:
    """Whether the ``state_leaves`` entry ``entry`` covers the leaf named ``name``: the
    leaf itself, or a subtree above it (``bn1`` covers ``bn1.mean`` and ``bn1[0]``, not
    ``bn10.mean``)."""
    return name == entry or name.startswith((f"{entry}.", f"{entry}["))


def declared_state(model: Any, name: str) -> bool:
    """Whether the params leaf named ``name`` is covered by ``model.state_leaves``."""
    return any(covers(entry, name) for entry in model.state_leaves)


def trainable_dtype(dtype: Any) -> bool:
    """Whether a leaf of ``dtype`` can be differentiated and stepped: a float dtype."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


@dataclass(frozen=True)
class ParamsPartition:
    """The params' leaves split into trainable ones and declared state.

    ``names`` are every leaf's path in tree order, ``is_state`` whether each is declared
    state. :meth:`split` and :meth:`merge` are pure pytree operations (no arithmetic), so
    they run inside ``jit`` and a state leaf comes back from :meth:`merge` bit for bit.
    """

    treedef: Any
    names: tuple[str, ...]
    is_state: tuple[bool, ...]

    @property
    def trainable_names(self) -> tuple[str, ...]:
        return tuple(n for n, s in zip(self.names, self.is_state, strict=True) if not s)

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(n for n, s in zip(self.names, self.is_state, strict=True) if s)

    def split(self, params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(trainable, state)``: two dicts ``{leaf path: array}`` of ``params`` (a tree of
        this partition's structure)."""
        leaves = self.treedef.flatten_up_to(params)
        trainable: dict[str, Any] = {}
        state: dict[str, Any] = {}
        for name, declared, leaf in zip(self.names, self.is_state, leaves, strict=True):
            (state if declared else trainable)[name] = leaf
        return trainable, state

    def trainable(self, params: Any) -> dict[str, Any]:
        """The trainable leaves of ``params``, ``{leaf path: array}``: what optax steps."""
        return self.split(params)[0]

    def merge(self, trainable: Mapping[str, Any], state: Mapping[str, Any]) -> Any:
        """The params tree again, from the two dicts :meth:`split` returns."""
        leaves = [
            state[name] if declared else trainable[name]
            for name, declared in zip(self.names, self.is_state, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _common_subtree(names: list[str]) -> str | None:
    """The deepest subtree path (dotted components) above every one of ``names``; None
    when they share none."""
    split = [name.split(".")[:-1] for name in names]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common) or None


def _undeclared_message(model: str, untrainable: list[tuple[str, str]]) -> str:
    """The refusal of undeclared non-float leaves: each leaf's path and dtype, and the
    declaration that fixes it."""
    names = [name for name, _ in untrainable]
    found = "; ".join(f"params leaf {name!r} has dtype {dtype}" for name, dtype in untrainable)
    subtree = _common_subtree(names) if len(names) > 1 else None
    also = (
        f", or the subtree that holds them all, state_leaves=({subtree!r},) (every leaf under "
        "it is then state)"
        if subtree
        else ""
    )
    return (
        f"model {model!r}: {found}. A leaf of a non-float dtype cannot be trained (jax.grad "
        "and optax take float leaves only) and must be declared as the model's state. "
        f"Declare it in the model's factory: Model(..., state_leaves={tuple(names)!r}){also}. "
        "Declared leaves stay in the params (file, contract, reference, registry), "
        f"unchanged by training; see {STATE_LEAVES_DOC}"
    )


def partition(model: Any, params: Any) -> ParamsPartition:
    """Split ``params`` (arrays or ``jax.ShapeDtypeStruct``: ``jax.eval_shape(model.init,
    key)`` will do) by ``model.state_leaves`` (a :class:`vmapcheck.core.models.Model`).

    Raises:
        ConfigError: an entry of ``model.state_leaves`` covers no leaf (naming the entry
            and the leaves there are); or a leaf that is not declared is not a float array
            (naming every such leaf, its dtype, and the declaration that fixes it).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = tuple(leaf_name(path) for path, _ in flat)
    declared = tuple(model.state_leaves)
    for entry in declared:
        if not any(covers(entry, name) for name in names):
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(
                f"model {model.name!r}: state_leaves entry {entry!r} covers no params leaf: "
                f"expected a leaf path or a subtree of the params ({shown}); see "
                f"{STATE_LEAVES_DOC}"
            )
    is_state = tuple(any(covers(entry, name) for entry in declared) for name in names)
    untrainable = [
        (name, np.dtype(leaf.dtype).name if hasattr(leaf, "dtype") else type(leaf).__name__)
        for (_, leaf), name, state in zip(flat, names, is_state, strict=True)
        if not state and not (hasattr(leaf, "dtype") and trainable_dtype(leaf.dtype))
    ]
    if untrainable:
        raise ConfigError(_undeclared_message(model.name, untrainable))
    return ParamsPartition(treedef, names, is_state)


def grad_of_trainable(loss: Callable[..., jax.Array], leaves: ParamsPartition) -> Callable:
    """``jax.grad(loss)`` with respect to the trainable leaves of its first argument only:
    ``(params, *args) -> {leaf path: gradient}`` (each of its leaf's shape), the declared
    state leaves held fixed, as training differentiates."""

    def grad(params: Any, *args: Any) -> dict[str, jax.Array]:
        trainable, state = leaves.split(params)
        return jax.grad(lambda weights: loss(leaves.merge(weights, state), *args))(trainable)

    return grad
