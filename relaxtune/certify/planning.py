"""Sample-size planning for the exported drop bound: what a sample can certify, and the
problems x repeats at which a confirmation certifies a target with a stated power.

The exported bound is a confirmation's (``relaxtune.tune.confirm``): at the job's
confidence split over its T planned confirmations (``split_confidence``), on the
held-out half of the problems (``--confirm holdout``, the default) or on all of them
(``--confirm seeds``). Every number here is at that confidence and on that sample.

- Smallest certifiable drop: the bound when relaxed and strict agree on every sample,
  ``1 - (1 - c)^(1/K)`` for K problems up to about 200 at 0.9, whatever the repeats
  (``relaxtune.certify.stats.smallest_certifiable_drop``).
- Power, exact: the bound (``relaxtune.certify.stats.drop_bound``) is the exact one-sample
  bound on each problem's outcome (its first repeat when it has several). A point with
  true drop D and discordance delta (strict-only with probability ``(delta + D) / 2``,
  relaxed-only with ``(delta - D) / 2``) certifies epsilon exactly when the outcome's
  Tango bound is at most the largest one whose exact tail probability at epsilon stays
  within ``1 - c`` (``relaxtune.certify.paired_bound``: the test the bound inverts), so
  ``P(certify) = sum_m Bin(m; K, delta) P(Bin(m, theta) <= t[m])`` is a finite sum, no
  simulation. Repeats change neither the power nor the floor, whether the loss spreads
  over problems or concentrates in a few.
- Problems needed: the fewest K (x R) whose power reaches the target (``problems_needed``),
  searched upward from the fewest problems a perfect sample needs. Power is not strictly
  monotone in K (the bound is discrete), so a few K above the answer may fall a hair short.
  Above ``MAX_EXACT`` problems the normal approximation
  ``K = (z_c + z_power)^2 (delta' - D^2) / (epsilon - D)^2`` (Connor 1987, Biometrics
  43:207) is returned and flagged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .inputs import check_confidence, check_count, check_finite, check_probability
from .paired_bound import exact_pvalue
from .stats import smallest_certifiable_drop

__all__ = [
    "SamplePlan",
    "plan",
    "problems_needed",
    "fewest_problems",
    "certified_power",
    "sample_power",
    "split_confidence",
    "planning_discordance",
    "DEFAULT_DISCORDANCE",
    "MAX_EXACT",
]

DEFAULT_DISCORDANCE = 0.1  # typical of common random numbers: about 10 discordant pairs per 100 problems
MAX_EXACT = 4000  # problems beyond which the need is the normal approximation
_COARSE = 32  # discordance grid of the search for the certified outcomes (the full grid checks the result)


def planning_discordance(discordant: float, pairs: int, confidence: float) -> float:
    """The discordance a plan assumes after ``discordant`` of ``pairs`` paired samples
    disagreed (a mean over repeats may be fractional): the one-sided Clopper-Pearson
    upper bound at ``confidence`` (Clopper and Pearson 1934, Biometrika 26:404),
    ``DEFAULT_DISCORDANCE`` without pairs. An upper bound, so that a few agreeing pairs
    never promise a small sample: 0 of 16 plans for 0.134 at 0.9, not for the 0
    observed (which needs a fraction of the problems).

    Raises:
        ValueError: ``pairs`` not an integer >= 0, ``discordant`` outside [0, pairs],
            confidence outside (0, 1).
    """
    from scipy.stats import beta

    pairs, discordant = check_count("pairs", pairs, 0), check_finite(discordant, "discordant")
    if not 0 <= discordant <= pairs:
        raise ValueError(f"discordant pairs must lie in [0, pairs = {pairs}], got {discordant}")
    confidence = check_confidence(confidence)
    if pairs == 0:
        return DEFAULT_DISCORDANCE
    if discordant == pairs:
        return 1.0
    return float(beta.ppf(confidence, discordant + 1, pairs - discordant))


def split_confidence(confidence: float, planned: int) -> float:
    """One-sided confidence of each of ``planned`` confirmations: ``1 - (1 - c) / planned``
    (Bonferroni; one when ``planned`` < 1).

    Raises:
        ValueError: confidence outside (0, 1), planned not an integer.
    """
    check_confidence(confidence)
    return 1.0 - (1.0 - confidence) / max(check_count("planned", planned), 1)


def _check_target(epsilon, confidence, true_drop, discordance) -> tuple[float, float, float, float]:
    epsilon = check_probability(epsilon, "epsilon")
    true_drop = check_finite(true_drop, "true_drop")
    discordance = check_probability(discordance, "discordance")
    if not abs(true_drop) <= discordance:
        raise ValueError(f"discordance must lie in [|true drop| = {abs(true_drop):g}, 1], got {discordance}")
    return epsilon, check_confidence(confidence), true_drop, discordance


@functools.lru_cache(maxsize=512)
def _certified(problems: int, epsilon: float, confidence: float) -> np.ndarray:
    """``t[m]``, m = 0..problems: a confirmation of ``problems`` outcomes with m discordant
    ones certifies ``epsilon`` at ``confidence`` exactly when at most ``t[m]`` are
    strict-only (-1: none). The largest Tango bound u whose tail at epsilon has
    probability at most 1 - c, found by bisection (coarse grid first, then checked on
    the bound's own supremum); outcomes ranked at or below u are the certified ones."""
    from scipy import stats

    from .paired_bound import _grid, _sup, _tail, _thresholds

    z, alpha = stats.norm.ppf(confidence), 1.0 - confidence
    coarse = _grid(epsilon)[:: len(_grid(epsilon)) // _COARSE]
    thresholds = functools.lru_cache(maxsize=None)(lambda u: _thresholds(problems, u, z))

    def search(lo: float, hi: float, ok) -> float:  # lo passes, hi fails; the certified set is the lo side's
        while hi - lo > 1e-7 and not np.array_equal(thresholds(lo), thresholds(hi)):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ok(thresholds(mid)) else (lo, mid)
        return lo

    rough = lambda t: float(_tail(problems, t, epsilon, coarse).max()) <= alpha  # noqa: E731 - optimistic
    near = max(epsilon - 0.25, -1.0)  # the boundary lies just below epsilon (Tango's bound is nearly exact)
    hi = min(epsilon + 0.02, 1.0)
    lo = search(near if rough(thresholds(near)) else -1.0, hi if not rough(thresholds(hi)) else 1.0, rough)
    if _sup(problems, thresholds(lo), epsilon) > alpha:  # the coarse grid missed the peak: search on the full one
        lo = search(-1.0, lo, lambda t: rough(t) and _sup(problems, t, epsilon) <= alpha)
    return thresholds(lo)


def certified_power(problems: int, epsilon: float, confidence: float, true_drop: float, discordance: float) -> float:
    """Exact probability that the bound at ``confidence`` from ``problems`` independent
    paired outcomes (strict-only with probability ``(discordance + true_drop) / 2``,
    relaxed-only with ``(discordance - true_drop) / 2``) is at most ``epsilon`` (module doc).

    Raises:
        ValueError: problems not an integer >= 1, epsilon outside [0, 1], confidence
            outside (0, 1), discordance outside [|true_drop|, 1], a NaN or infinite input.
    """
    from .paired_bound import _tail

    problems = check_count("problems", problems, 1)
    epsilon, confidence, true_drop, discordance = _check_target(epsilon, confidence, true_drop, discordance)
    if discordance == 0.0:  # every outcome concordant: certified iff a perfect sample is
        return float(smallest_certifiable_drop(problems, 1, confidence) <= epsilon)
    return float(_tail(problems, _certified(problems, epsilon, confidence), true_drop, [discordance])[0])


def sample_power(
    problems: int, repeats: int, epsilon: float, confidence: float, true_drop: float, discordance: float
) -> float:
    """Exact probability that a sample of ``problems`` x ``repeats`` certifies ``epsilon``
    at ``confidence`` for a point with ``true_drop`` and ``discordance`` (per sample): the
    bound reads each problem's first repeat, so this is ``certified_power`` of ``problems``.

    Raises:
        ValueError: as ``certified_power``, repeats not an integer >= 1.
    """
    check_count("repeats", repeats, 1)
    return certified_power(problems, epsilon, confidence, true_drop, discordance)


def fewest_problems(epsilon: float, confidence: float, repeats: int = 1) -> int:
    """The fewest problems (x ``repeats``) whose smallest certifiable drop is at
    most ``epsilon`` at ``confidence``: never fewer than ``ln(1 - c) / ln(1 - epsilon)``,
    then found by doubling and bisection (the exact bound of a perfect sample is
    not strictly monotone in n, so a smaller n may occasionally fit too). A size
    fits when the exact test the bound inverts rejects a drop of ``epsilon`` for a
    perfect sample (``exact_pvalue(K, 0, 0, epsilon, c) <= 1 - c``, which holds exactly
    when ``exact_upper(K, 0, 0, c) <= epsilon``: one tail supremum instead of the
    bound's root search).

    Raises:
        ValueError: epsilon outside (0, 1], confidence outside (0, 1), repeats not an integer >= 1.
    """
    epsilon = check_finite(epsilon, "epsilon")
    if not 0.0 < epsilon <= 1.0:
        raise ValueError(f"epsilon must be in (0, 1], got {epsilon!r}")
    check_confidence(confidence)
    check_count("repeats", repeats, 1)
    return _fewest(float(epsilon), float(confidence))


@functools.lru_cache(maxsize=256)
def _fewest(epsilon: float, confidence: float) -> int:
    """``fewest_problems`` of valid inputs (a job asks it in its checks, then in its plan)."""
    fits = lambda k: exact_pvalue(k, 0, 0, epsilon, confidence) <= 1.0 - confidence  # noqa: E731
    lo = math.ceil(math.log(1.0 - confidence) / math.log1p(-epsilon) - 1e-9) - 1 if epsilon < 1 else 0
    step = 1
    while not fits(lo + step):  # lo never fits: below it even a perfect sample falls short
        lo, step = lo + step, 2 * step
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return max(hi, 1)


def _normal_need(epsilon, confidence, power_, true_drop, delta) -> int:
    from scipy import stats

    z = stats.norm.ppf(confidence) + stats.norm.ppf(power_)
    return math.ceil(z * z * max(delta - true_drop**2, 1e-12) / (epsilon - true_drop) ** 2 - 1e-9)


def problems_needed(
    epsilon: float, confidence: float, discordance: float, true_drop: float = 0.0, power: float = 0.8, repeats: int = 1
) -> int | None:
    """The fewest problems (x any ``repeats``) whose bound at ``confidence`` certifies
    ``epsilon`` with probability at least ``power`` (exact, ``sample_power``), for a point with
    ``true_drop`` and ``discordance``; None when ``true_drop >= epsilon`` (such a point
    must not be certified). Beyond ``MAX_EXACT`` problems: the normal approximation.

    Raises:
        ValueError: discordance outside [|true_drop|, 1], power or confidence outside
            (0, 1), epsilon outside [0, 1], a NaN or infinite input.
    """
    epsilon, confidence, true_drop, discordance = _check_target(epsilon, confidence, true_drop, discordance)
    target = check_confidence(power, "power")
    if true_drop >= epsilon:
        return None
    check_count("repeats", repeats, 1)  # the bound reads each problem's first repeat: repeats do not change the need
    return _needed(epsilon, confidence, true_drop, discordance, target)


@functools.lru_cache(maxsize=1024)
def _needed(epsilon: float, confidence: float, true_drop: float, delta: float, target: float) -> int:
    """``problems_needed`` at discordance ``delta``: the normal approximation,
    corrected once on the probit scale by the exact power there, then a bracket around
    it and bisection (each step one exact power)."""
    from scipy import stats

    at = lambda k: certified_power(k, epsilon, confidence, true_drop, delta)  # noqa: E731
    floor = fewest_problems(epsilon, confidence) if epsilon > 0 else 1  # below a perfect sample's need, power is 0
    guess = max(_normal_need(epsilon, confidence, target, true_drop, delta), floor)
    if guess > MAX_EXACT:
        return guess
    z_c, z_t = stats.norm.ppf(confidence), stats.norm.ppf(target)
    z_now = stats.norm.ppf(min(max(at(guess), 1e-6), 1 - 1e-6))  # the power grows about as sqrt(K) on this scale
    if z_c + z_now > 0.1:
        guess = max(min(round(guess * ((z_c + z_t) / (z_c + z_now)) ** 2), MAX_EXACT), floor)
    lo, hi, step = floor - 1, guess, max(guess // 32, 1)
    if at(guess) >= target:
        while hi - step > lo and at(hi - step) >= target:
            hi, step = hi - step, 2 * step
        lo = max(hi - step, lo)
    else:
        lo = guess
        while (hi := min(lo + step, MAX_EXACT + 1)) <= MAX_EXACT and at(hi) < target:
            lo, step = hi, 2 * step
        if hi > MAX_EXACT:
            return max(_normal_need(epsilon, confidence, target, true_drop, delta), MAX_EXACT + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(mid) >= target else (mid, hi)
    return hi


@dataclass(frozen=True)
class SamplePlan:
    """What a job's sample can certify, and what ``epsilon`` needs, for the exported bound.

    Attributes:
        problems, repeats: the job's sample (``--limit``, the task's repeats).
        epsilon, confidence: the target; ``confidence`` is the job's.
        planned: confirmations the job plans (T); confidence_each: each one's (``split_confidence``).
        holdout: confirmations run on the held-out half (else on every problem, with fresh seeds).
        confirm_problems: problems a confirmation runs on.
        smallest_certifiable: the smallest drop a confirmation can certify at ``confidence_each``.
        search_smallest_certifiable: the same for the search (its problems, at ``confidence``).
        discordance, true_drop, power: the point planned for (``discordance`` per sample).
        power_now: the exact chance a confirmation of this sample certifies epsilon for it
            (loss spread evenly).
        needed: the job's problems (``--limit``, x repeats) at which a confirmation certifies
            epsilon with probability ``power`` (None: true_drop >= epsilon).
        power_needed: the exact power at ``needed``.
    """

    problems: int
    repeats: int
    epsilon: float
    confidence: float
    planned: int
    confidence_each: float
    holdout: bool
    confirm_problems: int
    smallest_certifiable: float
    search_smallest_certifiable: float
    discordance: float
    true_drop: float
    power: float
    power_now: float
    needed: int | None
    power_needed: float | None

    def assumptions(self) -> str:
        """What the numbers assume, in words."""
        where = (
            "the held-out half of the problems (--confirm holdout)"
            if self.holdout
            else "every problem with fresh seeds (--confirm seeds: a promise about these problems, not new ones)"
        )
        return (
            f"the exported bound is a confirmation's: on {where}, at {self.confidence_each:.4g} one-sided "
            f"({self.confidence:g} split over {self.planned} planned confirmation(s)); the point planned for has "
            f"true drop {self.true_drop:g} and discordance {self.discordance:g} per sample, problems independent "
            "draws from the task's population; power is exact (the bound's own test summed over every outcome)"
        )

    def line(self) -> str:
        """One line for a summary."""
        head = (
            f"with {self.problems} problems x {self.repeats} a confirmation ({self.confirm_problems} problems, "
            f"{self.confidence_each:.1%} one-sided) certifies no drop below {self.smallest_certifiable:.3f}"
        )
        if self.needed is None:
            return (
                f"{head}; a point whose true drop is {self.true_drop:g} >= epsilon {self.epsilon:g} cannot be certified"
            )
        return (
            f"{head}; {self.needed} problems x {self.repeats} (--limit) would certify {self.epsilon:g} "
            f"{self.power:.0%} of the time for a point with true drop {self.true_drop:g} and discordance "
            f"{self.discordance:.2f} (this sample: {self.power_now:.0%})"
        )


def plan(
    problems: int,
    repeats: int,
    epsilon: float,
    confidence: float,
    discordance: float = DEFAULT_DISCORDANCE,
    true_drop: float = 0.0,
    power: float = 0.8,
    planned: int = 1,
    holdout: bool = True,
) -> SamplePlan:
    """``SamplePlan`` for a job's sample and target (module doc): a confirmation runs on
    ``problems // 2`` held-out problems (``holdout``) or on all ``problems``, at
    ``split_confidence(confidence, planned)``; ``needed`` counts the job's problems.

    Raises:
        ValueError: as ``problems_needed``, ``certified_power`` and ``split_confidence``.
    """
    problems, repeats = check_count("problems", problems, 1), check_count("repeats", repeats, 1)
    each = split_confidence(confidence, planned)
    confirm_problems = problems // 2 if holdout else problems
    search_problems = problems - confirm_problems if holdout else problems
    k = problems_needed(epsilon, each, discordance, true_drop, power, repeats)
    needed = None if k is None else (2 if holdout else 1) * k
    at_need = None if k is None else certified_power(k, epsilon, each, true_drop, discordance)
    now = 0.0
    if confirm_problems >= 1 and true_drop < epsilon:
        now = sample_power(confirm_problems, repeats, epsilon, each, true_drop, discordance)
    floor = smallest_certifiable_drop(confirm_problems, repeats, each) if confirm_problems >= 1 else 1.0
    search_floor = smallest_certifiable_drop(max(search_problems, 1), repeats, confidence)
    return SamplePlan(
        problems,
        repeats,
        float(epsilon),
        float(confidence),
        max(planned, 1),
        each,
        holdout,
        confirm_problems,
        floor,
        search_floor,
        float(discordance),
        float(true_drop),
        float(power),
        now,
        needed,
        at_need,
    )
