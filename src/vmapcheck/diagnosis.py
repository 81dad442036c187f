"""Diagnosis: when a check fails, find the first stage, layer and leaf that diverge.

The protocol of MISSION.md ("Diagnosing a divergence"), run in its order. Each stage is
either ruled out, with the evidence that rules it out, or the first to diverge:

1. ``data`` — data and preprocessing: every case file matches its manifest's sha256;
   the cases re-derive from the prepared splits (:func:`regression_cases`); the prepared
   rows re-derive from the raw source (anonymization keeps the numbers, the key stream
   chooses the rows); a model's own preprocessing steps (``Model.preprocessing``) agree
   between the paths.
2. ``key_stream`` — the named subkeys are reproducible and distinct; ``init`` consumes
   no key twice (``jax_debug_key_reuse``), is a function of its key alone, and draws no
   two params leaves from one key (a reused key repeats the same random numbers).
3. ``shapes`` — params tree structure and every leaf's shape and dtype against the
   model's contract; every layer's activation shape and dtype in every path, evaluated
   abstractly (``jax.eval_shape``); the recorded output contract and refusals.
4. ``forward`` — without jit: loop, vmap and direct, on a minimal input (one row) first,
   then the failing case; layer by layer, the first layer where two paths disagree or a
   non-finite value appears.
5. ``loss``, 6. ``gradients`` (every leaf), 7. ``update`` (one optax step, every leaf):
   eager, the per-example loop against the batched forms, on inputs with targets.
8. ``jit`` — the transformations added back one at a time: each path under ``jax.jit``
   against its eager form, per layer; the loss gradients under jit.
9. ``backend`` — the run's stored outputs (computed on its backend) against the same
   paths recomputed here, on CPU.
10. ``sharding`` — the run's ``sharded_jit`` against its ``vmap_jit`` (same backend).
11. ``reference`` — this run against the stored verified run (versions, backend).

The protocol stops at the first stage that diverges: later stages inherit that
divergence and would only repeat it. Every numeric comparison records the max absolute
and relative error, the distance in ULPs (units in the last place of the compared dtype)
and the tolerance it used, which is always the run's own setting, never widened.
Non-finite values are located, never masked (no ``nan_to_num``). Nothing here writes
an input value: only error figures, shapes, dtypes and indices.

``python -m vmapcheck.diagnosis`` (``make diagnose``) runs it on demand against the
current outputs; the ``check`` stage runs it whenever a check fails
(``reports/diagnosis.json`` and ``reports/diagnosis.txt``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.errors import KeyReuseError

from vmapcheck.anonymize import AnonymizePolicy, anonymize
from vmapcheck.config import BackendConfig, Config, DataConfig, ToleranceConfig, load_config
from vmapcheck.data import load_raw, split_indices
from vmapcheck.errors import VmapcheckError
from vmapcheck.gradients import make_loss_one
from vmapcheck.io import atomic_write_json, atomic_write_text, load_npz, read_json, sha256_file
from vmapcheck.keys import KEY_NAMES, named_keys
from vmapcheck.models import Model, Params, build_model
from vmapcheck.names import PATH_NAMES, output_key
from vmapcheck.params_io import contract_of, leaf_paths, load_model_params
from vmapcheck.paths import cast_tree
from vmapcheck.regression import CASES_MANIFEST, SPLITS, regression_cases
from vmapcheck.runtime import configure_jax
from vmapcheck.training import make_loss, make_optimizer

# (stage, what it examines), in the protocol's order.
STAGES = (
    ("data", "data and preprocessing"),
    ("key_stream", "key stream"),
    ("shapes", "shapes and dtypes"),
    ("forward", "forward without jit, minimal input first, layer by layer"),
    ("loss", "loss"),
    ("gradients", "gradients, leaf by leaf"),
    ("update", "one optimizer update, leaf by leaf"),
    ("jit", "jit added back, path by path"),
    ("backend", "the run's backend against this machine's CPU"),
    ("sharding", "sharding over the device mesh against vmap_jit"),
    ("reference", "this run against the stored verified run"),
)
STAGE_NAMES = tuple(name for name, _ in STAGES)
# The three batched forms; loop (forward_one row by row) is the per-example oracle.
FORMS = ("loop", "vmap", "direct")
# The activation name used when a model exposes no activations: the output alone.
OUTPUT = "output"
# Two params leaves whose first values correlate this closely are one random draw:
# independent draws of n >= MIN_DRAW values correlate by about 1/sqrt(n).
SAME_DRAW = 1.0 - 1e-4
MIN_DRAW = 8

EXACT = ToleranceConfig(rtol=0.0, atol=0.0)


# --- comparisons ----------------------------------------------------------------------


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def _float_dtype(a: np.ndarray, b: np.ndarray, dtype: Any) -> np.dtype | None:
    if dtype is not None:
        return np.dtype(dtype)
    both = jnp.promote_types(a.dtype, b.dtype)
    return np.dtype(both) if jnp.issubdtype(both, jnp.floating) else None


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Elementwise distance between ``a`` and ``b`` in ULPs of ``dtype``, as uint64.

    ``dtype`` defaults to the wider of the two (a bfloat16 path against a float32 one is
    measured in float32 ULPs; the caller passes the run's dtype for stored outputs).
    Values are cast to it (exact when they already hold values of it); then each float's
    bit pattern, read as a sign-magnitude integer, gives its position on the number
    line, and the distance is the difference of positions: 1 between neighbouring
    floats, 0 between +0.0 and -0.0, across zero the sum of both sides. Entries where
    either value is non-finite are 0: they are located separately, never measured.
    """
    kind = _float_dtype(a, b, dtype)
    a, b = np.asarray(a), np.asarray(b)
    if kind is None:  # integers: the distance is the difference itself
        with np.errstate(over="ignore"):
            return np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.uint64)
    ints = {2: np.int16, 4: np.int32, 8: np.int64}[kind.itemsize]
    magnitude = np.iinfo(ints).max  # every bit but the sign

    def position(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bits = np.ascontiguousarray(x.astype(kind)).view(ints).astype(np.int64)
        negative = bits < 0
        return (bits & magnitude).astype(np.uint64), negative

    ma, na = position(a)
    mb, nb = position(b)
    same_side = na == nb
    apart = np.where(ma >= mb, ma - mb, mb - ma)
    across = ma + mb  # both magnitudes < 2**63: no overflow in uint64
    out = np.where(same_side, apart, across)
    finite = np.isfinite(a.astype(np.float64)) & np.isfinite(b.astype(np.float64))
    return np.where(finite, out, np.uint64(0))


def measure(
    a: Any,
    b: Any,
    tolerance: ToleranceConfig,
    source: str,
    ulp_dtype: Any = None,
) -> dict[str, Any]:
    """Compare ``a`` with ``b``: max abs / rel error, max ULP distance, and the verdict.

    The verdict is :func:`vmapcheck.agreement.compare`'s rule, elementwise
    ``|a - b| <= atol + rtol * max(|a|, |b|)`` in float64, with ``tolerance`` as given
    (``source`` names the setting it comes from). A non-finite value in either array is
    a failure, located (count and first index), never masked; the error figures then
    cover the elements finite in both. ``element`` is the index of the worst element.
    """
    a, b = np.asarray(a), np.asarray(b)
    out: dict[str, Any] = {
        "max_abs": None,
        "max_rel": None,
        "max_ulp": None,
        "ulp_dtype": None,
        "tolerance": {"rtol": tolerance.rtol, "atol": tolerance.atol, "from": source},
        "passed": False,
        "element": None,
        "reason": "",
    }
    if a.shape != b.shape:
        out["reason"] = f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
        return out
    if a.size == 0:
        out.update(max_abs=0.0, max_rel=0.0, max_ulp=0, passed=True)
        return out
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    both = fa & fb
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(both, np.abs(a64 - b64), 0.0)
        scale = np.where(both, np.maximum(np.abs(a64), np.abs(b64)), 0.0)
    rel = np.divide(diff, scale, out=np.zeros_like(diff), where=scale > 0)
    allowed = tolerance.atol + tolerance.rtol * scale
    kind = _float_dtype(a, b, ulp_dtype)
    ulps = ulp_distance(a, b, kind)
    out.update(
        max_abs=float(diff.max()),
        max_rel=float(rel.max()),
        max_ulp=int(ulps.max()),
        ulp_dtype=kind.name if kind is not None else "integer",
    )
    if not both.all():
        first = _index(int(np.flatnonzero(~both)[0]), a.shape)
        out["non_finite"] = {"a": int((~fa).sum()), "b": int((~fb).sum())}
        out["element"] = first
        out["reason"] = (
            f"non-finite values: {int((~fa).sum())} in one, {int((~fb).sum())} in the other "
            f"(first at {tuple(first)})"
        )
        return out
    excess = diff - allowed
    worst = int(np.argmax(excess))
    out["element"] = _index(worst, a.shape)
    out["passed"] = bool(np.all(excess <= 0))
    if not out["passed"]:
        out["reason"] = (
            f"element {tuple(out['element'])}: |a-b|={diff.flat[worst]:.3g} > atol + "
            f"rtol*|x| = {allowed.flat[worst]:.3g} ({int(ulps.flat[worst])} ULP)"
        )
    return out


def _exact(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Bitwise agreement of stored and re-derived arrays (data are never recomputed
    approximately: the same steps on the same CPU give the same bits)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        result = measure(a, b, EXACT, "exact") if a.shape == b.shape else None
        return {
            **(result or {}),
            "passed": False,
            "reason": f"dtype {a.dtype} vs {b.dtype}",
        }
    if jnp.issubdtype(a.dtype, jnp.floating):
        result = measure(a, b, EXACT, "exact")
        # NaN where the stored array holds NaN (an invalid case) is the same value.
        same = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        result["passed"] = bool(same)
        if same:
            result["reason"] = ""
        return result
    same = a.shape == b.shape and np.array_equal(a, b)
    return {
        "passed": bool(same),
        "tolerance": {"rtol": 0.0, "atol": 0.0, "from": "exact"},
        "reason": "" if same else f"{a.dtype} arrays {tuple(a.shape)} vs {tuple(b.shape)} differ",
    }


# --- what the diagnosis runs on -------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """An input of the ladder: ``x`` (rows, in_features), batch axis 0; ``y`` (rows,
    out_features) or None. ``label`` says where it comes from (never its values)."""

    label: str
    x: np.ndarray
    y: np.ndarray | None = None


@dataclass(frozen=True)
class Subject:
    """The model and numerics under diagnosis.

    ``params``: as loaded (float32 leaves); they enter every computation cast to
    ``dtype``, as in the forward stage. ``probes``: the input ladder, minimal first.
    ``tolerance``: between paths of one run (precision.tolerance); ``cross_run_tolerance``:
    between backends or runs. ``optimizer``: the training optimizer (None: not trained).
    ``seed``: the key stream's root seed (None: the key stream is not examined).
    """

    model: Model
    params: Params
    dtype: Any
    tolerance: ToleranceConfig
    cross_run_tolerance: ToleranceConfig
    probes: tuple[Probe, ...]
    optimizer: optax.GradientTransformation | None = None
    seed: int | None = None

    @property
    def run_params(self) -> Params:
        return cast_tree(self.params, self.dtype)

    def inputs(self, probe: Probe) -> tuple[jax.Array, jax.Array | None]:
        x = jnp.asarray(probe.x, dtype=self.dtype)
        y = None if probe.y is None else jnp.asarray(probe.y, dtype=self.dtype)
        return x, y


@dataclass(frozen=True)
class DataSources:
    """Where the data stage finds the stored data: ``cases`` (data/cases), ``prepared``
    (data/prepared), the data config and seed that made them, and the folder the raw
    source path is relative to."""

    cases: Path
    prepared: Path
    config: DataConfig
    seed: int
    root: Path


@dataclass(frozen=True)
class StoredRun:
    """The run being diagnosed: ``outputs`` (data/forward/outputs.npz, ``<case>.<path>``),
    ``record`` (data/forward/record.json) and the inputs ``cases`` (name -> x) whose
    outputs the backend stage recomputes here."""

    outputs: dict[str, np.ndarray]
    record: dict[str, Any]
    cases: dict[str, np.ndarray]


# --- stage results --------------------------------------------------------------------


def _finding(stage: str, message: str, **fields: Any) -> dict[str, Any]:
    """The first divergence of a stage; every key present (None when it does not apply)."""
    base = {
        "stage": stage,
        "what": None,
        "input": None,
        "layer": None,
        "leaf": None,
        "params_leaves": None,
        "paths": None,
        "pair": None,
        "element": None,
        "max_abs": None,
        "max_rel": None,
        "max_ulp": None,
        "ulp_dtype": None,
        "tolerance": None,
    }
    figures = {k: v for k, v in fields.pop("figures", {}).items() if k in base}
    return {**base, **figures, **fields, "message": message}


def _stage(
    name: str,
    evidence: list[dict[str, Any]],
    finding: dict[str, Any] | None = None,
    summary: str = "",
    skipped: str | None = None,
) -> dict[str, Any]:
    title = dict(STAGES)[name]
    if skipped is not None:
        status, summary = "skipped", skipped
    elif finding is not None:
        status, summary = "diverged", finding["message"]
    else:
        status = "ruled_out"
    return {
        "stage": name,
        "title": title,
        "status": status,
        "summary": summary,
        "finding": finding,
        "evidence": evidence,
    }


def _error_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _layer_of(leaf: str) -> str:
    """``layers[1].W`` -> ``layers[1]``: the layer a params leaf belongs to."""
    return leaf.rsplit(".", 1)[0] if "." in leaf else leaf


def _params_leaves(layer: str, leaves: Iterable[str], n_layers: int) -> list[str] | None:
    """The params leaves feeding ``layer``, when the model names its layers after them
    (``layers[1]`` -> ``layers[1].W``, ``layers[1].b``); a one-layer model's leaves all
    feed its one layer."""
    leaves = list(leaves)
    named = [leaf for leaf in leaves if leaf.startswith((f"{layer}.", f"{layer}["))]
    if named:
        return named
    return leaves if n_layers == 1 else None


# --- the paths, as activations --------------------------------------------------------


class _Layers:
    """One form's activations as a list of arrays (what jit, vmap and eval_shape accept);
    the layer names are filled in whenever the function runs or is traced."""

    def __init__(self, fn: Callable[[Params, jax.Array], list[tuple[str, jax.Array]]]):
        self.fn = fn
        self.names: list[str] = []

    def __call__(self, params: Params, x: jax.Array) -> list[jax.Array]:
        acts = self.fn(params, x)
        self.names = [name for name, _ in acts]
        return [value for _, value in acts]


def _named(one: _Layers, arrays: list[jax.Array]) -> list[tuple[str, jax.Array]]:
    # After the call: running (or tracing) ``one`` is what fills in its names.
    return list(zip(one.names, arrays, strict=True))


def _per_row(model: Model) -> tuple[_Layers, bool]:
    if model.activations_one is not None:
        return _Layers(model.activations_one), True
    return _Layers(lambda p, x: [(OUTPUT, model.forward_one(p, x))]), False


def _form(model: Model, form: str) -> tuple[_Layers | None, Callable | None, bool]:
    """(activations of ``form`` on a batch (rows, in) -> [(rows, units)...], the form's
    plain forward, whether the activations are per layer). None: the model lacks it."""
    one, per_layer = _per_row(model)
    if form == "loop":

        def loop(params: Params, batch: jax.Array) -> list[jax.Array]:
            rows = [one(params, row) for row in batch]
            return [jnp.stack(layer) for layer in zip(*rows, strict=True)]

        layers = _Layers(lambda p, x: _named(one, loop(p, x)))
        plain = lambda p, x: jnp.stack([model.forward_one(p, row) for row in x])  # noqa: E731
        return layers, plain, per_layer
    if form == "vmap":
        mapped = jax.vmap(one, in_axes=(None, 0))
        layers = _Layers(lambda p, x: _named(one, mapped(p, x)))
        return layers, jax.vmap(model.forward_one, in_axes=(None, 0)), per_layer
    if model.forward_batch is None:
        return None, None, False
    if model.activations_batch is not None:
        return _Layers(model.activations_batch), model.forward_batch, True
    forward_batch = model.forward_batch
    return _Layers(lambda p, x: [(OUTPUT, forward_batch(p, x))]), forward_batch, False


@dataclass
class _Run:
    """One form evaluated on one probe."""

    path: str
    names: list[str]
    arrays: list[np.ndarray]
    per_layer: bool
    error: str | None = None
    note: str | None = None


def _evaluate(subject: Subject, probe: Probe, jit: bool) -> dict[str, _Run]:
    """Each form's activations on ``probe`` (eager, or under jax.jit), checked against
    the form's own forward: activations that do not reproduce it are not trusted per
    layer, and the form is compared on its forward's output alone."""
    params = subject.run_params
    x, _ = subject.inputs(probe)
    mode = "jit" if jit else "eager"
    runs: dict[str, _Run] = {}
    for form in FORMS:
        layers, plain, per_layer = _form(subject.model, form)
        if layers is None:
            continue
        path = f"{form}_{mode}"
        try:
            fn = jax.jit(layers) if jit else layers
            arrays = [np.asarray(a) for a in jax.block_until_ready(fn(params, x))]
            names = list(layers.names)
            forward = jax.jit(plain) if jit else plain
            out = np.asarray(jax.block_until_ready(forward(params, x)))
        except Exception as exc:  # a crashing path is a finding, not the diagnosis' end
            runs[form] = _Run(path, [], [], False, error=_error_line(exc))
            continue
        run = _Run(path, names, arrays, per_layer)
        same = measure(arrays[-1], out, subject.tolerance, "precision.tolerance")
        if not (same["passed"] or _same_non_finite(arrays[-1], out)):
            run.note = (
                f"the activations of {path} do not reproduce its forward output "
                f"({same['reason']}): compared on the forward's output only"
            )
            run.names, run.arrays, run.per_layer = [OUTPUT], [out], False
        runs[form] = run
    return runs


def _same_non_finite(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


def _layer_table(runs: dict[str, _Run]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """[(layer, {form: activation})] in the loop's layer order; a form known only by its
    output joins at the last layer."""
    ordered = [r for r in runs.values() if r.error is None]
    per_layer = [r for r in ordered if r.per_layer]
    names = per_layer[0].names if per_layer else [OUTPUT]
    table = []
    for i, name in enumerate(names):
        last = i == len(names) - 1
        arrays = {}
        for form, run in runs.items():
            if run.error is not None:
                continue
            if run.per_layer and name in run.names:
                arrays[form] = run.arrays[run.names.index(name)]
            elif last and not run.per_layer:
                arrays[form] = run.arrays[-1]
        table.append((name, arrays))
    return table


def _odd_paths(failing: list[tuple[str, str]], forms: list[str]) -> list[str]:
    """The forms in every failing pair (the odd one out), else all forms of those pairs."""
    counts = {f: sum(f in pair for pair in failing) for f in forms}
    top = max(counts.values())
    odd = [f for f in forms if counts[f] == top and top == len(failing)]
    return odd or sorted({f for pair in failing for f in pair}, key=forms.index)


def _walk(
    stage: str,
    subject: Subject,
    probe: Probe,
    runs: dict[str, _Run],
    only: Callable[[str], bool],
    evidence: list[dict[str, Any]],
    mode: str,
    against: dict[str, _Run] | None = None,
) -> dict[str, Any] | None:
    """Layer by layer (``only`` selects the layers), the first where a path is
    non-finite or two paths disagree. ``against``: compare each form with its own
    counterpart there (eager against jit) instead of the forms with one another."""
    leaves = list(leaf_paths(subject.params))
    for run in [*runs.values(), *(against or {}).values()]:
        if run.error is not None:
            evidence.append({"what": f"{run.path} on {probe.label}", "passed": False})
            return _finding(
                stage,
                f"{run.path} raised on {probe.label}: {run.error}",
                what="path raised",
                input=probe.label,
                paths=[run.path],
            )
    table = _layer_table(runs)
    other = dict(_layer_table(against)) if against is not None else None
    n_layers = len(table)
    agreed: list[dict[str, Any]] = []  # the layers before the divergence, and how close
    for name, arrays in table:
        if not only(name):
            continue
        if other is not None:
            pairs = [
                (runs[f].path, against[f].path, arrays[f], other[name][f])
                for f in arrays
                if f in other.get(name, {})
            ]
        else:
            forms = list(arrays)
            pairs = [
                (runs[f].path, runs[g].path, arrays[f], arrays[g])
                for f, g in combinations(forms, 2)
            ]
        candidates = [(runs[f].path, a) for f, a in arrays.items()]
        if other is not None:
            candidates += [(against[f].path, a) for f, a in other.get(name, {}).items()]
        non_finite = {
            path: arr
            for path, arr in candidates
            if not np.all(np.isfinite(np.asarray(arr, dtype=np.float64)))
        }
        failing: list[tuple[str, str, dict[str, Any]]] = []
        results = []
        for left, right, a, b in pairs:
            result = measure(a, b, subject.tolerance, "precision.tolerance")
            results.append(result)
            evidence.append(
                {"what": f"{name} on {probe.label}", "pair": f"{left}-vs-{right}", **result}
            )
            if not result["passed"]:
                failing.append((left, right, result))
        if not failing and not non_finite:
            agreed.append(
                {
                    "layer": name,
                    "max_abs": max((r["max_abs"] for r in results), default=0.0),
                    "max_ulp": max((r["max_ulp"] for r in results), default=0),
                }
            )
            continue
        params_leaves = _params_leaves(name, leaves, n_layers)
        role = "preprocessing step" if name in subject.model.preprocessing else "layer"
        if non_finite:
            paths = list(non_finite)
            first_path, arr = next(iter(non_finite.items()))
            bad = ~np.isfinite(np.asarray(arr, dtype=np.float64))
            element = _index(int(np.flatnonzero(bad)[0]), arr.shape)
            kinds = "NaN" if np.isnan(np.asarray(arr, dtype=np.float64)).any() else "Inf"
            return _finding(
                stage,
                f"non-finite values ({kinds}) first appear at {role} {name} on {probe.label} "
                f"in {', '.join(paths)} ({int(bad.sum())} element(s) in {first_path}, first at "
                f"{tuple(element)}); every earlier {role} is finite",
                what="non-finite activation",
                input=probe.label,
                layer=name,
                params_leaves=params_leaves,
                paths=paths,
                element=element,
                agreed_before=agreed,
            )
        pair_paths = [(left, right) for left, right, _ in failing]
        all_paths = list(dict.fromkeys(p for pair in pair_paths for p in pair))
        odd = _odd_paths(pair_paths, all_paths) if other is None else all_paths
        left, right, result = next((f for f in failing if set(odd) & {f[0], f[1]}), failing[0])
        dtypes = {runs[f].path: str(arrays[f].dtype) for f in arrays}
        return _finding(
            stage,
            f"{role} {name} diverges on {probe.label} ({mode}): {left} vs {right}: "
            f"max_abs {result['max_abs']:.3g}, max_rel {result['max_rel']:.3g}, "
            f"{result['max_ulp']} ULP ({result['ulp_dtype']}) at element "
            f"{tuple(result['element'])}; tolerance rtol={subject.tolerance.rtol:g} "
            f"atol={subject.tolerance.atol:g} (precision.tolerance, not widened)",
            what="activation",
            input=probe.label,
            layer=name,
            params_leaves=params_leaves,
            paths=odd,
            pair=f"{left}-vs-{right}",
            figures=result,
            dtypes=dtypes,
            agreed_before=agreed,
        )
    return None


# --- 1. data and preprocessing --------------------------------------------------------


def _split_arrays(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    return {name: load_npz(folder / f"{name}.npz") for name in SPLITS}


def _first_feature(result: dict[str, Any], features: list[str]) -> str | None:
    element = result.get("element")
    if element and features and len(element) >= 1 and element[-1] < len(features):
        return features[element[-1]]
    return None


def _data_mismatch(
    evidence: list[dict[str, Any]],
    stored: np.ndarray,
    derived: np.ndarray,
    *,
    checked: str,
    what: str,
    layer: str,
    features: list[str] | None,
    claim: str,
    cause: str,
) -> dict[str, Any] | None:
    """Compare a stored array with its re-derivation bit for bit and record the evidence
    (``checked``: what was compared). On a difference, the data stage's finding: "<claim>
    (<reason>[, feature <name>]): <cause>", the feature named from ``features`` (the
    columns of a (rows, features) array; None for other arrays)."""
    result = _exact(stored, derived)
    evidence.append({"what": checked, **result})
    if result["passed"]:
        return None
    feature = _first_feature(result, features) if features is not None else None
    return _finding(
        "data",
        f"{claim} ({result['reason']}"
        + (f", feature {feature}" if feature else "")
        + f"): {cause}",
        what=what,
        layer=layer,
        figures=result,
        feature=feature,
    )


def data_stage(sources: DataSources | None, subject: Subject | None = None) -> dict[str, Any]:
    """Stage 1: the stored data are what the preprocessing makes of the raw source, and
    the model's own preprocessing steps agree between the paths.

    In order: every case file against its manifest sha256; every case (x and y)
    against :func:`regression_cases` re-run on the prepared splits; every prepared row
    against the raw source's row it came from (anonymization keeps features and
    targets unchanged; a step applied twice shows here), and each split's rows against
    :func:`split_indices` re-run from the key stream's ``split`` subkey; then, for a
    model that declares ``preprocessing`` activations, those steps across the paths
    (eager, minimal input first). All stored-data comparisons are exact.
    """
    evidence: list[dict[str, Any]] = []
    if sources is not None:
        finding = _stored_data(sources, evidence)
        if finding is not None:
            return _stage("data", evidence, finding)
    if subject is not None and subject.model.preprocessing:
        steps = set(subject.model.preprocessing)
        for probe in subject.probes:
            runs = _evaluate(subject, probe, jit=False)
            finding = _walk("data", subject, probe, runs, steps.__contains__, evidence, "eager")
            if finding is not None:
                return _stage("data", evidence, finding)
    if sources is None and not (subject is not None and subject.model.preprocessing):
        return _stage("data", evidence, skipped="no stored data given and no preprocessing")
    parts = []
    if sources is not None:
        parts.append(
            "case files match their manifest; cases re-derive from the prepared splits; "
            "prepared rows equal the raw rows they came from"
        )
    if subject is not None and subject.model.preprocessing:
        parts.append(f"preprocessing {', '.join(subject.model.preprocessing)} agrees in every path")
    elif subject is not None:
        parts.append("the model declares no preprocessing of its own")
    return _stage("data", evidence, summary="; ".join(parts))


def _stored_data(sources: DataSources, evidence: list[dict[str, Any]]) -> dict[str, Any] | None:
    manifest = read_json(sources.cases / CASES_MANIFEST)
    features = list(manifest.get("features", []))
    stored: dict[str, dict[str, np.ndarray]] = {}
    for name, entry in manifest["cases"].items():
        path = sources.cases / entry["file"]
        found = sha256_file(path) if path.is_file() else "missing"
        ok = found == entry["sha256"]
        evidence.append(
            {"what": f"cases/{entry['file']} sha256 against the manifest", "passed": ok}
        )
        if not ok:
            return _finding(
                "data",
                f"cases/{entry['file']} does not match its manifest (sha256 "
                f"{'missing file' if found == 'missing' else 'differs'}): the case was "
                "changed after prepare wrote it",
                what="case file",
                layer=f"cases/{entry['file']}",
            )
        stored[name] = load_npz(path)
    splits = _split_arrays(sources.prepared)
    derived = regression_cases(
        splits["train"]["features"],
        splits["test"]["features"],
        splits["test"]["targets"],
        sources.config.standard_batch,
    )
    if set(derived) != set(stored):
        return _finding(
            "data",
            f"the stored cases {sorted(stored)} are not the cases prepare makes {sorted(derived)}",
            what="case set",
        )
    for name, case in derived.items():
        for key in ("x", "y"):
            if key not in case and key not in stored[name]:
                continue
            if (key in case) != (key in stored[name]):
                return _finding(
                    "data",
                    f"case {name}: {key} stored and re-derived differ in presence",
                    what="case",
                    layer=f"cases.{name}.{key}",
                )
            finding = _data_mismatch(
                evidence,
                stored[name][key],
                case[key],
                checked=f"cases.{name}.{key} re-derived from the prepared splits",
                what="case array",
                layer=f"cases.{name}.{key}",
                features=features if key == "x" else None,
                claim=f"case {name}: stored {key} differs from {key} re-derived from the "
                "prepared splits",
                cause="a step was applied to the cases that prepare does not apply "
                "(or applied twice)",
            )
            if finding:
                return finding
    return _raw_rows(sources, splits, features, evidence)


def _raw_rows(
    sources: DataSources,
    splits: dict[str, dict[str, np.ndarray]],
    features: list[str],
    evidence: list[dict[str, Any]],
) -> dict[str, Any] | None:
    config = sources.config
    # Exactly prepare's numerics (configure_cpu_float32): the same bits come out.
    with jax.enable_x64(False), jax.default_matmul_precision("highest"):
        keys = named_keys(sources.seed)
        try:
            raw = load_raw(config, keys["data"], sources.root)
            group_ids = anonymize(
                raw,
                AnonymizePolicy(
                    # Pseudonyms are not needed to compare numbers: no secret is read.
                    join_key=None,
                    secret_env=config.anonymize.secret_env,
                    group_by=config.anonymize.group_by,
                ),
            ).group_ids
            parts = split_indices(keys["split"], group_ids, config)
        except VmapcheckError as exc:
            evidence.append(
                {"what": "raw source re-read", "passed": None, "reason": _error_line(exc)}
            )
            return None
    for split in SPLITS:
        rows = splits[split]["row"]
        result = _exact(rows, parts[split])
        evidence.append({"what": f"prepared/{split} rows re-derived from key 'split'", **result})
        if not result["passed"]:
            return _finding(
                "data",
                f"the rows of the prepared {split} split are not those split_indices draws "
                "from the key stream's 'split' subkey",
                what="split rows",
                layer=f"prepared.{split}.row",
            )
        for key, block in (("features", raw.features), ("targets", raw.targets)):
            finding = _data_mismatch(
                evidence,
                splits[split][key],
                block[rows],
                checked=f"prepared.{split}.{key} against the raw rows",
                what="prepared array",
                layer=f"prepared.{split}.{key}",
                features=features if key == "features" else None,
                claim=f"prepared {split} {key} differ from the raw source's rows",
                cause="anonymization keeps the numbers, so a preprocessing step changed "
                "them (or ran twice)",
            )
            if finding:
                return finding
    return None


# --- 2. key stream --------------------------------------------------------------------


def _random_leaves(params: Params, elsewhere: Params) -> dict[str, np.ndarray]:
    """Leaves that hold random draws: floating, at least MIN_DRAW values, not constant,
    and changed in ``elsewhere`` (init from another key). A leaf the key does not move
    (an identity matrix, a fixed table) is no draw, however it correlates."""
    other = leaf_paths(elsewhere)
    out = {}
    for name, leaf in leaf_paths(params).items():
        host = np.asarray(leaf)
        if jnp.issubdtype(host.dtype, jnp.floating) and host.size >= MIN_DRAW:
            flat = host.astype(np.float64).ravel()
            moved = not np.array_equal(host, np.asarray(other.get(name)))
            if np.all(np.isfinite(flat)) and flat.std() > 0 and moved:
                out[name] = flat
    return out


def _correlation(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Correlation of the first min(len) values: a key reused for two draws gives the
    same random bits position by position (threefry counts through the flat index), so
    the shared prefix correlates exactly, whatever each draw's scale."""
    n = min(a.size, b.size)
    x, y = a[:n] - a[:n].mean(), b[:n] - b[:n].mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return (float((x * y).sum() / denom) if denom > 0 else 0.0), n


def key_stream_stage(model: Model, seed: int | None) -> dict[str, Any]:
    """Stage 2: each named subkey feeds one random draw.

    Evidence: :func:`named_keys` twice gives the same keys, and the subkeys differ
    pairwise; ``model.init(keys['init'])`` under ``jax_debug_key_reuse`` consumes no key
    twice; two calls give identical params (init depends on its key alone); no two
    params leaves repeat one draw (their first values correlate to 1 within
    :data:`SAME_DRAW`: a key reused by value, e.g. the same ``fold_in`` for every layer,
    which the reuse checker cannot see). Runs as prepare and train do (float32, no x64).
    Used by the check itself (a reused key fails it) and as the diagnosis' stage 2.
    """
    evidence: list[dict[str, Any]] = []
    if seed is None:
        return _stage("key_stream", evidence, skipped="no seed given")
    with jax.enable_x64(False), jax.default_matmul_precision("highest"):
        first, again = named_keys(seed), named_keys(seed)
        data = {n: np.asarray(jax.random.key_data(k)) for n, k in first.items()}
        same = all(np.array_equal(data[n], jax.random.key_data(again[n])) for n in KEY_NAMES)
        evidence.append({"what": "named subkeys re-derived from the seed", "passed": same})
        if not same:
            return _stage(
                "key_stream",
                evidence,
                _finding("key_stream", "named_keys(seed) is not reproducible", what="keys"),
            )
        for left, right in combinations(KEY_NAMES, 2):
            distinct = not np.array_equal(data[left], data[right])
            evidence.append({"what": f"subkeys {left!r} and {right!r} differ", "passed": distinct})
            if not distinct:
                return _stage(
                    "key_stream",
                    evidence,
                    _finding(
                        "key_stream",
                        f"the named subkeys {left!r} and {right!r} are the same key",
                        what="keys",
                        layer=f"keys.{right}",
                    ),
                )
        reuse = None
        try:
            with jax.debug_key_reuse(True):
                params = jax.block_until_ready(model.init(named_keys(seed)["init"]))
                repeat = model.init(named_keys(seed)["init"])
                elsewhere = model.init(named_keys(seed + 1)["init"])
        except KeyReuseError as exc:
            reuse = _error_line(exc)
            # Drawn again without the checker, to name the leaves that share a key.
            with jax.debug_key_reuse(False):
                params = model.init(named_keys(seed)["init"])
                repeat = model.init(named_keys(seed)["init"])
                elsewhere = model.init(named_keys(seed + 1)["init"])
        evidence.append(
            {"what": "init under jax_debug_key_reuse", "passed": reuse is None, "reason": reuse}
        )
    pure = all(
        np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(repeat), strict=True)
    )
    evidence.append({"what": "init twice from the same key gives the same params", "passed": pure})
    draws = _random_leaves(params, elsewhere)
    names = list(draws)
    for i, later in enumerate(names):
        for earlier in names[:i]:
            corr, n = _correlation(draws[earlier], draws[later])
            repeated = abs(corr) >= SAME_DRAW and n >= MIN_DRAW
            evidence.append(
                {
                    "what": f"init draws {earlier} and {later} independent",
                    "correlation": corr,
                    "values": n,
                    "passed": not repeated,
                }
            )
            if repeated:
                return _stage(
                    "key_stream",
                    evidence,
                    _finding(
                        "key_stream",
                        f"init draws {later} with the key already used for {earlier}: their "
                        f"first {n} values correlate {corr:.6f} (one PRNG key fed both)"
                        + (f"; the reuse checker also saw it ({reuse})" if reuse else ""),
                        what="reused PRNG key",
                        layer=_layer_of(later),
                        leaf=later,
                        params_leaves=[earlier, later],
                        key="init",
                    ),
                )
    if reuse is not None:
        return _stage(
            "key_stream",
            evidence,
            _finding(
                "key_stream",
                f"init consumed a PRNG key twice ({reuse})",
                what="reused PRNG key",
                layer="init",
                key="init",
            ),
        )
    if not pure:
        return _stage(
            "key_stream",
            evidence,
            _finding(
                "key_stream",
                "init gives different params from the same key: it draws randomness "
                "outside the key stream (a global RNG, the clock)",
                what="impure init",
                layer="init",
                key="init",
            ),
        )
    return _stage(
        "key_stream",
        evidence,
        summary=f"{len(KEY_NAMES)} named subkeys reproducible and distinct; init consumes "
        f"no key twice and repeats no draw across {len(draws)} random leaves",
    )


# --- 3. shapes and dtypes -------------------------------------------------------------


def _abstract(subject: Subject, probe: Probe) -> dict[str, tuple[list[str], list[Any], str]]:
    """Each form's activation shapes/dtypes on ``probe``, traced, not computed."""
    params = subject.run_params
    x, _ = subject.inputs(probe)
    out: dict[str, tuple[list[str], list[Any], str]] = {}
    for form in FORMS:
        layers, _, per_layer = _form(subject.model, form)
        if layers is None:
            continue
        try:
            if form == "loop":  # one row traced; the loop stacks rows on axis 0
                one, _ = _per_row(subject.model)
                row = jax.eval_shape(one, params, x[0])
                structs = [jax.ShapeDtypeStruct((x.shape[0], *s.shape), s.dtype) for s in row]
                names = list(one.names)
            else:
                structs = jax.eval_shape(layers, params, x)
                names = list(layers.names)
            out[form] = (names, structs, "")
        except Exception as exc:
            out[form] = ([], [], _error_line(exc))
        if not per_layer and form in out and not out[form][2]:
            out[form] = ([OUTPUT], out[form][1][-1:], "")
    return out


def shapes_stage(subject: Subject, check: dict[str, Any] | None = None) -> dict[str, Any]:
    """Stage 3: tree structure and every leaf; every layer's shape and dtype per path.

    Params against ``jax.eval_shape(model.init)`` (structure, then each leaf's shape and
    dtype); then, for each probe, each form's activations (abstract evaluation): the
    same layer names, the same shape and dtype at every layer as the loop's, and an
    output of (rows, out_features) in the run's dtype; then the check's recorded output
    contract and refusals of invalid inputs.
    """
    evidence: list[dict[str, Any]] = []
    model = subject.model
    template = jax.eval_shape(model.init, jax.random.key(0))
    same_tree = jax.tree_util.tree_structure(subject.params) == jax.tree_util.tree_structure(
        template
    )
    evidence.append({"what": "params tree structure against the model's", "passed": same_tree})
    if not same_tree:
        return _stage(
            "shapes",
            evidence,
            _finding(
                "shapes",
                f"params tree structure {jax.tree_util.tree_structure(subject.params)} is "
                f"not the model's {jax.tree_util.tree_structure(template)}",
                what="params tree",
            ),
        )
    found, expected = contract_of(subject.params), contract_of(template)
    for leaf, want in expected.items():
        got = found.get(leaf)
        ok = got == want
        evidence.append(
            {"what": f"params leaf {leaf}", "expected": want, "found": got, "passed": ok}
        )
        if not ok:
            return _stage(
                "shapes",
                evidence,
                _finding(
                    "shapes",
                    f"params leaf {leaf}: expected shape {want['shape']} dtype {want['dtype']}, "
                    f"found {got}",
                    what="params leaf",
                    layer=_layer_of(leaf),
                    leaf=leaf,
                ),
            )
    run_dtype = np.dtype(subject.dtype).name
    for probe in subject.probes:
        forms = _abstract(subject, probe)
        rows = probe.x.shape[0]
        for form, (_, _, error) in forms.items():
            if error:
                evidence.append({"what": f"{form} traced on {probe.label}", "passed": False})
                return _stage(
                    "shapes",
                    evidence,
                    _finding(
                        "shapes",
                        f"{form}_eager cannot be traced on {probe.label}: {error}",
                        what="path raised",
                        input=probe.label,
                        paths=[f"{form}_eager"],
                    ),
                )
        reference_form = next(iter(forms))
        ref_names, ref_structs, _ = forms[reference_form]
        layered = {f: v for f, v in forms.items() if v[0] != [OUTPUT] or ref_names == [OUTPUT]}
        for form, (names, _, _) in layered.items():
            ok = names == ref_names
            evidence.append({"what": f"{form} layer names on {probe.label}", "passed": ok})
            if not ok:
                return _stage(
                    "shapes",
                    evidence,
                    _finding(
                        "shapes",
                        f"{form}_eager names its layers {names}, {reference_form}_eager "
                        f"{ref_names}: the paths do not compute the same layers",
                        what="layer names",
                        input=probe.label,
                        paths=[f"{form}_eager"],
                    ),
                )
        leaves = list(leaf_paths(subject.params))
        for i, name in enumerate(ref_names):
            last = i == len(ref_names) - 1
            want = ref_structs[i]
            for form, (names, structs, _) in forms.items():
                if names == [OUTPUT] and not last and ref_names != [OUTPUT]:
                    continue
                got = structs[-1] if names == [OUTPUT] else structs[i]
                ok = tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
                evidence.append(
                    {
                        "what": f"{name} on {probe.label}",
                        "path": f"{form}_eager",
                        "shape": list(got.shape),
                        "dtype": str(np.dtype(got.dtype)),
                        "passed": ok,
                    }
                )
                if not ok:
                    return _stage(
                        "shapes",
                        evidence,
                        _finding(
                            "shapes",
                            f"layer {name} on {probe.label}: {form}_eager gives shape "
                            f"{tuple(got.shape)} {np.dtype(got.dtype).name}, "
                            f"{reference_form}_eager {tuple(want.shape)} "
                            f"{np.dtype(want.dtype).name}",
                            what="activation shape/dtype",
                            input=probe.label,
                            layer=name,
                            params_leaves=_params_leaves(name, leaves, len(ref_names)),
                            paths=[f"{form}_eager"],
                            expected={
                                "shape": list(want.shape),
                                "dtype": str(np.dtype(want.dtype)),
                            },
                            found={"shape": list(got.shape), "dtype": str(np.dtype(got.dtype))},
                        ),
                    )
        out = ref_structs[-1]
        contract = (rows, model.out_features)
        ok = tuple(out.shape) == contract and np.dtype(out.dtype).name == run_dtype
        evidence.append({"what": f"output contract on {probe.label}", "passed": ok})
        if not ok:
            return _stage(
                "shapes",
                evidence,
                _finding(
                    "shapes",
                    f"every path gives an output of shape {tuple(out.shape)} "
                    f"{np.dtype(out.dtype).name} on {probe.label}; the contract is "
                    f"{contract} {run_dtype}",
                    what="output contract",
                    input=probe.label,
                    layer=ref_names[-1],
                ),
            )
    finding = _recorded_contract(check, evidence)
    if finding is not None:
        return _stage("shapes", evidence, finding)
    return _stage(
        "shapes",
        evidence,
        summary=f"params tree and {len(expected)} leaves match the contract; every layer's "
        f"shape and dtype agree in every path on {len(subject.probes)} input(s)",
    )


def _recorded_contract(
    check: dict[str, Any] | None, evidence: list[dict[str, Any]]
) -> dict[str, Any] | None:
    if check is None:
        return None
    for case, report in check.get("cases", {}).items():
        for path, problems in report.get("contract", {}).items():
            evidence.append({"what": f"recorded contract {case}/{path}", "passed": not problems})
            if problems:
                return _finding(
                    "shapes",
                    f"the run's {path} on case {case}: {'; '.join(problems)}",
                    what="output contract",
                    input=f"case {case}",
                    paths=[path],
                )
    for case, report in check.get("negative", {}).items():
        for path, entry in report.get("paths", {}).items():
            evidence.append({"what": f"refusal {case}/{path}", "passed": entry["passed"]})
            if not entry["passed"]:
                return _finding(
                    "shapes",
                    f"invalid input {case} was not refused as expected by {path}: "
                    f"{entry.get('error') or 'an output'}: {entry.get('message')}",
                    what="input contract",
                    input=f"case {case}",
                    paths=[path],
                )
    return None


# --- 4. forward -----------------------------------------------------------------------


def forward_stage(subject: Subject) -> dict[str, Any]:
    """Stage 4: eager loop / vmap / direct, minimal input first, layer by layer."""
    evidence: list[dict[str, Any]] = []
    notes = []
    steps = set(subject.model.preprocessing)
    for probe in subject.probes:
        runs = _evaluate(subject, probe, jit=False)
        notes += [r.note for r in runs.values() if r.note]
        finding = _walk(
            "forward", subject, probe, runs, lambda n: n not in steps, evidence, "eager"
        )
        if finding is not None:
            return _stage("forward", evidence, {**finding, "notes": notes})
    per_layer = subject.model.activations_one is not None
    return _stage(
        "forward",
        evidence,
        summary=(
            f"loop, vmap{' and direct' if subject.model.forward_batch else ''} agree eagerly "
            + ("layer by layer" if per_layer else "on the output (no activations exposed)")
            + f" on {', '.join(p.label for p in subject.probes)}"
            + (f"; {'; '.join(notes)}" if notes else "")
        ),
    )


# --- 5-7. loss, gradients, update -----------------------------------------------------


def _targets(subject: Subject) -> list[Probe]:
    return [p for p in subject.probes if p.y is not None]


def _direct_loss(model: Model) -> Callable | None:
    if model.forward_batch is None:
        return None
    forward_batch = model.forward_batch

    def loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((forward_batch(params, x) - y) ** 2)

    return loss


def _losses(subject: Subject, probe: Probe) -> dict[str, jax.Array]:
    """The mean squared error three ways: the training loss (vmap), the mean of the
    per-example losses in a Python loop, and through the hand-batched forward."""
    params = subject.run_params
    x, y = subject.inputs(probe)
    loss_one = make_loss_one(subject.model)
    out = {
        "loop": jnp.mean(
            jnp.stack([loss_one(params, xi, yi) for xi, yi in zip(x, y, strict=True)])
        ),
        "vmap": make_loss(subject.model)(params, x, y),
    }
    direct = _direct_loss(subject.model)
    if direct is not None:
        out["direct"] = direct(params, x, y)
    return out


def _gradients(subject: Subject, probe: Probe) -> dict[str, Params]:
    params = subject.run_params
    x, y = subject.inputs(probe)
    grad_one = jax.grad(make_loss_one(subject.model))
    rows = [grad_one(params, xi, yi) for xi, yi in zip(x, y, strict=True)]
    out = {
        # The per-example oracle: the mean of each example's gradient, one at a time.
        "loop": jax.tree.map(lambda *g: jnp.mean(jnp.stack(g), axis=0), *rows),
        "vmap": jax.grad(make_loss(subject.model))(params, x, y),
    }
    direct = _direct_loss(subject.model)
    if direct is not None:
        out["direct"] = jax.grad(direct)(params, x, y)
    return out


def _compare_trees(
    stage: str,
    subject: Subject,
    probe: Probe,
    trees: dict[str, Params],
    evidence: list[dict[str, Any]],
    what: str,
    suffix: str = "eager",
) -> dict[str, Any] | None:
    """Leaf by leaf in tree order, every source against the first (the loop). Paths are
    named ``<source>_<suffix>`` (just the source when ``suffix`` is empty)."""

    def path(source: str) -> str:
        return f"{source}_{suffix}" if suffix else source

    named = {source: leaf_paths(tree) for source, tree in trees.items()}
    sources = list(trees)
    base = sources[0]
    structures = {s: jax.tree_util.tree_structure(t) for s, t in trees.items()}
    for source in sources[1:]:
        if structures[source] != structures[base]:
            return _finding(
                stage,
                f"{what} from {source} has tree structure {structures[source]}, from {base} "
                f"{structures[base]}",
                what=f"{what} tree",
                input=probe.label,
                paths=[path(source)],
            )
    for leaf in named[base]:
        for source in sources:
            value = np.asarray(named[source][leaf])
            if not np.all(np.isfinite(value.astype(np.float64))):
                element = _index(
                    int(np.flatnonzero(~np.isfinite(value.astype(np.float64)))[0]), value.shape
                )
                return _finding(
                    stage,
                    f"{what} of leaf {leaf} via {source} on {probe.label} is not finite "
                    f"(first at {tuple(element)})",
                    what=f"non-finite {what}",
                    input=probe.label,
                    layer=_layer_of(leaf),
                    leaf=leaf,
                    paths=[path(source)],
                    element=element,
                )
        for source in sources[1:]:
            result = measure(
                named[base][leaf], named[source][leaf], subject.tolerance, "precision.tolerance"
            )
            pair = f"{path(base)}-vs-{path(source)}"
            evidence.append({"what": f"{what} {leaf} on {probe.label}", "pair": pair, **result})
            if not result["passed"]:
                return _finding(
                    stage,
                    f"{what} of leaf {leaf} diverges on {probe.label}: {pair}: max_abs "
                    f"{result['max_abs']:.3g}, max_rel {result['max_rel']:.3g}, "
                    f"{result['max_ulp']} ULP ({result['ulp_dtype']}); tolerance "
                    f"rtol={subject.tolerance.rtol:g} atol={subject.tolerance.atol:g} "
                    "(precision.tolerance, not widened)",
                    what=what,
                    input=probe.label,
                    layer=_layer_of(leaf),
                    leaf=leaf,
                    paths=[path(source)],
                    pair=pair,
                    figures=result,
                )
    return None


def loss_stage(subject: Subject) -> dict[str, Any]:
    """Stage 5: the loss by the loop, by vmap (the training loss) and through direct."""
    evidence: list[dict[str, Any]] = []
    probes = _targets(subject)
    if not probes:
        return _stage("loss", evidence, skipped="no input with targets")
    for probe in probes:
        finding = _compare_trees(
            "loss",
            subject,
            probe,
            {k: {"loss": v} for k, v in _losses(subject, probe).items()},
            evidence,
            "loss",
        )
        if finding is not None:
            return _stage("loss", evidence, {**finding, "layer": "loss", "leaf": None})
    return _stage(
        "loss",
        evidence,
        summary=f"loop, vmap and direct losses agree on {', '.join(p.label for p in probes)}",
    )


def gradients_stage(subject: Subject) -> dict[str, Any]:
    """Stage 6: every leaf's gradient: the mean of per-example gradients (loop) against
    the gradient of the vmap loss and of the direct loss."""
    evidence: list[dict[str, Any]] = []
    probes = _targets(subject)
    if not probes:
        return _stage("gradients", evidence, skipped="no input with targets")
    for probe in probes:
        finding = _compare_trees(
            "gradients", subject, probe, _gradients(subject, probe), evidence, "gradient"
        )
        if finding is not None:
            return _stage("gradients", evidence, finding)
    n = len(leaf_paths(subject.params))
    return _stage(
        "gradients",
        evidence,
        summary=f"gradients of all {n} leaves agree (loop mean, vmap, direct) on "
        f"{', '.join(p.label for p in probes)}",
    )


def update_stage(subject: Subject) -> dict[str, Any]:
    """Stage 7: one optimizer step from each gradient; the new params leaf by leaf."""
    evidence: list[dict[str, Any]] = []
    probes = _targets(subject)
    if subject.optimizer is None:
        return _stage("update", evidence, skipped="the model is not trained (no optimizer)")
    if not probes:
        return _stage("update", evidence, skipped="no input with targets")
    params = subject.run_params
    optimizer = subject.optimizer
    for probe in probes:
        updated = {}
        for source, grads in _gradients(subject, probe).items():
            state = optimizer.init(params)
            updates, _ = optimizer.update(grads, state, params)
            updated[source] = optax.apply_updates(params, updates)
        finding = _compare_trees("update", subject, probe, updated, evidence, "updated param")
        if finding is not None:
            return _stage("update", evidence, finding)
    return _stage(
        "update",
        evidence,
        summary=f"one optimizer step gives the same params from every gradient on "
        f"{', '.join(p.label for p in probes)}",
    )


# --- 8. jit ---------------------------------------------------------------------------


def jit_stage(subject: Subject) -> dict[str, Any]:
    """Stage 8: jit added back: each path's jitted activations against its eager ones,
    then the gradients of the training loss and the per-example gradients under jit."""
    evidence: list[dict[str, Any]] = []
    for probe in subject.probes:
        eager = _evaluate(subject, probe, jit=False)
        jitted = _evaluate(subject, probe, jit=True)
        finding = _walk(
            "jit", subject, probe, eager, lambda n: True, evidence, "eager vs jit", against=jitted
        )
        if finding is not None:
            return _stage("jit", evidence, finding)
    loss = make_loss(subject.model)
    grad_one = jax.grad(make_loss_one(subject.model))
    params = subject.run_params
    for probe in _targets(subject):
        x, y = subject.inputs(probe)
        per_example = jax.vmap(grad_one, in_axes=(None, 0, 0))
        for what, eager_fn in (
            ("gradient of the training loss", jax.grad(loss)),
            (
                "mean per-example gradient",
                lambda p, a, b, f=per_example: jax.tree.map(
                    lambda g: jnp.mean(g, axis=0), f(p, a, b)
                ),
            ),
        ):
            trees = {"eager": eager_fn(params, x, y), "jit": jax.jit(eager_fn)(params, x, y)}
            finding = _compare_trees("jit", subject, probe, trees, evidence, what, suffix="")
            if finding is not None:
                return _stage("jit", evidence, finding)
    return _stage(
        "jit",
        evidence,
        summary="every path under jit agrees with its eager form layer by layer; gradients "
        "under jit agree with eager ones",
    )


# --- 9-11. backend, sharding, reference -----------------------------------------------


def _recompute(subject: Subject, x: np.ndarray, path: str) -> np.ndarray | None:
    model = subject.model
    params = subject.run_params
    form, mode = path.rsplit("_", 1)
    if form == "one":
        fn = model.forward_one
    else:
        _, plain, _ = _form(model, form)
        if plain is None:
            return None
        fn = plain
    fn = jax.jit(fn) if mode == "jit" else fn
    return np.asarray(jax.block_until_ready(fn(params, jnp.asarray(x, dtype=subject.dtype))))


def backend_stage(subject: Subject, stored: StoredRun | None) -> dict[str, Any]:
    """Stage 9: the run's stored outputs (its backend) against the same path, same mode,
    recomputed here on CPU, within precision.cross_run_tolerance (backends round
    differently; that tolerance is the run's own setting for it)."""
    evidence: list[dict[str, Any]] = []
    if stored is None:
        return _stage("backend", evidence, skipped="no stored run outputs given")
    runtime = stored.record.get("runtime", {})
    platform = runtime.get("platform", "?")
    here = jax.devices()[0].platform
    tolerance = subject.cross_run_tolerance
    run_dtype = np.dtype(subject.dtype)
    for case, x in stored.cases.items():
        vector = np.ndim(x) == 1
        for path in ("one_eager", "one_jit") if vector else PATH_NAMES:
            key = output_key(case, path)
            if path == "sharded_jit" or key not in stored.outputs:
                continue
            try:
                mine = _recompute(subject, x, path)
            except Exception as exc:
                evidence.append(
                    {"what": f"{key} recomputed", "passed": False, "reason": _error_line(exc)}
                )
                continue
            if mine is None:
                continue
            result = measure(
                stored.outputs[key], mine, tolerance, "precision.cross_run_tolerance", run_dtype
            )
            pair = f"{path}@{platform}-vs-{path}@{here}"
            evidence.append({"what": f"case {case}", "pair": pair, **result})
            if not result["passed"]:
                return _stage(
                    "backend",
                    evidence,
                    _finding(
                        "backend",
                        f"case {case}: the run's {path} on {platform} "
                        f"({runtime.get('device_kind', '?')}) differs from {path} recomputed "
                        f"here on {here} ({result['reason']}); everything before agrees on "
                        f"{here}, so the backend is where it diverges",
                        what="output",
                        input=f"case {case}",
                        layer=OUTPUT,
                        paths=[path],
                        pair=pair,
                        figures=result,
                    ),
                )
    if not evidence:
        return _stage("backend", evidence, skipped="no stored outputs for the probed cases")
    return _stage(
        "backend",
        evidence,
        summary=f"the run's outputs on {platform} agree with this machine's {here} "
        f"recomputation within precision.cross_run_tolerance",
    )


def sharding_stage(subject: Subject, stored: StoredRun | None) -> dict[str, Any]:
    """Stage 10: the run's sharded_jit against its vmap_jit (the same program, the batch
    spread over the mesh), every batch case, within precision.tolerance."""
    evidence: list[dict[str, Any]] = []
    if stored is None:
        return _stage("sharding", evidence, skipped="no stored run outputs given")
    mesh = stored.record.get("sharded") or {}
    for key in stored.outputs:
        case, path = key.rsplit(".", 1)
        if path != "sharded_jit" or output_key(case, "vmap_jit") not in stored.outputs:
            continue
        result = measure(
            stored.outputs[output_key(case, "vmap_jit")],
            stored.outputs[key],
            subject.tolerance,
            "precision.tolerance",
            np.dtype(subject.dtype),
        )
        evidence.append({"what": f"case {case}", "pair": "vmap_jit-vs-sharded_jit", **result})
        if not result["passed"]:
            return _stage(
                "sharding",
                evidence,
                _finding(
                    "sharding",
                    f"case {case}: sharded_jit over {mesh.get('devices', '?')} device(s) "
                    f"differs from vmap_jit ({result['reason']})",
                    what="output",
                    input=f"case {case}",
                    layer=OUTPUT,
                    paths=["sharded_jit"],
                    pair="vmap_jit-vs-sharded_jit",
                    figures=result,
                ),
            )
    if not evidence:
        return _stage("sharding", evidence, skipped="the run has no sharded_jit outputs")
    return _stage(
        "sharding",
        evidence,
        summary=f"sharded_jit over {mesh.get('devices', '?')} device(s) agrees with vmap_jit "
        f"on {len(evidence)} case(s)",
    )


def reference_stage(check: dict[str, Any] | None) -> dict[str, Any]:
    """Stage 11: the check's comparison with the stored reference run, and what differs
    between the two runs (versions, backend, dtype)."""
    evidence: list[dict[str, Any]] = []
    reference = (check or {}).get("reference")
    if not reference:
        return _stage("reference", evidence, skipped="no check report given")
    if reference.get("status") != "ok":
        evidence.append({"what": "reference", "status": reference.get("status")})
        if not reference.get("passed", True):
            return _stage(
                "reference",
                evidence,
                _finding(
                    "reference",
                    f"reference {reference['status']}: {reference.get('message', '')}",
                    what="reference",
                ),
            )
        return _stage("reference", evidence, skipped=f"reference {reference['status']}")
    for case, paths in reference.get("cases", {}).items():
        for path, result in paths.items():
            evidence.append({"what": f"reference {case}/{path}", **result})
            if not result["passed"]:
                made, now = reference.get("made_with", {}), reference.get("compared_with", {})
                changed = {k: [made.get(k), now.get(k)] for k in made if made.get(k) != now.get(k)}
                return _stage(
                    "reference",
                    evidence,
                    _finding(
                        "reference",
                        f"case {case}, {path}: this run differs from the stored reference "
                        f"({result['reason']}); everything within this run agrees, so the "
                        "difference is between the runs"
                        + (
                            ": " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
                            if changed
                            else " (same versions, backend and dtype)"
                        ),
                        what="reference",
                        input=f"case {case}",
                        layer=OUTPUT,
                        paths=[path],
                        figures=result,
                        changed=changed,
                    ),
                )
    for case, loss in reference.get("losses", {}).items():
        evidence.append({"what": f"reference loss {case}", **loss})
        if not loss["passed"]:
            return _stage(
                "reference",
                evidence,
                _finding(
                    "reference",
                    f"case {case}: the loss differs from the stored reference's",
                    what="reference loss",
                    input=f"case {case}",
                    layer="loss",
                ),
            )
    return _stage("reference", evidence, summary="this run agrees with the stored reference")


# --- the protocol ---------------------------------------------------------------------


def diagnose(
    subject: Subject,
    *,
    sources: DataSources | None = None,
    stored: StoredRun | None = None,
    check: dict[str, Any] | None = None,
    key_stream: dict[str, Any] | None = None,
    trigger: str = "on demand",
) -> dict[str, Any]:
    """Run the protocol's stages in order, stopping at the first that diverges.

    ``key_stream``: the check's own key-stream result, reused (None: run it here).
    Returns the report written as reports/diagnosis.json (see :func:`render_text`).
    """
    plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("data", lambda: data_stage(sources, subject)),
        (
            "key_stream",
            lambda: (
                key_stream
                if key_stream is not None
                else key_stream_stage(subject.model, subject.seed)
            ),
        ),
        ("shapes", lambda: shapes_stage(subject, check)),
        ("forward", lambda: forward_stage(subject)),
        ("loss", lambda: loss_stage(subject)),
        ("gradients", lambda: gradients_stage(subject)),
        ("update", lambda: update_stage(subject)),
        ("jit", lambda: jit_stage(subject)),
        ("backend", lambda: backend_stage(subject, stored)),
        ("sharding", lambda: sharding_stage(subject, stored)),
        ("reference", lambda: reference_stage(check)),
    ]
    stages: list[dict[str, Any]] = []
    first = None
    for name, run in plan:
        try:
            result = run()
        except Exception as exc:  # a stage that cannot run is reported, the rest still run
            result = _stage(name, [], skipped=f"could not run: {_error_line(exc)}")
            result["status"] = "error"
        stages.append(result)
        if result["status"] == "diverged":
            first = result["finding"]
            break
    reached = {s["stage"] for s in stages}
    model = subject.model
    activations = (
        f"model {model.name} exposes its activations: compared layer by layer"
        if model.activations_one is not None
        else f"model {model.name} exposes no activations (Model.activations_one): the "
        "forward stages compare outputs only, so they name no layer inside the model"
    )
    report = {
        "status": "diverged" if first else "no divergence found",
        "trigger": trigger,
        "check_failed": None if check is None else not check["passed"],
        "model": model.name,
        "dtype": np.dtype(subject.dtype).name,
        "tolerance": {
            "between_paths": subject.tolerance.model_dump(),
            "cross_run": subject.cross_run_tolerance.model_dump(),
            "note": "the run's own settings (precision.tolerance, "
            "precision.cross_run_tolerance), never widened; stored data are compared "
            "exactly; non-finite values are located, never masked",
        },
        "activations": activations,
        "inputs": [
            {"label": p.label, "rows": int(p.x.shape[0]), "targets": p.y is not None}
            for p in subject.probes
        ],
        "first_divergence": first,
        "ruled_out": [
            {"stage": s["stage"], "title": s["title"], "evidence": s["summary"]}
            for s in stages
            if s["status"] == "ruled_out"
        ],
        "skipped": [
            {"stage": s["stage"], "why": s["summary"]}
            for s in stages
            if s["status"] in ("skipped", "error")
        ],
        "not_reached": [name for name in STAGE_NAMES if name not in reached],
        "stages": stages,
    }
    report["summary"] = render_text(report)
    return report


def not_needed(check: dict[str, Any]) -> dict[str, Any]:
    """What reports/diagnosis.json holds when every check passed."""
    report = {
        "status": "not needed",
        "trigger": "the check passed: nothing to diagnose",
        "first_divergence": None,
        "ruled_out": [],
        "skipped": [],
        "not_reached": list(STAGE_NAMES),
        "stages": [],
        "check_passed": bool(check.get("passed")),
    }
    report["summary"] = (
        "vmapcheck diagnosis: not needed, the check passed "
        "(run `make diagnose` to run the protocol anyway)\n"
    )
    return report


def _figures(finding: dict[str, Any]) -> str:
    if finding.get("max_abs") is None:
        return ""
    tol = finding.get("tolerance") or {}
    return (
        f"max_abs {finding['max_abs']:.3g}, max_rel {finding['max_rel']:.3g}, "
        f"{finding['max_ulp']} ULP ({finding['ulp_dtype']})"
        + (f" at element {tuple(finding['element'])}" if finding.get("element") else "")
        + (f"; tolerance rtol={tol['rtol']:g} atol={tol['atol']:g} ({tol['from']})" if tol else "")
    )


def render_text(report: dict[str, Any]) -> str:
    """The readable summary: the first divergence, then what was ruled out before it."""
    lines = [f"vmapcheck diagnosis of model {report.get('model')} ({report.get('dtype')})"]
    lines.append(f"trigger: {report['trigger']}")
    first = report.get("first_divergence")
    if first:
        where = [f"stage {first['stage']}"]
        if first.get("layer"):
            where.append(f"layer {first['layer']}")
        if first.get("leaf"):
            where.append(f"leaf {first['leaf']}")
        if first.get("paths"):
            where.append(f"path(s) {', '.join(first['paths'])}")
        lines.append("FIRST DIVERGENCE: " + ", ".join(where))
        lines.append(f"  {first['message']}")
        if first.get("params_leaves"):
            lines.append(f"  params feeding it: {', '.join(first['params_leaves'])}")
        figures = _figures(first)
        if figures and "max_abs" not in first["message"]:
            lines.append(f"  {first.get('pair') or 'compared'}: {figures}")
        if first.get("agreed_before"):
            lines.append(
                "  before it, the paths agree at: "
                + ", ".join(f"{a['layer']} ({a['max_ulp']} ULP)" for a in first["agreed_before"])
            )
        for note in first.get("notes") or []:
            lines.append(f"  note: {note}")
    elif report.get("check_failed"):
        lines.append(
            "no stage diverged: the failure is not localized by the protocol "
            "(see reports/check_details.json)"
        )
    else:
        lines.append("no stage diverged: every stage agrees")
    lines.append("ruled out before it:" if first else "ruled out:")
    for entry in report["ruled_out"] or [{"stage": "(none)", "evidence": ""}]:
        lines.append(f"  {entry['stage']:<11} {entry['evidence']}")
    for entry in report["skipped"]:
        lines.append(f"  skipped {entry['stage']}: {entry['why']}")
    if report["not_reached"]:
        lines.append(f"not reached: {', '.join(report['not_reached'])}")
    if report.get("activations"):
        lines.append(report["activations"])
    if report.get("tolerance"):
        lines.append(f"tolerances: {report['tolerance']['note']}")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], json_path: Path) -> Path:
    """Write ``report`` to ``json_path`` and its summary beside it (.txt), atomically."""
    json_path = Path(json_path)
    atomic_write_json(json_path, report)
    text_path = json_path.with_suffix(".txt")
    atomic_write_text(text_path, report["summary"])
    return text_path


# --- on a project's outputs -----------------------------------------------------------


def _failing_case(check: dict[str, Any] | None, manifest: dict[str, Any]) -> str:
    """The first valid case the check failed on (else the standard batch)."""
    for name, report in (check or {}).get("cases", {}).items():
        if not report.get("passed", True):
            return name
    for failure in (check or {}).get("failures", []):
        parts = failure.split("/")
        if parts[0] == "reference" and len(parts) > 1 and parts[1] in manifest["cases"]:
            return parts[1]
    return "standard"


def probes_for(
    manifest: dict[str, Any], cases: dict[str, dict[str, np.ndarray]], check: dict[str, Any] | None
) -> tuple[Probe, ...]:
    """The input ladder: one row of the failing case (minimal), then the whole case, then
    the standard batch's first row and the batch when the failing case has no targets."""
    failing = _failing_case(check, manifest)
    order = [failing] + (["standard"] if "y" not in cases.get(failing, {}) else [])
    probes: list[Probe] = []
    for name in dict.fromkeys(order):
        if name not in cases:
            continue
        x = np.asarray(cases[name]["x"])
        x = x[None, :] if x.ndim == 1 else x
        y = cases[name].get("y")
        probes.append(
            Probe(
                f"minimal input (row 0 of case {name})",
                x[:1],
                None if y is None else np.asarray(y)[:1],
            )
        )
        if x.shape[0] > 1:
            probes.append(Probe(f"case {name} ({x.shape[0]} rows)", x, y))
    return tuple(probes)


def diagnose_project(
    root: Path,
    config: Config,
    check: dict[str, Any] | None,
    *,
    key_stream: dict[str, Any] | None = None,
    trigger: str = "on demand",
) -> dict[str, Any]:
    """Run the protocol on the pipeline outputs under ``root`` (data/, reports/).

    Recomputation runs on this machine's CPU at the run's dtype, x64 and matmul
    precision; the backend stage compares with the outputs the run's backend stored.
    """
    data = Path(root) / "data"
    model = build_model(config.model)
    params, _ = load_model_params(model, data / "params")
    manifest = read_json(data / "cases" / CASES_MANIFEST)
    # Loaded without the sha256 gate: the data stage judges the files, it does not stop.
    cases = {
        name: load_npz(data / "cases" / entry["file"])
        for name, entry in manifest["cases"].items()
        if entry["kind"] in ("batch", "vector") and (data / "cases" / entry["file"]).is_file()
    }
    probes = probes_for(manifest, cases, check)
    precision = config.precision
    subject = Subject(
        model=model,
        params=params,
        dtype=jnp.dtype(precision.dtype),
        tolerance=precision.tolerance,
        cross_run_tolerance=precision.cross_run_tolerance,
        probes=probes,
        optimizer=make_optimizer(config.train) if model.trainable else None,
        seed=config.seed,
    )
    failing = _failing_case(check, manifest)
    stored_cases = {n: cases[n]["x"] for n in dict.fromkeys([failing, "standard"]) if n in cases}
    forward = data / "forward"
    stored = (
        StoredRun(
            outputs=load_npz(forward / "outputs.npz"),
            record=read_json(forward / "record.json"),
            cases=stored_cases,
        )
        if (forward / "outputs.npz").is_file()
        else None
    )
    sources = DataSources(
        cases=data / "cases",
        prepared=data / "prepared",
        config=config.data,
        seed=config.seed,
        root=Path(root),
    )
    with (
        jax.enable_x64(precision.enable_x64),
        jax.default_matmul_precision(precision.matmul_precision),
    ):
        return diagnose(
            subject,
            sources=sources,
            stored=stored,
            check=check,
            key_stream=key_stream,
            trigger=trigger,
        )


def for_check(
    root: Path, config: Config, check: dict[str, Any], key_stream: dict[str, Any] | None
) -> dict[str, Any]:
    """What the check stage writes: "not needed" when it passed, else the protocol's
    report. The diagnosis never hides the check's own verdict: if it cannot run, its
    report says why (status "error") and the check's reports stand."""
    if check["passed"]:
        return not_needed(check)
    failures = check["failures"]
    trigger = f"the check failed ({len(failures)} failure(s); first: {failures[0]})"
    try:
        return diagnose_project(root, config, check, key_stream=key_stream, trigger=trigger)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        report = {
            "status": "error",
            "trigger": trigger,
            "error": _error_line(exc),
            "first_divergence": None,
            "ruled_out": [],
            "skipped": [],
            "not_reached": list(STAGE_NAMES),
            "stages": [],
        }
        report["summary"] = (
            f"vmapcheck diagnosis could not run ({report['error']}); the check's own "
            "reports stand (reports/check_details.json)\n"
        )
        return report


def main(argv: list[str] | None = None) -> int:
    """``make diagnose``: the protocol on the current outputs. Exit 0: no divergence
    found, 1: a divergence localized, 2: the diagnosis could not run."""
    parser = argparse.ArgumentParser(prog="python -m vmapcheck.diagnosis", description=__doc__)
    parser.add_argument(
        "--out",
        default="reports/diagnosis-on-demand.json",
        help="where to write the report (its summary goes beside it as .txt); the check "
        "stage's own diagnosis is reports/diagnosis.json",
    )
    args = parser.parse_args(argv)
    root = Path.cwd()
    try:
        config = load_config(root / "params.yaml")
        # On CPU, like check: one device, the run's precision settings.
        configure_jax(BackendConfig(name="cpu", platform="cpu", num_devices=None), config.precision)
        details = root / "reports" / "check_details.json"
        check = read_json(details) if details.is_file() else None
        state = (
            "no check report"
            if check is None
            else ("the last check PASSED" if check["passed"] else "the last check FAILED")
        )
        report = diagnose_project(root, config, check, trigger=f"on demand ({state})")
    except VmapcheckError as exc:
        print(f"diagnosis: error: {exc}", file=sys.stderr)
        return 2
    text = write_report(report, root / args.out)
    print(report["summary"], end="")
    print(f"diagnosis: written to {args.out} and {text.relative_to(root)}")
    return 1 if report["status"] == "diverged" else 0


if __name__ == "__main__":
    raise SystemExit(main())
