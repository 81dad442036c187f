"""Group-sequential tests: boundaries from an alpha-spending function, and stagewise p.

The paired verdict (vmapcheck.bench.verdict.paired) looks at its pairs a few times on the way
to its maximum number (``looks``), and stops timing a cell once the cell is decided. A
test that looks several times at a growing sample and stops at the first significant
look has a false-positive rate far above its nominal level, unless each look uses a
stricter boundary. This module computes those boundaries the way the group-sequential
literature does (Jennison & Turnbull, *Group Sequential Methods with Applications to
Clinical Trials*, 2000, ch. 7 and 19):

- the test statistic at look ``k`` is a standardized score ``Z_k``, with information
  fraction ``t_k`` (here: pairs taken / maximum pairs). Under the null, ``(Z_1, ...,
  Z_K)`` is multivariate normal with ``corr(Z_i, Z_j) = sqrt(t_i / t_j)`` (i <= j): the
  canonical joint distribution of a Brownian motion watched at times ``t_k``. The
  standardized Wilcoxon signed-rank statistic of the pairs taken so far follows it
  asymptotically (Jennison & Turnbull, section 12.3);
- a Lan-DeMets alpha-spending function ``alpha(t)`` (:data:`SPENDING`) says how much of
  the test's level may be spent by time ``t``: ``alpha(1) = alpha``. The boundary of look
  ``k`` is the ``c_k`` for which P(no crossing at looks 1..k-1, ``Z_k >= c_k``) =
  ``alpha(t_k) - alpha(t_{k-1})``. Over all looks the chance of ever crossing under the
  null is then exactly ``alpha``, whatever look the test stops at;
- O'Brien-Fleming type, ``2 - 2 Phi(z_(1-alpha/2) / sqrt(t))``: almost nothing spent
  early, the last boundary close to the fixed-sample test's (its power kept); Pocock
  type, ``alpha ln(1 + (e - 1) t)``: spent evenly, early stops likelier, the last
  boundary stricter.

The crossing probabilities are computed by recursive numerical integration of the
Brownian motion's density over the continuation region (Armitage, McPherson and Rowe,
1969; Jennison & Turnbull ch. 19) on a fixed grid: deterministic, about 1e-6 accurate.

:func:`stagewise_p` is the p-value that goes with the design (stagewise ordering,
Jennison & Turnbull section 8.4): an outcome that crossed at an earlier look is more
extreme than any later one. Under the null it is uniform, so Benjamini-Hochberg over the
cells applies to it as to a fixed-sample p.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize, stats

OBRIEN_FLEMING, POCOCK = "obrien-fleming", "pocock"
# The grid of the score S = Z sqrt(t) the density is carried on: S in [-LIMIT, LIMIT].
# Beyond 12 standard deviations at t = 1 nothing measurable remains.
_LIMIT = 12.0
_STEP = 0.004


def spend(kind: str, alpha: float, t: float) -> float:
    """The level spent by information fraction ``t`` (0 < t <= 1) by the Lan-DeMets
    spending function ``kind`` (module docstring); ``spend(kind, alpha, 1) == alpha``."""
    if not 0.0 < t <= 1.0:
        raise ValueError(f"information fraction: expected 0 < t <= 1, found {t}")
    if kind == OBRIEN_FLEMING:
        return float(2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1.0 - alpha / 2.0) / math.sqrt(t)))
    if kind == POCOCK:
        return float(alpha * math.log(1.0 + (math.e - 1.0) * t))
    raise ValueError(
        f"spending function: expected {OBRIEN_FLEMING!r} or {POCOCK!r}, found {kind!r}"
    )


SPENDING = (OBRIEN_FLEMING, POCOCK)


def _fractions(looks: Sequence[float]) -> np.ndarray:
    t = np.asarray(looks, float)
    if t.size == 0 or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1.0 + 1e-12:
        raise ValueError(f"information fractions: expected increasing in (0, 1], found {list(t)}")
    return t


class Design:
    """A one-sided group-sequential test (upper boundary only) of level ``alpha`` with
    looks at information fractions ``looks`` (increasing, the last 1 for the planned
    maximum) and spending function ``kind``.

    ``bounds``: the critical values ``c_k`` of ``Z_k``, shape (K,). Built once per
    design: a comparison of many cells shares it.
    """

    def __init__(self, looks: Sequence[float], alpha: float, kind: str) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha: expected 0 < alpha < 1, found {alpha}")
        self.t = _fractions(looks)
        self.alpha = alpha
        self.kind = kind
        self.grid = np.arange(-_LIMIT, _LIMIT + _STEP / 2, _STEP)
        spent = [spend(kind, alpha, float(t)) for t in self.t]
        self.increments = np.diff([0.0, *spent])
        # densities[k]: the sub-density of S_k on the grid over the paths that have not
        # crossed at looks 1..k (0 above the boundary); what look k+1 integrates over.
        self.bounds = np.empty(self.t.size)
        self._densities: list[np.ndarray] = []
        density: np.ndarray | None = None
        for k in range(self.t.size):
            tail = self._tail_function(k, density)
            target = float(self.increments[k])
            # The boundary in Z: crossing probability at look k equals the level spent.
            self.bounds[k] = optimize.brentq(
                lambda z, f=tail, a=target: f(z) - a, -8.0, 40.0, xtol=1e-9
            )
            density = self._continue(k, density, self.bounds[k])
            self._densities.append(density)

    def _tail_function(self, k: int, density: np.ndarray | None) -> Callable[[float], float]:
        """z -> P(no crossing before look k, Z_k >= z) under the null."""
        t_k = float(self.t[k])
        if density is None:
            return lambda z: float(stats.norm.sf(z))
        dt = t_k - float(self.t[k - 1])
        weights = density * _STEP

        def tail(z: float) -> float:
            s = z * math.sqrt(t_k)
            return float(np.dot(weights, stats.norm.sf((s - self.grid) / math.sqrt(dt))))

        return tail

    def _continue(self, k: int, density: np.ndarray | None, bound: float) -> np.ndarray:
        """The sub-density of S_k on the grid, the paths that crossed at look k removed."""
        t_k = float(self.t[k])
        if density is None:
            out = stats.norm.pdf(self.grid, scale=math.sqrt(t_k))
        else:
            dt = t_k - float(self.t[k - 1])
            kernel = stats.norm.pdf(
                np.arange(-_LIMIT, _LIMIT + _STEP / 2, _STEP), scale=math.sqrt(dt)
            )
            out = np.convolve(density, kernel, mode="same") * _STEP
        out[self.grid >= bound * math.sqrt(t_k)] = 0.0
        return out

    def crossed(self, k: int, z: float) -> bool:
        """Whether ``z`` at look ``k`` (0-based) is on or beyond the boundary."""
        return z >= self.bounds[k]

    def stagewise_p(self, k: int, z: float) -> float:
        """The p-value of stopping at look ``k`` (0-based) with statistic ``z``
        (stagewise ordering): the level spent before look ``k`` plus P(no crossing
        before ``k``, ``Z_k >= z``). Equals the fixed-sample ``sf(z)`` for one look."""
        before = float(np.sum(self.increments[:k]))
        previous = self._densities[k - 1] if k > 0 else None
        return min(1.0, before + self._tail_function(k, previous)(z))


def wilcoxon_z(values: np.ndarray) -> float:
    """The standardized one-sample Wilcoxon signed-rank statistic of ``values`` (n,)
    against 0: ``(T+ - n(n+1)/4) / sd``, zeros dropped (Wilcoxon's way), the variance
    corrected for tied ranks. Large when the values lie above 0. 0.0 when nothing is
    left to rank."""
    values = np.asarray(values, float)
    values = values[values != 0]
    n = values.size
    if n == 0:
        return 0.0
    ranks = stats.rankdata(np.abs(values))
    t_plus = float(ranks[values > 0].sum())
    _, counts = np.unique(np.abs(values), return_counts=True)
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(counts**3 - counts)) / 48.0
    if variance <= 0:
        return 0.0
    return (t_plus - n * (n + 1) / 4.0) / math.sqrt(variance)


def look_sizes(maximum: int, looks: int) -> list[int]:
    """Sample sizes (pairs) at each of ``looks`` equally spaced looks up to ``maximum``:
    ``[ceil(k * maximum / looks) for k = 1..looks]``, the last ``maximum``."""
    if looks < 1 or maximum < looks:
        raise ValueError(f"looks: expected 1 to {maximum} (the maximum), found {looks}")
    return [math.ceil(k * maximum / looks) for k in range(1, looks + 1)]
