"""Property-based refusal at the door (hypothesis): every public entry point, fed random
input, either serves it correctly or refuses it with the project's own error.

- Forward paths (``vmapcheck.core.paths.build_paths``) and the serving ``Guard``: arrays
  of random rank, shape, dtype and contents (NaN, Inf, subnormals, huge values, empty),
  as masked arrays, non-contiguous views, Python lists (ragged too), object arrays, JAX
  arrays on either of the two CPU devices conftest.py creates; for a flat-vector model and
  a dict-input model (float, int32 id and bool mask leaves). A valid batch must come back
  equal to the per-example loop oracle (``forward_one`` row by row) within
  conf/precision/f32.yaml's within-run tolerance, judged by vmapcheck.core.compare on the
  magnitude of the terms; anything else must raise InvalidInputError (the guard also
  NonFiniteOutputError, for an output that overflows).
- The contract's validation alone (InputSpec.validate_batch / validate_example) against
  an independent statement of the contract.
- The CSV loader (vmapcheck.data.sources.read_table) on random mutations of a valid file.
- The config validation on random mutations of the composed defaults.
- The params loader (vmapcheck.params_io) on random corruptions of a saved artifact.

No message may hold a value from the data: a marker value is planted and searched for.
Bounded for ``make test``: a fixed seed, at most ``MAX_EXAMPLES`` examples per property,
no deadline; failing examples are saved in tests/hypothesis-db (committed) and replayed
first on the next run.
"""

from __future__ import annotations

import json
import math
import os
import string
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.extra import numpy as hnp

from tests.helpers.config import PACKAGE_CONF, ROOT
from vmapcheck.compose import compose_yaml
from vmapcheck.config import (
    GuardConfig,
    GuardReplayConfig,
    ModelConfig,
    ToleranceConfig,
    validate_config,
)
from vmapcheck.core import paths
from vmapcheck.core.compare import compare
from vmapcheck.core.contract import InputSpec, Leaf
from vmapcheck.core.magnitude import magnitude_function
from vmapcheck.core.models import Model, build_model
from vmapcheck.data.sources import Schema, read_table
from vmapcheck.errors import (
    ArtifactError,
    ConfigError,
    InvalidInputError,
    NonFiniteOutputError,
    SourceError,
)
from vmapcheck.guard.predictor import Guard
from vmapcheck.io import sha256_file
from vmapcheck.layout import MANIFEST_FILE, PARAMS_FILE
from vmapcheck.params_io import load_params, save_params

# Examples per property in `make test`; more while hunting: VMAPCHECK_EXAMPLES=1000.
HUNT = "VMAPCHECK_EXAMPLES"
MAX_EXAMPLES = int(os.environ.get(HUNT, "60"))
SEED = 20261201
settings.register_profile(
    "vmapcheck-properties",
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=DirectoryBasedExampleDatabase(ROOT / "tests" / "hypothesis-db"),
    # Fixtures are module-scoped and read-only; compiles make the first examples slow.
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
    print_blob=True,
)
PROFILE = settings.get_profile("vmapcheck-properties")


def bounded(test):
    """The suite's settings and fixed seed. The settings go on after ``seed``, which
    would otherwise switch the database off: earlier failures replay first, then the
    same seeded examples as every run."""
    return PROFILE(seed(SEED)(test))


# conf/precision/f32.yaml's within-run tolerance (read, not copied).
_F32 = yaml.safe_load((PACKAGE_CONF / "precision" / "f32.yaml").read_text())["tolerance"]
TOLERANCE = ToleranceConfig(**_F32)
F32_MAX = float(np.finfo(np.float32).max)
DTYPE = jnp.float32
# Planted in inputs; no error message may hold it. float32 holds 123456.7890625 exactly,
# so every decimal form of it starts with MARKER_TEXT.
MARKER = 123456.789
MARKER_TEXT = "123456.7"
MARKER_ID = 918273
MARKER_CELL = "leak.marker@example.org"


def assert_no_marker(message: str) -> None:
    for text in (MARKER_TEXT, str(MARKER_ID), MARKER_CELL, "leak.marker"):
        assert text not in message, f"a data value leaked into an error: {message}"


# --- the models -----------------------------------------------------------------------------

FEATURES = 4


@pytest.fixture(scope="module")
def flat_model() -> tuple[Model, Any]:
    model = build_model(ModelConfig(name="mlp", in_features=FEATURES, hidden=[8], out_features=3))
    return model, model.init(jax.random.key(0))


VOCAB = 5
TOKENS = 4
DICT_SPEC = InputSpec(
    (
        Leaf("x", (2, 3), "float"),
        Leaf("ids", (TOKENS,), "int32", vocab=VOCAB),
        Leaf("mask", (TOKENS,), "bool"),
    )
)


def _dict_forward_one(params: Any, example: dict[str, jax.Array]) -> jax.Array:
    """One example ``{"x": (2, 3) float, "ids": (4,) int32, "mask": (4,) bool}`` -> (2,):
    the masked sum of the ids' embeddings plus a dense layer of x."""
    embedded = params["E"][example["ids"]] * example["mask"].astype(params["E"].dtype)[:, None]
    dense = example["x"].reshape(-1) @ params["W"]
    return embedded.sum(axis=0) @ params["H"] + dense + params["b"]


def _dict_forward_batch(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """The same, hand-batched: every leaf with batch axis 0 -> (batch, 2)."""
    mask = batch["mask"].astype(params["E"].dtype)[:, :, None]
    embedded = (params["E"][batch["ids"]] * mask).sum(axis=1)
    dense = batch["x"].reshape(batch["x"].shape[0], -1) @ params["W"]
    return embedded @ params["H"] + dense + params["b"][None, :]


def _dict_init(key: jax.Array) -> Any:
    e, w, h = jax.random.split(key, 3)
    return {
        "E": jax.random.normal(e, (VOCAB, 3), jnp.float32),
        "W": jax.random.normal(w, (6, 2), jnp.float32),
        "H": jax.random.normal(h, (3, 2), jnp.float32),
        "b": jnp.zeros((2,), jnp.float32),
    }


@pytest.fixture(scope="module")
def dict_model() -> tuple[Model, Any]:
    model = Model(
        name="tokens_and_x",
        in_features=DICT_SPEC.size,
        out_features=2,
        forward_one=_dict_forward_one,
        forward_batch=_dict_forward_batch,
        init=_dict_init,
        inputs=DICT_SPEC,
    )
    return model, model.init(jax.random.key(1))


# --- the oracle -----------------------------------------------------------------------------


class Oracle:
    """The per-example loop (``forward_one`` row by row, eager, float32) and the
    magnitude of each output's terms (vmapcheck.core.magnitude, in float64), per model."""

    def __init__(self, model: Model, params: Any):
        self.model, self.params = model, params
        self._magnitude = None

    def _g(self, example: Any):
        if self._magnitude is None:
            params64 = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), self.params)
            self._params64 = params64
            self._magnitude, _ = magnitude_function(self.model.forward_one, params64, example)
        return self._magnitude

    def __call__(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """(loop outputs float32, terms magnitude float64), both (rows, out), axis 0."""
        rows = [
            jax.tree.map(lambda leaf, i=i: np.asarray(leaf)[i], batch) for i in range(_rows(batch))
        ]
        outs = np.stack([np.asarray(self.model.forward_one(self.params, r)) for r in rows])
        with jax.enable_x64(True):
            wide = [jax.tree.map(_widen, r) for r in rows]
            g = self._g(wide[0])
            scale = np.stack([np.asarray(g(self._params64, r)) for r in wide])
        return outs, scale


def _widen(leaf: Any) -> Any:
    host = np.asarray(leaf)
    return jnp.asarray(host, jnp.float64) if host.dtype == np.float32 else jnp.asarray(host)


def _rows(batch: Any) -> int:
    return int(np.shape(jax.tree.leaves(batch)[0])[0])


def assert_served_correctly(out: Any, batch: Any, oracle: Oracle, where: str) -> None:
    """``out`` agrees with the loop oracle on every element whose terms stay within
    float32's range (beyond it, overflow to Inf is float32's own answer)."""
    expected, scale = oracle(batch)
    out = np.asarray(out)
    assert out.shape == expected.shape, where
    # Where the loop itself overflows (an intermediate beyond float32's range, even when
    # the output's own terms are not), its answer is float32's; the check stage judges
    # non-finite outputs.
    representable = np.isfinite(expected) & (scale * (1 + 1e-3) < F32_MAX)
    result = compare(
        np.where(representable, out, 0.0),
        np.where(representable, expected, 0.0),
        TOLERANCE,
        scale=np.where(representable, scale, 0.0),
    )
    assert result["passed"], f"{where}: {result['reason']}"


# --- generated inputs -----------------------------------------------------------------------

_TINY = float(np.finfo(np.float32).tiny)  # below it: the subnormals
# Finite floats of every kind float32 has: subnormals, huge, signed zeros, the marker.
_FLOATS = st.one_of(
    st.floats(-10, 10, width=32),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.floats(-_TINY, _TINY, width=32, allow_subnormal=True),
    st.just(MARKER),
)
_ANY_FLOATS = st.one_of(_FLOATS, st.sampled_from([math.nan, math.inf, -math.inf]))
_DTYPES = st.sampled_from(
    [np.float32] * 6 + [np.float64, np.float16, np.int32, np.int64, np.bool_, np.complex64]
)


def _elements(dtype: Any, finite: bool) -> st.SearchStrategy:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        floats = _FLOATS if finite else _ANY_FLOATS
        if dtype.itemsize < 4:
            floats = st.floats(-100, 100, width=16)
        return floats
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind == "c":
        return st.complex_numbers(max_magnitude=10, width=64)
    return st.integers(-3, VOCAB + 2) | st.just(MARKER_ID)


@st.composite
def arrays_near(draw, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A plain array of ``shape`` and ``dtype`` most of the time; else another rank,
    shape or dtype; contents of every kind, non-finite now and then."""
    if draw(st.integers(0, 3)) == 0:
        shape = draw(
            st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
            | st.just((shape[0], *shape[1:-1], shape[-1] + 1) if shape else (1,))
        )
    if draw(st.integers(0, 3)) == 0:
        dtype = draw(_DTYPES)
    finite = draw(st.integers(0, 4)) > 0
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=_elements(dtype, finite)))


@st.composite
def wrapped(draw, array: np.ndarray, how: str | None = None) -> Any:
    """``array`` as a caller might hand it over (``how``, else drawn): as is, on a JAX
    device, as a view that is not contiguous, masked, as a (possibly ragged) list, as an
    object array."""
    how = how or draw(
        st.sampled_from(
            ["numpy"] * 4
            + ["device0", "device1", "strided", "fortran", "masked", "list", "ragged", "object"]
        )
    )
    if how in ("device0", "device1"):
        devices = jax.devices()
        device = devices[min(int(how[-1]), len(devices) - 1)]
        try:
            return jax.device_put(array, device)
        except TypeError:  # a dtype JAX does not hold (e.g. complex128 under x64 off)
            return array
    if how == "strided" and array.ndim >= 1:
        doubled = np.repeat(array, 2, axis=0)
        return doubled[::2]  # the same values, every other row of a bigger buffer
    if how == "fortran":
        return np.asfortranarray(array)
    if how == "masked":
        mask = draw(hnp.arrays(np.bool_, array.shape))
        return np.ma.masked_array(array, mask=mask)
    if how == "list":
        return array.tolist()
    if how == "ragged" and array.ndim >= 2 and array.shape[0] >= 1:
        rows = array.tolist()
        rows[0] = rows[0][:-1] if rows[0] else [0.0]
        return rows
    if how == "object":
        return array.astype(object)
    return array


def plain_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | jax.Array) and not isinstance(x, np.ma.MaskedArray)


def valid_leaf(x: Any, leaf: Leaf, rows: int | None) -> bool:
    """The contract, stated independently: a plain array of the leaf's dtype, shape
    ``(rows, *leaf.shape)`` (``rows`` None: unbatched), finite floats, ids in range."""
    if not plain_array(x):
        return False
    want = np.dtype(np.float32) if leaf.dtype == "float" else np.dtype(leaf.dtype)
    if x.dtype != want:
        return False
    lead = () if rows is None else (rows,)
    if tuple(x.shape) != (*lead, *leaf.shape) or (rows is not None and rows < 1):
        return False
    host = np.asarray(x)
    if leaf.dtype == "float":
        return bool(np.isfinite(host).all())
    if leaf.dtype == "int32":
        return bool(((host >= 0) & (host < leaf.vocab)).all())
    return True


def one_device(arrays: list[Any]) -> bool:
    """The committed JAX arrays among ``arrays`` are all on the same device(s)."""
    placed = {frozenset(a.devices()) for a in arrays if isinstance(a, jax.Array) and a.committed}
    return len(placed) <= 1


def valid_batch(x: Any, spec: InputSpec) -> bool:
    if spec.flat:
        rows = np.shape(x)[0] if plain_array(x) and np.ndim(x) >= 1 else None
        return rows is not None and valid_leaf(x, spec.leaves[0], rows)
    if not isinstance(x, dict) or set(x) != set(spec.names):
        return False
    first = x[spec.names[0]]
    if not plain_array(first) or np.ndim(first) < 1:
        return False
    rows = np.shape(first)[0]
    leaves = [x[leaf.name] for leaf in spec.leaves]
    return all(valid_leaf(x[leaf.name], leaf, rows) for leaf in spec.leaves) and one_device(leaves)


@st.composite
def flat_requests(draw, max_rows: int = 4) -> Any:
    rows = draw(st.integers(0, max_rows))
    return draw(wrapped(draw(arrays_near((rows, FEATURES)))))


def _valid_leaf_values(leaf: Leaf, rows: int) -> st.SearchStrategy:
    shape = (rows, *leaf.shape)
    if leaf.dtype == "float":
        return hnp.arrays(np.float32, shape, elements=_FLOATS)
    if leaf.dtype == "int32":
        return hnp.arrays(np.int32, shape, elements=st.integers(0, leaf.vocab - 1))
    return hnp.arrays(np.bool_, shape)


@st.composite
def dict_requests(draw) -> Any:
    """A valid batch of DICT_SPEC (each leaf plain, on a device, or a view) half of the
    time; else one mistake: a leaf of any kind (arrays_near, wrapped), a leaf missing or
    extra, rows that differ, no rows, no dict at all."""
    # Few batch sizes and placements: each pair compiles every path once (~1 s a path on
    # two loaded cores). JAX's default device is device 0: an array put there explicitly
    # is left to wrapped() below and to the flat model's requests.
    rows = draw(st.integers(1, 2))
    how = draw(st.sampled_from(["numpy", "device1", "strided", "fortran"]))
    batch: dict[Any, Any] = {}
    for leaf in DICT_SPEC.leaves:
        array = draw(_valid_leaf_values(leaf, rows))
        batch[leaf.name] = draw(wrapped(array, how))
    change = draw(
        st.sampled_from(["none"] * 5 + ["leaf", "leaf", "drop", "extra", "rows", "empty", "type"])
    )
    if change == "leaf":
        leaf = draw(st.sampled_from(DICT_SPEC.leaves))
        dtype = np.float32 if leaf.dtype == "float" else np.dtype(leaf.dtype)
        batch[leaf.name] = draw(wrapped(draw(arrays_near((rows, *leaf.shape), dtype))))
    elif change == "drop":
        del batch[draw(st.sampled_from(DICT_SPEC.names))]
    elif change == "extra":
        batch[draw(st.sampled_from(["unexpected", 0, "x "]))] = np.zeros((rows, 1), np.float32)
    elif change == "rows":
        name = draw(st.sampled_from(DICT_SPEC.names))
        batch[name] = np.concatenate([np.asarray(batch[name])] * 2)
    elif change == "empty":
        batch = {k: np.asarray(v)[:0] for k, v in batch.items()}
    elif change == "type":
        return draw(st.sampled_from([list(batch.values()), tuple(batch.values()), None, "x"]))
    return batch


def _refusal(exc: Exception) -> None:
    assert isinstance(exc, InvalidInputError), f"{type(exc).__name__}: {exc}"
    event(f"refused: {exc.reason}")
    assert exc.reason and str(exc)
    assert_no_marker(str(exc))


# --- forward paths ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def flat_paths(flat_model):
    model, params = flat_model
    return paths.build_paths(model, DTYPE), Oracle(model, params), params


@pytest.fixture(scope="module")
def dict_paths(dict_model):
    model, params = dict_model
    return paths.build_paths(model, DTYPE), Oracle(model, params), params


def _check_every_path(built, oracle, params, x, spec) -> None:
    valid = valid_batch(x, spec)
    for name, forward in built.items():
        try:
            out = forward(params, x)
        except Exception as exc:  # judged below: only the project's refusal may escape
            assert not valid, f"{name} refused a valid batch: {type(exc).__name__}: {exc}"
            _refusal(exc)
            continue
        assert valid, f"{name} served an invalid batch"
        assert_served_correctly(out, x, oracle, name)
        event("served")


@bounded
@given(x=flat_requests())
def test_every_path_serves_a_valid_flat_batch_like_the_loop_or_refuses_it(flat_paths, x):
    built, oracle, params = flat_paths
    _check_every_path(built, oracle, params, x, InputSpec.vector(FEATURES))


@bounded
@given(x=dict_requests())
def test_every_path_serves_a_valid_dict_batch_like_the_loop_or_refuses_it(dict_paths, x):
    built, oracle, params = dict_paths
    _check_every_path(built, oracle, params, x, DICT_SPEC)


# --- the contract's validation alone --------------------------------------------------------


@bounded
@given(x=flat_requests(), dict_x=dict_requests())
def test_the_contract_accepts_exactly_the_valid_batches(flat_model, dict_model, x, dict_x):
    for (model, _), batch in ((flat_model, x), (dict_model, dict_x)):
        spec = model.contract
        try:
            spec.validate_batch(batch, DTYPE)
        except Exception as exc:
            _refusal(exc)
            assert not valid_batch(batch, spec), f"a valid batch refused: {exc}"
        else:
            assert valid_batch(batch, spec), "an invalid batch accepted"


@pytest.fixture(scope="module")
def vector_paths(flat_model, dict_model):
    return [
        (model, params, paths.build_vector_paths(model, DTYPE), Oracle(model, params))
        for model, params in (flat_model, dict_model)
    ]


@st.composite
def examples(draw, spec: InputSpec) -> Any:
    """One unbatched example of ``spec``: valid half of the time, else any leaf of any
    kind (arrays_near, wrapped)."""
    leaves = {}
    for leaf in spec.leaves:
        if draw(st.booleans()):
            leaves[leaf.name] = draw(_valid_leaf_values(leaf, 1))[0]
        else:
            dtype = np.float32 if leaf.dtype == "float" else np.dtype(leaf.dtype)
            leaves[leaf.name] = draw(wrapped(draw(arrays_near(leaf.shape, dtype))))
    return leaves[spec.names[0]] if spec.flat else leaves


@bounded
@given(data=st.data())
def test_one_example_is_served_by_forward_one_or_refused(vector_paths, data):
    for model, params, built, oracle in vector_paths:
        spec = model.contract
        x = data.draw(examples(spec))
        valid = (
            valid_leaf(x, spec.leaves[0], None)
            if spec.flat
            else all(valid_leaf(x[leaf.name], leaf, None) for leaf in spec.leaves)
            and one_device(list(x.values()))
        )
        try:
            spec.validate_example(x, DTYPE)
        except Exception as exc:
            _refusal(exc)
            assert not valid, f"a valid example refused: {exc}"
        else:
            assert valid, "an invalid example accepted"
        for name, forward in built.items():
            try:
                out = forward(params, x)
            except Exception as exc:
                _refusal(exc)
                assert not valid, f"{name} refused a valid example: {exc}"
                continue
            assert valid, f"{name} served an invalid example"
            batch = jax.tree.map(lambda leaf: np.asarray(leaf)[None], x)
            assert_served_correctly(np.asarray(out)[None], batch, oracle, name)
            event("served")


# --- the guard ------------------------------------------------------------------------------


def _guard_config(max_request_bytes: int = 1 << 16) -> GuardConfig:
    return GuardConfig(
        buckets=[1, 4, 8],
        max_batch=8,
        max_request_bytes=max_request_bytes,
        precompile=False,
        latency_edges_ms=[1.0, 10.0],
        latency_window=100,
        replay=GuardReplayConfig(
            n_requests=1, invalid_share=0.0, seed=0, noise_std=0.0, unbucketed_requests=0
        ),
    )


@pytest.fixture(scope="module")
def guards(flat_model, dict_model):
    def tight(model: Model) -> GuardConfig:
        # The byte limit at one full float32 batch: a wider dtype's full batch is over it.
        per_example = sum(
            leaf.size * leaf.array_dtype(DTYPE).itemsize for leaf in model.contract.leaves
        )
        return _guard_config(max_request_bytes=8 * per_example)

    return {
        name: (Guard(*pair, DTYPE, tight(pair[0])), Oracle(*pair), pair[0].contract)
        for name, pair in (("flat", flat_model), ("dict", dict_model))
    }


def _check_guard(guard: Guard, oracle: Oracle, spec: InputSpec, x: Any) -> None:
    # The guard's limits on top of the contract: at most max_batch rows (8).
    valid = valid_batch(x, spec) and _rows(x) <= 8
    try:
        out = guard.predict(x)
    except NonFiniteOutputError as exc:
        # Only a valid batch runs; it may overflow float32 (huge inputs) and be refused.
        assert valid, f"an invalid request ran: {exc}"
        _, scale = oracle(x)
        assert (scale * (1 + 1e-3) >= F32_MAX).any() or not np.isfinite(scale).all(), str(exc)
        assert_no_marker(str(exc))
        return
    except Exception as exc:
        assert not valid, f"the guard refused a valid request: {type(exc).__name__}: {exc}"
        _refusal(exc)
        return
    assert valid, "the guard served an invalid request"
    assert_served_correctly(out, x, oracle, "guard")
    event("served")


@bounded
@given(x=flat_requests(max_rows=12))
def test_the_guard_serves_a_valid_flat_request_like_the_loop_or_refuses_it(guards, x):
    _check_guard(*guards["flat"], x)


@bounded
@given(x=dict_requests())
def test_the_guard_serves_a_valid_dict_request_like_the_loop_or_refuses_it(guards, x):
    _check_guard(*guards["dict"], x)


@st.composite
def corrupted_params(draw, params: Any) -> tuple[Any, bool]:
    """``params`` with one leaf changed (shape, dtype, NaN/Inf, missing, extra) or
    untouched; and whether the result is still valid."""
    leaves = dict(params)
    name = draw(st.sampled_from(sorted(leaves)))
    leaf = np.asarray(leaves[name])
    how = draw(st.sampled_from(["none", "shape", "dtype", "nan", "missing", "extra", "list"]))
    if how == "shape":
        leaves[name] = np.zeros((*leaf.shape[:-1], leaf.shape[-1] + 1), leaf.dtype)
    elif how == "dtype":
        leaves[name] = leaf.astype(draw(st.sampled_from([np.int32, np.bool_, np.float16])))
    elif how == "nan":
        bad = leaf.copy()
        bad.reshape(-1)[draw(st.integers(0, bad.size - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
        leaves[name] = bad
    elif how == "missing":
        del leaves[name]
    elif how == "extra":
        leaves["unexpected"] = np.zeros((2,), np.float32)
    elif how == "list":
        leaves[name] = leaf.tolist()
    # float16 is a float: the guard casts params to the run's precision.
    valid = how == "none" or (how == "dtype" and leaves[name].dtype == np.float16)
    return leaves, valid


@bounded
@given(data=st.data())
def test_a_guard_is_built_only_over_params_of_the_model(dict_model, data):
    model, params = dict_model
    corrupted, valid = data.draw(corrupted_params(params))
    try:
        guard = Guard(model, corrupted, DTYPE, _guard_config())
    except (ArtifactError, ConfigError) as exc:
        assert not valid, f"valid params refused: {exc}"
        assert_no_marker(str(exc))
        return
    assert valid, "a guard was built over corrupted params"
    x = DICT_SPEC.zeros(2, DTYPE)
    assert guard.predict(x).shape == (2, 2)


# --- the CSV loader -------------------------------------------------------------------------

SCHEMA = Schema(identifiers=("id",), quasi_identifiers={}, features=("f1", "f2"), targets=("t",))


# How each mutation must end: read exactly ("valid"), refused, or either (a cut file may
# end at a line boundary).
_CSV_MUTATIONS = {
    "none": "valid",
    "swap": "valid",  # whole columns, header included: read by name
    "blank_lines": "valid",
    "crlf": "valid",
    "quoted": "valid",
    "delete": "refused",
    "duplicate": "refused",
    "extra_column": "refused",
    "non_numeric": "refused",
    "marker_in_feature": "refused",
    "non_utf8": "refused",
    "empty": "refused",
    "header_only": "refused",
    "semicolons": "refused",
    "short_row": "refused",
    "truncate": "either",
}


@st.composite
def csv_files(draw) -> tuple[bytes, str, np.ndarray, int | None]:
    """(file bytes, the outcome it must have, the features a valid file holds, the
    1-based line of a planted non-UTF-8 byte or None)."""
    n = draw(st.integers(1, 6))
    values = draw(hnp.arrays(np.float32, (n, 3), elements=st.floats(-1e6, 1e6, width=32)))
    header = ["id", "f1", "f2", "t"]
    rows = [[f"p{i}", *(repr(float(v)) for v in row)] for i, row in enumerate(values)]
    order = list(range(4))
    how = draw(st.sampled_from(sorted(_CSV_MUTATIONS)))
    bad_line = None
    if how == "swap":
        i, j = draw(st.permutations(range(4)))[:2]
        order[i], order[j] = order[j], order[i]
    lines = [[header[k] for k in order]] + [[r[k] for k in order] for r in rows]
    if how == "delete":
        k = draw(st.integers(0, 3))
        lines = [[c for j, c in enumerate(line) if j != k] for line in lines]
    elif how == "duplicate":
        k = draw(st.integers(0, 3))
        lines = [[*line, line[k]] for line in lines]
    elif how == "extra_column":
        lines = [[*line, "email" if i == 0 else MARKER_CELL] for i, line in enumerate(lines)]
    elif how in ("non_numeric", "marker_in_feature"):
        r = draw(st.integers(1, n))
        k = lines[0].index(draw(st.sampled_from(["f1", "f2", "t"])))
        bad = ["", " ", "1,5", "x", "nan", "inf", "-inf", "1e39", "0x10", "--1"]
        lines[r][k] = MARKER_CELL if how == "marker_in_feature" else draw(st.sampled_from(bad))
    elif how == "quoted":
        lines = [[f'"{c}"' for c in line] for line in lines]
    elif how == "short_row":
        r = draw(st.integers(1, n))
        lines[r] = lines[r][:-1]
    text = "\n".join(",".join(line) for line in lines) + "\n"
    if how == "semicolons":
        text = text.replace(",", ";")
    elif how == "blank_lines":
        text = text.replace("\n", "\n\n", draw(st.integers(1, n)))
    elif how == "crlf":
        text = text.replace("\n", "\r\n")
    data = text.encode()
    if how == "non_utf8":
        line_index = draw(st.integers(0, n))
        split = data.split(b"\n")
        split[line_index] += draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82"]))
        data = b"\n".join(split)
        bad_line = line_index + 1
    elif how == "empty":
        data = b""
    elif how == "header_only":
        data = ",".join(lines[0]).encode() + b"\n"
    elif how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data, _CSV_MUTATIONS[how], values[:, :2], bad_line


@bounded
@given(case=csv_files())
def test_a_mutated_csv_is_read_exactly_or_refused_naming_the_file(tmp_path_factory, case):
    data, outcome, features, bad_line = case
    path = tmp_path_factory.mktemp("csv") / "table.csv"
    path.write_bytes(data)
    try:
        table = read_table(path, SCHEMA)
    except SourceError as exc:
        message = str(exc)
        event("refused")
        assert outcome != "valid", f"a valid file refused: {message}"
        assert message.startswith(f"{path}: "), message
        assert_no_marker(message)
        if bad_line is not None:
            assert f"line {bad_line}:" in message, message
        return
    event("read")
    assert outcome != "refused", "a file that breaks the schema was read"
    if outcome == "valid":
        np.testing.assert_array_equal(table.features, features)
    assert table.features.dtype == np.float32 and np.isfinite(table.features).all()


@bounded
@given(
    table=hnp.arrays(
        np.float64,
        st.tuples(st.integers(0, 3), st.sampled_from([DICT_SPEC.size, DICT_SPEC.size + 1])),
        elements=st.sampled_from([0.0, 1.0, 2.0, 4.0]) | _ANY_FLOATS | st.just(float(MARKER_ID)),
    )
)
def test_table_rows_become_leaves_or_are_refused_naming_the_leaf(table):
    """InputSpec.from_table: the rows prepare's cases are built from."""
    names = [f"c{j}" for j in range(table.shape[1])]
    try:
        batch = DICT_SPEC.from_table(table, names)
    except ArtifactError as exc:
        event("refused")
        assert_no_marker(str(exc))
        assert table.shape[1] != DICT_SPEC.size or "leaf '" in str(exc), str(exc)
        return
    event("built")
    assert table.shape[1] == DICT_SPEC.size
    if table.shape[0]:
        DICT_SPEC.validate_batch(
            {**batch, "x": np.nan_to_num(batch["x"], posinf=0, neginf=0)}, DTYPE
        )


# --- the config -----------------------------------------------------------------------------

_DEFAULTS = yaml.safe_load(compose_yaml(ROOT / "conf"))
# Mappings whose keys are the user's (their own model's factory arguments, the leaves, the
# quasi-identifier columns): a new key there is not an unknown key.
_OPEN_MAPPINGS = ("model.factory", "model.inputs", "data.quasi_identifiers")


def _paths(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else key
            out.append((path, value))
            out += _paths(value, path)
    return out


_LEAF_PATHS = [p for p, v in _paths(_DEFAULTS) if not isinstance(v, dict)]
_SECTIONS = [""] + [
    p for p, v in _paths(_DEFAULTS) if isinstance(v, dict) and not p.startswith(_OPEN_MAPPINGS)
]
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(string.printable, max_size=12),
    st.lists(st.integers(-3, 2000), max_size=4),
    st.dictionaries(st.sampled_from(["a", "name", "rtol"]), st.integers(0, 3), max_size=2),
)


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        tree = tree[key]
    tree[last] = value


@st.composite
def config_overrides(draw) -> tuple[dict, list[str]]:
    """The composed defaults with 1-3 random edits; the unknown keys it added."""
    raw = json.loads(json.dumps(_DEFAULTS))
    unknown = []
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["set", "set", "add", "delete"]))
        if how == "set":
            _set(raw, draw(st.sampled_from(_LEAF_PATHS)), draw(_VALUES))
        elif how == "add":
            section = draw(st.sampled_from(_SECTIONS))
            key = "zz_" + draw(st.text(string.ascii_lowercase, min_size=1, max_size=5))
            path = f"{section}.{key}" if section else key
            try:
                _set(raw, path, draw(_VALUES))
            except (KeyError, TypeError):  # a parent was replaced by an earlier edit
                continue
            unknown.append(path)
        else:
            path = draw(st.sampled_from(_LEAF_PATHS))
            try:
                *parents, last = path.split(".")
                node = raw
                for key in parents:
                    node = node[key]
                del node[last]
            except (KeyError, TypeError):
                continue
    return raw, unknown


@bounded
@given(case=config_overrides())
def test_a_random_override_is_valid_or_refused_naming_the_key(case):
    raw, unknown = case
    try:
        validate_config(raw)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("invalid configuration in params.yaml:"), message
        assert len(message.splitlines()) >= 2, message
        for path in unknown:
            # Named, unless a union's tag was broken too (data.source: its section's
            # keys cannot be known then).
            named = f"  {path}: unknown key" in message
            assert named or (path.startswith("data.") and "  data.source:" in message), message
        return
    assert not unknown, f"unknown keys {unknown} accepted"


# --- the params artifact --------------------------------------------------------------------


@st.composite
def params_corruptions(draw) -> tuple[str, Any]:
    how = draw(
        st.sampled_from(
            [
                "none",
                "truncate",
                "flip",
                "flip_resigned",
                "leaf_shape",
                "leaf_dtype",
                "nan_leaf",
                "missing_leaf",
                "manifest_garbage",
                "manifest_fields",
            ]
        )
    )
    if how in ("truncate",):
        return how, draw(st.floats(0, 1, exclude_max=True))
    if how in ("flip", "flip_resigned"):
        return how, (draw(st.floats(0, 1, exclude_max=True)), draw(st.integers(1, 255)))
    if how == "manifest_garbage":
        return how, draw(st.binary(max_size=40))
    if how == "manifest_fields":
        key = draw(st.sampled_from(["file", "sha256", "contract"]))
        return how, (key, draw(_VALUES | st.just("../" + PARAMS_FILE)))
    return how, draw(st.integers(0, 3))


@bounded
@given(corruption=params_corruptions())
def test_a_corrupted_params_artifact_is_refused_naming_what_is_wrong(
    dict_model, tmp_path_factory, corruption
):
    model, params = dict_model
    how, arg = corruption
    folder = tmp_path_factory.mktemp("params")
    leaves = {k: np.asarray(v) for k, v in params.items()}
    names = sorted(leaves)
    if how in ("leaf_shape", "leaf_dtype", "nan_leaf", "missing_leaf"):
        name = names[arg % len(names)]
        if how == "leaf_shape":
            leaves[name] = np.zeros((*leaves[name].shape, 1), np.float32)
        elif how == "leaf_dtype":
            leaves[name] = leaves[name].astype(np.float64)
        elif how == "nan_leaf":
            leaves[name] = leaves[name].copy()
            leaves[name].reshape(-1)[0] = np.nan
        else:
            del leaves[name]
    save_params(folder, leaves, {})
    file, manifest_path = folder / PARAMS_FILE, folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    data = file.read_bytes()
    if how == "truncate":
        file.write_bytes(data[: int(arg * len(data))])
    elif how in ("flip", "flip_resigned"):
        at, mask = arg
        flipped = bytearray(data)
        flipped[int(at * len(data))] ^= mask
        file.write_bytes(bytes(flipped))
        if how == "flip_resigned":  # the manifest rewritten to match: the format must hold
            manifest["sha256"] = sha256_file(file)
            manifest_path.write_text(json.dumps(manifest))
    elif how == "manifest_garbage":
        manifest_path.write_bytes(arg)
    elif how == "manifest_fields":
        key, value = arg
        manifest[key] = value
        manifest_path.write_text(json.dumps(manifest))
    template = jax.eval_shape(model.init, jax.random.key(0))
    try:
        loaded, _ = load_params(folder, template)
    except ArtifactError as exc:
        assert how != "none", f"an intact artifact refused: {exc}"
        if how in ("leaf_shape", "leaf_dtype", "nan_leaf", "missing_leaf"):
            assert names[arg % len(names)] in str(exc), str(exc)
        return
    # Served: the params saved, or (a flipped data byte, re-signed) params of the
    # template's shapes and dtypes, finite.
    assert how in ("none", "flip_resigned", "manifest_fields"), how
    for name in names:
        got = np.asarray(loaded[name])
        assert got.shape == template[name].shape and got.dtype == template[name].dtype
        assert np.isfinite(got).all(), name
        if how != "flip_resigned":
            np.testing.assert_array_equal(got, leaves[name])


def test_the_suite_is_bounded_and_replays_from_a_committed_database():
    assert PROFILE.max_examples == MAX_EXAMPLES and PROFILE.deadline is None
    assert MAX_EXAMPLES <= 100 or HUNT in os.environ
    db = PROFILE.database
    assert isinstance(db, DirectoryBasedExampleDatabase)
    assert Path(db.path) == ROOT / "tests" / "hypothesis-db"


# Override strings as `dvc exp run -S` / `vmapcheck params` take them: a known or unknown
# key (with or without +), a group option that exists or not, values of every YAML kind.
_OVERRIDE_KEYS = st.sampled_from(
    [*_LEAF_PATHS, "model", "precision", "data", "bench", "nope", "model.nope", "data.split"]
)
_OVERRIDE_VALUES = st.sampled_from(
    [
        "1",
        "-1",
        "0",
        "1e-5",
        "inf",
        "nan",
        "null",
        "true",
        "x y",
        "[1,2]",
        "[]",
        "{a: 1}",
        "toy",
        "f64",
        "csv",
        "quick",
        "${seed}",
        "'3'",
        "[1, [2]]",
        "",
    ]
)


@settings(PROFILE, max_examples=30)
@seed(SEED)
@given(
    overrides=st.lists(
        st.tuples(st.sampled_from(["", "+", "~", "++"]), _OVERRIDE_KEYS, _OVERRIDE_VALUES),
        min_size=1,
        max_size=3,
    )
)
def test_random_overrides_compose_and_validate_or_are_refused_naming_them(overrides):
    texts = [f"{p}{k}" if p == "~" else f"{p}{k}={v}" for p, k, v in overrides]
    try:
        raw = yaml.safe_load(compose_yaml(ROOT / "conf", texts))
        validate_config(raw)
    except ConfigError as exc:
        event("refused")
        assert str(exc).startswith(("overrides [", "invalid configuration in")), str(exc)
        return
    event("valid")


def _dtype_name(dtype: Any) -> str | None:
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return None


@bounded
@given(
    dtype=st.sampled_from(
        [
            jnp.float32,
            "float32",
            jnp.bfloat16,
            jnp.float64,
            jnp.float16,
            jnp.int32,
            jnp.bool_,
            np.complex64,
            None,
            "nope",
            object,
        ]
    )
)
def test_a_guard_serves_only_a_float_dtype_a_run_can_have(flat_model, dtype):
    model, params = flat_model
    # float64 only with jax_enable_x64, off here (conftest.py).
    servable = _dtype_name(dtype) in ("float32", "bfloat16") and dtype is not None
    try:
        guard = Guard(model, params, dtype, _guard_config())
    except ConfigError as exc:
        event("refused")
        assert "Guard dtype" in str(exc) and not servable, str(exc)
        return
    event(f"built {jnp.dtype(dtype).name}")
    assert servable, dtype
    out = guard.predict(np.ones((3, FEATURES), jnp.dtype(dtype)))
    assert out.shape == (3, 3) and np.isfinite(np.asarray(out, np.float32)).all()


@bounded
@given(
    in_axes=st.one_of(
        st.sampled_from([(None, 0), [None, 0], (0, 0), (None, 1), (1, 0), 0, None, "0", (None,)]),
        st.tuples(
            st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=2),
            st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=2),
        ),
    )
)
def test_batched_forward_takes_a_pair_of_axes_or_refuses_it(flat_model, in_axes):
    from vmapcheck.core.forms import batched_forward

    model, params = flat_model
    x = np.arange(2 * FEATURES, dtype=np.float32).reshape(2, FEATURES) / 8
    try:
        forward = batched_forward(model, params, in_axes=in_axes)
    except InvalidInputError as exc:
        event(f"refused: {exc.reason}")
        assert exc.reason in ("in_axes", "invalid"), exc.reason
        return
    event("served")
    # Params shared (they have no batch copies); the batch on the axis asked for.
    assert in_axes[0] is None and in_axes[1] in (-2, -1, 0, 1), in_axes
    out = forward(params, np.moveaxis(x, 0, in_axes[1]))
    expected = np.stack([np.asarray(model.forward_one(params, row)) for row in x])
    np.testing.assert_allclose(out, expected, rtol=TOLERANCE.rtol, atol=TOLERANCE.atol)
