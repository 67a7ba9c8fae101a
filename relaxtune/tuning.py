"""Tune the relaxation knob (and draft length) per task and method under a
capability-loss constraint.

One Optuna study per (task, method, pair), named ``<task>__<method>__<pair>``, in
an RDB storage with ``load_if_exists`` (a killed job resumes; trials left
RUNNING are failed and re-enqueued, and their finished samples are reused from
the JSONL records). The sampler is multi-objective TPE with constraints (``Trial.set_constraint``):

- objectives: modeled speed-up ``S_relax`` at the chosen cost profile, and accuracy;
- constraint: ``UCB(accuracy drop vs strict) - epsilon <= 0``, the upper
  one-sided ``confidence`` bound of the PAIRED drop (same problems, repeats and
  seeds for strict and the trial: common random numbers), plus optional rambling
  guards (length ratio, truncated share).

Cost control: a trial is evaluated in stages of ``stage_size`` problems and
pruned as soon as the lower bound of its drop already exceeds epsilon. Strict
runs once per (task, pair, N, seed) and is reused by every study (its records
are cached on disk); it also stands for AR (same output distribution), giving
``L_AR``. A failed or NaN evaluation is a FAILED trial, never a crash; pruned
and failed trials count as violating the constraint.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .embedded import DRAFTER, VERIFIER
from .evaluation import DecodeConfig, EvalResult, evaluate
from .methods import get_method
from .rambling import loop_rate
from .speed import PAPER_C_REL, CostProfile, c_rel_of, modeled_speedup, speedup
from .stats import paired_drop
from .tasks import Problem, TaskSpec

__all__ = ["TuneSettings", "Tuner", "point_metrics", "study_name", "MethodOutcome", "feasible"]

VIOLATED = 1.0  # constraint value recorded for pruned and failed trials


class TuneSettings(BaseModel):
    """Everything a tuning job needs (CLI flags and ``--config`` YAML keys)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    methods: list[str] = ["cactus", "mentored"]
    drafter: str = DRAFTER.name
    verifier: str = VERIFIER.name
    dtype: str = "bfloat16"
    drafter_url: str | None = Field(None, description="SGLang drafter server (with verifier_url: SGLang backend)")
    verifier_url: str | None = Field(None, description="SGLang verifier server")
    tokenizer: str | None = Field(None, description="tokenizer id/folder for SGLang (default: the verifier id)")
    native_url: str | None = Field(None, description="STANDALONE speculative SGLang server running sglang_threshold")
    concurrency: int = Field(8, ge=1, description="sequences in flight against SGLang servers")
    epsilon: float = Field(0.05, ge=0.0, le=1.0, description="allowed accuracy drop vs strict")
    confidence: float = Field(0.9, gt=0.5, lt=1.0, description="one-sided confidence of the drop bound")
    c_rel: float | Literal["measured"] = Field("measured", description="drafter/verifier cost ratio, or measured")
    n_drafts: list[int] = [3, 5, 10, 20]
    trials: int = Field(8, ge=1, description="completed or pruned trials per method")
    limit: int | None = Field(None, ge=1, description="first N problems only")
    seed: int = 0
    stage_size: int = Field(4, ge=1, description="problems per evaluation stage (pruning granularity)")
    output_dir: str = "relaxtune-runs"
    storage: str | None = Field(None, description="Optuna RDB URL; default sqlite:///<output_dir>/optuna.db")
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; default sqlite:///mlflow.db")
    max_length_ratio: float | None = Field(None, gt=0, description="optional guard: L_relax / L_strict")
    max_truncated: float | None = Field(None, ge=0, le=1, description="optional guard: truncated share")
    export: str | None = Field(None, description="tuned config path; default <output_dir>/<task>.tuned.yaml")

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        for m in methods:
            get_method(m)
        if "strict" in methods:
            raise ValueError("strict is the baseline every study compares against; tune relaxed methods")
        if not methods:
            raise ValueError("give at least one method")
        return methods

    @property
    def mid_n_draft(self) -> int:
        """The middle draft length of ``n_drafts`` (the paper's grid runs there first)."""
        return self.n_drafts[(len(self.n_drafts) - 1) // 2]

    @field_validator("c_rel")
    @classmethod
    def _finite_c_rel(cls, c_rel):
        if c_rel != "measured" and not (math.isfinite(c_rel) and c_rel >= 0):
            raise ValueError(f"c_rel must be a finite number >= 0 or 'measured', got {c_rel}")
        return c_rel

    @field_validator("n_drafts")
    @classmethod
    def _positive_drafts(cls, n_drafts: list[int]) -> list[int]:
        if not n_drafts or any(n < 1 for n in n_drafts):
            raise ValueError(f"n_drafts must be integers >= 1, got {n_drafts}")
        return sorted(set(n_drafts))

    @property
    def storage_url(self) -> str:
        """The Optuna storage URL."""
        if self.storage:
            return self.storage
        path = Path(self.output_dir).resolve() / "optuna.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"


def study_name(task: str, method: str, pair: str, version: int = 1) -> str:
    """``<task>__<method>__<pair>`` (pair sanitised), with ``-v<version>`` after the
    task from version 2 on, so a new task version starts fresh studies."""
    task = task if version == 1 else f"{task}-v{version}"
    return f"{task}__{method}__{re.sub(r'[^A-Za-z0-9._-]+', '_', pair)}"


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


def _set_constraints(trial, values: dict[str, float]) -> None:
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


@dataclass
class MethodOutcome:
    """The result of one method's study.

    Attributes:
        method: method id; study: the Optuna study (name, trials).
        chosen: the chosen feasible trial (max speed-up, then accuracy), or None.
        mlflow_run_id: the study's MLflow run.
        tokens: model tokens spent by the study's trials (strict excluded).
    """

    method: str
    study: object
    chosen: object | None
    mlflow_run_id: str | None = None
    tokens: int = 0


@dataclass
class Tuner:
    """Runs the studies of one task.

    Args:
        settings: the job.
        spec: the task; problems: its loaded problems.
        backend: the model pair.
        profile: measured ``CostProfile`` or a c_rel value.
        tracker: an optional ``relaxtune.tracking.Tracker``.
        evaluate_fn: how a point is evaluated (the Prefect flow wraps it in a task);
            default ``relaxtune.evaluation.evaluate``.
        progress: show progress bars.
        new_trials: run trials (False: only read what the studies hold, for export).
        log: receives one line per finished trial.
    """

    settings: TuneSettings
    spec: TaskSpec
    problems: list[Problem]
    backend: object
    profile: CostProfile | float
    tracker: object | None = None
    evaluate_fn: Callable[..., EvalResult] | None = None
    progress: bool = True
    new_trials: bool = True
    log: Callable[[str], None] = lambda message: None
    baselines: dict[int, EvalResult] = field(default_factory=dict)

    # ------------------------------------------------------------- evaluation

    def _evaluate(self, config: DecodeConfig, problems: list[Problem]) -> EvalResult:
        fn = self.evaluate_fn or evaluate
        return fn(self.spec, self.backend, config, output_dir=self.settings.output_dir, problems=problems,
                  progress=self.progress)

    def baseline(self, n_draft: int) -> EvalResult:
        """Strict at draft length N on all problems (cached in memory and on disk)."""
        if n_draft not in self.baselines:
            config = DecodeConfig("strict", None, n_draft, self.settings.seed)
            self.baselines[n_draft] = self._evaluate(config, self.problems)
        return self.baselines[n_draft]

    def strict_speedup(self, n_draft: int) -> float:
        """Modeled speed-up of strict at N (length ratio 1)."""
        b = self.baseline(n_draft)
        return modeled_speedup(self.profile, min(b.l_accept, float(n_draft)), n_draft)

    def evaluate_point(self, method: str, knob: float | None, n_draft: int,
                       on_stage: Callable[[int, dict], None] | None = None) -> tuple[dict, EvalResult]:
        """Evaluate (method, knob, N) in stages; ``on_stage(problems_done, metrics)``
        runs after every stage but the last and may raise to stop (pruning)."""
        strict = self.baseline(n_draft)
        config = DecodeConfig(method, knob, n_draft, self.settings.seed)
        size = self.settings.stage_size
        ends = list(range(size, len(self.problems), size)) + [len(self.problems)]
        for end in ends:
            result = self._evaluate(config, self.problems[:end])
            metrics = point_metrics(strict, result, n_draft, self.profile, self.settings.confidence)
            if end < len(self.problems) and on_stage is not None:
                on_stage(end, metrics)
        return metrics, result

    # ----------------------------------------------------------------- studies

    def pinned(self, method: str) -> dict | None:
        """The one point ``{"knob", "n_draft"}`` the backend can serve for ``method``
        (``sglang_threshold`` on a native speculative server: launch flags), or None."""
        from .engine import native_server

        server = native_server(self.backend, method)
        if server is None:
            return None
        knob, n_draft = server.point()
        return {"knob": knob, "n_draft": n_draft}

    def _distributions(self, method: str) -> dict:
        from optuna.distributions import CategoricalDistribution, FloatDistribution

        spec = get_method(method)
        if (pin := self.pinned(method)) is not None:
            return {"n_draft": CategoricalDistribution([pin["n_draft"]]),
                    "knob": FloatDistribution(pin["knob"], pin["knob"])}
        dist = {"n_draft": CategoricalDistribution(self.settings.n_drafts)}
        if spec.has_knob:
            low, high, log = spec.search
            dist["knob"] = FloatDistribution(low, high, log=log)
        return dist

    def open_study(self, method: str):
        """Create or load the method's study; fail stale RUNNING trials and
        re-enqueue them; enqueue the paper's grid into a new study."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # multivariate TPE
        sampler = optuna.samplers.TPESampler(seed=self.settings.seed, n_startup_trials=4, multivariate=True)
        pin = self.pinned(method)
        pair = getattr(self.backend, "name", "backend")
        name = study_name(self.spec.name, method, pair if pin is None else f"{pair}@t{pin['knob']:g}-n{pin['n_draft']}",
                          self.spec.version)
        study = optuna.create_study(
            storage=self.settings.storage_url, sampler=sampler, study_name=name,
            directions=["maximize", "maximize"], load_if_exists=True,
        )
        trials = study.get_trials(deepcopy=False)
        for t in trials:
            if t.state == optuna.trial.TrialState.RUNNING:  # left by a killed run
                study.enqueue_trial(dict(t.params))
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        if not trials and not self.new_trials:  # export: read what is there, add nothing
            pass
        elif not trials and pin is not None:
            study.enqueue_trial(pin)
        elif not trials:
            spec = get_method(method)
            mid = self.settings.mid_n_draft
            for value in spec.grid or (None,):
                params = {"n_draft": mid} | ({"knob": value} if value is not None else {})
                study.enqueue_trial(params)
        return study

    def tune_method(self, method: str) -> MethodOutcome:
        """Run (or resume) the method's study until it has ``settings.trials``
        completed or pruned trials (or as many failures); one trial when the
        backend serves a single pinned point for the method."""
        import optuna

        spec = get_method(method)
        spec.check_temperature(self.spec.sampling.temperature)
        study = self.open_study(method)
        if self.new_trials:
            study.set_user_attr("problems", len(self.problems))  # what an export must match
        dists = self._distributions(method)
        states = optuna.trial.TrialState
        run_id = self.tracker.start_study(method, study) if self.tracker else None
        done = sum(t.state in (states.COMPLETE, states.PRUNED) for t in study.get_trials(deepcopy=False))
        if done and self.new_trials:
            self.log(f"resuming {study.study_name}: {done} trial(s) already finished")
        while True:
            trials = study.get_trials(deepcopy=False)
            finished = sum(t.state in (states.COMPLETE, states.PRUNED) for t in trials)
            failures = sum(t.state == states.FAIL for t in trials)
            wanted = 1 if self.pinned(method) is not None else self.settings.trials  # one point: one trial
            if not self.new_trials or finished >= wanted or failures >= self.settings.trials:
                break
            trial = study.ask(dists)
            knob, n = trial.params.get("knob"), trial.params["n_draft"]
            last: dict = {}

            def on_stage(done: int, m: dict, trial=trial) -> None:
                last.update(m)
                trial.set_user_attr(f"stage_{done}", {"accuracy": m["accuracy"], "drop_lcb": m["drop_lcb"]})
                if m["drop_lcb"] > self.settings.epsilon:
                    raise optuna.TrialPruned(f"drop >= {m['drop_lcb']:.3f} after {done} problems")

            try:
                metrics, result = self.evaluate_point(method, knob, n, on_stage)
                if not all(math.isfinite(v) for v in (metrics["speedup"], metrics["accuracy"])):
                    raise ValueError(f"non-finite objective {metrics['speedup']}, {metrics['accuracy']}")
            except optuna.TrialPruned as pruned:
                trial.set_user_attr("metrics", last)
                _set_constraints(trial, {"drop_ucb_minus_epsilon": VIOLATED})
                trial.set_user_attr("pruned", str(pruned))
                study.tell(trial, state=states.PRUNED)
                metrics, result, state = last, None, "PRUNED"
            except Exception as err:  # noqa: BLE001 - a failed evaluation must not end the study
                trial.set_user_attr("error", f"{type(err).__name__}: {err}")
                _set_constraints(trial, {"drop_ucb_minus_epsilon": VIOLATED})
                study.tell(trial, state=states.FAIL)
                metrics, result, state = {}, None, "FAIL"
            else:
                trial.set_user_attr("metrics", metrics)
                _set_constraints(trial, constraint_values(metrics, self.settings))
                study.tell(trial, [metrics["speedup"], metrics["accuracy"]])
                state = "COMPLETE"
            if self.tracker:
                self.tracker.log_trial(method, trial.number, trial.params, metrics, state, result)
            self.log(_trial_line(method, trial.number, trial.params, metrics, state, finished + 1, self.settings.trials))
        return MethodOutcome(method, study, choose(study, self.settings), run_id, tokens=study_tokens(study))


def _trial_line(method: str, number: int, params: dict, m: dict, state: str, done: int, total: int) -> str:
    knob = f" {get_method(method).knob}={params['knob']:.3g}" if "knob" in params else ""
    head = f"[{min(done, total)}/{total}] {method}{knob} N={params['n_draft']} (trial {number}): {state}"
    if not m:
        return head
    return (f"{head}, accuracy {m['accuracy']:.3f} vs strict {m['strict_accuracy']:.3f}, drop <= {m['drop_ucb']:.3f}, "
            f"l_accept {m['l_accept']:.2f}, length x{m['length_ratio']:.2f}, speed-up {m['speedup']:.2f} (n={m['n']})")


def choose(study, settings: TuneSettings | None = None):
    """The feasible completed trial with the highest speed-up (then accuracy), or None."""
    candidates = [t for t in study.get_trials(deepcopy=False) if feasible(t, settings)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.values[0], t.values[1], -t.number))


def study_tokens(study) -> int:
    """Model tokens generated by the study's trials (from their metrics)."""
    return int(sum(t.user_attrs.get("metrics", {}).get("tokens", 0) for t in study.get_trials(deepcopy=False)))
