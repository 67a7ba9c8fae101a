"""The speed model of relaxed speculative decoding, and cost profiles.

``S_relax = (L_AR / L_relax) * (l_accept + 1) / (1 + N * c_rel)``
(Xia, Ribar and Balanca, arXiv 2607.08690, 2026; ``shared/docs/relaxed-methods.md``,
"Speed model"). ``l_accept`` is the mean number of accepted drafts per round (the
"+1" is the residual or bonus token every round emits), ``L`` the mean response
length in tokens (strict has AR's expected length, so ``L_strict`` stands for
``L_AR``), ``c_rel`` the drafter's cost per token over the verifier's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

__all__ = ["speedup", "CostProfile", "PAPER_C_REL", "modeled_speedup", "c_rel_of"]

PAPER_C_REL = (0.05, 0.2, 0.5)  # the c_rel values the paper sweeps


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

    Raises:
        ValueError: non-positive or non-finite times.
    """

    t_ar: float
    t_draft: float
    t_verify: dict[int, float] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
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
    def from_dict(cls, raw: dict) -> "CostProfile":
        """The inverse of ``to_dict`` (``t_verify`` keys may come back as strings)."""
        return cls(raw["t_ar"], raw["t_draft"], {int(k): v for k, v in raw.get("t_verify", {}).items()},
                   raw.get("source", ""))

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
            ValueError: as ``relaxtune.speed.speedup``.
        """
        base = speedup(l_accept, n_draft, 0.0, L_ar, L_relax)
        return base * self.t_ar / self.round_seconds(n_draft)


def modeled_speedup(profile: CostProfile | float, l_accept: float, n_draft: int, L_ar: float = 1.0,
                    L_relax: float = 1.0) -> float:
    """``speedup`` with a measured ``CostProfile`` (its round costs) or a c_rel value."""
    if isinstance(profile, CostProfile):
        return profile.speedup(l_accept, n_draft, L_ar, L_relax)
    return speedup(l_accept, n_draft, float(profile), L_ar, L_relax)


def c_rel_of(profile: CostProfile | float) -> float:
    """The c_rel of a measured profile, or the value itself."""
    return profile.c_rel if isinstance(profile, CostProfile) else float(profile)
