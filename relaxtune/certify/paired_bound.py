"""Exact one-sided bounds on the difference of two paired proportions (one sample per problem).

With ``n`` pairs of binary outcomes (strict, relaxed) of which ``b`` are
strict-only correct and ``c`` relaxed-only correct, the accuracy drop is
``D = p10 - p01`` and its natural estimate ``(b - c) / n``. The nuisance is the
discordance ``delta = p10 + p01``; given it, the number of discordant pairs is
``m ~ Bin(n, delta)`` and ``b | m ~ Bin(m, theta)`` with ``theta = (delta + D) / (2 delta)``.

The upper bound is Buehler's exact construction (Buehler 1957, JASA 52:482)
ordered by an approximate bound, as Lloyd and Moldovan (Stat Med 2008) do for
independent proportions; here the ordering is Tango's asymptotic score bound
for paired proportions (Tango 1998, Stat Med 17:891; the score statistic of the
exact unconditional tests of Hsueh, Liu and Chen, Biometrics 2001). Outcomes
are ranked by their Tango upper bound ``T(b, c)``, and

    U(b, c) = sup{ D : sup_delta P_{D,delta}( T(B, C) <= T(b, c) ) > alpha }.

The tail set does not depend on D and is a lower set (T rises with b and falls
with c), so the p-value falls monotonically in D and ``P(U < D) <= alpha`` for
every n and discordance: coverage is at least nominal, not only asymptotically.
The supremum over delta is taken on a grid dense at both ends, then refined
around its best local maxima.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .inputs import check_confidence, check_count, check_finite

__all__ = ["tango_score", "tango_upper", "exact_pvalue", "exact_upper", "exact_pvalue_table"]

DISCORDANCE_GRID = 256  # grid points for the supremum over the discordance (cosine-spaced)
_TIE = 1e-9  # score ties (the observed outcome itself) belong to the tail


def tango_score(b, c, n: int, d0):
    """Tango's score statistic for H0: drop = ``d0`` (Tango 1998):
    ``(b - c - n d0) / sqrt(n (2 p01~ + d0 (1 - d0)))`` with ``p01~`` the MLE of
    the relaxed-only probability under H0. Broadcasts over ``b``, ``c``, ``d0``;
    a zero variance gives 0 for a zero numerator, else +-inf. Decreasing in
    ``d0``, increasing in ``b`` at fixed ``b + c``."""
    b, c, d0 = (np.asarray(x, dtype=np.float64) for x in (b, c, d0))
    a_, b_ = 2.0 * n, -b - c + (2.0 * n - b + c) * d0
    c_ = -c * d0 * (1.0 - d0)
    p01 = (-b_ + np.sqrt(np.maximum(b_ * b_ - 4.0 * a_ * c_, 0.0))) / (2.0 * a_)
    var = n * (2.0 * p01 + d0 * (1.0 - d0))
    num = b - c - n * d0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = num / np.sqrt(var)
    return np.where(var > 0, z, np.where(num > 0, np.inf, np.where(num < 0, -np.inf, 0.0)))


def tango_upper(b: int, c: int, n: int, confidence: float) -> float:
    """Tango's asymptotic one-sided upper bound of the drop: the root in d0 of
    ``tango_score(b, c, n, d0) = -z_confidence`` (1.0 when ``b = n``)."""
    from scipy import optimize, stats

    check_confidence(confidence)
    if b >= n:
        return 1.0
    z = stats.norm.ppf(confidence)
    return float(optimize.brentq(lambda d: float(tango_score(b, c, n, d)) + z, -1.0, 1.0 - 1e-15, xtol=1e-13))


def _thresholds(n: int, u_obs: float, z: float) -> np.ndarray:
    """``t[m]``: the largest b' with ``T(b', m - b') <= u_obs`` (-1 if none), for m = 0..n.
    As the score falls in d0, ``T(b', c') <= u_obs`` iff ``tango_score(b', c', n, u_obs) <= -z``."""
    m = np.arange(n + 1)
    lo, hi = np.full(n + 1, -1), m + 1  # lo: in the tail, hi: not (the score rises with b')
    while np.any(hi - lo > 1):
        active = hi - lo > 1
        mid = (lo + hi) // 2
        inside = tango_score(mid, m - mid, n, u_obs) <= -z + _TIE
        lo = np.where(active & inside, mid, lo)
        hi = np.where(active & ~inside, mid, hi)
    return lo


def _tail(n: int, t: np.ndarray, d0: float, delta) -> np.ndarray:
    """P_{d0, delta}(outcome in the tail) for each discordance in ``delta`` [K]:
    ``sum_m Bin(m; n, delta) P(Bin(m, theta) <= t[m])`` (terms below 1e-18 skipped)."""
    from scipy import special

    delta = np.atleast_1d(np.asarray(delta, dtype=np.float64))[:, None]
    m = np.arange(n + 1)[None, :]
    log_pm = (
        special.gammaln(n + 1)
        - special.gammaln(m + 1)
        - special.gammaln(n - m + 1)
        + special.xlogy(m, delta)
        + special.xlog1py(n - m, -delta)
    )
    keep = (log_pm > -41.5) & (t >= 0)
    rows, cols = np.nonzero(keep)
    d = delta[rows, 0]
    theta = np.clip((d + d0) / (2.0 * d), 0.0, 1.0)
    terms = np.exp(log_pm[rows, cols]) * special.bdtr(t[cols], cols, theta)
    return np.minimum(np.bincount(rows, weights=terms, minlength=delta.shape[0]), 1.0)


def _grid(d0: float) -> np.ndarray:
    low = max(abs(d0), 1e-12)
    return low + (1.0 - low) * (1.0 - np.cos(np.linspace(0.0, math.pi, DISCORDANCE_GRID))) / 2.0


def _sup(n: int, t: np.ndarray, d0: float) -> float:
    """sup over delta in [|d0|, 1] of the tail probability: the grid, then the three
    best local maxima refined (the function is a polynomial with several peaks)."""
    from scipy import optimize

    grid = _grid(d0)
    vals = _tail(n, t, d0, grid)
    best = float(vals.max())
    last = len(grid) - 1
    peaks = [i for i in range(len(grid)) if vals[i] >= vals[max(i - 1, 0)] and vals[i] >= vals[min(i + 1, last)]]
    for i in sorted(peaks, key=lambda i: -vals[i])[:3]:
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, last)]
        if hi > lo:
            r = optimize.minimize_scalar(
                lambda x: -_tail(n, t, d0, x)[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
            )
            best = max(best, -float(r.fun))
    return min(best, 1.0)


def _check(n: int, b: int, c: int, confidence: float) -> tuple[int, int, int]:
    n, b, c = check_count("n", n, 1), check_count("b", b), check_count("c", c)
    check_confidence(confidence)
    if b + c > n:
        raise ValueError(
            f"paired counts need n >= 1 and 0 <= strict-only b, relaxed-only c with b + c <= n; got n={n}, b={b}, c={c}"
        )
    return n, b, c


def exact_pvalue(n: int, b: int, c: int, margin: float, confidence: float) -> float:
    """Exact unconditional p-value of H0: drop >= ``margin`` given b strict-only and
    c relaxed-only pairs out of n, with the tail ordered by Tango's bound at
    ``confidence``. ``exact_upper(n, b, c, confidence) >= margin`` exactly when
    this exceeds ``1 - confidence`` (the p-value falls monotonically in margin).

    Raises:
        ValueError: counts that are not integers with ``0 <= b, c``, ``b + c <= n``
            (naming the count), a NaN or infinite margin, or confidence outside (0, 1).
    """
    n, b, c = _check(n, b, c, confidence)
    margin = check_finite(margin, "margin")
    from scipy import stats

    u = tango_upper(b, c, n, confidence)
    if u >= 1.0 or margin <= -1.0:
        return 1.0
    if margin >= 1.0:
        return 0.0
    return _sup(n, _thresholds(n, u, stats.norm.ppf(confidence)), float(margin))


@functools.lru_cache(maxsize=4096)
def exact_upper(n: int, b: int, c: int, confidence: float) -> float:
    """Buehler's exact one-sided upper ``confidence`` bound of the paired drop
    ``(p10 - p01)`` from n pairs, b strict-only, c relaxed-only (module doc);
    accuracy units, in [-1, 1], to 1e-7. The lower bound is ``-exact_upper(n, c, b, .)``.

    Raises:
        ValueError: as ``exact_pvalue``.
    """
    n, b, c = _check(n, b, c, confidence)
    from scipy import optimize, stats

    u = tango_upper(b, c, n, confidence)
    if u >= 1.0:
        return 1.0
    t, alpha = _thresholds(n, u, stats.norm.ppf(confidence)), 1.0 - confidence
    f = lambda d: _sup(n, t, d) - alpha  # noqa: E731 - falls from 1 - alpha at d = -1 to -alpha at d = 1
    lo, hi = max(u - 0.01, -1.0), min(u + 0.02, 1.0)  # the exact bound lies near Tango's
    while lo > -1.0 and f(lo) <= 0:
        lo = max(2 * lo - u - 0.01, -1.0)
    while hi < 1.0 and f(hi) > 0:
        hi = min(2 * hi - u + 0.02, 1.0)
    return float(optimize.brentq(f, lo, hi, xtol=1e-7, rtol=1e-12))


def exact_pvalue_table(n: int, margin: float, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``exact_pvalue`` for every outcome (b, c) with b + c <= n at once, on the
    grid alone (no refinement, so each value is at most ``exact_pvalue``'s): for
    coverage studies, where ``p > 1 - confidence`` means the bound covers ``margin``.

    Returns:
        ``(b, c, p)``, three arrays over the ``(n + 1)(n + 2) / 2`` outcomes.

    Raises:
        ValueError: n not an integer >= 1, a NaN or infinite margin, confidence outside (0, 1).
    """
    from scipy import special, stats

    n, margin, confidence = check_count("n", n, 1), check_finite(margin, "margin"), check_confidence(confidence)
    b, c = (x.ravel() for x in np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"))
    keep = b + c <= n
    b, c = b[keep], c[keep]
    z = stats.norm.ppf(confidence)
    lo, hi = np.full(len(b), -1.0), np.full(len(b), 1.0)  # Tango's bound of every outcome, by bisection
    for _ in range(60):
        mid = (lo + hi) / 2
        above = tango_score(b, c, n, mid) + z > 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    u = np.where(b == n, 1.0, hi)
    order = np.argsort(u, kind="stable")
    last = np.searchsorted(u[order], u[order] + _TIE, side="right") - 1  # ties share their tail
    bo, co = b[order], c[order]
    log_c = (
        special.gammaln(n + 1) - special.gammaln(bo + 1) - special.gammaln(co + 1) - special.gammaln(n - bo - co + 1)
    )
    best = np.zeros(len(b))
    for delta in _grid(margin):
        p10, p01 = max((delta + margin) / 2, 0.0), max((delta - margin) / 2, 0.0)
        log_p = (
            log_c + special.xlogy(bo, p10) + special.xlogy(co, p01) + special.xlogy(n - bo - co, max(1 - delta, 0.0))
        )
        best = np.maximum(best, np.cumsum(np.exp(log_p))[last])
    p = np.empty(len(b))
    p[order] = np.minimum(best, 1.0)
    return b, c, p
