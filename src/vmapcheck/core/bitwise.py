"""Bitwise batch invariance: is a row's output the same bits whatever batch it is in?

The agreement checks judge within a tolerance (:mod:`vmapcheck.core.compare`), which is
right by default: a batched kernel may sum in another order. Some users need more: the
same bits for a row whatever its batch-mates (reproducible serving, caching, an RL
rollout replayed; Thinking Machines' "batch-invariant kernels", 2025). This module
measures it, for every batch path of :data:`vmapcheck.core.paths.PATHS` on one case
``x`` (batch axis 0, ``rows`` rows), on the backend the paths ran on:

- **compositions**: each row's output in the batch of ``rows`` against the same row
  computed ``alone`` (a batch of 1, run here) and under each regrouping of
  :data:`vmapcheck.core.composition.REGROUPINGS` (rows permuted, batch split: the
  outputs the forward stage already has);
- **across paths**: the path's output against the plain loop's (``loop_eager``) on the
  same batch;
- per comparison, the rows whose bits differ anywhere, the largest ULP distance
  (:func:`vmapcheck.core.compare.ulp_distance`, in the run dtype) and, for a model with
  class outputs (``out_features >= 2``), the rows whose argmax differs;
- **the first operation where the bits part**: for a path whose row alone differs from
  the row in the batch, the path's form is traced for both batches (``jax.make_jaxpr``)
  and evaluated equation by equation in lockstep, each equation bound on its own as
  eager JAX runs it; the first equation whose output's row (the one axis where the
  batch has ``rows`` and the single row 1) differs in bits is named with its primitive
  and source line, with the first layer (the path's activations,
  :mod:`vmapcheck.core.forms` ``*_activations``) op by op, and the first layer as the
  path runs (compiled) where that is another. When the two programs differ in structure
  (an unrolled loop), or op by op the bits agree (the compiled program's fusion parts
  them, not an operation), the first layer as the path runs is named instead;
  ``found_at`` says which was reported. When each row alone is bitwise and the bits
  part under a regrouping only, that is said (the walk compares with one row alone).

Bitwise means identical bit patterns (``-0.0`` is not ``0.0``; NaN payloads count);
the ULP figure is a distance between finite values (a non-finite element counts 0
there, and is still a differing bit). Pure JAX and NumPy: no files, no MLflow. JAX is
imported where a measurement runs. The check
(:func:`vmapcheck.core.bitwise_verdict.judge`) turns a measurement into the report's
section, failing it only in mode ``"require"``; the modes, the lines that say it and
the Python API's ``PathBitwise`` are :mod:`vmapcheck.core.bitwise_verdict`'s.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vmapcheck.core.cases import Case
    from vmapcheck.core.models import Model, Params
    from vmapcheck.core.paths import Forward
    from vmapcheck.core.record import (
        BitwiseAgainst,
        BitwiseFirstOp,
        BitwiseFlips,
        BitwisePathReport,
        BitwiseReport,
    )

# The composition this module runs itself: every row as a batch of 1.
ALONE = "alone"


# --- comparing bits ---------------------------------------------------------------------


def _bits(a: np.ndarray) -> np.ndarray:
    """``a``'s bit patterns as unsigned integers (same shape), so that ``==`` compares
    bits, not values (``-0.0 == 0.0`` and ``nan != nan`` as floats)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def differing_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(rows,)`` bool: the rows (batch axis 0) of ``a`` and ``b`` (same shape and
    dtype) whose bits differ in any element."""
    same = _bits(a) == _bits(b)
    return ~same.reshape(same.shape[0], -1).all(axis=1)


def argmax_flips(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``(rows,)`` bool: the rows whose argmax over the classes differs; None when the
    outputs are not class scores ``(rows, out_features >= 2)``."""
    if a.ndim != 2 or a.shape[1] < 2:
        return None
    return np.argmax(a, axis=1) != np.argmax(b, axis=1)


def against(batch: np.ndarray, other: np.ndarray, dtype: Any) -> BitwiseAgainst:
    """Row by row, ``batch`` (a path's outputs on the batch) against ``other`` (the same
    rows computed another way), on the rows both have: the rows compared, those whose
    bits differ (and the first), the largest ULP distance in ``dtype``, the argmax
    flips (None without class outputs)."""
    return _against(batch, other, dtype)[0]


def _against(
    batch: np.ndarray, other: np.ndarray, dtype: Any
) -> tuple[BitwiseAgainst, np.ndarray, np.ndarray | None]:
    """:func:`against`, with the rows that differ and those whose argmax flips
    (``(rows compared,)`` bool each; flips None without class outputs)."""
    from vmapcheck.core.compare import ulp_distance  # JAX: imported where it measures

    n = min(batch.shape[0], other.shape[0])
    a, b = batch[:n], other[:n]
    if a.dtype != b.dtype:
        # A bfloat16 output stored as float32 (exactly) against one computed here: both
        # in float64, exact for either, where equal bits are equal values.
        a, b = a.astype(np.float64), b.astype(np.float64)
    rows = differing_rows(a, b)
    flips = argmax_flips(a, b)
    ulps = ulp_distance(a, b, dtype)
    figures: BitwiseAgainst = {
        "rows": int(n),
        "rows_differing": int(rows.sum()),
        "first_row": int(np.flatnonzero(rows)[0]) if rows.any() else None,
        "max_ulp": int(ulps.max()) if ulps.size else 0,
        "argmax_flips": None if flips is None else int(flips.sum()),
    }
    return figures, rows, flips


def _union(masks: Sequence[np.ndarray | None]) -> int | None:
    """How many rows are set in any of ``masks`` (each over the first rows it covers);
    None when every mask is None."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    longest = max(m.shape[0] for m in present)
    union = np.zeros(longest, dtype=bool)
    for m in present:
        union[: m.shape[0]] |= m
    return int(union.sum())


# --- the first operation where the bits part ---------------------------------------------


def _source(eqn: Any) -> str:
    """The user's source line of an equation (``file.py:12 (fn)``), "" when unknown."""
    from jax.extend import source_info_util

    try:
        return str(source_info_util.summarize(eqn.source_info))
    except Exception:  # the source is a nicety of the report: never a failure of it
        return ""


# Yields (equation, its outputs); returns the jaxpr's outputs (what a call gives back).
Walk = Generator[tuple[Any, list[Any]], None, list[Any]]


def _equations(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> Walk:
    """Evaluate ``jaxpr`` on ``args`` one equation at a time, each bound on its own (as
    eager JAX runs it), calls walked into; yield ``(eqn, outputs)`` per equation."""
    from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, Literal

    # The calls walked into (their equations are the operations), as the terms'
    # magnitude walks them.
    from vmapcheck.core.magnitude import CALLS

    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = eqn.params.get(CALLS.get(eqn.primitive.name, ""))
        if isinstance(sub, ClosedJaxpr | Jaxpr):
            inner = sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
            inner_consts = sub.consts if isinstance(sub, ClosedJaxpr) else []
            outs = yield from _equations(inner, inner_consts, ins)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns: Sequence[Any] = ()
            if isinstance(params, tuple):  # JAX before 0.7: (subfuns, params)
                subfuns, params = params
            out = eqn.primitive.bind(*subfuns, *ins, **params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
            yield eqn, outs
        for var, value in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _row_of(batched: np.ndarray, single: np.ndarray, rows: int, row: int) -> np.ndarray | None:
    """Row ``row`` of an intermediate of the batch of ``rows``, where ``single`` is the
    same intermediate for that row alone: the one axis where the shapes differ, ``rows``
    against 1, every other axis equal. None when the shapes say no such axis (the batch
    folded into another axis, or no batch axis: a weight): not compared."""
    if batched.ndim != single.ndim:
        return None
    apart = [k for k, (p, q) in enumerate(zip(batched.shape, single.shape, strict=True)) if p != q]
    if len(apart) != 1 or batched.shape[apart[0]] != rows or single.shape[apart[0]] != 1:
        return None
    return np.take(batched, [row], axis=apart[0])


def first_operation(form: Forward, params: Params, x: Any, row: int) -> BitwiseFirstOp:
    """Where row ``row`` of the batch ``x`` and the same row alone stop being bitwise
    equal, walking ``form``'s jaxpr (``form``: a batch form of
    :mod:`vmapcheck.core.forms`, untransformed, ``(params, X) -> (rows, ...)``).

    Both traces are evaluated equation by equation in lockstep; at each equation, every
    output with a batch axis (:func:`_row_of`) is compared on the row. Returns
    ``found_at`` ``"jaxpr"`` with the equation (its index among the walked equations,
    primitive and source line), or ``"none"`` with why: the traces differ in structure
    (an unrolled loop's program grows with the rows), or op by op every compared
    output agrees (the compiled program, not an operation, parts the bits).
    """
    import jax

    from vmapcheck.core.contract import rows as rows_of
    from vmapcheck.core.contract import take

    n = rows_of(x)
    one = take(x, slice(row, row + 1))
    traces = []
    for batch in (x, one):
        closed = jax.make_jaxpr(form)(params, batch)
        flat = jax.tree.leaves((params, batch))
        traces.append(_equations(closed.jaxpr, closed.consts, flat))
    index = 0
    for (eqn, outs), (eqn_one, outs_one) in zip(*traces, strict=False):
        if eqn.primitive != eqn_one.primitive:
            return _not_located(
                row,
                f"the programs for {n} rows and for 1 differ in structure at equation "
                f"{index} ({eqn.primitive.name} vs {eqn_one.primitive.name})",
            )
        for out, out_one in zip(outs, outs_one, strict=True):
            got, alone = np.asarray(out), np.asarray(out_one)
            mine = _row_of(got, alone, n, row)
            if mine is not None and differing_rows(mine, alone).any():
                return {
                    "found_at": "jaxpr",
                    "row": row,
                    "equation": index,
                    "primitive": eqn.primitive.name,
                    "source": _source(eqn) or None,
                    "layer": None,
                    "why": "",
                }
        index += 1
    return _not_located(
        row,
        f"evaluated op by op, all {index} equations give the row the same bits: the "
        "compiled program (fusion, another kernel for another shape) parts them",
    )


def _not_located(row: int, why: str) -> BitwiseFirstOp:
    """No first op found for ``row``, and ``why``."""
    return {
        "found_at": "none",
        "row": row,
        "equation": None,
        "primitive": None,
        "source": None,
        "layer": None,
        "why": why,
    }


def first_layer(
    path_name: str, model: Model, params: Params, x: Any, row: int, op_by_op: bool = False
) -> tuple[str | None, bool]:
    """``(layer, per_layer)``: the first of the path's activations (its layers,
    :mod:`vmapcheck.core.forms`) whose row ``row`` differs in bits between the batch
    ``x`` and the row alone, None when every layer agrees or the path has no
    activations; ``per_layer`` False when the model exposes no layers (the one "layer"
    is then its output). Run as the path runs (under ``jax.jit`` for a jit path, and
    any ``jit`` inside compiled), or with ``op_by_op`` every primitive on its own
    (``jax.disable_jit``), as :func:`first_operation` walks them."""
    import contextlib

    import jax

    from vmapcheck.core.contract import take
    from vmapcheck.core.jit_cache import cached
    from vmapcheck.core.paths import PATHS

    path = PATHS[path_name]
    activations = path.activations
    if activations is None:
        return None, False

    def make() -> tuple[Any, bool, Any] | None:
        made = activations(model)
        if made is None:
            return None
        layers, per_layer = made
        return layers, per_layer, jax.jit(layers) if path.jit else layers

    # The same jitted activations on every row and call in this process (the bits are
    # compared on each row that differs: one compile per shape, not per row and call).
    built = cached(model, "activations", path_name, make)
    if built is None:
        return None, False
    layers, per_layer, run = built
    with jax.disable_jit() if op_by_op else contextlib.nullcontext():
        batch = [np.asarray(a) for a in run(params, x)]
        names = list(layers.names)
        alone = [np.asarray(a) for a in run(params, take(x, slice(row, row + 1)))]
    for name, got, single in zip(names, batch, alone, strict=True):
        if got.shape[1:] == single.shape[1:] and differing_rows(got[row : row + 1], single).any():
            return name, per_layer
    return None, per_layer


# --- the measurement -------------------------------------------------------------------


def _alone(path: Forward, params: Params, x: Any, rows: int) -> np.ndarray:
    """The path's outputs for the first ``rows`` rows of ``x``, each run as a batch of 1
    (``(rows, *out)``, batch axis 0)."""
    import jax

    from vmapcheck.core.contract import take

    outs = [
        np.asarray(jax.block_until_ready(path(params, take(x, slice(i, i + 1)))))[0]
        for i in range(rows)
    ]
    return np.stack(outs)


def measure(
    model: Model,
    params: Params,
    x: Any,
    dtype: Any,
    paths: Mapping[str, Forward],
    outputs: Mapping[str, np.ndarray],
    regrouped: Mapping[str, Mapping[str, np.ndarray]],
    *,
    case: str,
    runtime: Mapping[str, Any],
    max_rows: int | None = None,
    capped_by: str | None = None,
) -> BitwiseReport:
    """Measure bitwise batch invariance of every batch path in ``paths`` on the batch
    ``x`` (batch axis 0; ``params`` already at the run's ``dtype``), on this process's
    backend.

    ``paths``: name -> the built path (:func:`vmapcheck.core.forward.build_all`'s
    ``"batch"``); ``outputs``: name -> the path's output on ``x`` (a capped path's on
    its first rows); ``regrouped``: name -> regrouping -> the path's output on ``x``
    regrouped, in ``x``'s row order (what the forward stage stores in
    data/forward/composition.npz); ``case``: the case's name, for the report;
    ``runtime``: the backend's description (:class:`vmapcheck.core.runtime.RuntimeInfo`
    as a dict); ``max_rows``: at most that many rows are run alone (``capped_by``: the
    setting that says so), None: every row.

    Returns the report's section without its verdict (:func:`judge` adds ``mode``,
    ``passed``): per path, each composition and the plain loop compared row by row,
    and the first operation where the bits part.
    """
    from vmapcheck.core.contract import rows as rows_of
    from vmapcheck.core.paths import PATHS, plain_path

    n = rows_of(x)
    run_rows = n if max_rows is None else min(n, max_rows)
    ulp_dtype = np.dtype(dtype)
    plain = plain_path()
    by_path: dict[str, BitwisePathReport] = {}
    class_outputs = model.out_features >= 2
    every: list[np.ndarray] = []  # every output measured, for the argmax flips overall
    walked: dict[tuple[str, int], BitwiseFirstOp] = {}
    layered: dict[tuple[str, int], str | None] = {}
    for name, path in paths.items():
        if name not in outputs or PATHS[name].takes != "batch":
            continue
        batch = np.asarray(outputs[name])
        try:
            alone = _alone(path, params, x, min(run_rows, batch.shape[0]))
        except Exception as exc:  # a path that cannot run one row: said, never a crash
            by_path[name] = _unmeasured(name, f"{type(exc).__name__}: {exc}")
            continue
        measured = {ALONE: _against(batch, alone, ulp_dtype)}
        for regrouping, out in regrouped.get(name, {}).items():
            measured[regrouping] = _against(batch, np.asarray(out), ulp_dtype)
        compositions = {k: figures for k, (figures, _, _) in measured.items()}
        every += [batch, alone, *(np.asarray(o) for o in regrouped.get(name, {}).values())]
        vs_plain = None
        if name != plain and plain in outputs:
            vs_plain = against(batch, np.asarray(outputs[plain]), ulp_dtype)
        first: BitwiseFirstOp | None = None
        row = compositions[ALONE]["first_row"]
        if row is not None:
            try:
                first = _first(name, model, params, x, row, walked, layered)
            except Exception as exc:  # the walk is a diagnosis: its failure is said
                first = _not_located(row, f"the walk raised {type(exc).__name__}: {exc}"[:500])
        else:
            parted = [k for k, c in compositions.items() if c["rows_differing"]]
            if parted:
                # Alone each row is bitwise: the bits part with another batch size or
                # order only, which the walk (a batch against one row) cannot compare.
                first = _not_located(
                    int(compositions[parted[0]]["first_row"] or 0),
                    f"each row alone is bitwise; the bits part under {' and '.join(parted)} "
                    "only, which the walk (the batch against one row alone) does not compare",
                )
        by_path[name] = {
            "bitwise": all(c["rows_differing"] == 0 for c in compositions.values()),
            "rows": max(c["rows"] for c in compositions.values()),
            "rows_differing": _union([rows for _, rows, _ in measured.values()]) or 0,
            "max_ulp": max(c["max_ulp"] for c in compositions.values()),
            "argmax_flips": _union([flips for _, _, flips in measured.values()]),
            "compositions": compositions,
            "vs_plain": vs_plain,
            "first_op": first,
        }
    return {
        "case": case,
        "rows": n,
        "rows_alone": run_rows,
        "capped_by": capped_by if run_rows < n else None,
        "backend": str(runtime.get("backend", "")),
        "device_kind": str(runtime.get("device_kind", "")),
        "dtype": str(ulp_dtype),
        "plain": plain,
        "class_outputs": class_outputs,
        "paths": by_path,
        "argmax_flips": _argmax_total(every, class_outputs),
    }


def _unmeasured(name: str, error: str) -> BitwisePathReport:
    """A path whose rows could not be run alone: not bitwise (nothing shows it is), the
    error said (``alone_error``)."""
    return {
        "bitwise": False,
        "rows": 0,
        "rows_differing": 0,
        "max_ulp": 0,
        "argmax_flips": None,
        "compositions": {},
        "vs_plain": None,
        "first_op": None,
        "alone_error": error[:500],
    }


def measure_case(
    model: Model,
    params: Params,
    cases: Mapping[str, Case],
    case: str,
    dtype: Any,
    paths: Mapping[str, Forward],
    outputs: Mapping[str, np.ndarray],
    regrouped: Mapping[str, np.ndarray],
    *,
    runtime: Mapping[str, Any],
    max_rows: int | None = None,
    capped_by: str | None = None,
) -> BitwiseReport | None:
    """:func:`measure` on case ``case`` of ``cases`` as the forward stage holds it:
    ``outputs`` keyed ``<case>.<path>`` (data/forward/outputs.npz), ``regrouped``
    keyed ``<case>.<path>.<regrouping>`` (composition.npz), ``params`` as stored (cast
    to ``dtype`` here, as the paths ran). None when the case is absent or has fewer than
    2 rows (a row alone is the whole batch)."""
    from vmapcheck.core.cases import case_input
    from vmapcheck.core.composition import REGROUPINGS, composition_key
    from vmapcheck.core.contract import rows
    from vmapcheck.core.forms import cast_tree
    from vmapcheck.core.paths import output_key

    if case not in cases:
        return None
    x = case_input(cases[case], dtype)
    if rows(x) < 2:
        return None
    mine = {
        name: outputs[output_key(case, name)] for name in paths if output_key(case, name) in outputs
    }
    again = {
        name: {
            g: regrouped[composition_key(case, name, g)]
            for g in REGROUPINGS
            if composition_key(case, name, g) in regrouped
        }
        for name in mine
    }
    return measure(
        model,
        cast_tree(params, dtype),
        x,
        dtype,
        paths,
        mine,
        again,
        case=case,
        runtime=runtime,
        max_rows=max_rows,
        capped_by=capped_by,
    )


def _argmax_total(arrays: Sequence[np.ndarray], class_outputs: bool) -> BitwiseFlips | None:
    """The rows whose argmax is not the same in every one of ``arrays`` (every path's
    outputs on the batch, regrouped and alone, each over the first rows it covers), of
    the rows covered. None without class outputs (or no outputs)."""
    if not class_outputs or not arrays or any(a.ndim != 2 for a in arrays):
        return None
    n = max(a.shape[0] for a in arrays)
    choices = np.full((len(arrays), n), -1, dtype=np.int64)  # -1: the row is not covered
    for k, a in enumerate(arrays):
        choices[k, : a.shape[0]] = np.argmax(a, axis=1)
    low = np.where(choices < 0, np.iinfo(np.int64).max, choices).min(axis=0)
    flipped = (choices.max(axis=0) != low).sum()
    return {"rows": int(n), "flipped": int(flipped)}


def _first(
    name: str,
    model: Model,
    params: Params,
    x: Any,
    row: int,
    walked: dict[tuple[str, int], BitwiseFirstOp],
    layered: dict[tuple[str, int], str | None],
) -> BitwiseFirstOp:
    """The first operation where row ``row`` alone and in ``x`` part, for path
    ``name``: the jaxpr walk, else the first layer (``found_at`` says which).
    ``walked`` / ``layered``: the walks and op-by-op layers already found, by (form,
    row): a form's eager and jit paths are the same program op by op, walked once."""
    from vmapcheck.core.paths import PATHS

    path = PATHS[name]
    # A distributed path's form is its single-device program (``same_program_as``): the
    # walk evaluates that, one device, op by op.
    program = PATHS[path.same_program_as] if path.distributed and path.same_program_as else path
    form = path.forward(model)
    found: BitwiseFirstOp
    if (program.form, row) in walked:
        found = walked[(program.form, row)]
    elif form is None:
        found = _not_located(row, "the model has no form for this path to walk")
    else:
        found = walked[(program.form, row)] = first_operation(form, params, x, row)
    # The layer too: op by op, as the walk ran (context for the equation, whose source
    # line may be a shared helper), and as the path runs, compiled where it is: XLA's
    # fusion, or another kernel for another shape, may part the bits at an earlier layer.
    as_run, per_layer = first_layer(name, model, params, x, row)
    if found["found_at"] == "jaxpr":
        if not per_layer:
            return {**found, "layer": None}
        # Op by op, a form's eager and jit paths run the same activations: found once.
        key = f"{program.form}.layers"
        if (key, row) not in layered:
            layered[(key, row)] = first_layer(name, model, params, x, row, op_by_op=True)[0]
        op_by_op = layered[(key, row)]
        named: BitwiseFirstOp = {**found, "layer": op_by_op}
        if as_run != op_by_op:
            named["layer_as_run"] = as_run
        return named
    if as_run is not None:
        return {**found, "found_at": "layer", "layer": as_run}
    return found
