"""Sample-size planning for the drop bound: what a sample can certify, and what
a target needs.

- Smallest certifiable drop: the bound of ``relaxtune.certify.stats`` when relaxed and
  strict agree on every sample (no sample can do better). With one sample per
  problem it is at least ``1 - (1 - c)^(1/n)``, as a point with drop D and no
  relaxed-only pair shows no discordant pair with probability ``(1 - D)^n``,
  and equal to it up to about 200 problems at c = 0.9.
- Problems needed to certify epsilon at confidence c with probability ``power``
  for a point with true drop D and discordance delta (normal approximation to
  the bound, one-sided, after Connor 1987, Biometrics 43:207):

      K = (z_c + z_power)^2 V / (epsilon - D)^2,   V = (delta - D^2) / R

  per problem with R repeats when the loss spreads evenly over problems, and
  ``V = delta - D^2`` (repeats add nothing) when it concentrates in a few; K is
  at least the number of problems whose smallest certifiable drop is epsilon.
  The exact bounds are somewhat wider than the approximation at small K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .stats import smallest_certifiable_drop

__all__ = ["SamplePlan", "plan", "problems_needed", "fewest_problems"]

DEFAULT_DISCORDANCE = 0.1  # typical of common random numbers: about 10 discordant pairs per 100 problems


def fewest_problems(epsilon: float, confidence: float, repeats: int = 1) -> int:
    """The fewest problems (x ``repeats``) whose smallest certifiable drop is at
    most ``epsilon`` at ``confidence``: never fewer than ``ln(1 - c) / ln(1 - epsilon)``,
    then found by doubling and bisection (the exact bound of a perfect sample is
    not strictly monotone in n, so a smaller n may occasionally fit too).

    Raises:
        ValueError: epsilon outside (0, 1], confidence outside (0, 1).
    """
    if not 0.0 < epsilon <= 1.0:
        raise ValueError(f"epsilon must be in (0, 1], got {epsilon}")
    fits = lambda k: smallest_certifiable_drop(k, repeats, confidence) <= epsilon  # noqa: E731
    lo = math.ceil(math.log(1.0 - confidence) / math.log1p(-epsilon) - 1e-9) - 1 if epsilon < 1 else 0
    step = 1
    while not fits(lo + step):  # lo never fits: below it even a perfect sample falls short
        lo, step = lo + step, 2 * step
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return max(hi, 1)


def problems_needed(epsilon: float, confidence: float, discordance: float, true_drop: float = 0.0,
                    power: float = 0.8, repeats: int = 1, concentrated: bool = False) -> int | None:
    """Problems (x ``repeats``) needed to certify ``epsilon`` at ``confidence``
    with probability ``power`` (module doc), or None when ``true_drop >= epsilon``
    (such a point must not be certified).

    Raises:
        ValueError: discordance outside [|true_drop|, 1], power or confidence outside (0, 1).
    """
    from scipy import stats

    if not abs(true_drop) <= discordance <= 1.0:
        raise ValueError(f"discordance must lie in [|true drop| = {abs(true_drop):g}, 1], got {discordance}")
    if not (0.0 < power < 1.0 and 0.0 < confidence < 1.0):
        raise ValueError(f"power and confidence must be in (0, 1), got {power}, {confidence}")
    if true_drop >= epsilon:
        return None
    var = (discordance - true_drop ** 2) / (1 if concentrated else repeats)
    k = math.ceil((stats.norm.ppf(confidence) + stats.norm.ppf(power)) ** 2 * var / (epsilon - true_drop) ** 2 - 1e-9)
    return max(k, fewest_problems(epsilon, confidence, repeats))


@dataclass(frozen=True)
class SamplePlan:
    """What a sample of ``problems`` x ``repeats`` can certify, and what ``epsilon`` needs.

    Attributes:
        smallest_certifiable: the smallest drop this sample can certify at ``confidence``.
        needed: problems (x repeats) to certify epsilon with probability ``power`` for a
            point with ``true_drop`` and ``discordance``, loss spread evenly (None: impossible).
        needed_concentrated: the same when the loss concentrates in a few problems
            (only with repeats; equals ``needed`` otherwise).
    """

    problems: int
    repeats: int
    epsilon: float
    confidence: float
    smallest_certifiable: float
    discordance: float
    true_drop: float
    power: float
    needed: int | None
    needed_concentrated: int | None

    def line(self) -> str:
        """One line for a summary."""
        head = (f"with {self.problems} problems x {self.repeats} the smallest certifiable drop is "
                f"{self.smallest_certifiable:.3f} ({self.confidence:.0%} one-sided)")
        if self.needed is None:
            return (f"{head}; a point whose true drop is {self.true_drop:g} >= epsilon {self.epsilon:g} cannot be "
                    "certified")
        spread = ("" if self.repeats == 1 or self.needed_concentrated == self.needed else
                  f" if the loss spreads evenly over problems ({self.needed_concentrated} if it concentrates in a few)")
        return (f"{head}; about {self.needed} problems x {self.repeats} would certify {self.epsilon:g}{spread} for a "
                f"point with true drop {self.true_drop:g} and discordance {self.discordance:.2f} "
                f"({self.power:.0%} of the time)")


def plan(problems: int, repeats: int, epsilon: float, confidence: float, discordance: float = DEFAULT_DISCORDANCE,
         true_drop: float = 0.0, power: float = 0.8) -> SamplePlan:
    """``SamplePlan`` for a sample and a target (module doc for the formulas).

    Raises:
        ValueError: as ``problems_needed`` and ``smallest_certifiable_drop``.
    """
    kw = dict(true_drop=true_drop, power=power, repeats=repeats)
    needed = problems_needed(epsilon, confidence, discordance, **kw)
    concentrated = problems_needed(epsilon, confidence, discordance, concentrated=True, **kw)
    return SamplePlan(problems, repeats, epsilon, confidence, smallest_certifiable_drop(problems, repeats, confidence),
                      discordance, true_drop, power, needed, concentrated)
