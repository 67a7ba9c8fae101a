"""Confidence intervals, pass@k, and the bound on a relaxed point's accuracy drop vs strict.

The drop bound (``drop_bound``) is the product's promise: "accuracy drop vs
strict <= epsilon with confidence c". Its population is problems like the
task's: the problems are a sample from such problems, and a problem's repeats
are samples of its own success rates, so the bound clusters by problem.

- One sample per problem: the pairs are independent draws of (strict, relaxed)
  outcomes and the bound is exact (``relaxtune.certify.paired_bound``: Buehler's bound
  ordered by Tango's score, nominal coverage for every n and discordance).
- Repeats: each problem's first paired repeat (the lowest repeat index) is one
  draw of the problem's paired outcome, whatever the other repeats show, so the
  first repeats of the problems are independent draws of a paired outcome whose
  drop is the true drop, and the exact bound above on them covers it at nominal
  for any spread of harm across problems and repeats (``"exact-first-repeat"``).
  Repeats never loosen the bound: it is the bound of the same problems with one
  sample each (floor ``1 - (1 - c)^(1/K)`` for K problems, which no valid bound
  beats). They do not tighten it either: a bound that nets a problem's
  strict-only and relaxed-only repeats needs randomness of its own (rounding each
  problem's mean difference to one outcome at random), and with a fixed seed its
  coverage holds only averaged over seeds, not for the sample at hand; the
  betting bound over per-problem means (``relaxtune.certify.cluster_bound``) is
  valid but its floor is higher (0.0859 against 0.0739 for 30 problems at 0.9).
  Stored counts without the first repeat (metrics written before this rule)
  are bounded by that betting bound (``"cluster-betting"``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .inputs import check_confidence, check_count

__all__ = [
    "wilson_interval",
    "pass_at_k",
    "DropBound",
    "paired_counts",
    "check_counts",
    "drop_bound",
    "smallest_certifiable_drop",
]


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k / n`` (``(0, 1)`` when n = 0).

    Raises:
        ValueError: k outside [0, n] or confidence outside (0, 1).
    """
    from scipy import stats

    check_confidence(confidence)
    k, n = check_count("k", k), check_count("n", n)
    if n == 0:
        return 0.0, 1.0
    if not k <= n:
        raise ValueError(f"k = {k} outside [0, n = {n}]")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, eq. 1):
    ``1 - C(n - c, k) / C(n, k)``.

    Raises:
        ValueError: k outside [1, n] or c outside [0, n], a count that is not an integer.
    """
    n, c, k = check_count("n", n), check_count("c", c), check_count("k", k)
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
        strict_only, relaxed_only: discordant samples, summed over problems and repeats.
        method: ``"exact-score"`` (one sample per problem), ``"exact-first-repeat"``
            (repeats: the exact bound on each problem's first repeat) or ``"cluster-betting"``
            (repeats stored without their first repeat).
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


Counts = tuple[tuple[int, ...], ...]


def paired_counts(strict: Iterable[dict], relaxed: Iterable[dict]) -> list[tuple[int, int, int, int]]:
    """Per-problem paired counts ``(n_j, strict_only_j, relaxed_only_j, first_j)`` from
    per-sample records (``problem_id``, ``repeat``, ``correct``, ``failed``),
    pairing by (problem, repeat) and skipping pairs where either generation
    failed; problems in the order strict's records list them. ``first_j`` is the
    outcome of the problem's paired repeat with the lowest index: 1 strict-only,
    -1 relaxed-only, 0 concordant."""
    base = {(r["problem_id"], r["repeat"]): r for r in strict if not r.get("failed")}
    order = list(dict.fromkeys(pid for pid, _ in base))
    per: dict[str, list[int]] = {}
    first: dict[str, tuple[int, int]] = {}  # problem -> (repeat, outcome) of its lowest paired repeat
    for r in relaxed:
        key = (r["problem_id"], r["repeat"])
        if r.get("failed") or key not in base:
            continue
        s_ok, r_ok = bool(base[key].get("correct")), bool(r.get("correct"))
        row = per.setdefault(key[0], [0, 0, 0])
        row[0] += 1
        row[1] += s_ok and not r_ok
        row[2] += r_ok and not s_ok
        if key[0] not in first or key[1] < first[key[0]][0]:
            first[key[0]] = (key[1], int(s_ok and not r_ok) - int(r_ok and not s_ok))
    return [(*per[p], first[p][1]) for p in order if p in per]


def check_counts(counts: Iterable[Sequence[int]]) -> Counts:
    """Validate per-problem counts ``(n_j, strict_only_j, relaxed_only_j[, first_j])``
    (``first_j``: the outcome of the first paired repeat, 1, -1 or 0, consistent with the counts).

    Raises:
        ValueError: no problem, a count that is not a finite integer (naming the problem
            and the count: ``"problem 3: strict_only must be an integer >= 0, got nan"``), ``n_j < 1``, a negative
            discordant count, or discordant counts above ``n_j`` (stored
            metrics edited or corrupted: re-run or re-export the trial).
    """
    out = []
    for j, row in enumerate(counts):
        if len(row) not in (3, 4):
            raise ValueError(
                f"problem {j}: counts must be three integers (n, strict_only, relaxed_only) and "
                f"optionally the first repeat's outcome, got {row!r}"
            )
        n, b, c = (check_count(f"problem {j}: {name}", v) for name, v in zip(("n", "strict_only", "relaxed_only"), row))
        if len(row) == 4:
            f = check_count(f"problem {j}: first", row[3] + 1) - 1  # -1, 0 or 1
            if f > 1 or (f == 1 and b < 1) or (f == -1 and c < 1) or (f == 0 and b + c == n):
                raise ValueError(
                    f"problem {j}: the first repeat's outcome {f} does not fit n={n}, strict_only={b}, "
                    f"relaxed_only={c}: the stored metrics are corrupt; evaluate the point again"
                )
        if n < 1 or b + c > n:
            raise ValueError(
                f"problem {j}: paired counts n={n}, strict_only={b}, relaxed_only={c} are impossible "
                "(need n >= 1 and 0 <= strict_only + relaxed_only <= n): the stored metrics are "
                "corrupt; evaluate the point again"
            )
        out.append((n, b, c) if len(row) == 3 else (n, b, c, f))
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
        counts; otherwise the exact bound on each problem's first repeat, or,
        for counts without it, the betting bound over per-problem means (module doc).

    Raises:
        ValueError: as ``check_counts``, or confidence outside (0, 1).
    """
    return _drop_bound(check_counts(counts), check_confidence(confidence))


@functools.lru_cache(maxsize=2048)
def _drop_bound(counts: Counts, confidence: float) -> DropBound:
    from .cluster_bound import betting_upper
    from .paired_bound import exact_upper

    n, b, c = (sum(row[i] for row in counts) for i in range(3))
    k = len(counts)
    drop = sum((row[1] - row[2]) / row[0] for row in counts) / k
    if all(row[0] == 1 for row in counts):
        upper, lower, method = exact_upper(n, b, c, confidence), -exact_upper(n, c, b, confidence), "exact-score"
    elif all(len(row) == 4 for row in counts):
        fb, fc = sum(row[3] == 1 for row in counts), sum(row[3] == -1 for row in counts)
        upper, lower, method = (
            exact_upper(k, fb, fc, confidence),
            -exact_upper(k, fc, fb, confidence),
            "exact-first-repeat",
        )
    else:  # stored before the first repeat was kept
        d = [(row[1] - row[2]) / row[0] for row in counts]
        upper = 2.0 * betting_upper([(1.0 + x) / 2.0 for x in d], confidence) - 1.0
        lower = 1.0 - 2.0 * betting_upper([(1.0 - x) / 2.0 for x in d], confidence)
        method = "cluster-betting"
    return DropBound(drop, lower, upper, confidence, n, k, b, c, method)


def smallest_certifiable_drop(problems: int, repeats: int, confidence: float) -> float:
    """The smallest epsilon a sample of ``problems`` x ``repeats`` can certify at
    ``confidence``: the upper bound when relaxed and strict agree on every sample,
    ``1 - (1 - confidence)^(1 / problems)`` up to about 200 problems at 0.9 and the
    same for every number of repeats (no valid bound does better: a point that
    loses every repeat of a share D of the problems shows no discordant sample with
    probability ``(1 - D)^problems``).

    Raises:
        ValueError: problems or repeats not an integer >= 1, confidence outside (0, 1).
    """
    problems, repeats = check_count("problems", problems, 1), check_count("repeats", repeats, 1)
    return drop_bound([(repeats, 0, 0, 0)] * problems, confidence).upper
