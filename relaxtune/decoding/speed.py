"""The speed model of relaxed speculative decoding, and cost profiles.

``S_relax = (L_AR / L_relax) * (l_accept + 1) / (1 + N * c_rel)``
(Xia, Ribar and Balanca, arXiv 2607.08690, 2026; ``docs/concepts/speed-model.md``,
"Speed model"). ``l_accept`` is the mean number of accepted drafts per round (the
"+1" is the residual or bonus token every round emits), ``L`` the mean response
length in tokens (strict has AR's expected length, so ``L_strict`` stands for
``L_AR``), ``c_rel`` the drafter's cost per token over the verifier's.

Measured costs (``measure_interleaved``) are timed in passes that run every
shape once, one after the other, so a disturbance from other work on the
machine hits all of them alike; passes repeat until every shape's spread (the
gap between its fastest and its median pass, relative to the fastest) is within
``SPREAD_TOLERANCE``, or ``MAX_PASSES`` have run. The spread is kept with the
profile, and a profile still noisy after the last pass says so in its ``flags``.
The model here is the paper's single-stream latency model; the speed at a serving batch
size is the same model priced with that batch size's costs (``relaxtune.decoding.serving``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field

__all__ = [
    "speedup",
    "CostProfile",
    "PAPER_C_REL",
    "modeled_speedup",
    "c_rel_of",
    "measure_interleaved",
    "noisy_flags",
    "SPREAD_TOLERANCE",
    "COST_MARGIN",
    "MIN_PASSES",
    "MAX_PASSES",
]

PAPER_C_REL = (0.05, 0.2, 0.5)  # the c_rel values the paper sweeps
SPREAD_TOLERANCE = 0.10  # a shape's (median - fastest) / fastest pass above this is noisy
COST_MARGIN = 0.25  # a profile whose cost ratios differ from the saved one's by more is flagged
MIN_PASSES, MAX_PASSES = 5, 15


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def speedup(
    l_accept: float,
    n_draft: int,
    c_rel: float,
    L_ar: float = 1.0,
    L_relax: float = 1.0,
) -> float:
    """Modeled speed-up over autoregressive decoding (dimensionless).

    Args:
        l_accept: mean accepted drafts per verification round, in ``[0, N]`` (tokens).
        n_draft: draft length N >= 1.
        c_rel: drafter cost per token / verifier cost per token, >= 0.
        L_ar: mean AR (or strict) response length in tokens, > 0.
        L_relax: mean response length of the relaxed method in tokens, > 0.

    Returns:
        ``(L_ar / L_relax) * (l_accept + 1) / (1 + n_draft * c_rel)``.

    Raises:
        ValueError: N < 1, l_accept outside [0, N], negative or non-finite c_rel,
            non-positive lengths.
    """
    if int(n_draft) != n_draft or n_draft < 1:
        raise ValueError(f"n_draft must be an integer >= 1, got {n_draft!r}")
    if not (0.0 <= float(l_accept) <= n_draft):
        raise ValueError(f"l_accept must lie in [0, N = {n_draft}], got {l_accept!r}")
    if not (float(c_rel) >= 0 and math.isfinite(c_rel)):
        raise ValueError(f"c_rel must be a finite number >= 0, got {c_rel!r}")
    ratio = _positive("L_ar", L_ar) / _positive("L_relax", L_relax)
    return ratio * (l_accept + 1.0) / (1.0 + n_draft * c_rel)


@dataclass(frozen=True)
class CostProfile:
    """Measured per-step costs of a drafter/verifier pair on one machine.

    Attributes:
        t_ar: verifier seconds per single-token decoding step (AR).
        t_draft: drafter seconds per single-token step.
        t_verify: optional measured verifier seconds for one pass over k tokens,
            keyed by k (a round with draft length N verifies k = N + 1 tokens).
        source: where the numbers come from (machine, batch size, date).
        batch_size: the serving batch size B the times are for: every time is one
            step of B rows together (a verify pass: B rows of k tokens each).
        spread: per timing ("t_ar", "t_draft", "t_verify[k]"), the relative gap
            between its fastest and its median pass (0.1 = 10 %).
        passes: interleaved passes the measurement took (0: not measured here).
        flags: warnings a reader of the numbers must see (a noisy measurement, a
            profile that differs from this machine's current costs).

    Raises:
        ValueError: non-positive or non-finite times.
    """

    t_ar: float
    t_draft: float
    t_verify: dict[int, float] = field(default_factory=dict)
    source: str = ""
    spread: dict[str, float] = field(default_factory=dict)
    passes: int = 0
    flags: list[str] = field(default_factory=list)
    batch_size: int = 1

    def __post_init__(self) -> None:
        if int(self.batch_size) != self.batch_size or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        _positive("t_ar", self.t_ar)
        _positive("t_draft", self.t_draft)
        for k, t in self.t_verify.items():
            if int(k) != k or k < 1:
                raise ValueError(f"t_verify keys are token counts >= 1, got {k!r}")
            _positive(f"t_verify[{k}]", t)

    def to_dict(self) -> dict:
        """Plain fields, for JSON and YAML (``from_dict`` reads them back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> CostProfile:
        """The inverse of ``to_dict`` (``t_verify`` keys may come back as strings;
        profiles saved before spreads were kept read back without them)."""
        return cls(
            raw["t_ar"],
            raw["t_draft"],
            {int(k): v for k, v in raw.get("t_verify", {}).items()},
            raw.get("source", ""),
            dict(raw.get("spread", {})),
            int(raw.get("passes", 0)),
            list(raw.get("flags", [])),
            int(raw.get("batch_size", 1)),
        )

    @property
    def ratios(self) -> dict[str, float]:
        """What the speed model reads: ``c_rel`` and ``t_verify[k] / t_ar`` per k."""
        return {"c_rel": self.c_rel} | {f"t_verify[{k}]/t_ar": t / self.t_ar for k, t in sorted(self.t_verify.items())}

    def difference(self, other: CostProfile) -> tuple[float, str]:
        """The largest relative difference between the two profiles' shared
        ``ratios`` (``|a - b| / b``, b from ``other``), and which ratio it is."""
        mine, theirs = self.ratios, other.ratios
        diffs = {k: abs(mine[k] - theirs[k]) / theirs[k] for k in mine.keys() & theirs.keys()}
        key = max(diffs, key=diffs.get)
        return diffs[key], key

    def summary(self) -> str:
        """One line: t_AR, t_draft, c_rel, verify costs and the worst spread."""
        worst = max(self.spread.values(), default=None)
        return (
            f"t_AR {self.t_ar * 1e3:.1f} ms, t_draft {self.t_draft * 1e3:.1f} ms, c_rel {self.c_rel:.3f}; "
            "verify(N+1) ms: "
            + ", ".join(f"{k}: {v * 1e3:.1f}" for k, v in sorted(self.t_verify.items()))
            + ("" if worst is None else f"; spread up to {worst:.0%} over {self.passes} interleaved passes")
        )

    @property
    def c_rel(self) -> float:
        """``t_draft / t_ar`` (dimensionless)."""
        return self.t_draft / self.t_ar

    def round_seconds(self, n_draft: int) -> float:
        """Seconds of one round: N drafter steps plus one verifier pass over N + 1
        tokens (the measured ``t_verify[N+1]``, else ``t_ar``, the GPU assumption
        that verifying a few tokens costs one step)."""
        return n_draft * self.t_draft + self.t_verify.get(n_draft + 1, self.t_ar)

    def speedup(self, l_accept: float, n_draft: int, L_ar: float = 1.0, L_relax: float = 1.0) -> float:
        """Speed-up from measured costs:
        ``(L_ar / L_relax) * (l_accept + 1) * t_ar / round_seconds(N)``. Without
        ``t_verify`` it equals ``speedup(l_accept, N, self.c_rel, L_ar, L_relax)``.

        Raises:
            ValueError: as ``relaxtune.decoding.speed.speedup``.
        """
        base = speedup(l_accept, n_draft, 0.0, L_ar, L_relax)
        return base * self.t_ar / self.round_seconds(n_draft)


def modeled_speedup(
    profile: CostProfile | float, l_accept: float, n_draft: int, L_ar: float = 1.0, L_relax: float = 1.0
) -> float:
    """``speedup`` with measured costs (a ``CostProfile``, or a
    ``relaxtune.decoding.serving.ServingProfile``: anything with ``speedup``) or a c_rel value."""
    if not isinstance(profile, int | float):
        return profile.speedup(l_accept, n_draft, L_ar, L_relax)
    return speedup(l_accept, n_draft, float(profile), L_ar, L_relax)


def c_rel_of(profile: CostProfile | float) -> float:
    """The c_rel of a measured profile (a serving profile's: at its declared batch
    size), or the value itself."""
    return float(profile) if isinstance(profile, int | float) else profile.c_rel


def measure_interleaved(
    jobs: dict[Hashable, Callable[[], object]],
    *,
    min_passes: int = MIN_PASSES,
    max_passes: int = MAX_PASSES,
    tolerance: float = SPREAD_TOLERANCE,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[Hashable, float], dict[Hashable, float], int]:
    """Time every job once per pass, in order, pass after pass, until each job's
    spread is within ``tolerance`` (after at least ``min_passes``) or
    ``max_passes`` have run. Each job is called once untimed first (the first
    call of a shape is slow).

    Args:
        jobs: what to time, by name (e.g. one forward pass of one shape).
        min_passes / max_passes: bounds on the passes.
        tolerance: the largest acceptable spread, as a fraction.
        clock: seconds (``time.perf_counter``; tests pass a scripted clock).

    Returns:
        ``(fastest, spread, passes)``: the fastest time per job (seconds; other
        work only ever adds time), its spread ``(median - fastest) / fastest``,
        and the passes run.

    Raises:
        ValueError: no jobs, or bounds with ``1 <= min_passes <= max_passes`` broken.
    """
    if not jobs or not 1 <= min_passes <= max_passes:
        raise ValueError(
            f"need jobs and 1 <= min_passes <= max_passes, got {len(jobs)} jobs, {min_passes}..{max_passes} passes"
        )
    for job in jobs.values():
        job()
    times: dict[Hashable, list[float]] = {name: [] for name in jobs}
    passes = 0
    while passes < max_passes:
        for name, job in jobs.items():
            t0 = clock()
            job()
            times[name].append(clock() - t0)
        passes += 1
        spread = {name: _spread(t) for name, t in times.items()}
        if passes >= min_passes and max(spread.values()) <= tolerance:
            break
    return {name: min(t) for name, t in times.items()}, spread, passes


def noisy_flags(spread: dict[str, float], passes: int, advice: str) -> list[str]:
    """The flag a measurement carries when some timing's spread stays above
    ``SPREAD_TOLERANCE`` after ``passes`` interleaved passes (none when every one is
    within), ending with ``advice`` (what the reader should do)."""
    noisy = {k: v for k, v in spread.items() if v > SPREAD_TOLERANCE}
    if not noisy:
        return []
    shown = ", ".join(f"{k} {v:.0%}" for k, v in noisy.items())
    return [
        f"noisy measurement: spread {shown} after {passes} interleaved passes (tolerance {SPREAD_TOLERANCE:.0%})"
        f"{advice}"
    ]


def _spread(times: list[float]) -> float:
    """``(median - fastest) / fastest`` (the lower median for an even count)."""
    ordered = sorted(times)
    fastest, median = ordered[0], ordered[(len(ordered) - 1) // 2]
    return (median - fastest) / fastest if fastest > 0 else math.inf
