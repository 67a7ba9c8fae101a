"""Judging one evaluated point against strict: paired metrics, speed, and the
capability-loss constraint (``UCB(drop) - epsilon <= 0`` plus optional rambling
guards), as stored on Optuna trials and re-judged by an export."""

from __future__ import annotations

import math

from .evaluation import EvalResult
from .rambling import loop_rate
from .settings import TuneSettings
from .speed import PAPER_C_REL, CostProfile, c_rel_of, modeled_speedup, speedup
from .stats import paired_drop

__all__ = ["point_metrics", "constraint_values", "drop_ucb_at", "feasible", "set_constraints", "CONSTRAINTS", "VIOLATED"]

VIOLATED = 1.0  # constraint value recorded for pruned and failed trials


def point_metrics(
    strict: EvalResult, relaxed: EvalResult, n_draft: int, profile: CostProfile | float, confidence: float
) -> dict:
    """Metrics of one evaluated point against the strict baseline at the same N.

    Pairs samples by (problem, repeat), skipping pairs where either generation
    failed. ``drop_lcb`` / ``drop_ucb`` bound the paired accuracy drop at one-sided
    ``confidence``. Speed-ups follow the paper's model (``relaxtune.speed``) with
    ``L_AR`` = strict's mean length; ``speedup`` uses ``profile`` (measured costs
    or a c_rel value), ``speedup_c<c>`` the paper's c_rel values.
    """
    base = {(r["problem_id"], r["repeat"]): r for r in strict.records if not r.get("failed")}
    pairs = [(base[k], r) for r in relaxed.records if not r.get("failed") and (k := (r["problem_id"], r["repeat"])) in base]
    if not pairs:
        raise ValueError("no paired samples to compare (every generation failed?)")
    s_ok = [bool(s.get("correct")) for s, _ in pairs]
    r_ok = [bool(r.get("correct")) for _, r in pairs]
    drop, lo, hi = paired_drop(s_ok, r_ok, confidence=2 * confidence - 1)
    l_strict = max(sum(s["response_tokens"] for s, _ in pairs) / len(pairs), 1.0)
    l_relax = max(sum(r["response_tokens"] for _, r in pairs) / len(pairs), 1.0)
    l_accept = min(relaxed.l_accept, float(n_draft))
    out = dict(
        n=len(pairs), failed=relaxed.failed, accuracy=sum(r_ok) / len(pairs), strict_accuracy=sum(s_ok) / len(pairs),
        accuracy_ci_low=relaxed.ci_low, accuracy_ci_high=relaxed.ci_high, drop=drop, drop_lcb=lo, drop_ucb=hi,
        confidence=confidence, strict_only=sum(a and not b for a, b in zip(s_ok, r_ok)),
        relaxed_only=sum(b and not a for a, b in zip(s_ok, r_ok)),
        l_accept=l_accept, length=l_relax, strict_length=l_strict, length_ratio=l_relax / l_strict,
        truncated=relaxed.truncated, loop_rate=loop_rate([r.get("output", "") for _, r in pairs]),
        tokens=relaxed.tokens, tokens_per_second=relaxed.tokens_per_second,
    )
    for c in PAPER_C_REL:
        out[f"speedup_c{c:g}"] = speedup(l_accept, n_draft, c, l_strict, l_relax)
    out["speedup"] = modeled_speedup(profile, l_accept, n_draft, l_strict, l_relax)
    out["c_rel"] = c_rel_of(profile)
    return out


CONSTRAINTS = ("drop_ucb_minus_epsilon", "length_ratio_over_max", "truncated_over_max")


def drop_ucb_at(metrics: dict, confidence: float) -> float:
    """The upper bound of the paired accuracy drop at one-sided ``confidence``:
    the stored one, or rebuilt from the stored discordant counts when the metrics
    were computed at another confidence (the paired statistic depends only on
    them and n)."""
    if metrics.get("confidence", confidence) == confidence or "strict_only" not in metrics:
        return metrics["drop_ucb"]
    n, s_only, r_only = int(metrics["n"]), int(metrics["strict_only"]), int(metrics["relaxed_only"])
    # the paired test only sees the differences: +1 s_only times, -1 r_only times, 0 otherwise
    strict = [True] * s_only + [False] * r_only + [False] * (n - s_only - r_only)
    relaxed = [False] * s_only + [True] * r_only + [False] * (n - s_only - r_only)
    return paired_drop(strict, relaxed, confidence=2 * confidence - 1)[2]


def constraint_values(metrics: dict, settings: TuneSettings) -> dict[str, float]:
    """Named constraint values (each must be <= 0): drop UCB - epsilon, then the
    optional rambling guards (length ratio, truncated share). The drop bound is
    rebuilt from the stored discordant counts when ``settings.confidence``
    differs from the one the metrics were computed at."""
    values = {"drop_ucb_minus_epsilon": drop_ucb_at(metrics, settings.confidence) - settings.epsilon}
    if settings.max_length_ratio is not None:
        values["length_ratio_over_max"] = metrics["length_ratio"] - settings.max_length_ratio
    if settings.max_truncated is not None:
        values["truncated_over_max"] = metrics["truncated"] - settings.max_truncated
    return {k: v if math.isfinite(v) else VIOLATED for k, v in values.items()}


def set_constraints(trial, values: dict[str, float]) -> None:
    for key, value in values.items():
        trial.set_constraint(key, value)
    trial.set_user_attr("constraints", list(values.values()))


def feasible(trial, settings: TuneSettings | None = None) -> bool:
    """A COMPLETE trial whose constraints hold: recomputed from its stored
    metrics under ``settings`` (so an export with another epsilon or guard
    re-decides), else the values recorded when it ran."""
    import optuna

    if trial.state != optuna.trial.TrialState.COMPLETE:
        return False
    metrics = trial.user_attrs.get("metrics") or {}
    if settings is not None and "drop_ucb" in metrics:
        cons = list(constraint_values(metrics, settings).values())
    else:
        cons = trial.user_attrs.get("constraints")
    return cons is not None and all(c <= 0 for c in cons)
