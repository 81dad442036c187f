"""The magnitude forward: how large the terms are that make up each output element.

Two paths that sum the same terms in different orders differ by rounding, and that
rounding is relative to the size of the *terms*, not of the result: a dot product of
32 terms whose magnitudes add up to 104 may legitimately come out as -0.093 in one path
and -0.093005 in another (float32 allows ~1e-5 there). The comparison rule
(:mod:`vmapcheck.core.compare`, ``precision.tolerance.scale: terms``) therefore scales
its relative tolerance by ``S``: for each output element, the magnitude of the terms it
is made of.

:func:`terms_magnitude` computes ``S`` by re-running the function's jaxpr
(``jax.make_jaxpr``) in float64 with absolute values: every equation computes its real
value (the very primitive, on the real inputs) and the magnitude of its terms from the
magnitudes of its inputs. The rules (:data:`HANDLED`):

- sums: ``add``/``sub``/``add_any`` -> ``S_a + S_b``; ``reduce_sum``/``cumsum`` on
  ``S``; ``dot_general`` and ``conv_general_dilated`` -> ``sum |a_i| |b_i|`` on the
  operands' own values: the terms of the sum each output is. A matmul does not carry
  the terms behind its operands: carried through, a cancellation in each layer
  multiplies into the next (a small transformer's output reached ``S/|y|`` ~ 1e6, a
  tolerance that would pass any bug), while rounding errors of earlier layers reach the
  output only through this sum's own terms, which ``rtol`` (many ulps) covers;
- products: ``mul`` -> ``S_a |b| + |a| S_b - |a||b|`` (first order; ``S_a |b|`` for an
  exact ``b``, and never the square of a cancellation where both operands carry one,
  such as a LayerNorm's ``(x - mean)^2``); ``square``/``integer_pow`` (n >= 0) likewise;
  ``reduce_prod``/``cumprod`` on ``S``; ``div`` -> ``S_a/|b| + |a| S_b/b^2`` (the first
  order terms of a quotient; where ``b == 0`` no bound is claimed: ``S = |y|``, an
  infinite or NaN value the comparison never accepts as a scale);
- structure: reshape, broadcast, transpose, squeeze, expand_dims, slice, concatenate,
  pad, rev, gather, dynamic_slice, dynamic_update_slice, scatter, select_n (on the real
  predicate), split, copy, stop_gradient, ... move the magnitudes as they move values;
- order: ``max``/``min``/``clamp``/``reduce_max``/``reduce_min`` -> the largest finite
  magnitude of the operands in contention for the result (within ``CONTENTION`` of it):
  ``relu = max(x, 0)`` keeps ``S_x`` for a live or nearly dead unit, 0 for a clearly
  dead one; a masked attention score (-1e9) or the ``-inf`` of a softmax's max
  contributes only if chosen;
- conversions: ``neg``/``abs``/``convert_element_type``/``reduce_precision`` keep ``S``;
- smooth elementwise functions (exp, log, tanh, logistic, sqrt, rsqrt, sin, erf, pow,
  ...): their condition at the input, ``max(|y|, |f'(x)| |x|)``, what one rounding of
  ``x`` moves the result by (``|x| exp(x)`` for exp, 1 for log near 1); like a matmul
  they start afresh from their input's value (an ill-conditioned point, e.g. ``sqrt``
  at 0, gives an infinite ``S``, which the comparison replaces by the output's own
  magnitude: never an unbounded tolerance);
- discrete results (comparisons, ``sign``, ``floor``, ``argmax``, ``iota``, ...):
  ``|y|``, their own value;
- calls: ``jit``/``pjit``/``closed_call``/``core_call``/``remat``/``custom_jvp_call``/
  ``custom_vjp_call`` are interpreted equation by equation; ``cond`` interprets every
  branch and selects with the real index.

Every output ``S`` is at least ``|y|``. A primitive without a rule (``scan``,
``while``, ``sort``, a custom call, ...) or whose rule cannot apply falls back to
``|y|`` of its real output and is **recorded**: :func:`terms_magnitude` returns the
sorted names, and the check reports them (``fallbacks``) with each case. A fallback
never loosens the comparison: ``|y|`` is exactly today's output rule at that point.

Needs ``jax_enable_x64`` (the check stage calls
:func:`vmapcheck.core.runtime.configure_cpu_float64` first; a test may use
``jax.enable_x64(True)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, JaxprEqn, Literal

from vmapcheck.core.cases import Case, kind_of
from vmapcheck.core.contract import rows, take
from vmapcheck.core.oracle import to_f64

# (real value, magnitude of its terms): the magnitude is float64, of the value's shape.
Pair = tuple[jax.Array, jax.Array]
MagnitudeRule = Callable[[list[jax.Array], list[jax.Array], list[jax.Array], dict], list]

F64 = jnp.float64


def _f64(x: jax.Array) -> jax.Array:
    """The real value as float64 (complex: its modulus; bool and integers: exact)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.abs(x).astype(F64)
    return x.astype(F64)


def _abs64(x: jax.Array) -> jax.Array:
    return jnp.abs(_f64(x))


def _to(m: jax.Array, shape: Sequence[int]) -> jax.Array:
    """A magnitude broadcast explicitly to ``shape`` (JAX may run with strict ranks)."""
    return jnp.broadcast_to(m, tuple(shape))


def _finite(m: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(m), m, 0.0)


# --- rules: (values, magnitudes, real outputs, params) -> output magnitudes -----------


def _sum(vals, mags, outs, params):
    shape = outs[0].shape
    return [_to(mags[0], shape) + _to(mags[1], shape)]


def _first_order_product(a, b, sa, sb):
    """``S_a |b| + |a| S_b - |a||b|``: the first-order terms of a product's error (an
    error of ``S_a`` in ``a`` moves ``ab`` by ``S_a |b|``) less the product's own terms
    counted twice. It is ``S_a |b|`` when ``b`` is exact (a weight: ``S_b = |b|``), the
    same as ``S_a S_b``; where both operands cancel (attention scores ``q . k``, a
    LayerNorm's ``(x - mean)^2``) ``S_a S_b`` would square the cancellation at every
    such product, while the error it bounds grows only to first order."""
    a, b = jnp.abs(a), jnp.abs(b)
    return sa * b + a * sb - a * b


def _product(vals, mags, outs, params):
    shape = outs[0].shape
    a, b = _to(_f64(vals[0]), shape), _to(_f64(vals[1]), shape)
    return [_first_order_product(a, b, _to(mags[0], shape), _to(mags[1], shape))]


def _quotient(vals, mags, outs, params):
    shape = outs[0].shape
    a, b = _to(_f64(vals[0]), shape), _to(_f64(vals[1]), shape)
    sa, sb = _to(mags[0], shape), _to(mags[1], shape)
    safe = jnp.where(b != 0, jnp.abs(b), 1.0)
    bound = sa / safe + jnp.abs(a) * sb / (safe * safe)
    return [jnp.where(b != 0, bound, _abs64(outs[0]))]


def _same(vals, mags, outs, params):
    """Unary ops that keep the magnitude: neg, abs, conversions to a float, copies."""
    return [_to(m, o.shape) for m, o in zip(mags, outs, strict=False)]


def _convert(vals, mags, outs, params):
    out = outs[0]
    if jnp.issubdtype(out.dtype, jnp.inexact):
        return [mags[0]]
    return [_abs64(out)]  # to an integer or bool: exact, its own value


def _own_value(vals, mags, outs, params):
    return [_abs64(o) for o in outs]


# How far (relative to the terms' magnitude) an operand of max/min may lie from the
# result and still be the one chosen in another, correctly rounding path: 2**-5, above
# the relative tolerance of every precision vmapcheck runs (bf16's eps is 2**-8). An
# operand further away loses in every path that agrees with this one at all.
CONTENTION = 2.0**-5


def _order(vals, mags, outs, params):
    """max/min/clamp: the result is one of the operands; its error is at most the error
    of the operands in contention, those whose value lies within ``CONTENTION`` times
    their terms' magnitude of the result. So ``relu = max(x, 0)`` keeps ``S_x`` for a
    live or nearly dead unit and gives 0 for a clearly dead one (whose input no path
    agreeing on it can push above zero). An infinite operand contributes only when it
    is chosen, and then |y| (applied to every rule) covers it."""
    shape = outs[0].shape
    y = _to(outs[0].astype(jnp.float64), shape)
    out = jnp.zeros(shape, jnp.float64)
    for value, mag in zip(vals, mags, strict=True):
        m = _to(_finite(mag), shape)
        v = _to(jnp.asarray(value).astype(jnp.float64), shape)
        with jax.numpy_dtype_promotion("standard"):
            near = jnp.abs(v - y) <= CONTENTION * (m + _to(_finite(_abs64(y)), shape))
        out = jnp.maximum(out, jnp.where(near, m, 0.0))
    return [out]


def _structural(vals, mags, outs, params, prim):
    """Move the magnitudes as the values move: bind the same primitive on them."""
    result = prim.bind(*mags, **params)
    return list(result) if prim.multiple_results else [result]


def _with_real_args(positions: Sequence[int]):
    """Structural primitives whose operands at ``positions`` are indices or predicates:
    those stay the real values, the others become magnitudes."""

    def rule(vals, mags, outs, params, prim):
        args = [vals[i] if i in positions else mags[i] for i in range(len(vals))]
        result = prim.bind(*args, **params)
        return list(result) if prim.multiple_results else [result]

    return rule


def _index_rule(first_magnitudes: int):
    """gather/dynamic_slice/...: the first operands are data, the rest real indices."""

    def rule(vals, mags, outs, params, prim):
        args = [*mags[:first_magnitudes], *vals[first_magnitudes:]]
        result = prim.bind(*args, **params)
        return list(result) if prim.multiple_results else [result]

    return rule


def _scatter(vals, mags, outs, params, prim):
    # (operand, indices, updates): magnitudes move with the values, indices stay real.
    result = prim.bind(mags[0], vals[1], mags[2], **params)
    return [result]


def _dot(vals, mags, outs, params, prim):
    """dot_general/conv: the sum each output element is, ``sum |a_i| |b_i|``, on the
    operands' own values: the terms of the sum it rounds. The terms behind the operands
    (earlier layers) are not carried into it: carried through every matmul, a
    cancellation in each layer multiplies into the next (see the module doc)."""
    return [
        prim.bind(_abs64(vals[0]), _abs64(vals[1]), **{**params, "preferred_element_type": F64})
    ]


def _reduced_order(vals, mags, outs, params):
    """reduce_max/reduce_min over ``axes``: the result is one of the elements; its error is
    at most that of the elements in contention for it (within ``CONTENTION`` of it, as
    :func:`_order`). So a softmax's max over scores where padded keys hold -1e9 keeps the
    magnitude of the real scores, not the 1e9 of a masked one that no path picks."""
    axes = tuple(params["axes"])
    x = _f64(vals[0])
    y = jnp.expand_dims(_f64(outs[0]), axes)
    m = _finite(mags[0])
    with jax.numpy_dtype_promotion("standard"):
        near = jnp.abs(x - y) <= CONTENTION * (m + _finite(jnp.abs(y)))
    return [jnp.max(jnp.where(near, m, 0.0), axis=axes)]


def _integer_pow(vals, mags, outs, params):
    n = params["y"]
    x = _f64(vals[0])
    if n == 0:
        return [jnp.ones_like(mags[0])]
    if n > 0:
        # x^n = x * x^(n-1): the product rule applied n-1 times, in closed form.
        ax = jnp.abs(x)
        return [n * ax ** (n - 1) * mags[0] - (n - 1) * ax**n]
    # A negative power is a nonlinear step: its condition |n| |y| (as a smooth function).
    return [abs(n) * _abs64(outs[0])]


def _pow(vals, mags, outs, params):
    """x**p, a nonlinear step: its condition in x and in p, ``|p y| + |y log|x|| |p|``."""
    shape = outs[0].shape
    x, p = _to(_f64(vals[0]), shape), _to(_f64(vals[1]), shape)
    y = _f64(outs[0])
    return [jnp.abs(p * y) + jnp.abs(y * jnp.log(jnp.abs(x)) * p)]


def _first_order(derivative: Callable[[jax.Array, jax.Array], jax.Array]) -> MagnitudeRule:
    """A smooth elementwise f, a nonlinear step: ``|f'(x)| |x|`` (``derivative(x, y)`` in
    float64), what one rounding of its own input ``x`` moves the result by (its
    condition), e.g. ``|x| exp(x)`` for exp, 1 for log: the terms behind ``x`` are not
    carried through (see the module doc)."""

    def rule(vals, mags, outs, params):
        x, y = _f64(vals[0]), _f64(outs[0])
        return [jnp.abs(derivative(x, y)) * jnp.abs(x)]

    return rule


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# Rules that need no primitive: (values, magnitudes, outputs, params) -> magnitudes.
_PLAIN: dict[str, MagnitudeRule] = {
    "add": _sum,
    "sub": _sum,
    "add_any": _sum,
    "mul": _product,
    "div": _quotient,
    "neg": _same,
    "abs": _same,
    "copy": _same,
    "copy_p": _same,
    "stop_gradient": _same,
    "reduce_precision": _same,
    "real": _same,
    "imag": _same,
    "conj": _same,
    "optimization_barrier": _same,
    "sharding_constraint": _same,
    "mesh_cast": _same,
    "device_put": _same,
    "convert_element_type": _convert,
    "max": _order,
    "min": _order,
    "reduce_max": _reduced_order,
    "reduce_min": _reduced_order,
    "clamp": _order,
    "square": lambda vals, mags, outs, params: [
        _first_order_product(_f64(vals[0]), _f64(vals[0]), mags[0], mags[0])
    ],
    "one_minus_square": lambda vals, mags, outs, params: [1.0 + mags[0] * mags[0]],
    "integer_pow": _integer_pow,
    "pow": _pow,
    "exp": _first_order(lambda x, y: y),
    "exp2": _first_order(lambda x, y: math.log(2.0) * y),
    "expm1": _first_order(lambda x, y: y + 1.0),
    "log": _first_order(lambda x, y: 1.0 / x),
    "log1p": _first_order(lambda x, y: 1.0 / (1.0 + x)),
    "tanh": _first_order(lambda x, y: 1.0 - y * y),
    "logistic": _first_order(lambda x, y: y * (1.0 - y)),
    "sqrt": _first_order(lambda x, y: 0.5 / y),
    "rsqrt": _first_order(lambda x, y: 0.5 * y / x),
    "cbrt": _first_order(lambda x, y: 1.0 / (3.0 * y * y)),
    "sin": _first_order(lambda x, y: jnp.cos(x)),
    "cos": _first_order(lambda x, y: jnp.sin(x)),
    "tan": _first_order(lambda x, y: 1.0 + y * y),
    "atan": _first_order(lambda x, y: 1.0 / (1.0 + x * x)),
    "sinh": _first_order(lambda x, y: jnp.cosh(x)),
    "cosh": _first_order(lambda x, y: jnp.sinh(x)),
    "asinh": _first_order(lambda x, y: 1.0 / jnp.sqrt(1.0 + x * x)),
    "erf": _first_order(lambda x, y: _TWO_OVER_SQRT_PI * jnp.exp(-x * x)),
    "erfc": _first_order(lambda x, y: _TWO_OVER_SQRT_PI * jnp.exp(-x * x)),
}

# Discrete or exact results: the magnitude is the value itself (nothing to bound).
_DISCRETE = frozenset(
    {
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "not",
        "xor",
        "is_finite",
        "sign",
        "floor",
        "ceil",
        "round",
        "argmax",
        "argmin",
        "iota",
        "reduce_and",
        "reduce_or",
        "shift_left",
        "shift_right_logical",
        "shift_right_arithmetic",
        "population_count",
        "clz",
    }
)

# Rules that bind a primitive (the equation's own, or a stand-in) on the magnitudes.
_BOUND: dict[str, Callable[..., list]] = {
    **{
        name: _structural
        for name in (
            "reshape",
            "broadcast_in_dim",
            "transpose",
            "squeeze",
            "expand_dims",
            "slice",
            "concatenate",
            "pad",
            "rev",
            "split",
            "reduce_sum",
            "reduce_prod",
            "cumsum",
            "cumprod",
        )
    },
    "dot_general": _dot,
    "conv_general_dilated": _dot,
    "select_n": _with_real_args([0]),
    "gather": _index_rule(1),
    "dynamic_slice": _index_rule(1),
    "dynamic_update_slice": _index_rule(2),
    "scatter": _scatter,
    "scatter-add": _scatter,
}

# Calls into a sub-jaxpr: primitive name -> the param holding it (also walked into by
# vmapcheck.core.bitwise).
CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}

HANDLED: tuple[str, ...] = tuple(sorted({*_PLAIN, *_DISCRETE, *_BOUND, *CALLS, "cond"}))


def _real(eqn: JaxprEqn, vals: list[jax.Array]) -> list[jax.Array]:
    """The equation's real outputs: its own primitive on the real inputs."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: Sequence[Any] = ()
    if isinstance(params, tuple):  # JAX before 0.7: (subfuns, params)
        subfuns, params = params
    out = eqn.primitive.bind(*subfuns, *vals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _fallback(eqn: JaxprEqn, vals: list[jax.Array], fallbacks: set[str]) -> list[Pair]:
    fallbacks.add(eqn.primitive.name)
    outs = _real(eqn, vals)
    return [(o, _abs64(o)) for o in outs]


def _call(eqn: JaxprEqn, ins: list[Pair], fallbacks: set[str]) -> list[Pair]:
    sub = eqn.params[CALLS[eqn.primitive.name]]
    if isinstance(sub, ClosedJaxpr):
        return _eval(sub.jaxpr, sub.consts, ins, fallbacks)
    if isinstance(sub, Jaxpr):
        return _eval(sub, [], ins, fallbacks)
    return _fallback(eqn, [v for v, _ in ins], fallbacks)


def _cond(eqn: JaxprEqn, ins: list[Pair], fallbacks: set[str]) -> list[Pair]:
    """Every branch interpreted; the real index selects values and magnitudes."""
    index, operands = ins[0][0], ins[1:]
    branches = [_eval(b.jaxpr, b.consts, operands, fallbacks) for b in eqn.params["branches"]]
    which = jnp.clip(index.astype(jnp.int32), 0, len(branches) - 1)
    out = []
    for k in range(len(eqn.outvars)):
        vals = [branch[k][0] for branch in branches]
        mags = [branch[k][1] for branch in branches]
        out.append((lax.select_n(which, *vals), lax.select_n(which, *mags)))
    return out


def _apply(eqn: JaxprEqn, ins: list[Pair], fallbacks: set[str]) -> list[Pair]:
    name = eqn.primitive.name
    if name in CALLS:
        return _call(eqn, ins, fallbacks)
    if name == "cond":
        return _cond(eqn, ins, fallbacks)
    vals = [v for v, _ in ins]
    mags = [m for _, m in ins]
    if name not in _PLAIN and name not in _DISCRETE and name not in _BOUND:
        return _fallback(eqn, vals, fallbacks)
    outs = _real(eqn, vals)
    try:
        if name in _DISCRETE:
            rule_mags = _own_value(vals, mags, outs, eqn.params)
        elif name in _PLAIN:
            rule_mags = _PLAIN[name](vals, mags, outs, eqn.params)
        else:
            rule_mags = _BOUND[name](vals, mags, outs, eqn.params, eqn.primitive)
    except Exception:  # a rule that cannot apply to these params: |y|, recorded
        fallbacks.add(name)
        return [(o, _abs64(o)) for o in outs]
    # Never below the value's own magnitude (its last rounding is relative to it).
    return [
        (o, jnp.maximum(_to(m.astype(F64), o.shape), _abs64(o)))
        for o, m in zip(outs, rule_mags, strict=True)
    ]


def _literal(v: Literal) -> Pair:
    val = jnp.asarray(v.val, dtype=v.aval.dtype)  # type: ignore[attr-defined]  # a ShapedArray
    return val, _abs64(val)


def _eval(jaxpr: Jaxpr, consts: Sequence[Any], args: list[Pair], fallbacks: set[str]):
    env: dict[Any, Pair] = {}

    def read(v: Any) -> Pair:
        return _literal(v) if isinstance(v, Literal) else env[v]

    for var, const in zip(jaxpr.constvars, consts, strict=True):
        env[var] = (jnp.asarray(const), _abs64(const))
    for var, arg in zip(jaxpr.invars, args, strict=True):
        env[var] = arg
    for eqn in jaxpr.eqns:
        outs = _apply(eqn, [read(v) for v in eqn.invars], fallbacks)
        for var, out in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, DropVar):
                env[var] = out
    return [read(v) for v in jaxpr.outvars]


def _float64_leaf(leaf: Any) -> jax.Array:
    leaf = jnp.asarray(leaf)
    return leaf.astype(F64) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf


def _require_x64() -> None:
    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            "the magnitude forward runs in float64 and needs jax_enable_x64 "
            "(vmapcheck.core.runtime.configure_cpu_float64, or jax.enable_x64(True))"
        )


def magnitude_function(
    f: Callable[[Any, jax.Array], Any], params: Any, x: Any
) -> tuple[Callable[[Any, jax.Array], Any], set[str]]:
    """``(g, fallbacks)``: ``g(params, x)`` returns ``S`` for ``f(params, x)``, jitted,
    for arguments of the structure, shapes and dtypes of ``params`` and ``x`` (float
    leaves as float64); ``fallbacks`` fills with the primitive names that had no rule
    when ``g`` is first traced."""
    closed = jax.make_jaxpr(f)(params, x)
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(f, params, x))
    fallbacks: set[str] = set()

    def g(params: Any, x: jax.Array) -> Any:
        leaves = jax.tree_util.tree_leaves((params, x))
        pairs = [(leaf, _abs64(leaf)) for leaf in leaves]
        outs = _eval(closed.jaxpr, closed.consts, pairs, fallbacks)
        return jax.tree_util.tree_unflatten(out_tree, [m for _, m in outs])

    return jax.jit(g), fallbacks


def terms_magnitude(
    f: Callable[[Any, jax.Array], Any], params: Any, x: Any
) -> tuple[np.ndarray, list[str]]:
    """``(S, fallbacks)``: the magnitude of the terms of every element of ``f(params, x)``.

    ``f`` is any ``(params, x) -> y``: a model's ``forward_one`` (x: ``(in_features,)``,
    S: ``(out_features,)``), a hand-batched forward (x: ``(rows, in_features)`` with the
    batch on axis 0, S: ``(rows, out_features)``), or anything else JAX can trace. ``S``
    has ``y``'s shape (a pytree of arrays if ``y`` is one), is float64 and ``>= |y|``
    elementwise; float leaves of ``params`` and ``x`` are taken as float64 (exact for
    float32 and bfloat16 values; round them first to the dtype that ran). ``fallbacks``:
    the sorted names of the primitives that fell back to ``|y|`` (see the module doc).
    """
    _require_x64()
    params64 = jax.tree_util.tree_map(_float64_leaf, params)
    x64 = jax.tree_util.tree_map(_float64_leaf, x)
    g, fallbacks = magnitude_function(f, params64, x64)
    scale = jax.tree_util.tree_map(np.asarray, g(params64, x64))
    return scale, sorted(fallbacks)


Program = tuple[Callable[[Any, jax.Array], Any], set[str]]


def _rows(
    programs: dict[Any, Program],
    forward_one: Callable,
    params64: Any,
    x64: Any,
    batched: bool,
) -> tuple[np.ndarray, list[str]]:
    """S of ``forward_one`` row by row (``batched``: ``x64`` has the batch axis 0 on every
    leaf, else it is one example); ``programs`` caches one jitted magnitude program per
    example structure, shapes and dtypes (traced once)."""
    example = (
        jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), x64)
        if batched
        else jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), x64)
    )
    key = str(example)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), example)
    if key not in programs:
        programs[key] = magnitude_function(forward_one, params64, zeros)
    g, fallbacks = programs[key]
    if not batched:
        scale = np.asarray(g(params64, x64))
    elif rows(x64) == 0:
        out = jax.eval_shape(forward_one, params64, zeros)
        scale = np.zeros((0, *out.shape), np.float64)
    else:
        scale = np.stack([np.asarray(g(params64, take(x64, i))) for i in range(rows(x64))])
    return scale, sorted(fallbacks)


def rows_magnitude(
    forward_one: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    x: Any,
    batched: bool | None = None,
) -> tuple[np.ndarray, list[str]]:
    """``(S, fallbacks)`` of ``forward_one`` over the rows of ``x``, one row at a time.

    ``x``: one example ``(in_features,)`` -> S ``(out_features,)``, or a batch
    ``(rows, in_features)``, batch axis 0 -> S ``(rows, out_features)`` (a dict example
    or batch of leaves: ``batched`` says which; by default a bare array of rank >= 2 is
    a batch). Each row runs through the same jitted magnitude program (never ``vmap``:
    the scale must not depend on the batching the check is judging).
    """
    _require_x64()
    params64 = jax.tree_util.tree_map(_float64_leaf, params)
    x64 = jax.tree.map(_float64_leaf, x)
    if batched is None:
        batched = np.ndim(x64) >= 2
    return _rows({}, forward_one, params64, x64, batched)


class CaseMagnitude(TypedDict):
    """The terms' magnitude of one case (:func:`case_magnitudes`): ``S`` of the case's
    output shape (``(rows, out_features)``, batch axis 0, or ``(out_features,)`` for a
    vector case; None: not computed, ``error`` says why) and the primitives whose
    magnitude fell back to ``|y|``."""

    scale: np.ndarray | None
    fallbacks: list[str]
    error: NotRequired[str]


# Why a stochastic model's cases are judged by the output rule (Model.stochastic).
SAMPLED = (
    "the model samples (stochastic=True): the terms' magnitude is not computed for a "
    "forward that draws random numbers (the magnitude program is traced on zero inputs, "
    "and has no zero key nor rule for a draw), so the case is judged by the output rule"
)


def sampled_magnitudes(cases: dict[str, Case]) -> dict[str, CaseMagnitude]:
    """What :func:`case_magnitudes` gives a stochastic model: for every valid case the
    entry of a magnitude that could not be computed (``scale`` None, ``error``
    :data:`SAMPLED`), so the check judges it by the output rule and says why."""
    return {
        name: {"scale": None, "fallbacks": [], "error": SAMPLED}
        for name, case in cases.items()
        if kind_of(case, name).valid
    }


def case_magnitudes(
    forward_one: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    cases: dict[str, Case],
    run_dtype: Any,
    max_rows: int | None = None,
    *,
    stochastic: bool = False,
    programs: dict[Any, Program] | None = None,
) -> dict[str, CaseMagnitude]:
    """case name -> ``{"scale": S, "fallbacks": [...]}`` for every valid case.

    ``programs``: the jitted magnitude programs by example structure, filled as they are
    traced; pass the same dict again (for the same ``forward_one`` and params structure)
    to reuse them (the Python API keeps it per model, :mod:`vmapcheck.core.jit_cache`);
    None: a new one, for this call only.

    ``stochastic`` (the model's ``Model.stochastic``): no magnitude is computed, every
    case gets :func:`sampled_magnitudes`' entry (judged by the output rule, saying why).

    ``max_rows`` (``budget.magnitude_max_rows``; None: every row): of a batch, only the
    first this many rows are computed, so ``S`` has ``min(rows, max_rows)`` rows; the
    check judges the rows beyond them by the output rule and reports the cap.

    Params and each case's ``x`` are first rounded to ``run_dtype`` exactly as the
    float64 oracle rounds them (:mod:`vmapcheck.core.oracle`), so S describes the numbers
    the paths saw. ``S`` has the case's output shape: ``(out_features,)`` for a vector
    case, ``(rows, out_features)`` (batch axis 0) for a batch. Where the magnitude
    forward itself fails on a case, its entry is ``{"scale": None, "fallbacks": [],
    "error": "<type>: <message>"}``: that case is judged by the output rule, and the
    report says why (the check reports; it does not crash on a model it cannot read).
    """
    if stochastic:
        return sampled_magnitudes(cases)
    _require_x64()
    params64 = jax.tree_util.tree_map(lambda leaf: to_f64(leaf, run_dtype), params)
    programs = {} if programs is None else programs
    out: dict[str, CaseMagnitude] = {}
    for name, case in cases.items():
        kind = kind_of(case, name)
        if not kind.valid:
            continue
        x = case["x"]
        if kind.takes == "batch" and max_rows is not None and rows(x) > max_rows:
            x = take(x, slice(0, max_rows))
        x64 = jax.tree.map(lambda leaf: to_f64(leaf, run_dtype), x)
        try:
            scale, fallbacks = _rows(
                programs, forward_one, params64, x64, batched=kind.takes == "batch"
            )
        except Exception as exc:  # reported with the case, judged by the output rule
            out[name] = {"scale": None, "fallbacks": [], "error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name] = {"scale": scale, "fallbacks": fallbacks}
    return out
