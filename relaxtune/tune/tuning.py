"""Tune the relaxation knob (and draft length) per task and method under a
capability-loss constraint.

One Optuna study per (task, method, pair), named ``<task>__<method>__<pair>``, in
an RDB storage that any number of worker processes and hosts share
(``relaxtune.tune.studies``: each study's queue holds exactly ``trials`` trials, the
paper's grid first; workers only run trials they take from it; heartbeats tell a
dead worker's trial, which is retried once with the same parameters, and its
finished samples are reused from the JSONL records). After the grid, the
sampler is ``relaxtune.tune.search.RelaxationSampler``: it moves the fastest feasible
knob to the draft length its measured acceptance predicts fastest and bisects
between the strongest feasible and the weakest infeasible relaxation, else
draws from multi-objective TPE with constraints (``Trial.set_constraint``);
both are seeded per trial number and count running trials as tried, so workers
draw different points:

- objectives: modeled speed-up ``S_relax`` at the chosen cost profile, and accuracy;
- constraint: ``UCB(accuracy drop vs strict) - epsilon <= 0``, the upper
  one-sided ``confidence`` bound of the PAIRED drop (same problems, repeats and
  seeds for strict and the trial: common random numbers; ``relaxtune.certify.stats.drop_bound``),
  plus optional rambling guards (length ratio, truncated share). A point strict
  dominates is never chosen (``choose``); the job confirms the chosen point on
  fresh samples (``relaxtune.tune.confirm``).

Cost control: a trial is evaluated in stages of ``stage_size`` problems and
pruned as soon as the lower bound of its drop already exceeds epsilon, or the
upper bound of its speed-up falls below the ``confirmations``-th fastest
feasible point's (it could never be confirmed); the grid runs strongest
relaxation first, so that its weaker, slower points are the ones cut. Strict
runs once per (task, pair, N, seed) and is reused by every study (its records
are cached on disk); it also stands for AR (same output distribution), giving
``L_AR``. A failed or NaN evaluation is a FAILED trial, never a crash, replaced
by a new one while fewer than ``trials`` have failed; pruned and failed trials
count as violating the constraint.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from ..decoding.methods import get_method
from ..decoding.scope import scopes_of
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile, modeled_speedup
from ..tasks.spec import Problem, TaskSpec
from .batches import strict_speedup
from .claims import claim, claim_path
from .evaluation import evaluate
from .helping import help_running, stage_attr
from .job_identity import study_name
from .judge import VIOLATED, constraint_values, drop_ucb_at, feasible, point_metrics
from .judge import set_constraints as _set_constraints
from .outcomes import MethodOutcome, TrialReport, candidates, choose, study_tokens, trial_line
from .phases import phase
from .point_records import SCOPE_PARAM, DecodeConfig, EvalResult, records_name, records_path, trial_scope
from .ranges import merge, split, stage_ends, worker_order
from .records import metrics_attr
from .result import JobResult
from .search import PRUNED_BY, RelaxationSampler, n_draft_choices, strength, valid_n
from .search_problems import search_digest
from .settings import TuneSettings, make_output_dir, storage_url
from .stopping import check_stop, environmental
from .studies import Plan, TrialQueue, default_worker, finished

__all__ = [
    "TuneSettings",
    "Tuner",
    "point_metrics",
    "study_name",
    "MethodOutcome",
    "TrialReport",
    "feasible",
    "choose",
    "candidates",
    "constraint_values",
    "drop_ucb_at",
    "study_tokens",
]


RangeRunner = Callable[[DecodeConfig, list[Problem], list[range]], list[EvalResult]]


@dataclass
class Tuner:
    """Runs the studies of one task, as one worker among any number sharing the storage.

    Args:
        settings: the job.
        spec: the task; problems: its loaded problems.
        backend: the model pair.
        profile: the measured ``ServingProfile`` (weighted as the search prices:
            ``modeled_speedup`` reads its objective), a ``CostProfile`` or a c_rel value.
        tracker: an optional ``relaxtune.report.tracking.Tracker``.
        evaluate_fn: how a range of problems is evaluated; default
            ``relaxtune.tune.evaluation.evaluate``.
        progress: show progress bars.
        new_trials: run trials (False: only read what the studies hold, for export).
        log: receives one line per finished trial.
        worker: this worker's label in the studies (default ``<host>:<pid>``).
        run_ranges: ``run_ranges(config, problems, ranges)`` evaluates a configuration
            on ranges of ``problems`` (indices, ``settings.range_size`` problems each)
            and returns the results in range order (the Prefect flow submits them as
            concurrent task runs, naming the problems by id); default:
            ``evaluate_fn`` on one range after the other, in an order drawn from
            ``worker``, so that workers evaluating the same configuration spread over
            its ranges.
        on_baseline: ``on_baseline(n_draft, result, seconds)`` after strict at N was
            evaluated by this worker (not read from memory), with its wall seconds (the
            job revises its time estimate from it).
    """

    settings: TuneSettings
    spec: TaskSpec
    problems: list[Problem]
    backend: object
    profile: ServingProfile | CostProfile | float
    tracker: object | None = None
    evaluate_fn: Callable[..., EvalResult] | None = None
    progress: bool = True
    new_trials: bool = True
    log: Callable[[str], None] = lambda message: None
    baselines: dict[int, EvalResult] = field(default_factory=dict)
    worker: str = field(default_factory=default_worker)
    run_ranges: RangeRunner | None = None
    on_baseline: Callable[[int, EvalResult, float], None] | None = None

    def __post_init__(self) -> None:
        self._baseline_lock = threading.Lock()
        self._queue: TrialQueue | None = None
        self._studies: dict[str, object] = {}
        self._helped: set = set()  # ranges of other trials this worker took (relaxtune.tune.helping)

    # ------------------------------------------------------------- evaluation

    def evaluate_range(
        self, config: DecodeConfig, problems: list[Problem], r: range, *, claimed: bool
    ) -> EvalResult | None:
        """``problems[r]`` evaluated under ``config`` as this tuner evaluates (its
        evaluation function, task, backend, output folder and progress). With
        ``claimed``, only under the range's claim (``relaxtune.tune.claims``): None,
        without evaluating, when another worker holds it; the claim is let go once the
        range is recorded (an evaluation's own error propagates)."""
        part = problems[r.start : r.stop]
        run = functools.partial(
            self.evaluate_fn or evaluate,
            self.spec,
            self.backend,
            config,
            output_dir=self.settings.output_dir,
            problems=part,
            progress=self.progress,
        )
        if not claimed:
            return run()
        records = records_path(
            Path(self.settings.output_dir), self.spec, config, records_name(self.backend, config.method)
        )
        with claim(claim_path(records, [p.id for p in part]), wait=False) as mine:
            return run() if mine else None

    def _evaluate(self, config: DecodeConfig, problems: list[Problem]) -> EvalResult:
        ranges = split(len(problems), self.settings.range_size)
        if self.run_ranges is not None:
            return merge(self.run_ranges(config, problems, ranges))
        if len(ranges) == 1:
            return self.evaluate_range(config, problems, ranges[0], claimed=False)
        # the ranges no other worker holds first, then the others (by then recorded: read, not generated)
        results, held = {}, []
        for r in worker_order(ranges, self.worker):
            result = self.evaluate_range(config, problems, r, claimed=True)
            if result is None:
                held.append(r)
            else:
                results[r.start] = result
        for r in held:
            results[r.start] = self.evaluate_range(config, problems, r, claimed=False)
        return merge([results[r.start] for r in ranges])

    def evaluate_ranges(
        self, spec: TaskSpec, backend, config: DecodeConfig, *, output_dir, problems: list[Problem], progress: bool
    ) -> EvalResult:
        """``evaluate``'s signature, run as the tuner runs an evaluation: in ranges of
        ``settings.range_size`` problems, claimed (``relaxtune.tune.claims``), so workers
        confirming the same point share its samples and generate each once (the
        tuner's own task, pair and output folder). Under a flow (``run_ranges``), one
        evaluation in this process, as before (claimed by ``evaluate`` itself)."""
        if self.run_ranges is not None:
            return (self.evaluate_fn or evaluate)(
                spec, backend, config, output_dir=output_dir, problems=problems, progress=progress
            )
        return self._evaluate(config, problems)

    def baseline(self, n_draft: int) -> EvalResult:
        """Strict at draft length N on all problems (cached in memory and on disk)."""
        with self._baseline_lock:
            if n_draft not in self.baselines:
                config = DecodeConfig("strict", None, n_draft, self.settings.seed)
                started = time.perf_counter()
                with phase("strict"):
                    self.baselines[n_draft] = self._evaluate(config, self.problems)
                if self.on_baseline is not None:
                    self.on_baseline(n_draft, self.baselines[n_draft], time.perf_counter() - started)
            return self.baselines[n_draft]

    def strict_speedup(self, n_draft: int) -> float:
        """Modeled speed-up of strict at N (length ratio 1)."""
        return strict_speedup(self.profile, self.baseline(n_draft).l_accept, n_draft)

    def strict_points(self) -> dict[int, tuple[float, float]]:
        """Strict at every draft length evaluated so far: N -> (modeled speed-up, accuracy)."""
        return {n: (self.strict_speedup(n), b.accuracy) for n, b in sorted(self.baselines.items())}

    def evaluate_point(
        self,
        method: str,
        knob: float | None,
        n_draft: int,
        on_stage: Callable[[int, dict], None] | None = None,
        extra: tuple = (),
        scope: str = "all",
    ) -> tuple[dict, EvalResult]:
        """Evaluate (method, knob, N, further knobs ``extra``: ``DecodeConfig.extra``) at a
        relaxation scope in stages; ``on_stage(problems_done, metrics)`` runs after every
        stage but the last and may raise to stop (pruning)."""
        strict = self.baseline(n_draft)
        config = DecodeConfig(method, knob, n_draft, self.settings.seed, scope, extra)
        for end in stage_ends(len(self.problems), self.settings.stage_size):
            check_stop()
            result = self._evaluate(config, self.problems[:end])
            metrics = point_metrics(strict, result, n_draft, self.profile, self.settings.confidence)
            if end < len(self.problems) and on_stage is not None:
                on_stage(end, metrics)
        return metrics, result

    # ----------------------------------------------------------------- studies

    def pinned(self, method: str) -> dict | None:
        """The one point ``{"knob", "n_draft"}`` the backend can serve for ``method``
        (``sglang_threshold`` on a native speculative server: launch flags), or None."""
        from ..engine.sequence import native_server

        server = native_server(self.backend, method)
        if server is None:
            return None
        knob, n_draft = server.point()
        return {"knob": knob, "n_draft": n_draft}

    def result(
        self, outcomes: list[MethodOutcome], confirmations: dict | None = None, confirm_problems: int | None = None
    ) -> JobResult:
        """The finished job, frozen, for ``report/`` (the tuned config, MLflow, figures):
        strict at every draft length evaluated so far, ``outcomes`` and their
        ``confirmations`` (method -> ``Confirmation``), ``confirm_problems`` (default:
        the search's problems)."""
        return JobResult(
            settings=self.settings.model_copy(deep=True),
            spec=self.spec,
            problems=len(self.problems),
            confirm_problems=confirm_problems or len(self.problems),
            baselines=dict(sorted(self.baselines.items())),
            strict_speedups={n: self.strict_speedup(n) for n in sorted(self.baselines)},
            outcomes=tuple(outcomes),
            confirmations=dict(confirmations or {}),
            profile=self.profile,
            pinned=frozenset(o.method for o in outcomes if self.pinned(o.method) is not None),
        )

    def _suggest(self, method: str) -> Callable:
        """Draws a taken trial's parameters (enqueued and retried trials keep theirs): the draft
        length, alpha as ``knob`` and each further named knob under its engine name
        (``relaxtune.tune.search``)."""
        spec, pin = get_method(method), self.pinned(method)

        def suggest(trial) -> None:
            if pin is not None:
                trial.suggest_categorical("n_draft", [pin["n_draft"]])
                trial.suggest_float("knob", pin["knob"], pin["knob"])
                self._suggest_scope(trial)
                return
            valid = [n for n in self.settings.n_drafts if valid_n(spec, n)]  # FLy: N >= 2
            n = trial.suggest_categorical("n_draft", n_draft_choices(trial.study, valid))
            if spec.has_knob:
                low, high, log = spec.search
                trial.suggest_float("knob", low, high, log=log)
            for k in spec.further_knobs:  # each further knob under its engine name, in its range at N
                low, high = k.search_at(n)
                if k.kind == "int":
                    trial.suggest_int(k.name, int(low), int(high))
                else:
                    trial.suggest_float(k.name, low, high, log=k.log)
            self._suggest_scope(trial)

        return suggest

    def _suggest_scope(self, trial) -> None:
        """A trial's relaxation scope, for a job whose ``--relaxation-scope`` is not ``all``
        (``both``: a categorical dimension); a job of scope all keeps its trials' parameters."""
        if self.settings.relaxation_scope != "all":
            trial.suggest_categorical(SCOPE_PARAM, list(scopes_of(self.settings.relaxation_scope)))

    def sampler(self, method: str, number: int):
        """The sampler that draws trial ``number`` of ``method``'s study: ``RelaxationSampler``
        (``relaxtune.tune.search``) over multivariate TPE, seeded by (seed, number), so a trial's
        draw does not depend on which worker takes it or how many draws came before."""
        import optuna

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # multivariate TPE
        seed = (self.settings.seed * 1_000_003 + number) % 2**32
        tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True, constant_liar=True)
        speed = lambda l_accept, n, ratio: modeled_speedup(self.profile, min(l_accept, n), n, 1.0, ratio)  # noqa: E731
        return RelaxationSampler(method, self.settings.n_drafts, speed, tpe)

    @property
    def queue(self) -> TrialQueue:
        """The studies' storage and queues (opened on first use)."""
        if self._queue is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            s = self.settings
            if s.stores.storage is None:  # the default SQLite file lies in the output folder
                make_output_dir(s.stores)
            self._queue = TrialQueue(storage_url(s.stores), s.heartbeat, s.stale_after, self.worker, self._on_stale)
        return self._queue

    def open_study(self, method: str):
        """Create or load the method's study; when running trials, top its queue up to
        ``settings.trials`` (one for a pinned point), the paper's grid first.

        Raises:
            SearchProblemsError: with ``--confirm holdout``, a study holding trials searched
                on other problems (checked under the storage's lock, as the study is set up).
        """
        pin = self.pinned(method)
        pair = getattr(self.backend, "name", "backend")
        name = study_name(
            self.spec.name,
            method,
            pair if pin is None else f"{pair}@t{pin['knob']:g}-n{pin['n_draft']}",
            self.spec.version,
            self.settings.relaxation_scope,
        )
        plan = None
        if self.new_trials:
            grid = [pin] if pin is not None else self.grid_points(method)
            wanted = 1 if pin is not None else self.settings.trials  # one point: one trial
            optional = tuple(k.name for k in get_method(method).further_knobs)  # runs from before they were searched
            plan = Plan(wanted, grid, self.settings.trials, self._suggest(method), optional)
        digest = search_digest(self.problems)
        return self.queue.open(
            name,
            self.sampler(method, 0),
            plan,
            {"search_problems": digest},
            problems=digest if self.new_trials and self.settings.confirm == "holdout" else None,
        )

    def grid_points(self, method: str) -> list[dict]:
        """The points (``{"knob", "n_draft"}``) a study's queue holds before any sampled
        one: the paper's grid values at the middle draft length, the strongest relaxation
        first (``relaxtune.tune.search.strength``), so the weaker ones that follow a feasible
        one are slower and pruned by speed after a stage. A rule's further knobs are at the
        alpha view there (``MethodSpec.alpha_view``: SGLang's thresholds tied, FLy's
        W = min(6, N - 1) and k = 3, TensorRT-LLM's top-k 10). A rule that cannot run at the
        middle draft length (FLy at N = 1) has its grid at the nearest one it runs at."""
        mid, spec = self.settings.mid_n_draft, get_method(method)
        if not valid_n(spec, mid):  # check_methods saw to it that one of n_drafts is valid
            mid = min((n for n in self.settings.n_drafts if valid_n(spec, n)), key=lambda n: (abs(n - mid), n))
        knobs = sorted(spec.grid, key=lambda k: -strength(spec, k)) if spec.has_knob else [None]
        return [{"n_draft": mid} | ({"knob": v} | spec.alpha_view(v, mid) if v is not None else {}) for v in knobs]

    def tune(self, methods: list[str], submit: Callable[[Callable], Future] | None = None) -> list[MethodOutcome]:
        """Run (or resume, or join other workers on) the methods' studies until each
        has its wanted number of completed or pruned trials (``settings.trials``, one
        for a pinned point) or as many failures; then choose each method's point.

        Args:
            methods: method ids, tuned in this order (their queues are drained together).
            submit: ``submit(next_trial)`` starts one call of it and returns its future (the
                Prefect flow submits a task run); default: ``settings.parallel_trials`` threads.
        """
        studies, run_ids = {}, {}
        for method in methods:
            get_method(method).check_temperature(self.spec.sampling.temperature)
            study = studies[method] = self.open_study(method)
            if self.new_trials:
                study.set_user_attr("problems", len(self.problems))  # what an export must match
                if done := finished(study.get_trials(deepcopy=False)):
                    self.log(f"resuming {study.study_name}: {done} trial(s) already finished")
            if self.tracker:
                run_ids[method] = self.tracker.start_study(method, study)
        if self.new_trials:
            self._studies = studies
            self._drive(submit)
        strict = self.strict_points()
        return [
            MethodOutcome(
                m, study, choose(study, self.settings.stats, strict), run_ids.get(m), tokens=study_tokens(study)
            )
            for m, study in studies.items()
        ]

    def tune_method(self, method: str) -> MethodOutcome:
        """``tune([method])``: one method's study."""
        return self.tune([method])[0]

    def _drive(self, submit: Callable[[Callable], Future] | None) -> None:
        """Keep ``settings.parallel_trials`` ``next_trial`` calls in flight until the studies are done."""
        lanes = self.settings.parallel_trials
        if submit is None and lanes == 1:
            while self.next_trial() is not None:
                pass
            return
        pool = ThreadPoolExecutor(lanes, thread_name_prefix="trial") if submit is None else None
        submit = submit or pool.submit
        try:
            pending = {submit(self.next_trial) for _ in range(lanes)}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    if future.result() is not None:  # this lane ran a trial: look for the next one
                        pending.add(submit(self.next_trial))
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def next_trial(self) -> TrialReport | None:
        """Take the next waiting trial of the studies ``tune`` opened and run it;
        while none is waiting but some still run (here or on other workers), help
        them (``relaxtune.tune.helping``: a range of a running trial's stage) or wait
        for one to finish or go stale. None when every study is finished."""
        while True:
            claim = self.queue.claim(self._studies, self.sampler)
            if claim is None:
                return None
            if claim == "wait":
                if not help_running(self, self._studies, self._helped):
                    self.queue.wait(self._studies)
                continue
            method, trial = claim
            return self._run_trial(method, trial)

    def _run_trial(self, method: str, trial) -> TrialReport:
        import optuna

        point = DecodeConfig.of_point(method, trial.params, self.settings.seed, trial_scope(trial.params))
        last: dict = {}
        bar: list = []  # [speed bar, when looked up]: again after a heartbeat interval

        def on_stage(done: int, m: dict) -> None:
            last.update(m)
            pruned = None
            if m["drop_lcb"] > self.settings.epsilon:
                pruned = "drop", f"drop >= {m['drop_lcb']:.3f} after {done} problems"
            else:
                if time.monotonic() - bar[1] >= self.settings.heartbeat:  # other workers may have finished trials
                    bar[:] = self.speed_bar(trial.study), time.monotonic()
                if bar[0] is not None and m["speedup_ucb"] < bar[0]:
                    pruned = (
                        "speed",
                        (
                            f"speed-up <= {m['speedup_ucb']:.3f} after {done} problems, below {bar[0]:.3f}: "
                            f"slower than {self.settings.confirmations} feasible point(s)"
                        ),
                    )
            if pruned:  # before the stage's attr: a helping worker never takes the next stage of a pruned trial
                trial.set_user_attr(PRUNED_BY, pruned[0])
            trial.set_user_attr(
                stage_attr(done),
                {"accuracy": m["accuracy"], "drop_lcb": m["drop_lcb"], "speedup_ucb": m["speedup_ucb"]},
            )
            if pruned:
                raise optuna.TrialPruned(pruned[1])

        result, note = None, None
        with self.queue.heartbeat(trial):  # first: the bar's lookup reads every trial of the study
            bar[:] = self.speed_bar(trial.study), time.monotonic()
            try:
                metrics, result = self.evaluate_point(
                    method, point.knob, point.n_draft, on_stage, point.extra, point.scope
                )
                if not all(math.isfinite(v) for v in (metrics["speedup"], metrics["accuracy"])):
                    raise ValueError(f"non-finite objective {metrics['speedup']}, {metrics['accuracy']}")
                state = "COMPLETE"
            except optuna.TrialPruned as pruned:
                metrics, state, note = last, "PRUNED", str(pruned)
            except optuna.exceptions.UpdateFinishedTrialError:
                metrics, state = {}, "LOST"
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the trial waits for the resume, first in line
                self._requeue(method, trial, "stopped")
                raise
            except Exception as err:
                if environmental(err):  # the machine failed, not the trial: the job stops, the trial waits
                    self._requeue(method, trial, f"{type(err).__name__}")
                    raise
                metrics, state, note = {}, "FAIL", f"{type(err).__name__}: {err}"
            if state != "LOST":
                state = self._tell(trial, state, metrics, note, method)
        report = TrialReport(method, trial.number, dict(trial.params), state, metrics)
        if state == "LOST":
            self.log(
                f"{method} trial {trial.number} was declared stale by another worker (no heartbeat within "
                f"{self.settings.stale_after} s) and runs again there; nothing of it is kept here"
            )
            return report
        if self.tracker:
            self.tracker.log_trial(method, trial.number, trial.params, metrics, state, result)
        done = finished(trial.study.get_trials(deepcopy=False))
        self.log(trial_line(method, trial.number, trial.params, metrics, state, done, self.settings.trials))
        return report

    def _requeue(self, method: str, trial, why: str) -> None:
        """Put a trial this worker was running back into its study's queue (WAITING, same
        parameters, same number), so the next worker (a resume) takes it first, with no
        wait for its heartbeat to go stale and no retry spent; its finished samples are
        in the records."""
        from .optuna_compat import requeue

        try:
            with self.queue.lock():
                trial.set_user_attr("requeued", f"{why} on {self.worker}")
                requeue(self.queue.storage, self.queue.trial_id(trial.study.study_name, trial.number))
            self.log(f"{method} trial {trial.number} goes back to its queue ({why}): the resume runs it first")
        except Exception as err:
            self.log(
                f"{method} trial {trial.number} could not go back to its queue ({type(err).__name__}: {err}); "
                f"it is retried once its heartbeat is older than {self.settings.stale_after} s"
            )

    def speed_bar(self, study) -> float | None:
        """The modeled speed-up a trial must be able to exceed to matter: that of the study's
        ``settings.confirmations``-th fastest candidate (``candidates``: every point the job
        could confirm is at least as fast), None while it has fewer candidates."""
        ranked = candidates(study, self.settings.stats, self.strict_points())
        k = self.settings.confirmations
        return ranked[k - 1].values[0] if len(ranked) >= k else None

    def _tell(self, trial, state: str, metrics: dict, note: str | None, method: str) -> str:
        """Store the trial's outcome (its metrics as a v3 ``metrics`` attribute,
        ``relaxtune.tune.records``); LOST when another worker failed it as stale meanwhile."""
        import optuna

        declared = self.profile.declared if isinstance(self.profile, ServingProfile) else 1
        point = DecodeConfig.of_point(method, trial.params, self.settings.seed, trial_scope(trial.params))
        stored = metrics_attr(metrics, method, point.point_knob, point.scope, declared) if metrics else metrics

        states = optuna.trial.TrialState
        try:
            if state == "COMPLETE":
                trial.set_user_attr("metrics", stored)
                _set_constraints(trial, constraint_values(metrics, self.settings.stats))
                trial.study.tell(trial, [metrics["speedup"], metrics["accuracy"]])
            else:
                attrs = {"metrics": stored, "pruned": note} if state == "PRUNED" else {"error": note}
                for key, value in attrs.items():
                    trial.set_user_attr(key, value)
                _set_constraints(trial, {"drop_ucb_minus_epsilon": VIOLATED})
                trial.study.tell(trial, state=states[state])
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            now = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
            if now.state != states.FAIL:
                raise
            return "LOST"
        return state

    def _on_stale(self, study, trial, retried: bool) -> None:
        """A trial of one of our studies went stale (found by this worker): log it as failed;
        one whose worker died after taking it but before drawing its point has no
        parameters and never ran: it gets no MLflow run (as ``Tracker.finish``'s backfill)."""
        method = next((m for m, s in self._studies.items() if s.study_name == study.study_name), None)
        what = "retried with the same parameters" if retried else "already retried once: replaced by a new trial"
        self.log(
            f"{study.study_name} trial {trial.number} went stale (no heartbeat from "
            f"{trial.user_attrs.get('worker', 'its worker')} for {self.settings.stale_after} s): {what}"
        )
        if self.tracker and method is not None and "n_draft" in trial.params:
            self.tracker.log_trial(method, trial.number, trial.params, {}, "FAIL", None, note=f"stale: {what}")
