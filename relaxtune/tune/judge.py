"""Judging one evaluated point against strict: paired metrics, speed, and the
capability-loss constraint (``UCB(drop) - epsilon <= 0`` plus optional rambling
guards), as stored on Optuna trials and re-judged by an export."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ..certify.inputs import check_count
from ..certify.stats import DropBound, drop_bound, paired_counts
from ..decoding.rambling import loop_rate
from ..decoding.serving import ServingProfile
from ..decoding.speed import PAPER_C_REL, CostProfile, c_rel_of, modeled_speedup, speedup
from .point_records import EvalResult
from .records import SampleRecord, load_record
from .setting_groups import StatsSettings

__all__ = [
    "point_metrics",
    "typed_records",
    "speedup_upper",
    "constraint_values",
    "drop_ucb_at",
    "stored_bound",
    "feasible",
    "set_constraints",
    "CONSTRAINTS",
    "VIOLATED",
]

VIOLATED = 1.0  # constraint value recorded for pruned and failed trials


def point_metrics(
    strict: EvalResult,
    relaxed: EvalResult,
    n_draft: int,
    profile: ServingProfile | CostProfile | float,
    confidence: float,
) -> dict:
    """Metrics of one evaluated point against the strict baseline at the same N.

    Pairs samples by (problem, repeat), skipping pairs where either generation
    failed. ``drop_lcb`` / ``drop_ucb`` bound the paired accuracy drop at one-sided
    ``confidence`` (``relaxtune.certify.stats.drop_bound``: exact with one sample per
    problem, clustered by problem with repeats); ``strict_only`` /
    ``relaxed_only`` count the discordant pairs and, with repeats,
    ``per_problem`` holds each problem's ``[n, strict_only, relaxed_only, first]`` so
    the bound can be rebuilt at another confidence. Speed-ups follow the paper's
    model (``relaxtune.decoding.speed``) with ``L_AR`` = strict's mean length; ``speedup``
    uses ``profile`` (measured costs or a c_rel value), ``speedup_c<c>`` the
    paper's c_rel values, ``speedup_ucb`` its upper one-sided ``confidence``
    bound (``speedup_upper``).

    Raises:
        ValueError: no paired sample (every generation failed).
    """
    base = {r.key: r for r in typed_records(strict) if not r.failed}
    pairs = [(base[r.key], r) for r in typed_records(relaxed) if not r.failed and r.key in base]
    if not pairs:
        raise ValueError("no paired samples to compare (every generation failed?)")
    counts = paired_counts(strict.records, relaxed.records)
    bound = drop_bound(counts, confidence)
    s_ok = [bool(s.correct) for s, _ in pairs]
    r_ok = [bool(r.correct) for _, r in pairs]
    l_strict = max(sum(s.response_tokens for s, _ in pairs) / len(pairs), 1.0)
    l_relax = max(sum(r.response_tokens for _, r in pairs) / len(pairs), 1.0)
    l_accept = min(relaxed.l_accept, float(n_draft))
    out = dict(
        n=len(pairs),
        failed=relaxed.failed,
        accuracy=sum(r_ok) / len(pairs),
        strict_accuracy=sum(s_ok) / len(pairs),
        accuracy_ci_low=relaxed.ci_low,
        accuracy_ci_high=relaxed.ci_high,
        drop=bound.drop,
        drop_lcb=bound.lower,
        drop_ucb=bound.upper,
        confidence=confidence,
        bound_method=bound.method,
        problems=bound.problems,
        strict_only=bound.strict_only,
        relaxed_only=bound.relaxed_only,
        discordance=bound.discordance,
        l_accept=l_accept,
        length=l_relax,
        strict_length=l_strict,
        length_ratio=l_relax / l_strict,
        truncated=relaxed.truncated,
        loop_rate=loop_rate([r.output or "" for _, r in pairs]),  # a graded sample has its text
        tokens=relaxed.tokens,
        tokens_per_second=relaxed.tokens_per_second,
    )
    for c in PAPER_C_REL:
        out[f"speedup_c{c:g}"] = speedup(l_accept, n_draft, c, l_strict, l_relax)
    out["speedup"] = modeled_speedup(profile, l_accept, n_draft, l_strict, l_relax)
    out["speedup_ucb"] = speedup_upper(pairs, out["speedup"], n_draft, profile, confidence)
    out["c_rel"] = c_rel_of(profile)
    if bound.method != "exact-score":  # with repeats the bound needs every problem's counts
        out["per_problem"] = [list(row) for row in counts]
    return out


def speedup_upper(
    pairs: list[tuple[SampleRecord, SampleRecord]],
    speedup_: float,
    n_draft: int,
    profile: ServingProfile | CostProfile | float,
    confidence: float,
) -> float:
    """Upper one-sided ``confidence`` bound of a point's modeled speed-up (dimensionless):
    ``speedup_ + z_c SE``, the standard error the jackknife's over problems (Efron and
    Tibshirani 1993, ch. 11: each problem left out in turn, ``l_accept`` and both mean
    lengths pooled again over the paired samples). Infinite with fewer than two problems.

    Args:
        pairs: ``(strict record, relaxed record)`` per paired sample; speedup_: the point's estimate.
    """
    per: dict[str, np.ndarray] = {}
    for s, r in pairs:  # per problem: samples, strict tokens, relaxed tokens, rounds, accepted drafts
        row = per.setdefault(s.problem_id, np.zeros(5))
        row += (1, s.response_tokens, r.response_tokens, r.stats["rounds"], r.stats["accepted"])
    if len(per) < 2:
        return math.inf
    table = np.array(list(per.values()))
    samples, strict_tokens, relaxed_tokens, rounds, accepted = (table.sum(0) - table).T  # each problem left out
    l_accept = np.minimum(accepted / np.maximum(rounds, 1), n_draft)
    ratio = np.maximum(strict_tokens / samples, 1.0) / np.maximum(relaxed_tokens / samples, 1.0)
    loo = modeled_speedup(profile, 0.0, n_draft) * ratio * (l_accept + 1.0)  # linear in (L_AR / L) (l + 1)
    k = len(loo)
    se = math.sqrt((k - 1) / k * float(((loo - loo.mean()) ** 2).sum()))
    return speedup_ + NormalDist().inv_cdf(confidence) * se


def typed_records(result: EvalResult) -> list[SampleRecord]:
    """An evaluation's records (``EvalResult.records``: ``SampleRecord.dump`` dicts, v2 or v3)
    read as typed ``SampleRecord``s (``relaxtune.tune.records.load_record``).

    Raises:
        RecordError: a record that does not validate (named by its file and position).
    """
    return [load_record(r, where=f"{result.path} record {i}") for i, r in enumerate(result.records)]


CONSTRAINTS = ("drop_ucb_minus_epsilon", "length_ratio_over_max", "truncated_over_max")


def stored_bound(metrics: dict, confidence: float) -> DropBound:
    """The drop bound at one-sided ``confidence`` rebuilt from a point's stored
    counts (``per_problem`` with repeats, else the pooled ``n``, ``strict_only``,
    ``relaxed_only``; metrics stored before the bound was clustered hold only
    the pooled counts and are bounded as one sample per problem).

    Raises:
        ValueError: stored counts that cannot be (negative, discordant counts above n).
    """
    if "per_problem" in metrics:
        return drop_bound(metrics["per_problem"], confidence)
    n, b, c = (check_count(f"stored {k}", metrics[k]) for k in ("n", "strict_only", "relaxed_only"))
    if n < 1 or b + c > n:
        raise ValueError(
            f"stored paired counts n={n}, strict_only={b}, relaxed_only={c} are impossible (need "
            "n >= 1 and 0 <= strict_only + relaxed_only <= n): the trial's metrics are corrupt; "
            "evaluate it again"
        )
    return drop_bound([(1, 1, 0)] * b + [(1, 0, 1)] * c + [(1, 0, 0)] * (n - b - c), confidence)


def drop_ucb_at(metrics: dict, confidence: float) -> float:
    """The upper bound of the paired accuracy drop at one-sided ``confidence``,
    rebuilt from the stored counts (``stored_bound``; the stored ``drop_ucb``
    only for metrics without counts).

    Raises:
        ValueError: as ``stored_bound``.
    """
    return stored_bound(metrics, confidence).upper if "strict_only" in metrics else metrics["drop_ucb"]


def constraint_values(metrics: dict, stats: StatsSettings) -> dict[str, float]:
    """Named constraint values (each must be <= 0): drop UCB - epsilon, then the
    optional rambling guards (length ratio, truncated share). The drop bound is
    rebuilt from the stored discordant counts when ``stats.confidence``
    differs from the one the metrics were computed at."""
    values = {"drop_ucb_minus_epsilon": drop_ucb_at(metrics, stats.confidence) - stats.epsilon}
    if stats.max_length_ratio is not None:
        values["length_ratio_over_max"] = metrics["length_ratio"] - stats.max_length_ratio
    if stats.max_truncated is not None:
        values["truncated_over_max"] = metrics["truncated"] - stats.max_truncated
    return {k: v if math.isfinite(v) else VIOLATED for k, v in values.items()}


def set_constraints(trial, values: dict[str, float]) -> None:
    for key, value in values.items():
        trial.set_constraint(key, value)
    trial.set_user_attr("constraints", list(values.values()))


def feasible(trial, stats: StatsSettings | None = None) -> bool:
    """A COMPLETE trial whose constraints hold: recomputed from its stored
    metrics under ``stats`` (so an export with another epsilon or guard
    re-decides), else the values recorded when it ran."""
    import optuna

    if trial.state != optuna.trial.TrialState.COMPLETE:
        return False
    metrics = trial.user_attrs.get("metrics") or {}
    if stats is not None and "drop_ucb" in metrics:
        cons = list(constraint_values(metrics, stats).values())
    else:
        cons = trial.user_attrs.get("constraints")
    return cons is not None and all(c <= 0 for c in cons)
