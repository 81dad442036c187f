"""The input contract: what one example is, leaf by leaf, and the one validation every path
shares.

One example is a pytree of arrays. A flat-vector model's example is a bare float array
``(in_features,)`` (the one-leaf case, :meth:`InputSpec.vector`); any other model's is a
dict of named leaves, e.g. ``{"image": (8, 8, 1) float}`` or ``{"tokens": (T,) int32,
"mask": (T,) bool}``. A batch is the same pytree with a leading batch axis 0 on every
leaf: ``{"tokens": (batch, T), "mask": (batch, T)}``. vmap maps every leaf over axis 0.

Leaf dtypes are ``float`` (the run's precision: float32, float64 or bfloat16), ``int32``
(ids, each in ``[0, vocab)``) or ``bool`` (a mask). The table a stage reads stays a
table: a leaf takes ``prod(shape)`` consecutive feature columns (row-major), in the
order the leaves are declared, and :meth:`InputSpec.from_table` builds the batch pytree
from the rows, refusing a column that is not a whole id in range or a 0/1 mask.

Validation (:meth:`InputSpec.validate_batch`, :meth:`InputSpec.validate_example`) is per
leaf and names the leaf; it never prints a value (inputs may be personal data), only
positions and counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from vmapcheck.config import ModelConfig
from vmapcheck.core.record import InputLeafRecord
from vmapcheck.errors import ArtifactError, InvalidInputError

LeafDtype = Literal["float", "int32", "bool"]
LEAF_DTYPES: tuple[str, ...] = ("float", "int32", "bool")
# The leaf name of a flat-vector model's one leaf (its example is the bare array).
VECTOR_LEAF = "x"
# The leaf a planted "extra leaf" mistake adds (regression cases, the guard's stream).
EXTRA_LEAF = "unexpected"


@dataclass(frozen=True)
class Leaf:
    """One input leaf of one example.

    Attributes:
        name: the key in the example dict (``"tokens"``).
        shape: its per-example shape, without the batch axis (``(64,)``).
        dtype: ``"float"`` (the run's precision), ``"int32"`` or ``"bool"``.
        vocab: for ``int32`` leaves, the number of ids: each id is in ``[0, vocab)``.
        meaning: one line for the contract and the report.
    """

    name: str
    shape: tuple[int, ...]
    dtype: LeafDtype = "float"
    vocab: int | None = None
    meaning: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in LEAF_DTYPES:
            raise ValueError(
                f"leaf {self.name!r}: expected dtype one of {LEAF_DTYPES}, got {self.dtype!r}"
            )
        if any(int(n) < 1 for n in self.shape):
            raise ValueError(
                f"leaf {self.name!r}: expected a shape of positive sizes, got {self.shape}"
            )
        if (self.dtype == "int32") != (self.vocab is not None):
            raise ValueError(
                f"leaf {self.name!r}: an int32 leaf needs vocab (ids are in [0, vocab)), "
                f"other leaves take none; got dtype {self.dtype} with vocab={self.vocab}"
            )
        if self.vocab is not None and self.vocab < 1:
            raise ValueError(f"leaf {self.name!r}: expected vocab >= 1, got {self.vocab}")

    @property
    def size(self) -> int:
        """Elements per example: the number of table columns the leaf takes."""
        return math.prod(self.shape)

    def array_dtype(self, float_dtype: Any) -> np.dtype:
        """The dtype its arrays have in a run of precision ``float_dtype``."""
        if self.dtype == "float":
            return jnp.dtype(float_dtype)
        return np.dtype(self.dtype)

    def describe(self) -> InputLeafRecord:
        """Shape, dtype, range and meaning, for the contract file and the report."""
        about: InputLeafRecord = {"leaf": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.vocab is not None:
            about["range"] = [0, self.vocab - 1]
        if self.meaning:
            about["meaning"] = self.meaning
        return about


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(bad)[0])


def not_an_array(x: Any) -> str | None:
    """What ``x`` is when it cannot be a leaf's array (the contract takes plain numeric
    numpy or JAX arrays), else None: a masked array (its mask would be ignored), a ragged
    nested list, an array of Python objects, any other non-array (a list, a scalar).
    Nothing of ``x``'s values is in the answer."""
    if isinstance(x, np.ma.MaskedArray):
        return (
            "a numpy masked array (np.ma), whose mask every path would ignore: drop or fill "
            "the masked entries and pass a plain array"
        )
    if isinstance(x, np.ndarray | jax.Array):
        dtype = x.dtype
    else:
        try:
            dtype = np.asarray(x).dtype
        except (ValueError, TypeError):
            return f"a ragged {type(x).__name__} (nested sequences of different lengths)"
    if dtype == np.dtype(object):
        return "an array of dtype object (Python objects, not numbers)"
    if not isinstance(x, np.ndarray | jax.Array):
        # A list of bools (or, under x64, of floats) would pass the dtype check, then be
        # mapped by vmap as a pytree of Python scalars, failing inside JAX.
        return f"a {type(x).__name__}, not an array: pass np.asarray(...) with the contract's dtype"
    return None


# The floats a run's precision may be (config: precision.dtype).
FLOAT_DTYPES: tuple[str, ...] = ("float32", "float64", "bfloat16")


def float_dtype_problem(dtype: Any) -> str | None:
    """Why ``dtype`` cannot be the float dtype of a run's float leaves (one of
    :data:`FLOAT_DTYPES`; float64 only with ``jax_enable_x64`` on), else None."""
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        return f"expected one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}"
    if name not in FLOAT_DTYPES:
        return f"expected one of {', '.join(FLOAT_DTYPES)} (the run's precision), got {name}"
    if name == "float64" and not jax.config.read("jax_enable_x64"):
        return (
            "float64 needs jax_enable_x64 (precision.enable_x64: true); with it off JAX "
            "computes in float32"
        )
    return None


@dataclass(frozen=True)
class InputSpec:
    """The leaves of one example; ``flat`` when the example is the bare array of its one
    leaf (a flat-vector model), else a dict keyed by leaf name."""

    leaves: tuple[Leaf, ...]
    flat: bool = False

    def __post_init__(self) -> None:
        names = [leaf.name for leaf in self.leaves]
        if not names:
            raise ValueError("an input contract needs at least one leaf")
        if len(set(names)) != len(names):
            raise ValueError(f"leaf names must be unique, got {names}")
        if self.flat and (len(self.leaves) != 1 or self.leaves[0].dtype != "float"):
            raise ValueError("a flat contract is one float leaf")

    @classmethod
    def vector(cls, in_features: int) -> InputSpec:
        """The flat-vector contract: one float leaf ``(in_features,)``, a bare array."""
        return cls((Leaf(VECTOR_LEAF, (int(in_features),), "float"),), flat=True)

    @classmethod
    def from_config(cls, model: ModelConfig) -> InputSpec:
        """The contract ``model`` (validated) declares: ``model.inputs``, else the flat
        vector ``(model.in_features,)``."""
        if model.inputs is None:
            return cls.vector(model.in_features)
        return cls(
            tuple(
                Leaf(name, tuple(leaf.shape), leaf.dtype, leaf.vocab, leaf.meaning)
                for name, leaf in model.inputs.items()
            )
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(leaf.name for leaf in self.leaves)

    @property
    def size(self) -> int:
        """Feature columns one example takes from the table (all leaves together)."""
        return sum(leaf.size for leaf in self.leaves)

    def has(self, dtype: LeafDtype) -> bool:
        """Whether any leaf is of ``dtype``."""
        return any(leaf.dtype == dtype for leaf in self.leaves)

    def zeros(self, rows: int, float_dtype: Any) -> Any:
        """A batch of ``rows`` all-zero rows (ids 0, masks all padding), on the host."""
        arrays = {
            leaf.name: np.zeros((rows, *leaf.shape), leaf.array_dtype(float_dtype))
            for leaf in self.leaves
        }
        return arrays[VECTOR_LEAF] if self.flat else arrays

    def describe(self) -> list[InputLeafRecord]:
        """Every leaf's shape, dtype, range and meaning, in declared order."""
        return [leaf.describe() for leaf in self.leaves]

    # --- building examples from the table -------------------------------------------------

    def from_table(self, rows: np.ndarray, columns: Sequence[str] = ()) -> Any:
        """The batch pytree of table ``rows`` (n, size), float, batch axis 0.

        Float leaves stay float32 (cases are stored in float32 and cast to the run's
        precision when run); ids become int32 and masks bool, refused when a value is not
        a whole id in ``[0, vocab)`` or not 0/1 (naming the leaf and the column).

        Raises:
            ArtifactError: the table's width differs from :attr:`size`, or a column does
                not hold what its leaf needs.
        """
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.size:
            raise ArtifactError(
                f"the input contract takes {self.size} feature columns "
                f"({', '.join(f'{leaf.name}: {leaf.size}' for leaf in self.leaves)}), "
                f"the table has shape {rows.shape}"
            )
        out: dict[str, np.ndarray] = {}
        start = 0
        for leaf in self.leaves:
            block = rows[:, start : start + leaf.size]
            names = list(columns[start : start + leaf.size]) if columns else []
            out[leaf.name] = self._leaf_from_block(leaf, block, names).reshape(
                (rows.shape[0], *leaf.shape)
            )
            start += leaf.size
        return out[VECTOR_LEAF] if self.flat else out

    @staticmethod
    def _leaf_from_block(leaf: Leaf, block: np.ndarray, names: list[str]) -> np.ndarray:
        def column(index: tuple[int, ...]) -> str:
            return names[index[1]] if names else f"#{index[1]}"

        if leaf.dtype == "float":
            return block.astype(np.float32)
        allowed = (
            (np.round(block) == block) & (block >= 0) & (block < leaf.vocab)
            if leaf.dtype == "int32"
            else (block == 0) | (block == 1)
        )
        if not allowed.all():
            where = _first(~allowed)
            wanted = f"whole ids in [0, {leaf.vocab})" if leaf.dtype == "int32" else "0 or 1"
            raise ArtifactError(
                f"leaf {leaf.name!r}: column {column(where)} expected {wanted}, found "
                f"{int((~allowed).sum())} other value(s) (first in row {where[0]})"
            )
        return block.astype(leaf.dtype)

    # --- validation -----------------------------------------------------------------------

    def _by_leaf(self, tree: Any, what: str) -> dict[str, Any]:
        """``{leaf name: array}`` of a batch or example, refusing missing and extra leaves."""
        if self.flat:
            if isinstance(tree, Mapping):
                raise InvalidInputError(
                    f"expected {what} as one array, got a dict with keys {sorted(tree)}",
                    reason="type",
                )
            return {VECTOR_LEAF: tree}
        if not isinstance(tree, Mapping):
            raise InvalidInputError(
                f"expected {what} as a dict of leaves {list(self.names)}, got "
                f"{type(tree).__name__}",
                reason="type",
            )
        missing = [name for name in self.names if name not in tree]
        if missing:
            raise InvalidInputError(
                f"leaf {missing[0]!r} is missing: expected leaves {list(self.names)}, got "
                f"{sorted(map(str, tree))}",
                reason="missing_leaf",
            )
        extra = sorted(str(name) for name in tree if name not in self.names)
        if extra:
            raise InvalidInputError(
                f"leaf {extra[0]!r} is not in the contract: expected leaves "
                f"{list(self.names)}, got {sorted(map(str, tree))}",
                reason="extra_leaf",
            )
        return {name: tree[name] for name in self.names}

    def _where(self, leaf: Leaf) -> str:
        return "" if self.flat else f"leaf {leaf.name!r}: "

    def check_types(self, arrays: Mapping[str, Any], what: str) -> None:
        """Refuse a leaf that is no plain numeric array (:func:`not_an_array`), naming the
        leaf, ``reason`` "type"; and leaves committed to different devices, ``reason``
        "devices" (JAX would refuse to compute with them together, naming no leaf)."""
        for leaf in self.leaves:
            problem = not_an_array(arrays[leaf.name])
            if problem:
                expected = f"{what} as a plain numeric array" if self.flat else "a plain array"
                raise InvalidInputError(
                    f"{self._where(leaf)}expected {expected}, got {problem}", reason="type"
                )
        # Only committed arrays (put on a device explicitly) are pinned there; numpy and
        # uncommitted JAX arrays follow them.
        placed = {
            name: tuple(sorted(str(d) for d in a.devices()))
            for name, a in arrays.items()
            if isinstance(a, jax.Array) and getattr(a, "committed", False)
        }
        if len(set(placed.values())) > 1:
            raise InvalidInputError(
                "expected every leaf on the same device(s), got "
                + ", ".join(f"{name}: {', '.join(ds)}" for name, ds in placed.items()),
                reason="devices",
            )

    def _check_shape(self, leaf: Leaf, shape: tuple[int, ...], batched: bool) -> None:
        where = self._where(leaf)
        lead = ("batch",) if batched else ()
        want_rank = len(leaf.shape) + len(lead)
        if len(shape) != want_rank:
            expected = ", ".join(map(str, (*lead, *leaf.shape)))
            noun = "a batch" if batched else "one example"
            if self.flat:
                noun = "a batch" if batched else "one feature vector"
            raise InvalidInputError(
                f"{where}expected {noun} of rank {want_rank} ({expected}"
                f"{',' if want_rank == 1 else ''}), got rank {len(shape)} with shape {shape}",
                reason="rank",
            )
        own = tuple(shape[len(lead) :])
        if own != leaf.shape:
            if self.flat:
                raise InvalidInputError(
                    f"expected {leaf.shape[0]} features, got {own[0]}", reason="features"
                )
            raise InvalidInputError(
                f"{where}expected per-example shape {leaf.shape}, got {own}", reason="shape"
            )

    def _check_values(self, leaf: Leaf, x: Any, float_dtype: Any) -> None:
        where = self._where(leaf)
        found = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        expected = leaf.array_dtype(float_dtype)
        if found != expected:
            raise InvalidInputError(
                f"{where}expected dtype {expected.name}, got {found}", reason="dtype"
            )
        # On the host: the check must not depend on the backend, and only a location is
        # reported (never a value: inputs may be personal data).
        host = np.asarray(x)
        if leaf.dtype == "float":
            for name, bad in (("NaN", np.isnan(host)), ("Inf", np.isinf(host))):
                if bad.any():
                    raise InvalidInputError(
                        f"{where}expected finite values, got {name} in {int(bad.sum())} "
                        f"element(s) (first at index {_first(bad)})",
                        reason="non_finite_input",
                    )
        elif leaf.dtype == "int32":
            bad = (host < 0) | (host >= leaf.vocab)
            if bad.any():
                raise InvalidInputError(
                    f"{where}expected ids in [0, {leaf.vocab}), got {int(bad.sum())} id(s) "
                    f"out of range (first at index {_first(bad)})",
                    reason="id_range",
                )

    def validate_batch(self, batch: Any, float_dtype: Any) -> None:
        """Refuse anything but a batch of this contract with batch >= 1 rows on every leaf.

        This is the one place every batched path validates its input.

        Raises:
            InvalidInputError: naming the leaf and the problem; ``reason`` is "type" (also
                a masked array, a ragged list or an object array), "devices" (leaves
                committed to different devices), "missing_leaf",
                "extra_leaf", "rank", "features" (flat) or "shape", "batch_sizes", "empty",
                "dtype", "non_finite_input" or "id_range".
        """
        arrays = self._by_leaf(batch, "a batch")
        self.check_types(arrays, "a batch")
        self._check_batch_shapes({name: tuple(np.shape(a)) for name, a in arrays.items()})
        for leaf in self.leaves:
            self._check_values(leaf, arrays[leaf.name], float_dtype)

    def validate_example(self, example: Any, float_dtype: Any) -> None:
        """The same contract for one unbatched example (what ``forward_one`` takes)."""
        arrays = self._by_leaf(example, "one example")
        self.check_types(arrays, "one example")
        for leaf in self.leaves:
            self._check_shape(leaf, tuple(np.shape(arrays[leaf.name])), batched=False)
        for leaf in self.leaves:
            self._check_values(leaf, arrays[leaf.name], float_dtype)

    def check_batch_shape(self, shapes: Any) -> None:
        """The shape half of :meth:`validate_batch`, on metadata only (nothing is read from
        the device): ``shapes`` is a shape tuple for a flat contract, else ``{leaf: shape}``.
        """
        by_leaf = {VECTOR_LEAF: shapes} if self.flat else self._by_leaf(shapes, "a batch")
        self._check_batch_shapes(by_leaf)

    def _check_batch_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        rows = {}
        for leaf in self.leaves:
            shape = tuple(int(n) for n in shapes[leaf.name])
            self._check_shape(leaf, shape, batched=True)
            rows[leaf.name] = shape[0]
        if len(set(rows.values())) > 1:
            raise InvalidInputError(
                "expected every leaf to have the same batch size, got "
                + ", ".join(f"{name}: {n}" for name, n in rows.items()),
                reason="batch_sizes",
            )
        if next(iter(rows.values())) == 0:
            raise InvalidInputError("expected at least one row, got an empty batch", reason="empty")


# --- batches as pytrees: the helpers every consumer uses instead of x.shape[0] / x[i] -----


def leaves(batch: Any) -> list[Any]:
    """The arrays of a batch or example, in key order (a bare array is its own leaf)."""
    return jax.tree.leaves(batch)


def rows(batch: Any) -> int:
    """The batch size: axis 0 of the first leaf (validated batches agree on it)."""
    return int(np.shape(leaves(batch)[0])[0])


def tree_map(fn: Callable[[Any], Any], batch: Any) -> Any:
    """``fn`` applied to every leaf; a bare array is a one-leaf tree. A dict keeps its
    leaves' order (``jax.tree.map`` would sort the keys: the contract's order is the
    one reports show)."""
    if isinstance(batch, Mapping):
        return {name: fn(leaf) for name, leaf in batch.items()}
    return jax.tree.map(fn, batch)


def take(batch: Any, index: Any) -> Any:
    """Rows ``index`` (an int, slice or index array) of every leaf."""
    return tree_map(lambda leaf: leaf[index], batch)


def cast_floats(batch: Any, dtype: Any) -> Any:
    """Float leaves cast to ``dtype`` (the run's precision); int and bool leaves unchanged."""

    def cast(leaf: Any) -> Any:
        found = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        if jnp.issubdtype(found, jnp.floating):
            return jnp.asarray(leaf, dtype=dtype)
        return jnp.asarray(leaf)

    return tree_map(cast, batch)


def tile_rows(batch: Any, n: int) -> Any:
    """``n`` rows made by repeating the batch's rows in order (bench's larger batches)."""
    index = np.arange(n) % rows(batch)
    return tree_map(lambda leaf: np.asarray(leaf)[index], batch)


def pad_rows(batch: Any, n: int) -> Any:
    """The batch padded to ``n`` rows by repeating its last row (a real, validated row)."""
    have = rows(batch)
    if n == have:
        return batch
    index = np.minimum(np.arange(n), have - 1)
    return tree_map(lambda leaf: jnp.asarray(leaf)[index], batch)


def leaf_arrays(batch: Any) -> dict[str, Any]:
    """``{leaf name: array}``: a dict batch as it is, a bare array under :data:`VECTOR_LEAF`."""
    if isinstance(batch, Mapping):
        return dict(batch)
    return {VECTOR_LEAF: batch}


def from_leaf_arrays(arrays: Mapping[str, Any]) -> Any:
    """Inverse of :func:`leaf_arrays`: one leaf named ``x`` is the bare array."""
    if set(arrays) == {VECTOR_LEAF}:
        return arrays[VECTOR_LEAF]
    return dict(arrays)


def output_contract_problem(model: Any, params: Any, batch: Any) -> str | None:
    """Why ``model.forward_one``'s output breaks its contract, found with
    ``jax.eval_shape`` (no compute), or None: on one example of ``batch`` (examples with
    the batch on axis 0, the contract's leaves) it must return one float array of shape
    ``(out_features,)``. ``params``: arrays or their shapes.

    ``forward_batch`` is not judged here: a hand-batched forward that breaks is what the
    check finds and the diagnosis locates (a wrong broadcast, say), path by path."""
    out = model.out_features
    checks = [("forward_one", model.forward_one, take(batch, 0), (out,), "one example")]
    for name, fn, x, expected, what in checks:
        try:
            shape = jax.eval_shape(fn, params, x)
        except Exception as exc:  # the model's own code: any error is its problem
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"{name} fails on {what} of its input contract: {type(exc).__name__}: {first}"
        if not isinstance(shape, jax.ShapeDtypeStruct):
            kind = type(shape).__name__
            return f"{name} returns a {kind}, expected one array of shape {expected}"
        if tuple(shape.shape) != expected:
            return (
                f"{name} returns shape {tuple(shape.shape)} for {what}, expected {expected} "
                f"(out_features={out})"
            )
        if not jnp.issubdtype(shape.dtype, jnp.floating):
            return f"{name} returns dtype {shape.dtype}, expected a float array"
    return None
