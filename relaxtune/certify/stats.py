"""Confidence intervals, pass@k, and the bound on a relaxed point's accuracy drop vs strict.

The drop bound (``drop_bound``) is the product's promise: "accuracy drop vs
strict <= epsilon with confidence c". Its population is problems like the
task's: the problems are a sample from such problems, and a problem's repeats
are samples of its own success rates, so the bound clusters by problem.

- One sample per problem: the pairs are independent draws of (strict, relaxed)
  outcomes and the bound is exact (``relaxtune.certify.paired_bound``: Buehler's bound
  ordered by Tango's score, nominal coverage for every n and discordance).
- Repeats: each problem gives one mean difference ``d_j = (b_j - c_j) / n_j`` in
  [-1, 1] and the bound is the betting bound on their mean
  (``relaxtune.certify.cluster_bound``), valid for any spread of harm across problems.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["wilson_interval", "pass_at_k", "DropBound", "paired_counts", "check_counts", "drop_bound",
           "smallest_certifiable_drop"]


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


@dataclass(frozen=True)
class DropBound:
    """A bound on the accuracy drop ``acc(strict) - acc(relaxed)`` (accuracy units).

    Attributes:
        drop: the observed drop, the mean over problems of each problem's mean difference.
        lower, upper: one-sided ``confidence`` bounds (each alone holds at ``confidence``).
        confidence: one-sided confidence in (0, 1).
        n: paired samples; problems: problems they come from.
        strict_only, relaxed_only: discordant pairs (strict right and relaxed wrong, and the reverse).
        method: ``"exact-score"`` (one sample per problem) or ``"cluster-betting"`` (repeats).
    """

    drop: float
    lower: float
    upper: float
    confidence: float
    n: int
    problems: int
    strict_only: int
    relaxed_only: int
    method: str

    @property
    def discordance(self) -> float:
        """Share of pairs whose outcomes differ."""
        return (self.strict_only + self.relaxed_only) / self.n


Counts = tuple[tuple[int, int, int], ...]


def paired_counts(strict: Iterable[dict], relaxed: Iterable[dict]) -> list[tuple[int, int, int]]:
    """Per-problem paired counts ``(n_j, strict_only_j, relaxed_only_j)`` from
    per-sample records (``problem_id``, ``repeat``, ``correct``, ``failed``),
    pairing by (problem, repeat) and skipping pairs where either generation
    failed; problems in the order strict's records list them."""
    base = {(r["problem_id"], r["repeat"]): r for r in strict if not r.get("failed")}
    order = list(dict.fromkeys(pid for pid, _ in base))
    per: dict[str, list[int]] = {}
    for r in relaxed:
        key = (r["problem_id"], r["repeat"])
        if r.get("failed") or key not in base:
            continue
        s_ok, r_ok = bool(base[key].get("correct")), bool(r.get("correct"))
        row = per.setdefault(key[0], [0, 0, 0])
        row[0] += 1
        row[1] += s_ok and not r_ok
        row[2] += r_ok and not s_ok
    return [tuple(per[p]) for p in order if p in per]


def check_counts(counts: Iterable[Sequence[int]]) -> Counts:
    """Validate per-problem counts ``(n_j, strict_only_j, relaxed_only_j)``.

    Raises:
        ValueError: no problem, a non-integer count, ``n_j < 1``, a negative
            discordant count, or discordant counts above ``n_j`` (stored
            metrics edited or corrupted: re-run or re-export the trial).
    """
    out = []
    for j, row in enumerate(counts):
        if len(row) != 3 or any(isinstance(v, bool) or int(v) != v for v in row):
            raise ValueError(f"problem {j}: counts must be three integers (n, strict_only, relaxed_only), got {row!r}")
        n, b, c = (int(v) for v in row)
        if n < 1 or b < 0 or c < 0 or b + c > n:
            raise ValueError(f"problem {j}: paired counts n={n}, strict_only={b}, relaxed_only={c} are impossible "
                             "(need n >= 1 and 0 <= strict_only + relaxed_only <= n): the stored metrics are "
                             "corrupt; evaluate the point again")
        out.append((n, b, c))
    if not out:
        raise ValueError("no paired samples to bound (every generation failed?)")
    return tuple(out)


def drop_bound(counts: Iterable[Sequence[int]], confidence: float) -> DropBound:
    """The bound on a relaxed point's accuracy drop vs strict (module doc).

    Args:
        counts: per problem ``(n_j, strict_only_j, relaxed_only_j)`` in a
            data-independent order (``paired_counts``); ``n_j`` paired samples.
        confidence: one-sided confidence of each bound, in (0, 1).

    Returns:
        ``DropBound``: with every ``n_j = 1``, the exact bound on the pooled
        counts; otherwise the cluster bound over per-problem mean differences.

    Raises:
        ValueError: as ``check_counts``, or confidence outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return _drop_bound(check_counts(counts), float(confidence))


@functools.lru_cache(maxsize=2048)
def _drop_bound(counts: Counts, confidence: float) -> DropBound:
    from .cluster_bound import betting_upper
    from .paired_bound import exact_upper

    n, b, c = (sum(col) for col in zip(*counts))
    drop = sum((bj - cj) / nj for nj, bj, cj in counts) / len(counts)
    if all(nj == 1 for nj, _, _ in counts):
        upper, lower = exact_upper(n, b, c, confidence), -exact_upper(n, c, b, confidence)
        method = "exact-score"
    else:
        d = [(bj - cj) / nj for nj, bj, cj in counts]
        upper = 2.0 * betting_upper([(1.0 + x) / 2.0 for x in d], confidence) - 1.0
        lower = 1.0 - 2.0 * betting_upper([(1.0 - x) / 2.0 for x in d], confidence)
        method = "cluster-betting"
    return DropBound(drop, lower, upper, confidence, n, len(counts), b, c, method)


def smallest_certifiable_drop(problems: int, repeats: int, confidence: float) -> float:
    """The smallest epsilon a sample of ``problems`` x ``repeats`` can certify at
    ``confidence``: the upper bound when relaxed and strict agree on every sample.

    Raises:
        ValueError: problems or repeats < 1, confidence outside (0, 1).
    """
    if problems < 1 or repeats < 1:
        raise ValueError(f"need at least one problem and one repeat, got {problems} x {repeats}")
    return drop_bound([(repeats, 0, 0)] * problems, confidence).upper
