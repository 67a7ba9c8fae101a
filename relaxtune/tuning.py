"""Tune the relaxation knob (and draft length) per task and method under a
capability-loss constraint.

One Optuna study per (task, method, pair), named ``<task>__<method>__<pair>``, in
an RDB storage with ``load_if_exists`` (a killed job resumes; trials left
RUNNING are failed and re-enqueued, and their finished samples are reused from
the JSONL records). The sampler is multi-objective TPE with constraints (``Trial.set_constraint``):

- objectives: modeled speed-up ``S_relax`` at the chosen cost profile, and accuracy;
- constraint: ``UCB(accuracy drop vs strict) - epsilon <= 0``, the upper
  one-sided ``confidence`` bound of the PAIRED drop (same problems, repeats and
  seeds for strict and the trial: common random numbers; ``relaxtune.stats.drop_bound``),
  plus optional rambling guards (length ratio, truncated share). A point strict
  dominates is never chosen (``choose``); the job confirms the chosen point on
  fresh samples (``relaxtune.confirm``).

Cost control: a trial is evaluated in stages of ``stage_size`` problems and
pruned as soon as the lower bound of its drop already exceeds epsilon. Strict
runs once per (task, pair, N, seed) and is reused by every study (its records
are cached on disk); it also stands for AR (same output distribution), giving
``L_AR``. A failed or NaN evaluation is a FAILED trial, never a crash; pruned
and failed trials count as violating the constraint.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

from .evaluation import DecodeConfig, EvalResult, evaluate
from .judge import VIOLATED, constraint_values, drop_ucb_at, feasible, point_metrics
from .judge import set_constraints as _set_constraints
from .methods import get_method
from .settings import TuneSettings, study_name
from .speed import CostProfile, modeled_speedup
from .tasks import Problem, TaskSpec

__all__ = ["TuneSettings", "Tuner", "point_metrics", "study_name", "MethodOutcome", "feasible", "choose", "candidates",
           "constraint_values", "drop_ucb_at", "study_tokens"]


@dataclass
class MethodOutcome:
    """The result of one method's study.

    Attributes:
        method: method id; study: the Optuna study (name, trials).
        chosen: the chosen feasible trial (``choose``: max speed-up, then accuracy, not dominated by
            strict), or None.
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

    def strict_points(self) -> dict[int, tuple[float, float]]:
        """Strict at every draft length evaluated so far: N -> (modeled speed-up, accuracy)."""
        return {n: (self.strict_speedup(n), b.accuracy) for n, b in sorted(self.baselines.items())}

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
        return MethodOutcome(method, study, choose(study, self.settings, self.strict_points()), run_id,
                             tokens=study_tokens(study))


def _trial_line(method: str, number: int, params: dict, m: dict, state: str, done: int, total: int) -> str:
    knob = f" {get_method(method).knob}={params['knob']:.3g}" if "knob" in params else ""
    head = f"[{min(done, total)}/{total}] {method}{knob} N={params['n_draft']} (trial {number}): {state}"
    if not m:
        return head
    return (f"{head}, accuracy {m['accuracy']:.3f} vs strict {m['strict_accuracy']:.3f}, drop <= {m['drop_ucb']:.3f}, "
            f"l_accept {m['l_accept']:.2f}, length x{m['length_ratio']:.2f}, speed-up {m['speedup']:.2f} (n={m['n']})")


def candidates(study, settings: TuneSettings | None = None, strict: dict[int, tuple[float, float]] | None = None) -> list:
    """The feasible completed trials, best first (speed-up, then accuracy), one per
    point (knob, N), leaving out every trial strict dominates: ``strict`` maps each
    evaluated draft length to strict's (modeled speed-up, accuracy), and strict at
    some N dominates a trial that is no faster and no more accurate."""
    seen, out = set(), []
    for t in sorted((t for t in study.get_trials(deepcopy=False) if feasible(t, settings)),
                    key=lambda t: (-t.values[0], -t.values[1], t.number)):
        point = (t.params.get("knob"), t.params["n_draft"])
        if point in seen or any(s >= t.values[0] and a >= t.values[1] for s, a in (strict or {}).values()):
            continue
        seen.add(point)
        out.append(t)
    return out


def choose(study, settings: TuneSettings | None = None, strict: dict[int, tuple[float, float]] | None = None):
    """The best of ``candidates`` (the feasible trial with the highest speed-up,
    then accuracy, that strict does not dominate), or None."""
    ranked = candidates(study, settings, strict)
    return ranked[0] if ranked else None


def study_tokens(study) -> int:
    """Model tokens generated by the study's trials (from their metrics)."""
    return int(sum(t.user_attrs.get("metrics", {}).get("tokens", 0) for t in study.get_trials(deepcopy=False)))
