"""What the stages after ``prepare`` read: the splits and the regression cases.

Shapes: ``features`` (n_rows, n_features) and ``targets`` (n_rows, n_targets), float32,
rows on axis 0. Cases are batches of the model's input contract (batch axis 0 on every
leaf; :mod:`vmapcheck.core.contract`) except where noted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vmapcheck.core.cases import Case, CaseEntry, CasesManifest
from vmapcheck.errors import ArtifactError
from vmapcheck.io import (
    atomic_save_npz,
    atomic_write_json,
    load_npz,
    read_json_typed,
    sha256_file,
)
from vmapcheck.layout import CASES_MANIFEST

# vmapcheck.core.contract (which imports JAX) only where cases are built: the stages that
# read them back (track among them) run no JAX, and importing it costs about a second.
if TYPE_CHECKING:
    from vmapcheck.core.contract import InputSpec, Leaf

SPLITS = ("train", "val", "test")
# The cases other stages name: the standard batch (bench times its rows, forward probes
# gradients on it, the diagnosis falls back to it) and the batch of one (the vector case
# is compared with it).
STANDARD_CASE = "standard"
SINGLE_CASE = "single"


def load_split(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, targets) of one split written by :func:`write_splits`."""
    arrays = load_npz(Path(folder) / f"{name}.npz")
    return arrays["features"], arrays["targets"]


# Large magnitudes near float32's limit (the dtype cases are stored in): sqrt(max) ~ 1.8e19,
# so one product with a weight of order one stays far from overflow, while float32's
# absolute rounding step at this magnitude (~2e12) makes any difference between paths
# in how they accumulate visible.
LARGE_MAGNITUDE = float(np.sqrt(np.finfo(np.float32).max))
# The copies of one row in the duplicate_rows case: enough for a vectorised kernel's
# tiles and a padded split to put copies in different places.
DUPLICATE_ROWS = 8


def subnormal_rows(n_features: int) -> np.ndarray:
    """(4, n_features) float32 subnormals: the smallest, the largest, alternating signs,
    and a row mixing subnormals with exact zeros."""
    tiny = np.finfo(np.float32).smallest_subnormal
    largest = np.nextafter(np.finfo(np.float32).smallest_normal, np.float32(0))
    signs = np.where(np.arange(n_features) % 2 == 0, 1.0, -1.0).astype(np.float32)
    steps = np.arange(1, n_features + 1, dtype=np.float32)
    rows = [
        np.full(n_features, tiny, np.float32),
        np.full(n_features, largest, np.float32),
        (signs * steps * tiny * np.float32(1000)).astype(np.float32),
        np.where(steps % 2 == 0, np.float32(0), -largest).astype(np.float32),
    ]
    return np.stack(rows).astype(np.float32)


def regression_cases(
    train_x: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    standard_batch: int,
    contract: InputSpec | None = None,
    columns: Sequence[str] = (),
) -> dict[str, Case]:
    """The regression set: case name -> its :class:`~vmapcheck.core.cases.Case`, built
    from the input ``contract`` (None: the flat vector of the table's width) and the
    table's feature ``columns`` (their names, for errors).

    ``x`` is a batch of the contract (every leaf with batch axis 0: ``(rows,
    n_features)`` for a flat vector, a dict of leaves otherwise) for the batch kinds
    (:data:`vmapcheck.core.cases.CASE_KINDS`), one example for "vector", and for
    "invalid" an input to refuse (``expect`` lists substrings the error message must
    contain, ``runs_on`` says which paths get it, and ``cast`` False keeps its stored
    dtype instead of casting float leaves to the run's). Cases drawn from the test split
    carry their targets ``y`` (rows, n_targets) so a loss can be compared too.

    Per leaf kind: float leaves get zeros, the train split's min and max, large
    magnitudes and subnormals; id leaves 0 and vocab-1; masks all padding and no
    padding. A case that varies one kind of leaf keeps the others at real test rows.
    """
    from vmapcheck.core.contract import InputSpec, take

    contract = contract if contract is not None else InputSpec.vector(train_x.shape[1])
    # A dict contract's cases fill the leaves they do not vary with 4 real test rows.
    needed = standard_batch if contract.flat else max(standard_batch, 4)
    if test_x.shape[0] < needed:
        raise ArtifactError(
            f"data.standard_batch={standard_batch} but the test split has only "
            f"{test_x.shape[0]} rows ({needed} are needed)"
        )
    build = _CaseBuilder(contract, train_x, test_x, columns)

    def batch(x: Any, about: str, y: Any = None, kind: str = "batch") -> Case:
        case: Case = {"x": x, "kind": kind, "about": about}
        if y is not None:
            case["y"] = np.asarray(y, dtype=np.float32)
        return case

    cases: dict[str, Case] = {
        STANDARD_CASE: batch(
            build.rows(test_x[:standard_batch]),
            f"first {standard_batch} rows of the test split",
            test_y[:standard_batch],
        ),
        SINGLE_CASE: batch(
            build.rows(test_x[:1]), "one row of the test split, as a batch of one", test_y[:1]
        ),
        "single_vector": {
            "x": take(build.rows(test_x[:1]), 0),
            "kind": "vector",
            "about": "the same row unbatched, for forward_one",
        },
        "zeros": batch(build.zeros(4), build.zeros_about(), kind="edge"),
        "boundary": batch(build.boundary(), build.boundary_about(), kind="edge"),
    }
    if contract.has("float"):
        cases["large_magnitude"] = batch(
            build.large(),
            f"+/-{LARGE_MAGNITUDE:.3g} (sqrt of float32's max) in every float element"
            + build.others_about(),
            kind="edge",
        )
        cases["denormal"] = {
            "x": build.subnormal(),
            "kind": "denormal",
            "about": "subnormal float32 values of both signs, smallest to largest, and zero"
            + build.others_about(),
        }
    cases["duplicate_rows"] = {
        "x": build.rows(np.repeat(test_x[:1], DUPLICATE_ROWS, axis=0)),
        "kind": "duplicate_rows",
        "about": f"the first row of the test split {DUPLICATE_ROWS} times in one batch",
    }
    cases.update(build.invalid_cases())
    return cases


class _CaseBuilder:
    """The inputs of the regression cases for one contract (see :func:`regression_cases`)."""

    def __init__(
        self, contract: InputSpec, train_x: np.ndarray, test_x: np.ndarray, columns: Sequence[str]
    ) -> None:
        from vmapcheck.core.contract import leaf_arrays

        self.contract = contract
        self.columns = list(columns)
        self.train = leaf_arrays(contract.from_table(train_x, self.columns))
        self.test4 = leaf_arrays(contract.from_table(test_x[:4], self.columns))

    def rows(self, table: np.ndarray) -> Any:
        return self.contract.from_table(table, self.columns)

    def _tree(self, fill: Callable[[Leaf], np.ndarray | None], n: int) -> Any:
        """A batch of ``n`` rows: ``fill(leaf)`` for a leaf it covers, else the first ``n``
        real test rows of that leaf."""
        from vmapcheck.core.contract import from_leaf_arrays

        arrays = {}
        for leaf in self.contract.leaves:
            made = fill(leaf)
            arrays[leaf.name] = made if made is not None else self.test4[leaf.name][:n]
        return from_leaf_arrays(arrays)

    def others_about(self) -> str:
        others = [leaf.name for leaf in self.contract.leaves if leaf.dtype != "float"]
        return f"; {', '.join(others)} from real test rows" if others else ""

    def zeros(self, n: int) -> Any:
        return self._tree(lambda leaf: np.zeros((n, *leaf.shape), _STORED[leaf.dtype]), n)

    def zeros_about(self) -> str:
        if self.contract.flat:
            return "all-zero rows"
        return "every leaf zero: " + ", ".join(
            f"{leaf.name} {_ZERO_MEANS[leaf.dtype]}" for leaf in self.contract.leaves
        )

    def boundary(self) -> Any:
        def fill(leaf: Leaf) -> np.ndarray:
            if leaf.dtype == "float":
                values = self.train[leaf.name]
                return np.stack([values.min(axis=0), values.max(axis=0)]).astype(np.float32)
            if leaf.dtype == "int32":
                assert leaf.vocab is not None  # Leaf requires it of an int32 leaf
                return np.stack(
                    [np.zeros(leaf.shape, np.int32), np.full(leaf.shape, leaf.vocab - 1, np.int32)]
                )
            return np.stack([np.zeros(leaf.shape, bool), np.ones(leaf.shape, bool)])

        return self._tree(fill, 2)

    def boundary_about(self) -> str:
        if self.contract.flat:
            return "per-feature min and max seen in the train split"
        parts = {
            "float": "its train-split min (row 0) and max (row 1) per element",
            "int32": "id 0 (row 0) and vocab-1 (row 1) everywhere",
            "bool": "all padding (row 0) and no padding (row 1)",
        }
        return "; ".join(f"{leaf.name}: {parts[leaf.dtype]}" for leaf in self.contract.leaves)

    def large(self) -> Any:
        def fill(leaf: Leaf) -> np.ndarray | None:
            if leaf.dtype != "float":
                return None
            alternating = np.where(np.arange(leaf.size) % 2 == 0, 1.0, -1.0)
            signs = np.stack([np.ones(leaf.size), -np.ones(leaf.size), alternating])
            return (LARGE_MAGNITUDE * signs).reshape((3, *leaf.shape)).astype(np.float32)

        return self._tree(fill, 3)

    def subnormal(self) -> Any:
        def fill(leaf: Leaf) -> np.ndarray | None:
            if leaf.dtype != "float":
                return None
            return subnormal_rows(leaf.size).reshape((4, *leaf.shape))

        return self._tree(fill, 4)

    def invalid_cases(self) -> dict[str, Case]:
        if self.contract.flat:
            return _flat_invalid_cases(self.contract.leaves[0].shape[0])
        return _tree_invalid_cases(self.contract, self.test4)


# How each leaf kind is stored in a case file (float leaves in float32, cast when run).
_STORED = {"float": np.float32, "int32": np.int32, "bool": np.bool_}
_ZERO_MEANS = {"float": "0.0", "int32": "id 0", "bool": "all padding"}


def _invalid(
    x: Any,
    about: str,
    expect: list[str],
    runs_on: str = "batch",
    cast: bool = True,
    keep: tuple[str, ...] = (),
) -> Case:
    """An input to be refused. ``cast`` False: run exactly as stored (a flat batch of a
    wrong dtype); ``keep``: the leaves of a dict run as stored while the others are cast
    to the run's dtype like any case, so that only the leaf under test is wrong at every
    precision (vmapcheck.core.cases.case_input)."""
    case: Case = {
        "x": x,
        "kind": "invalid",
        "about": about,
        "expect": expect,
        "runs_on": runs_on,
        "cast": cast,
    }
    if keep:
        case["keep"] = list(keep)
    return case


def _flat_invalid_cases(n_features: int) -> dict[str, Case]:
    """The inputs a flat-vector model must refuse (the names and messages since v1)."""
    f32 = np.float32
    ones = np.ones((4, n_features), dtype=f32)
    with_nan, with_inf = ones.copy(), ones.copy()
    with_nan[1, 0] = np.nan
    with_inf[2, n_features - 1] = np.inf
    return {
        "invalid_features": _invalid(
            np.ones((4, n_features + 1), f32),
            "one feature too many",
            [f"expected {n_features} features, got {n_features + 1}"],
        ),
        "invalid_rank": _invalid(
            np.ones((2, 2, n_features), f32),
            "a rank-3 array",
            ["expected a batch of rank 2", "got rank 3"],
        ),
        "invalid_dtype": _invalid(
            np.ones((4, n_features), np.int32),
            "integer features",
            ["expected dtype", "got int32"],
            cast=False,
        ),
        "invalid_nan": _invalid(
            with_nan, "a NaN in row 1", ["expected finite values, got NaN", "first at index (1, 0)"]
        ),
        "invalid_inf": _invalid(
            with_inf,
            "an Inf in row 2",
            ["expected finite values, got Inf", f"first at index (2, {n_features - 1})"],
        ),
        "invalid_empty": _invalid(
            np.ones((0, n_features), f32),
            "a batch of zero rows",
            ["expected at least one row, got an empty batch"],
        ),
        "invalid_vector": _invalid(
            np.ones(n_features + 1, f32),
            "forward_one given one feature too many",
            [f"expected {n_features} features, got {n_features + 1}"],
            runs_on="vector",
        ),
    }


# The dtype a leaf is wrongly given in its invalid_<leaf>_dtype case: ids as float is
# the classic one (an embedding lookup on floats), a mask as float another.
_WRONG_DTYPE = {"float": np.int32, "int32": np.float32, "bool": np.float32}


def _tree_invalid_cases(contract: InputSpec, valid: dict[str, np.ndarray]) -> dict[str, Case]:
    """The inputs a dict-of-leaves model must refuse: per leaf (rank, shape, dtype, NaN and
    Inf in floats, an id out of range) and per dict (a missing leaf, an extra leaf, batch
    sizes that disagree, no rows, a wrong example for forward_one). ``valid``: 4 real
    test rows per leaf, the rest of each input."""
    from vmapcheck.core.contract import EXTRA_LEAF

    cases: dict[str, Case] = {}

    def with_leaf(name: str, array: np.ndarray) -> dict[str, np.ndarray]:
        return {**valid, name: array}

    for leaf in contract.leaves:
        name, good = leaf.name, valid[leaf.name]
        where = f"leaf {name!r}"
        cases[f"invalid_{name}_rank"] = _invalid(
            with_leaf(name, good[:, None]),
            f"{name} with an extra axis",
            [where, f"expected a batch of rank {len(leaf.shape) + 1}", f"got rank {good.ndim + 1}"],
        )
        longer = np.concatenate([good, good[..., :1]], axis=-1)
        cases[f"invalid_{name}_shape"] = _invalid(
            with_leaf(name, longer),
            f"{name} one element too long on its last axis",
            [where, f"expected per-example shape {leaf.shape}", f"got {longer.shape[1:]}"],
        )
        wrong = _WRONG_DTYPE[leaf.dtype]
        cases[f"invalid_{name}_dtype"] = _invalid(
            with_leaf(name, good.astype(wrong)),
            f"{name} as {np.dtype(wrong).name}",
            [where, "expected dtype", f"got {np.dtype(wrong).name}"],
            keep=(name,),
        )
        if leaf.dtype == "float":
            for bad, row in (("nan", 1), ("inf", 2)):
                array = good.copy()
                array.reshape(4, -1)[row, 0] = np.nan if bad == "nan" else np.inf
                first = (row, *([0] * len(leaf.shape)))
                label = "NaN" if bad == "nan" else "Inf"
                cases[f"invalid_{name}_{bad}"] = _invalid(
                    with_leaf(name, array),
                    f"a {label} in row {row} of {name}",
                    [where, f"expected finite values, got {label}", f"first at index {first}"],
                )
        if leaf.dtype == "int32":
            array = good.copy()
            array.reshape(4, -1)[1, 0] = leaf.vocab
            cases[f"invalid_{name}_range"] = _invalid(
                with_leaf(name, array),
                f"an id equal to vocab ({leaf.vocab}) in row 1 of {name}",
                [where, f"expected ids in [0, {leaf.vocab})", "first at index (1, 0"],
            )
    last = contract.leaves[-1].name
    # One leaf: under another name (a dict without it would hold no array to store).
    without = {k: v for k, v in valid.items() if k != last}
    cases["invalid_missing_leaf"] = _invalid(
        without if without else {f"{last}_renamed": valid[last]},
        f"leaf {last} left out" if without else f"leaf {last} under another name",
        [f"leaf {last!r} is missing"],
    )
    cases["invalid_extra_leaf"] = _invalid(
        {**valid, EXTRA_LEAF: np.ones((4, 1), np.float32)},
        "a leaf the contract does not have",
        [f"leaf {EXTRA_LEAF!r} is not in the contract"],
    )
    if len(contract.leaves) > 1:
        first_leaf = contract.leaves[0].name
        cases["invalid_batch_sizes"] = _invalid(
            with_leaf(first_leaf, valid[first_leaf][:3]),
            f"{first_leaf} with 3 rows, the other leaves with 4",
            ["expected every leaf to have the same batch size", f"{first_leaf}: 3"],
        )
    cases["invalid_empty"] = _invalid(
        {k: v[:0] for k, v in valid.items()},
        "a batch of zero rows",
        ["expected at least one row, got an empty batch"],
    )
    head = contract.leaves[0]
    example = {k: v[0] for k, v in valid.items()}
    example[head.name] = np.concatenate([example[head.name], example[head.name][..., :1]], -1)
    cases["invalid_vector"] = _invalid(
        example,
        f"forward_one given {head.name} one element too long",
        [f"leaf {head.name!r}", f"expected per-example shape {head.shape}"],
        runs_on="vector",
    )
    return cases


def x_arrays(x: Any, prefix: str = "x") -> dict[str, np.ndarray]:
    """How a file stores an input ``x``: one array ``<prefix>`` for a bare array, one array
    ``<prefix>.<leaf>`` per leaf of a dict."""
    if isinstance(x, dict):
        return {f"{prefix}.{name}": np.asarray(value) for name, value in x.items()}
    return {prefix: np.asarray(x)}


def x_from_arrays(arrays: dict[str, np.ndarray], prefix: str = "x") -> Any:
    """The input stored by :func:`x_arrays` under ``prefix`` among ``arrays``."""
    if prefix in arrays:
        return arrays[prefix]
    start = f"{prefix}."
    leaves = {k[len(start) :]: v for k, v in arrays.items() if k.startswith(start)}
    if not leaves:
        raise ArtifactError(f"no input {prefix!r} among the arrays {sorted(arrays)}")
    return leaves


def _about_x(x: Any) -> tuple[Any, Any]:
    """The manifest's shape and dtype of ``x``: lists for a bare array, dicts per leaf."""
    if isinstance(x, dict):
        return (
            {k: list(np.shape(v)) for k, v in x.items()},
            {k: str(np.asarray(v).dtype) for k, v in x.items()},
        )
    return list(np.shape(x)), str(np.asarray(x).dtype)


def write_cases(
    folder: Path, cases: dict[str, Case], features: list[str] | None = None
) -> CasesManifest:
    """One .npz per case plus manifest.json with each file's sha256 and the feature names
    in order (checked against the params contract downstream); returns the manifest.

    A case's ``x`` is stored as the array ``x`` (a flat vector model) or one array
    ``x.<leaf>`` per leaf."""
    folder = Path(folder)
    entries: dict[str, CaseEntry] = {}
    for name, case in cases.items():
        path = folder / f"{name}.npz"
        arrays = {**x_arrays(case["x"]), **({"y": case["y"]} if "y" in case else {})}
        atomic_save_npz(path, arrays)
        shape, dtype = _about_x(case["x"])
        entry: CaseEntry = {
            "file": path.name,
            "sha256": sha256_file(path),
            "kind": case["kind"],
            "shape": shape,
            "dtype": dtype,
            "has_targets": "y" in case,
            "about": case["about"],
        }
        # An input to refuse: its keys, in this order (_Refusal's).
        for key in ("expect", "runs_on", "cast", "keep"):
            if key in case:
                entry[key] = case[key]
        entries[name] = entry
    manifest: CasesManifest = {"features": list(features or []), "cases": entries}
    atomic_write_json(folder / CASES_MANIFEST, manifest)
    return manifest


def read_cases_manifest(path: Path) -> CasesManifest:
    """``data/cases/manifest.json`` (:func:`write_cases`), its keys checked down to each
    case's entry (:func:`vmapcheck.io.read_json_typed`: the error names the file and the
    missing key's path)."""
    return read_json_typed(path, CasesManifest)


def load_cases(folder: Path) -> dict[str, Case]:
    """Cases written by :func:`write_cases`, each file verified against its sha256."""
    folder = Path(folder)
    manifest = read_cases_manifest(folder / CASES_MANIFEST)
    cases: dict[str, Case] = {}
    for name, entry in manifest["cases"].items():
        if "file" not in entry or "sha256" not in entry:
            raise ArtifactError(
                f"{folder / CASES_MANIFEST}: case {name!r} has no stored file: expected the "
                f"keys file and sha256 (written by write_cases), found {sorted(entry)}"
            )
        path = folder / entry["file"]
        digest = sha256_file(path) if path.is_file() else "missing"
        if digest != entry["sha256"]:
            raise ArtifactError(
                f"{path}: sha256 check failed: manifest says {entry['sha256']}, found {digest}"
            )
        arrays = load_npz(path)
        case: Case = {**entry, "x": x_from_arrays(arrays)}
        if "y" in arrays:
            case["y"] = arrays["y"]
        cases[name] = case
    return cases
