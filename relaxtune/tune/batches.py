"""The speed a deployment sees at each serving batch size: a job's costs read per batch
size (``Prices``), every confirmed point priced at each (``candidates``), the best one per
batch size and the batch size from which speculative decoding stops paying (``by_batch``).

A job prices its points with a ``relaxtune.decoding.serving.ServingProfile`` (cost profiles
at several serving batch sizes, weighted for the search's objective), a single
``CostProfile`` (a job measured before batch sizes: its own batch size alone, weighted 1)
or a fixed c_rel (no measured times: batch size 1, the paper's formula). ``Prices.of`` is
the one place the three are told apart. A point's speed-up at batch size B is the paper's
model priced with B's costs against batched AR at B (``ServingProfile.speedups``); the
candidates are the points the export may deploy: strict at every evaluated N and each
method's confirmed point (engines set N and the rule server-wide, so one point serves every
batch size). Pure numbers: no models, no files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..decoding.serving import ServingProfile, stops_paying_at
from ..decoding.speed import CostProfile, modeled_speedup

__all__ = ["Prices", "Candidate", "candidates", "by_batch", "paying_line", "strict_speedup"]


def strict_speedup(profile: ServingProfile | CostProfile | float, l_accept: float, n_draft: int) -> float:
    """Strict's modeled speed-up at N from its mean accepted drafts per round (capped at
    N; length ratio 1: strict has AR's lengths), priced with ``profile``."""
    return modeled_speedup(profile, min(float(l_accept), float(n_draft)), n_draft)


@dataclass(frozen=True)
class Prices:
    """A job's costs by serving batch size.

    Attributes:
        by_batch: batch size B -> what prices a point at B (a ``CostProfile`` of one batched
            step of B rows, or a fixed c_rel: ``relaxtune.decoding.speed.modeled_speedup``
            reads either), by increasing B.
        weights: batch size -> weight of its speed-up in the search's objective.
        declared: the batch size the recommendation is modeled at
            (``ServingProfile.declared``; a single profile's or c_rel's only batch size).
    """

    by_batch: Mapping[int, CostProfile | float]
    weights: Mapping[int, float]
    declared: int

    @classmethod
    def of(cls, profile: ServingProfile | CostProfile | float) -> Prices:
        """The prices of a job's costs: a ``ServingProfile``'s profiles and weights; a
        single ``CostProfile`` at its own batch size, weighted 1; a fixed c_rel at batch
        size 1, weighted 1."""
        if isinstance(profile, ServingProfile):
            by_batch, weights, declared = dict(profile.profiles), dict(profile.weights), profile.declared
        elif isinstance(profile, CostProfile):
            by_batch, weights, declared = {profile.batch_size: profile}, {profile.batch_size: 1.0}, profile.batch_size
        else:
            by_batch, weights, declared = {1: float(profile)}, {1: 1.0}, 1
        return cls(MappingProxyType(by_batch), MappingProxyType(weights), declared)

    @property
    def batch_sizes(self) -> list[int]:
        """The priced batch sizes, increasing."""
        return sorted(self.by_batch)

    @property
    def weighted(self) -> bool:
        """The objective weighs more than one batch size."""
        return len(self.weights) > 1

    def speedups(self, l_accept: float, n_draft: int, L_ar: float = 1.0, L_relax: float = 1.0) -> dict[int, float]:
        """Batch size -> modeled speed-up over batched AR at that batch size.

        Raises:
            ValueError: as ``relaxtune.decoding.speed.speedup``.
        """
        return {b: modeled_speedup(p, l_accept, n_draft, L_ar, L_relax) for b, p in sorted(self.by_batch.items())}

    def objective(self) -> str:
        """What the recommendation is chosen for, in words: ``serving batch size 32``, or
        ``the weighting 1: 0.5, 32: 0.5 of serving batch sizes``."""
        if not self.weighted:
            return f"serving batch size {self.declared}"
        shares = ", ".join(f"{b}: {w:g}" for b, w in sorted(self.weights.items()))
        return f"the weighting {shares} of serving batch sizes"


@dataclass(frozen=True)
class Candidate:
    """A point the export may deploy, priced at every batch size.

    Attributes:
        label: ``strict N=<n>`` or the method's name (its one confirmed point).
        method, knob, knobs, n_draft: the point (strict: knob None, knobs {}).
        speedups: batch size -> modeled speed-up over batched AR there.
    """

    label: str
    method: str
    knob: float | None
    knobs: Mapping[str, float]
    n_draft: int
    speedups: Mapping[int, float]


def candidates(strict: Mapping[int, Mapping], methods: Mapping, prices: Prices) -> list[Candidate]:
    """Strict at every evaluated N (``l_accept`` capped at N, length ratio 1) and each
    method's confirmed point (its ``l_accept``, length ratio and N), priced at every batch
    size of ``prices``; strict first, by increasing N, then the methods in order.

    Args:
        strict: N -> strict's summary as exported (``l_accept``).
        methods: method -> ``relaxtune.report.config_schema.MethodResult`` (``feasible``,
            ``l_accept``, ``length_ratio``, ``n_draft``, ``knob``, ``knobs``).
    """
    priced = sorted(prices.by_batch.items())
    out = [
        Candidate(f"strict N={n}", "strict", None, {}, n, {b: strict_speedup(p, v["l_accept"], n) for b, p in priced})
        for n, v in sorted(strict.items())
    ]
    for name, r in methods.items():
        if r.feasible:
            speeds = prices.speedups(r.l_accept, r.n_draft, 1.0, r.length_ratio)
            out.append(Candidate(name, r.method, r.knob, dict(r.knobs or {}), r.n_draft, speeds))
    return out


def paying_line(stops: int | None, batch_sizes: list[int], where: str = "on this host") -> str:
    """The one line that says where speculative decoding stops paying: ``speculative
    decoding stops paying from batch B <where>`` (``stops``: ``stops_paying_at``), or
    ``... pays up to batch Bmax <where>`` (the largest priced batch size)."""
    if stops is None:
        return f"speculative decoding pays up to batch {max(batch_sizes)} {where} (the largest profiled)"
    if stops == min(batch_sizes):
        return f"speculative decoding stops paying from batch {stops} {where} (it pays at no profiled batch size)"
    return f"speculative decoding stops paying from batch {stops} {where}"


def by_batch(strict: Mapping[int, Mapping], methods: Mapping, prices: Prices, where: str = "on this host") -> dict:
    """The best confirmed point at each batch size (the fastest candidate there; strict first
    on a tie), and where speculative decoding stops paying.

    Returns:
        ``{"best": {B: {method, knob, knobs, n_draft, modeled_speedup, decoding}},
        "speedups": {label: {B: speed-up}}, "stops_paying_at": B | None, "line": str}``:
        ``decoding`` is ``"plain"`` where the best is below 1 (serve the verifier alone at
        that batch size), ``stops_paying_at`` is ``relaxtune.decoding.serving.stops_paying_at``
        of the best per batch size, ``line`` is ``paying_line``'s.

    Raises:
        ValueError: no candidate (no strict baseline and no confirmed point).
    """
    points = candidates(strict, methods, prices)
    if not points:
        raise ValueError("no strict baseline and no confirmed point to price")
    best = {}
    for b in prices.batch_sizes:
        top = max(points, key=lambda c: c.speedups[b])  # the first of a tie: strict before the methods
        s = top.speedups[b]
        best[b] = {
            "method": top.method,
            "knob": top.knob,
            "knobs": dict(top.knobs),
            "n_draft": top.n_draft,
            "modeled_speedup": s,
            "decoding": "speculative" if s >= 1.0 else "plain",
        }
    stops = stops_paying_at({b: v["modeled_speedup"] for b, v in best.items()})
    return {
        "best": best,
        "speedups": {c.label: dict(c.speedups) for c in points},
        "stops_paying_at": stops,
        "line": paying_line(stops, prices.batch_sizes, where),
    }
