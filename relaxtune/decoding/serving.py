"""The speed a deployment sees at its serving batch size: cost profiles at several batch
sizes, the modeled speed-up of a point at each, and where speculation stops paying.

At a serving batch size B every row advances together, so one step costs the time of
one batched forward: ``t_ar(B)`` for a batched AR step, ``t_draft(B)`` for a batched
drafter step, ``t_verify[N+1](B)`` for a batched verify pass over N + 1 tokens of each
row. A row emits ``l_accept + 1`` tokens per round of ``N t_draft(B) + t_verify[N+1](B)``
seconds, against one token per ``t_ar(B)`` for batched AR at the same B, so the
speed-up against batched AR is the paper's model priced with B's costs
(``CostProfile.speedup``, length correction ``L_AR / L_relax`` included; Xia, Ribar and
Balanca, arXiv 2607.08690, "Speed model"; ``docs/concepts/speed-model.md``). On a
GPU, batched AR is memory bound at small B and the N + 1 extra tokens of verification
are nearly free; as B grows the forward turns compute bound, verification costs close
to N + 1 steps, and the speed-up falls below 1 (SGLang's AutoSpec, NVIDIA SPEED-Bench).

``ServingProfile`` holds one ``CostProfile`` per batch size and the weights the search's
speed objective gives them: the declared batch size alone (weight 1), or a weighting
the user gives (the objective is then the weighted mean of the per-batch speed-ups).
Pure numbers: no models, no files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .speed import CostProfile

__all__ = ["ServingProfile", "CPU_BATCH_SIZES", "GPU_BATCH_SIZES", "default_batch_sizes", "stops_paying_at"]

CPU_BATCH_SIZES = (1, 4, 16)
GPU_BATCH_SIZES = (1, 8, 32, 128)


def default_batch_sizes(device: str) -> tuple[int, ...]:
    """The serving batch sizes profiled by default: ``GPU_BATCH_SIZES`` on ``cuda``
    (any ``cuda:<i>``), else ``CPU_BATCH_SIZES`` (``cpu``, ``llamacpp``, ``mps``)."""
    return GPU_BATCH_SIZES if device.startswith("cuda") else CPU_BATCH_SIZES


@dataclass(frozen=True)
class ServingProfile:
    """Cost profiles at several serving batch sizes, and the weights that price the search.

    Attributes:
        profiles: batch size B -> ``CostProfile`` of one batched step of B rows
            (seconds; its ``batch_size`` is B).
        weights: batch size -> weight (> 0) of its speed-up in ``speedup``; every key
            is in ``profiles``. Default: ``{declared: 1}`` with ``declared`` the
            smallest batch size.

    Raises:
        ValueError: no profiles, a key that is not an integer >= 1 or differs from its
            profile's ``batch_size``, a weight that is not finite and > 0, or a
            weighted batch size without a profile.
    """

    profiles: Mapping[int, CostProfile]
    weights: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("a serving profile needs a cost profile at one batch size at least")
        for b, p in self.profiles.items():
            if int(b) != b or b < 1 or p.batch_size != b:
                raise ValueError(f"profile keys are batch sizes >= 1 equal to their profile's, got {b!r}")
        weights = dict(self.weights) or {min(self.profiles): 1.0}
        for b, w in weights.items():
            if b not in self.profiles:
                raise ValueError(f"weight for batch size {b}, which has no profile (measured: {self.batch_sizes})")
            if not (math.isfinite(w) and w > 0):
                raise ValueError(f"the weight of batch size {b} must be a finite number > 0, got {w!r}")
        object.__setattr__(self, "profiles", MappingProxyType(dict(sorted(self.profiles.items()))))
        object.__setattr__(self, "weights", MappingProxyType(dict(sorted(weights.items()))))

    @classmethod
    def single(cls, profile: CostProfile) -> ServingProfile:
        """One profile, at its own batch size, weighted 1."""
        return cls({profile.batch_size: profile})

    @property
    def batch_sizes(self) -> list[int]:
        """The profiled batch sizes, increasing."""
        return list(self.profiles)

    @property
    def declared(self) -> int:
        """The batch size the search prices at: the largest weight's (the smallest on a tie)."""
        return max(self.weights, key=lambda b: (self.weights[b], -b))

    def at(self, batch_size: int) -> CostProfile:
        """The profile at ``batch_size``. Raises KeyError naming the profiled sizes."""
        if batch_size not in self.profiles:
            raise KeyError(f"no cost profile at batch size {batch_size} (profiled: {self.batch_sizes})")
        return self.profiles[batch_size]

    @property
    def c_rel(self) -> float:
        """``t_draft / t_ar`` at the declared batch size."""
        return self.at(self.declared).c_rel

    @property
    def flags(self) -> list[str]:
        """Every profile's flags, each prefixed with its batch size."""
        return [f"batch {b}: {f}" for b, p in self.profiles.items() for f in p.flags]

    def speedups(self, l_accept: float, n_draft: int, L_ar: float = 1.0, L_relax: float = 1.0) -> dict[int, float]:
        """Batch size -> modeled speed-up over batched AR at that batch size
        (``CostProfile.speedup`` with that batch size's costs).

        Raises:
            ValueError: as ``relaxtune.decoding.speed.speedup``.
        """
        return {b: p.speedup(l_accept, n_draft, L_ar, L_relax) for b, p in self.profiles.items()}

    def speedup(self, l_accept: float, n_draft: int, L_ar: float = 1.0, L_relax: float = 1.0) -> float:
        """The search's speed objective: the weighted mean of ``speedups`` over ``weights``
        (the declared batch size's speed-up when it alone is weighted)."""
        total = sum(self.weights.values())
        return sum(w * self.at(b).speedup(l_accept, n_draft, L_ar, L_relax) for b, w in self.weights.items()) / total

    def reweighted(self, weights: Mapping[int, float]) -> ServingProfile:
        """The same profiles with other weights (``{B: 1}`` declares batch size B)."""
        return ServingProfile(self.profiles, weights)

    def difference(self, other: ServingProfile) -> tuple[float, str]:
        """The largest relative difference of ``CostProfile.ratios`` over the batch sizes
        both profiled, and which (``"batch B: ratio"``).

        Raises:
            ValueError: no batch size in common.
        """
        shared = sorted(self.profiles.keys() & other.profiles.keys())
        if not shared:
            raise ValueError(f"no batch size in common ({self.batch_sizes} against {other.batch_sizes})")
        gaps = {b: self.profiles[b].difference(other.profiles[b]) for b in shared}
        b = max(gaps, key=lambda k: gaps[k][0])
        return gaps[b][0], f"batch {b}: {gaps[b][1]}"

    def summary(self) -> str:
        """One line per batch size (``CostProfile.summary``)."""
        return "; ".join(f"batch {b}: {p.summary()}" for b, p in self.profiles.items())

    def to_dict(self) -> dict:
        """Plain fields for JSON and YAML: ``{"batch_sizes": {B: profile}, "weights": {B: w}}``."""
        return {
            "batch_sizes": {b: p.to_dict() for b, p in self.profiles.items()},
            "weights": dict(self.weights),
        }

    @classmethod
    def from_dict(cls, raw: Mapping) -> ServingProfile:
        """The inverse of ``to_dict`` (keys may come back as strings); a single
        ``CostProfile.to_dict`` (a profile saved before batch sizes) reads as that
        profile alone, at batch size 1.

        Raises:
            ValueError, KeyError: not a profile.
        """
        if "batch_sizes" not in raw:
            return cls.single(CostProfile.from_dict(dict(raw)))
        profiles = {
            int(b): CostProfile.from_dict(dict(p) | {"batch_size": int(b)}) for b, p in raw["batch_sizes"].items()
        }
        return cls(profiles, {int(b): float(w) for b, w in raw.get("weights", {}).items()})


def stops_paying_at(best: Mapping[int, float]) -> int | None:
    """The batch size from which speculative decoding stops paying: the smallest
    profiled B at which, and at every larger profiled B, the best modeled speed-up
    is below 1. None when it still pays at the largest.

    Args:
        best: batch size -> the best modeled speed-up there (over batched AR).

    Raises:
        ValueError: empty.
    """
    if not best:
        raise ValueError("no batch sizes")
    out = None
    for b in sorted(best, reverse=True):
        if best[b] >= 1.0:
            break
        out = b
    return out
