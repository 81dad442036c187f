"""The forward paths under comparison, and the input validation they all share.

Every path maps a batch ``X`` of shape ``(batch, in_features)`` (batch axis 0) to
``(batch, out_features)``:

- ``loop``: a Python loop of ``forward_one`` over rows, stacked (the per-example oracle);
- ``vmap``: ``jax.vmap(forward_one, in_axes=(None, 0))`` — params shared (None), rows
  mapped over axis 0;
- ``direct``: the model's hand-batched ``forward_batch``.

Each comes eager and under ``jax.jit``. Inputs are validated once, before dispatch, by
:func:`validate_batch`, so an invalid batch is refused identically by every path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.errors import InvalidInputError
from vmapcheck.models import Model, Params
from vmapcheck.params_io import leaf_name

Path = Callable[[Params, Any], jax.Array]


def _check_values(x: Any, dtype: Any) -> None:
    found = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if found != jnp.dtype(dtype):
        raise InvalidInputError(
            f"expected dtype {jnp.dtype(dtype).name}, got {found}", reason="dtype"
        )
    # On the host: the check must not depend on the backend, and a location is reported
    # (never a value: inputs may be personal data).
    host = np.asarray(x)
    for name, bad in (("NaN", np.isnan(host)), ("Inf", np.isinf(host))):
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidInputError(
                f"expected finite values, got {name} in {int(bad.sum())} element(s) "
                f"(first at index {first})",
                reason="non_finite_input",
            )


def check_batch_shape(shape: tuple[int, ...], in_features: int) -> None:
    """Refuse a shape other than (batch, in_features) with batch >= 1 (metadata only).

    Raises:
        InvalidInputError: with ``reason`` "rank", "features" or "empty".
    """
    shape = tuple(shape)
    if len(shape) != 2:
        raise InvalidInputError(
            f"expected a batch of rank 2 (batch, {in_features}), got rank {len(shape)} "
            f"with shape {shape}",
            reason="rank",
        )
    if shape[1] != in_features:
        raise InvalidInputError(
            f"expected {in_features} features, got {shape[1]}", reason="features"
        )
    if shape[0] == 0:
        raise InvalidInputError("expected at least one row, got an empty batch", reason="empty")


def validate_batch(x: Any, in_features: int, dtype: Any) -> None:
    """Refuse anything but a finite (batch, in_features) array of ``dtype`` with batch >= 1.

    This is the one place every batched path validates its input.

    Raises:
        InvalidInputError: naming the problem, e.g. "expected 3 features, got 4"; its
            ``reason`` is "rank", "features", "empty", "dtype" or "non_finite_input".
    """
    check_batch_shape(np.shape(x), in_features)
    _check_values(x, dtype)


def validate_vector(x: Any, in_features: int, dtype: Any) -> None:
    """The same contract for one unbatched feature vector of shape (in_features,)."""
    shape = np.shape(x)
    if len(shape) != 1:
        raise InvalidInputError(
            f"expected one feature vector of rank 1 ({in_features},), got rank {len(shape)} "
            f"with shape {tuple(shape)}",
            reason="rank",
        )
    if shape[0] != in_features:
        raise InvalidInputError(
            f"expected {in_features} features, got {shape[0]}", reason="features"
        )
    _check_values(x, dtype)


def batched_forward(model: Model, params: Params, in_axes: tuple[Any, Any] = (None, 0)) -> Path:
    """``jax.vmap(model.forward_one, in_axes)``, refusing params mapped without batch copies.

    The seed's first listed mistake is ``in_axes=(0, 0)`` for params that are shared by
    every row. JAX then slices the weights along their first axis as if each row had its
    own copy: it fails when that axis differs from the batch size, and silently computes
    something else when it happens to match. Mapping params is right only when every leaf
    carries a leading batch axis on top of the model's own (contract) shape.

    Raises:
        InvalidInputError: params are mapped but a leaf has exactly its unbatched shape;
            the message names the leaf and the fix.
    """
    params_axis = in_axes[0]
    if params_axis is not None:
        template = jax.eval_shape(model.init, jax.random.key(0))
        for (path, leaf), own in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree.leaves(template),
            strict=True,
        ):
            if tuple(np.shape(leaf)) == tuple(own.shape):
                raise InvalidInputError(
                    f"in_axes maps params over axis {params_axis}, but params have no batch "
                    f"copies: leaf {leaf_name(path)} has shape {tuple(own.shape)}, the model's "
                    "own shape, so vmap would slice the weights across the batch (or fail "
                    "on a size mismatch). Params shared by every row take in_axes=(None, 0)."
                )
    return jax.vmap(model.forward_one, in_axes=in_axes)


def _loop(forward_one: Callable) -> Path:
    def loop_forward(params: Params, batch: jax.Array) -> jax.Array:
        return jnp.stack([forward_one(params, row) for row in batch])

    return loop_forward


def raw_forwards(model: Model) -> dict[str, Path]:
    """The three batched forms, untransformed: ``loop``, ``vmap`` and, if given, ``direct``."""
    raw = {
        "loop": _loop(model.forward_one),
        # Params have no batch copies: in_axes None shares them; rows map over axis 0.
        "vmap": jax.vmap(model.forward_one, in_axes=(None, 0)),
    }
    if model.forward_batch is not None:  # absent: reported as not provided, never faked
        raw["direct"] = model.forward_batch
    return raw


def build_paths(model: Model, dtype: Any, validate: bool = True) -> dict[str, Path]:
    """The six forward paths for ``model``.

    With ``validate`` (the default) each path refuses an invalid batch before dispatch;
    the benchmark validates its inputs once and times the forward alone.
    """
    paths: dict[str, Path] = {}
    raw = raw_forwards(model)
    for name, fn in raw.items():
        for mode, compiled in (("eager", fn), ("jit", jax.jit(fn))):
            if not validate:
                paths[f"{name}_{mode}"] = compiled
                continue

            def guarded(params: Params, x: Any, _fn: Callable = compiled) -> jax.Array:
                validate_batch(x, model.in_features, dtype)
                return _fn(params, x)

            paths[f"{name}_{mode}"] = guarded
    return paths


def not_provided(model: Model) -> dict[str, str]:
    """Paths this model cannot have, with the reason (reported, not failed)."""
    if model.forward_batch is not None:
        return {}
    reason = f"model {model.name!r} provides no hand-batched forward (forward_batch)"
    return {"direct_eager": reason, "direct_jit": reason}


def build_vector_paths(model: Model, dtype: Any) -> dict[str, Path]:
    """``forward_one`` itself, eager and jit, for one unbatched vector (in_features,)."""
    paths: dict[str, Path] = {}
    for mode, compiled in (("eager", model.forward_one), ("jit", jax.jit(model.forward_one))):

        def guarded(params: Params, x: Any, _fn: Callable = compiled) -> jax.Array:
            validate_vector(x, model.in_features, dtype)
            return _fn(params, x)

        paths[f"one_{mode}"] = guarded
    return paths


def cast_tree(tree: Any, dtype: Any) -> Any:
    """Cast every floating leaf of ``tree`` to ``dtype`` (params enter at the run's precision)."""
    return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype=dtype), tree)
