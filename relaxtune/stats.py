"""Confidence intervals, paired comparisons and pass@k."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["wilson_interval", "pass_at_k", "paired_drop"]


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k / n`` (``(0, 1)`` when n = 0).

    Raises:
        ValueError: k outside [0, n] or confidence outside (0, 1).
    """
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k = {k} outside [0, n = {n}]")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, eq. 1):
    ``1 - C(n - c, k) / C(n, k)``.

    Raises:
        ValueError: k outside [1, n] or c outside [0, n].
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def paired_drop(strict: Sequence[bool], relaxed: Sequence[bool], confidence: float = 0.95) -> tuple[float, float, float]:
    """Accuracy drop ``acc(strict) - acc(relaxed)`` over paired samples (same
    problem, repeat and seed), with a two-sided ``confidence`` interval from the
    paired differences ``d_i = s_i - r_i`` (Student t on their mean; the t
    quantile makes it conservative at small n; a degenerate sample uses the
    Wilson interval of the discordant share).

    Returns:
        ``(drop, low, high)`` in accuracy units.

    Raises:
        ValueError: lengths differ or are zero.
    """
    from scipy import stats

    if len(strict) != len(relaxed) or not strict:
        raise ValueError(f"paired samples need equal, non-zero lengths: {len(strict)} vs {len(relaxed)}")
    d = [int(bool(s)) - int(bool(r)) for s, r in zip(strict, relaxed)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    if var == 0.0:  # all differences equal: bound the discordant rate instead
        lo, hi = wilson_interval(sum(1 for x in d if x != 0), n, confidence)
        sign = 1.0 if mean > 0 else -1.0 if mean < 0 else 0.0
        if sign == 0.0:
            return 0.0, -hi, hi
        return mean, min(sign * lo, sign * hi), max(sign * lo, sign * hi)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * math.sqrt(var / n)
    return mean, mean - half, mean + half
