"""A one-sided upper bound on the mean of bounded values that holds for every
distribution and every sample size: the betting ("hedged capital") bound of
Waudby-Smith and Ramdas, "Estimating means of bounded random variables by
betting", JRSS B 86:1 (2024), sections 4-5, one-sided, fixed sample size.

For x_1..x_K in [0, 1] and a candidate mean m, a gambler who bets that the mean
is below m grows the capital ``K_t(m) = prod_{i<=t} (1 + lambda_i (m - x_i))``;
under ``E[x] >= m`` it is a non-negative supermartingale, so by Ville's
inequality ``P(max_t K_t(m) >= 1/alpha) <= alpha``. The bound is the smallest m
whose capital reaches ``1/alpha``. Bets are predictable (they use only x_<i):
``lambda_i = min(sqrt(2 log(1/alpha) / (K var_{i-1})), c / (1 - m))`` with the
running variance ``var_{i-1} = (1/4 + sum_{j<i} (x_j - mean_j)^2) / i`` and
``c = 0.9`` of the largest bet that keeps the capital non-negative. Every factor
rises with m, so the rejected means form an interval and bisection is exact.

relaxtune applies it to per-problem mean differences (problems as clusters).
The values are taken in the order given, which must not depend on them (the
task's problem order).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["betting_upper"]

BET_CAP = 0.9  # c: the largest bet as a share of the one that could lose everything


def betting_upper(x, confidence: float, tol: float = 1e-7) -> np.ndarray | float:
    """Upper one-sided ``confidence`` bound on the mean of values in [0, 1].

    Args:
        x: ``[K]`` values, or ``[S, K]`` for S independent samples at once (the
            coverage benchmark), each in [0, 1], in a data-independent order.
        confidence: in (0, 1).
        tol: bisection tolerance (units of x).

    Returns:
        a float for ``[K]`` input, else an array ``[S]``.

    Raises:
        ValueError: empty input, values outside [0, 1] or NaN, confidence outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    arr = np.asarray(x, dtype=np.float64)
    single = arr.ndim == 1
    arr = np.atleast_2d(arr)
    if arr.shape[1] == 0:
        raise ValueError("the betting bound needs at least one value")
    if not np.all((arr >= 0.0) & (arr <= 1.0)):
        raise ValueError("the betting bound needs values in [0, 1]")
    k = arr.shape[1]
    log_wealth = math.log(1.0 / (1.0 - confidence))
    prior = np.full((arr.shape[0], 1), 0.5)
    means = (0.5 + np.cumsum(arr, axis=1)) / np.arange(2, k + 2)  # mean_i after x_1..x_i
    prev_means = np.concatenate([prior, means[:, :-1]], axis=1)
    var = (0.25 + np.cumsum((arr - prev_means) ** 2, axis=1)) / np.arange(2, k + 2)
    prev_var = np.concatenate([np.full_like(prior, 0.25), var[:, :-1]], axis=1)
    raw = np.sqrt(2.0 * log_wealth / (k * prev_var))

    def rejected(m: np.ndarray) -> np.ndarray:
        bet = np.minimum(raw, BET_CAP / (1.0 - m)[:, None])
        wealth = np.cumsum(np.log1p(bet * (m[:, None] - arr)), axis=1)
        return wealth.max(axis=1) >= log_wealth

    lo, hi = np.zeros(arr.shape[0]), np.ones(arr.shape[0])
    while np.any(hi - lo > tol):
        mid = (lo + hi) / 2
        rej = rejected(np.minimum(mid, 1.0 - 1e-12))
        hi, lo = np.where(rej, mid, hi), np.where(rej, lo, mid)
    return float(hi[0]) if single else hi
