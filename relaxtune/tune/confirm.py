"""Confirmation: the chosen point of each method, and strict at the same N, run
again on samples the search never saw; the exported bound comes from them alone.

The chosen trial is the fastest of many that passed the same test on the same
samples, so its search bound is optimistic (winner's curse). Confirmation
re-runs it on the half of the problems the search never saw (``--confirm
holdout``, the default: a seeded split made before any generation), or with
new seeds on the search's own problems (``--confirm seeds``; the seed of
attempt k derives from the job's seed and k). When a point fails, the
next-best candidate of the same method may be confirmed, up to
``--confirmations`` per method.

Confidence split (Bonferroni): the job fixes, before any generation, how many
confirmations can happen: ``T = sum over methods of min(--confirmations,
--trials)`` (one for a pinned point). Each confirmation is judged at one-sided
confidence ``1 - (1 - c) / T``.

What that promises (``promise``). With the held-out half, the candidates (and
their order) are a function of the search's problems only, which are
independent of the held-out ones when the task's problems are independent
draws from its population; so each confirmation is a valid test at
``(1 - c) / T`` whatever the search looked at, and by the union bound, with
probability at least ``c`` no point the job exports has a true drop above
epsilon over problems like these, however many methods, knobs and N the
search tried. Fresh seeds on the same problems are not fresh samples of that
population: at temperature 0 they replay the search's outcomes, and the
selection among the points the search tried is not covered (with 8 candidates
at a true drop of 0.055, epsilon 0.05, a bad point was exported in 17 % of
jobs at c = 0.9). With ``--confirm seeds`` the promise is about the search's
problems (their sampling noise), not new ones, and every output says so.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..tasks.spec import Problem
from .evaluation import evaluate
from .judge import constraint_values, drop_ucb_at, point_metrics
from .point_records import DecodeConfig, EvalResult, records_complete, trial_scope
from .records import load_metrics
from .tuning import candidates

__all__ = [
    "Attempt",
    "Confirmation",
    "confirm",
    "fresh_point",
    "confirmation_seed",
    "holdout_split",
    "split_confidence",
    "planned_confirmations",
    "promise",
    "RULE",
]

RULE = (
    "Bonferroni: the confidence c is split evenly over the T confirmations the job allows, fixed before any "
    "generation (sum over methods of min(--confirmations, --trials), one for a pinned point); each is judged at "
    "1 - (1 - c) / T, so every confirmed point holds at once with confidence c"
)


def planned_confirmations(
    methods: Sequence[str], confirmations: int, trials: int, pinned: set[str] = frozenset()
) -> int:
    """T: the confirmations a job allows, from its settings alone (known before any
    generation): per method of ``methods`` ``min(confirmations, trials)`` (``--confirmations``,
    ``--trials``), one for a ``pinned`` method."""
    return sum(1 if m in pinned else min(confirmations, trials) for m in methods)


def promise(confirm: str, confidence: float, epsilon: float, problems: int) -> str:
    """The exported promise in words, for the YAML, the summary and the MLflow task run."""
    if confirm == "holdout":
        return (
            f"over problems like this task's, the true accuracy drop vs strict of every exported point is at most "
            f"{epsilon:g} with confidence {confidence:g}: the {problems} confirmation problems were held out "
            "before any generation, so the promise covers the search and its choice among every method, knob "
            "and N it tried"
        )
    return (
        f"about these {problems} problems, not new ones: the confirmation re-ran the search's own problems with "
        f"fresh seeds, so the drop of at most {epsilon:g} (confidence {confidence:g}) holds for their sampling "
        "noise only, and the choice among the points the search tried is not covered (at temperature 0 fresh "
        "seeds replay the search's outcomes); use --confirm holdout for a promise about new problems"
    )


def confirmation_seed(seed: int, attempt: int) -> int:
    """Base seed of the ``attempt``-th confirmation (1-based) of a job with base
    ``seed``: a hash of both, never ``seed`` itself, so every sample seed differs
    from the search's (``relaxtune.tune.evaluation.sample_seed``)."""
    derived = zlib.crc32(f"relaxtune-confirm:{seed}:{attempt}".encode())
    return derived if derived != seed else derived + 1


def holdout_split(problems: list[Problem], seed: int) -> tuple[list[Problem], list[Problem]]:
    """``(search, held_out)``: a seeded half of the problems (rounded down) held
    out for confirmation; each part keeps the task's order."""
    ranked = sorted(problems, key=lambda p: zlib.crc32(f"relaxtune-holdout:{seed}:{p.id}".encode()))
    held = {p.id for p in ranked[: len(problems) // 2]}
    return [p for p in problems if p.id not in held], [p for p in problems if p.id in held]


def split_confidence(confidence: float, planned: int) -> float:
    """One-sided confidence of each of ``planned`` confirmations: ``1 - (1 - c) / planned``
    (``relaxtune.certify.planning.split_confidence``)."""
    from ..certify.planning import split_confidence as split

    return split(confidence, planned)


@dataclass
class Attempt:
    """One confirmation of one point.

    Attributes:
        attempt: 1-based, within its method; trial: the Optuna trial confirmed.
        knob, n_draft: the point; seed: base seed of its confirmation samples.
        confidence: one-sided confidence it was judged at (after the split).
        search_drop_upper_bound: the trial's search bound at the job's confidence.
        metrics: ``point_metrics`` on the confirmation samples (its ``drop_ucb`` at ``confidence``).
        passed: every constraint holds on the confirmation samples.
        strict, relaxed: the two evaluations (records for the speed bootstrap).
    """

    attempt: int
    trial: int
    knob: float | None
    n_draft: int
    seed: int
    confidence: float
    search_drop_upper_bound: float
    metrics: dict
    passed: bool
    strict: EvalResult | None = field(default=None, repr=False)
    relaxed: EvalResult | None = field(default=None, repr=False)
    extra: tuple = ()  # further named knobs (``DecodeConfig.extra``)

    @property
    def point(self) -> DecodeConfig:
        """The confirmed point (method-less: ``DecodeConfig.method`` is left at strict)."""
        return DecodeConfig(knob=self.knob, n_draft=self.n_draft, seed=self.seed, extra=self.extra)

    def summary(self) -> dict:
        """The numbers the export and MLflow show."""
        m = load_metrics(self.metrics, where=f"confirmation {self.attempt} of trial {self.trial}")  # typed
        return {
            "attempt": self.attempt,
            "trial": self.trial,
            "knob": self.knob,
            **({"extra_knobs": dict(self.extra)} if self.extra else {}),
            "n_draft": self.n_draft,
            "seed": self.seed,
            "confidence": self.confidence,
            "passed": self.passed,
            "n": m.n,
            "problems": m.problems,
            "accuracy": m.accuracy,
            "strict_accuracy": m.strict_accuracy,
            "drop": m.drop,
            "drop_upper_bound": m.drop_ucb,
            "bound_method": m.bound_method,
            "search_drop_upper_bound": self.search_drop_upper_bound,
            "l_accept": m.l_accept,
            "length_ratio": m.length_ratio,
            "modeled_speedup": m.speedup,
        }


@dataclass
class Confirmation:
    """A method's confirmations: ``attempts`` in order (the last passed, or all
    failed), each judged at ``confidence``, the share of the job's confidence
    left by the ``planned`` confirmations of every method; ``missing`` says why
    an export could not replay one (no records)."""

    method: str
    planned: int
    confidence: float
    attempts: list[Attempt] = field(default_factory=list)
    missing: str | None = None

    @property
    def confirmed(self) -> Attempt | None:
        """The attempt that passed, or None."""
        return next((a for a in self.attempts if a.passed), None)


def fresh_point(
    spec,
    backend,
    method: str,
    knob: float | None,
    n_draft: int,
    problems: list[Problem],
    seed: int,
    *,
    profile,
    confidence: float,
    output_dir: str,
    evaluate_fn: Callable | None = None,
    progress: bool = False,
    extra: tuple = (),
    scope: str = "all",
) -> tuple[dict, EvalResult, EvalResult]:
    """Run a point and strict at the same draft length on ``problems`` with base
    ``seed`` (e.g. ``confirmation_seed(job seed, attempt)``) and judge the pair, for
    any task: a confirmation, or a point tuned on one task evaluated on another.

    Args:
        spec, backend: the task and the model pair; method, knob, n_draft, extra (further
            named knobs, ``DecodeConfig.extra``): the point.
        profile: costs (``ServingProfile``, ``CostProfile`` or c_rel) for the modeled speed-up.
        confidence: one-sided confidence of the drop bound in the metrics.
        evaluate_fn: evaluation override with ``relaxtune.tune.evaluation.evaluate``'s signature.
        scope: the point's relaxation scope (``relaxtune.decoding.scope``; strict has none).

    Returns:
        ``(metrics, strict, relaxed)``: ``relaxtune.tune.judge.point_metrics`` (drop bound
        ``drop_ucb``, ``bound_method``, counts) and the two evaluations.
    """
    fn = evaluate_fn or evaluate
    configs = DecodeConfig("strict", None, n_draft, seed), DecodeConfig(method, knob, n_draft, seed, scope, extra)
    strict, relaxed = (
        fn(spec, backend, c, output_dir=output_dir, problems=problems, progress=progress) for c in configs
    )
    metrics = point_metrics(strict, relaxed, n_draft, profile, confidence)
    if scope != "all":  # the point's scope travels with its metrics (a v2-shaped dict reads scope all)
        metrics["scope"] = scope
    return metrics, strict, relaxed


def confirm(
    tuner,
    outcomes: list,
    problems: list[Problem],
    *,
    new_trials: bool = True,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Confirmation]:
    """Confirm each method's candidates in turn (``relaxtune.tune.tuning.candidates``:
    feasible, not dominated by strict, best first) until one passes or
    ``--confirmations`` failed (module doc for the confidence split).

    Args:
        tuner: the finished ``Tuner`` (settings, backend, profile, strict baselines).
        outcomes: its ``MethodOutcome``s.
        problems: the confirmation problems (the search's with fresh seeds, or the held-out half).
        new_trials: False (an export) reads finished records only and never generates.
        log: one line per attempt.

    Returns:
        method -> ``Confirmation``, for the methods with at least one candidate.
    """
    s = tuner.settings
    ranked = {o.method: candidates(o.study, s.stats, tuner.strict_points())[: s.confirmations] for o in outcomes}
    pinned = {o.method for o in outcomes if tuner.pinned(o.method) is not None}
    planned = max(
        planned_confirmations([o.method for o in outcomes], s.confirmations, s.trials, pinned),
        sum(len(c) for c in ranked.values()),
    )  # the max guards settings edited between tune and export
    level = split_confidence(s.confidence, planned)
    judge = s.stats.model_copy(update={"confidence": level})
    out: dict[str, Confirmation] = {}
    for method, trials in ranked.items():
        if not trials:
            continue
        out[method] = result = Confirmation(method, planned, level)
        for k, trial in enumerate(trials, 1):
            seed = confirmation_seed(s.seed, k)
            point = DecodeConfig.of_point(method, trial.params, seed, trial_scope(trial.params))  # every named knob
            knob, n_draft, extra, scope = point.knob, point.n_draft, point.extra, point.scope
            if not new_trials and not _recorded(tuner, method, knob, n_draft, seed, problems, extra, scope):
                result.missing = (
                    f"no confirmation records for trial {trial.number} (attempt {k}): an export never "
                    "generates; run `relaxtune tune` to confirm"
                )
                log(f"{method}: {result.missing}")
                break
            m, strict, relaxed = fresh_point(
                tuner.spec,
                tuner.backend,
                method,
                knob,
                n_draft,
                problems,
                seed,
                profile=tuner.profile,
                confidence=level,
                output_dir=s.output_dir,
                evaluate_fn=tuner.evaluate_ranges,
                progress=tuner.progress,
                extra=extra,
                scope=scope,
            )
            passed = all(v <= 0 for v in constraint_values(m, judge).values())
            search_ucb = drop_ucb_at(trial.user_attrs["metrics"], s.confidence)
            result.attempts.append(
                Attempt(k, trial.number, knob, n_draft, seed, level, search_ucb, m, passed, strict, relaxed, extra)
            )
            log(
                f"confirmation {k}/{len(trials)} of {method} (trial {trial.number}, N={n_draft}) on {m['problems']} "
                f"fresh problems x repeats: drop <= {m['drop_ucb']:.3f} at {level:.1%} (search: <= {search_ucb:.3f}): "
                + ("confirmed" if passed else f"FAILED (epsilon {s.epsilon:g})")
            )
            if passed:
                break
    return out


def _recorded(
    tuner,
    method: str,
    knob: float | None,
    n_draft: int,
    seed: int,
    problems: list[Problem],
    extra: tuple = (),
    scope: str = "all",
) -> bool:
    """Both evaluations of a confirmation are finished on disk (an export reads, never generates)."""
    from ..engine.sequence import native_server

    pair = getattr(tuner.backend, "name", "backend")
    native = "+native" if native_server(tuner.backend, method) is not None else ""  # as evaluate names them
    return all(
        records_complete(Path(tuner.settings.output_dir), tuner.spec, config, name, problems)
        for config, name in (
            (DecodeConfig("strict", None, n_draft, seed), pair),
            (DecodeConfig(method, knob, n_draft, seed, scope, extra), pair + native),
        )
    )
