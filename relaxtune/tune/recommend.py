"""Whether a confirmed relaxed point beats strict by more than the speed estimate's noise.

The modeled speed-up ``S = (L_AR / L_relax) (l_accept + 1) t_AR / round_seconds(N)``
(``relaxtune.decoding.speed``) is estimated from a finite sample of problems, so two
close values (1.621x against strict's 1.617x) do not show that either is
faster. The margin is the one-sided ``confidence`` percentile-bootstrap
half-width of ``S_relax - S_strict*`` (Efron and Tibshirani 1993, ch. 13):
problems are resampled with replacement (a point's relaxed and strict samples
of one problem move together), ``l_accept`` and lengths re-pooled, both
speed-ups recomputed; the margin is ``observed difference - lower quantile``.
When the cost profile carries relative spreads (``CostProfile.spread``, from
repeated interleaved passes; the worst is used) and the two draft lengths
differ, each speed-up's cost uncertainty (``spread * S``) is added in quadrature. A relaxed
point is recommended only when its difference exceeds the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile, modeled_speedup
from .batches import Prices
from .judge import typed_records
from .point_records import EvalResult

__all__ = [
    "PLAIN",
    "SpeedMargin",
    "speed_margin",
    "cost_spread",
    "recommend",
    "speculation_pays",
    "plain_if_nothing_pays",
    "as_plain",
]

RESAMPLES = 2000
PLAIN = "plain"  # the recommendation's method when no speculative point pays: serve the verifier alone


@dataclass(frozen=True)
class SpeedMargin:
    """``difference = S_relax - S_strict`` (dimensionless), ``margin`` its noise
    at ``confidence``; ``how`` says how the margin was computed."""

    difference: float
    margin: float
    confidence: float
    how: str

    @property
    def beats(self) -> bool:
        """The relaxed point is faster beyond the noise."""
        return self.difference > self.margin


def cost_spread(profile: ServingProfile | CostProfile | float) -> float | None:
    """The profile's worst relative spread of its timings (a fraction: the gap between
    the fastest and the median of its interleaved passes, ``CostProfile.spread``), over
    the batch sizes the objective weighs; None for a fixed ``c_rel`` or a profile
    measured without repeats."""
    prices = Prices.of(profile)
    spreads = [getattr(prices.by_batch[b], "spread", None) or {} for b in prices.weights]
    return max((float(v) for s in spreads for v in s.values() if math.isfinite(v) and v >= 0), default=None)


def _per_problem(result: EvalResult, ids: list[str]) -> np.ndarray:
    """``[K, 4]``: per problem (in ``ids`` order) samples, response tokens, rounds, accepted drafts."""
    rows = {pid: np.zeros(4) for pid in ids}
    for r in typed_records(result):
        if not r.failed and r.problem_id in rows:
            rows[r.problem_id] += (1, r.response_tokens, r.stats["rounds"], r.stats["accepted"])
    return np.array([rows[pid] for pid in ids])


def _pooled(table: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean length and l_accept ``[B]`` under bootstrap ``weights`` ``[B, K]``."""
    samples, tokens, rounds, accepted = (weights @ table[:, i] for i in range(4))
    return np.maximum(tokens / np.maximum(samples, 1), 1.0), accepted / np.maximum(rounds, 1)


def speed_margin(
    relaxed: EvalResult,
    paired_strict: EvalResult,
    n_draft: int,
    strict: EvalResult,
    strict_n: int,
    profile: ServingProfile | CostProfile | float,
    confidence: float,
    seed: int = 0,
) -> SpeedMargin:
    """Bootstrap the modeled speed-up of a relaxed point against strict's best (module doc).

    Args:
        relaxed, paired_strict: the point and strict at its draft length ``n_draft`` on
            the same problems and seeds (``L_AR`` comes from ``paired_strict``).
        strict, strict_n: strict at its fastest draft length (any problems).
        profile: the job's costs; confidence: one-sided, in (0, 1); seed: of the resampling.

    Raises:
        ValueError: no graded sample in an evaluation.
    """
    ids_point = list(dict.fromkeys(r.problem_id for r in typed_records(paired_strict)))
    ids_strict = list(dict.fromkeys(r.problem_id for r in typed_records(strict)))
    if not ids_point or not ids_strict:
        raise ValueError("the speed margin needs graded samples of both points")
    rng = np.random.default_rng(seed)
    w_point = rng.multinomial(len(ids_point), [1 / len(ids_point)] * len(ids_point), size=RESAMPLES).astype(float)
    w_strict = (
        w_point
        if ids_strict == ids_point
        else rng.multinomial(len(ids_strict), [1 / len(ids_strict)] * len(ids_strict), size=RESAMPLES).astype(float)
    )
    full_p, full_s = np.ones((1, len(ids_point))), np.ones((1, len(ids_strict)))

    def difference(wp: np.ndarray, ws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        l_ar, _ = _pooled(_per_problem(paired_strict, ids_point), wp)
        l_relax, acc = _pooled(_per_problem(relaxed, ids_point), wp)
        _, acc_s = _pooled(_per_problem(strict, ids_strict), ws)
        s_relax = [modeled_speedup(profile, min(a, n_draft), n_draft, la, lr) for a, la, lr in zip(acc, l_ar, l_relax)]
        s_strict = [modeled_speedup(profile, min(a, strict_n), strict_n) for a in acc_s]
        return np.array(s_relax) - np.array(s_strict), np.array(s_relax), np.array(s_strict)

    observed, s_relax, s_strict = (v[0] for v in difference(full_p, full_s))
    boot = difference(w_point, w_strict)[0]
    margin = max(observed - float(np.quantile(boot, 1.0 - confidence)), 0.0)
    how = (
        f"one-sided {confidence:.0%} percentile bootstrap over problems of the speed-up difference "
        f"({RESAMPLES} resamples)"
    )
    spread = cost_spread(profile)
    if spread and n_draft != strict_n:
        margin = math.hypot(margin, spread * s_relax, spread * s_strict)
        how += f", with the cost profile's {spread:.1%} spread of each round cost added in quadrature"
    return SpeedMargin(float(observed), float(margin), confidence, how)


def speculation_pays(strict: dict[int, dict], methods: dict) -> bool:
    """True when some speculative point models a speed-up of at least 1 on the
    measured costs: strict at some evaluated N, or a confirmed relaxed point.

    Args:
        strict: N -> strict's summary (``modeled_speedup``); methods: method ->
            ``MethodResult`` (``feasible``, ``modeled_speedup``).
    """
    speeds = [v["modeled_speedup"] for v in strict.values()]
    speeds += [r.modeled_speedup for r in methods.values() if r.feasible and r.modeled_speedup is not None]
    return any(s >= 1.0 for s in speeds)


def plain_if_nothing_pays(out: dict, strict: dict[int, dict], methods: dict, at: str = "") -> dict:
    """``out`` (the fastest speculative point's fields) with ``decoding`` "speculative" when
    ``speculation_pays``; else plain decoding of the verifier (``relaxtune.report.config_schema.PLAIN``):
    ``method`` plain, no knob and no N, modeled 1x (plain decoding is the AR baseline), the
    reason saying why, and ``out``'s point kept as ``fastest_speculative`` (method, knob, N,
    speed-up, speed margin, its reason), for information.

    Args:
        at: where the speed-ups are modeled, for the reason (``" at serving batch size 32"``;
            empty for a job priced at batch size 1 alone).
    """
    if speculation_pays(strict, methods):
        return out | {"decoding": "speculative"}
    best = max((v["modeled_speedup"] for v in strict.values()), default=out["modeled_speedup"])
    confirmed = any(r.feasible for r in methods.values())
    relaxed = "every confirmed relaxed point below 1x too" if confirmed else "no relaxed point confirmed"
    fastest = {k: out.get(k) for k in ("method", "knob", "n_draft", "modeled_speedup", "speed_margin", "reason")}
    reason = (
        f"serve the verifier alone (plain decoding): no speculative point pays on the measured costs{at} "
        f"(strict's best models {best:.2f}x, {relaxed})"
    )
    return as_plain(out, reason, fastest)


def as_plain(rec: dict, reason: str, fastest: dict) -> dict:
    """``rec`` (a recommendation's fields) as plain decoding of the verifier: ``method`` and
    ``decoding`` plain, no knob, knobs or N, modeled 1x (the AR baseline), no speed margin,
    ``reason``, and ``fastest`` (the fastest speculative point) kept beside it. The one place
    a plain recommendation's fields are written (``plain_if_nothing_pays``, and the loader of
    configs written before ``method: plain``)."""
    return rec | {
        "method": PLAIN,
        "knob": None,
        "knobs": {},
        "n_draft": None,
        "modeled_speedup": 1.0,
        "speed_margin": None,
        "decoding": PLAIN,
        "fastest_speculative": fastest,
        "reason": reason,
    }


def recommend(result, methods: dict, confirmations: dict, strict: dict[int, dict], dominated: list[str] = ()) -> dict:
    """The recommendation's fields (without ``serving``): plain decoding of the
    verifier when no speculative point pays (``plain_if_nothing_pays``); else the
    fastest confirmed method when its modeled speed-up beats strict's best (at any
    evaluated N) by more than the ``speed_margin``, else strict at its fastest N.

    Every speed-up here is the job's objective (``result.profile``): the modeled speed-up
    at the declared serving batch size, or the weighted mean over a weighting
    (``relaxtune.decoding.serving.ServingProfile.speedup``), so the one deployable point
    (engines set N and the rule server-wide) is chosen for the batch size a team runs;
    ``batch_size`` is the declared one (``relaxtune.tune.batches.Prices``), and where
    plain decoding wins there, the reason says at which batch size.

    Args:
        result: the finished job (``relaxtune.tune.result.JobResult``); methods: method -> ``MethodResult``;
        confirmations: method -> ``relaxtune.tune.confirm.Confirmation``;
        strict: N -> strict's summary (``modeled_speedup``) as exported.
        dominated: methods whose trials passed the loss constraint but strict
            dominates each (the reason names them).
    """
    stats = result.stats
    prices = Prices.of(result.profile)
    at = "" if prices.batch_sizes == [1] else f" at {prices.objective()}"
    best_n = max(strict, key=lambda n: strict[n]["modeled_speedup"]) if strict else result.search.n_drafts[0]
    strict_speed = strict.get(best_n, {}).get("modeled_speedup", 1.0)
    out = dict(
        method="strict",
        knob=None,
        n_draft=best_n,
        batch_size=prices.declared,
        weights={str(b): w for b, w in sorted(prices.weights.items())} if prices.weighted else None,
        modeled_speedup=strict_speed,
        strict_modeled_speedup=strict_speed,
        speed_margin=None,
    )
    best = max((r for r in methods.values() if r.feasible), key=lambda r: (r.modeled_speedup, r.accuracy), default=None)
    if best is None:
        out["reason"] = (
            f"use strict: no relaxed point was confirmed within the capability-loss budget (epsilon "
            f"{stats.epsilon:g}, {result.problems} problems)"
            + (
                f"; {', '.join(dominated)} had points within it, but strict (modeled {strict_speed:.2f}x "
                f"at N={best_n}) is as fast and as accurate as each"
                if dominated
                else ""
            )
        )
        return plain_if_nothing_pays(out, strict, methods, at)
    done = confirmations[best.method].confirmed
    sm = speed_margin(
        done.relaxed,
        done.strict,
        done.n_draft,
        result.baselines[best_n],
        best_n,
        result.profile,
        stats.confidence,
        result.search.seed,
    )
    out["speed_margin"] = {"difference": sm.difference, "margin": sm.margin, "confidence": sm.confidence, "how": sm.how}
    speeds = (
        f"models {best.modeled_speedup:.3f}x against strict's best {strict_speed:.3f}x (N={best_n}): "
        f"{sm.difference:+.3f}, speed margin {sm.margin:.3f} ({sm.how})"
    )
    if not sm.beats:
        out["reason"] = f"use strict: {best.method}'s confirmed point {speeds}, so it is not faster beyond the noise"
        return plain_if_nothing_pays(out, strict, methods, at)
    out.update(
        method=best.method,
        knob=best.knob,
        n_draft=best.n_draft,
        modeled_speedup=best.modeled_speedup,
        reason=(
            f"fastest confirmed point: accuracy drop vs strict <= {best.drop_upper_bound:.3f} on fresh "
            f"samples ({done.confidence:.1%} one-sided; search bound {best.search_drop_upper_bound:.3f}), "
            f"within epsilon {stats.epsilon:g}; it {speeds}"
        ),
    )
    return plain_if_nothing_pays(out, strict, methods, at)
