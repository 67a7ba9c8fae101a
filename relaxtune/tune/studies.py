"""Study bookkeeping for many workers: the trial queues of the studies in one Optuna
RDB storage (``storage``: opening it, its lock) shared by every worker process and
host of a tuning job.

- The queue. A study holds exactly the trials it should finish: the paper's grid
  first, then empty trials whose parameters the sampler draws when a worker takes
  them (``Plan``). Workers only run trials they take from this queue (Optuna's
  atomic pop of a WAITING trial), never ``Study.ask`` (which creates a trial when
  the queue is empty), so a study ends at exactly ``Plan.wanted`` finished
  (COMPLETE or PRUNED) trials however many workers run it.
- Heartbeats. A worker records a heartbeat for each trial it runs every
  ``heartbeat`` seconds (``RDBStorage(heartbeat_interval=...)``). A RUNNING trial
  whose last heartbeat is older than the grace period is stale (its worker died):
  it is failed and retried ONCE with the same parameters
  (``RetryHeartbeatStaleTrialCallback(max_retry=1)``: a WAITING copy). A live
  trial is never stale, so opening a study never fails another worker's trial.
  RUNNING trials without our worker mark (left by a relaxtune that kept no
  heartbeats) are stale at once.
- Top-up. Every change of the queue happens under one lock per storage
  (``storage.StorageLock``: a PostgreSQL advisory lock, MySQL ``GET_LOCK``, a file lock
  next to an SQLite file), and is computed from the study's state: whenever the
  study holds fewer live trials (finished, RUNNING or WAITING) than wanted, the
  grid points not tried yet and then empty trials fill the gap, while failed
  evaluations (and stale trials already retried) stay under the failure budget.
  So a failed trial is replaced exactly once, whoever notices.

A study set up with a ``search_digest`` refuses to mix in trials searched on other
problems (``search_problems.check_problems``, under the same lock).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from .search_problems import check_problems
from .storage import open_rdb, storage_lock, write_ahead_log

__all__ = [
    "Plan",
    "TrialQueue",
    "default_worker",
    "failures",
    "finished",
    "MAX_RETRY",
]

MAX_RETRY = 1  # a stale trial runs again once with the same parameters
WORKER_ATTR = "worker"  # user attribute: which worker (host:pid) runs the trial
LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
_WATCH = 0.1  # seconds between two reads of the running trials while a worker waits (TrialQueue.wait)
_log = logging.getLogger(__name__)


def default_worker() -> str:
    """``<host>:<pid>``: the label a worker marks its trials with."""
    return f"{socket.gethostname()}:{os.getpid()}"


def finished(trials: list[FrozenTrial]) -> int:
    """COMPLETE or PRUNED trials."""
    return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)


def _retry_history(trial: FrozenTrial) -> list[int]:
    """Numbers of the stale trials ``trial`` retries, the first one first (Optuna's record)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


def failures(trials: list[FrozenTrial]) -> int:
    """FAIL trials that used up a slot: failed evaluations, and stale trials that
    were not retried (a retried stale trial lives on in its WAITING copy)."""
    retried = {n for t in trials for n in _retry_history(t)}
    return sum(t.state == TrialState.FAIL and t.number not in retried for t in trials)


@dataclass
class Plan:
    """What a study's queue should hold.

    Attributes:
        wanted: finished (COMPLETE or PRUNED) trials the study should reach.
        grid: points (``{"knob", "n_draft"}``) enqueued before any sampled one.
        budget: failures after which a failed trial is no longer replaced.
        suggest: draws a taken trial's parameters (``trial.suggest_*``); enqueued and
            retried trials keep theirs.
        optional: parameters a tried point may lack and still be a grid point (a rule's
            further knobs, which runs from before they were searched did not set: such
            a trial was at the alpha view, as the grid's point is).
    """

    wanted: int
    grid: list[dict]
    budget: int
    suggest: Callable[[optuna.Trial], None] = field(default=lambda trial: None, repr=False)
    optional: tuple[str, ...] = ()


class TrialQueue:
    """The trial queues of one worker's studies in one RDB storage.

    Args:
        url: SQLAlchemy URL of the Optuna storage.
        heartbeat: seconds between heartbeats of a running trial (integer, Optuna's unit).
        stale_after: seconds without a heartbeat after which a RUNNING trial is stale.
        worker: this worker's label (``default_worker()``).
        on_stale: called as ``on_stale(study, trial, retried)`` for each trial this
            worker found stale (``retried``: a WAITING copy runs it again).

    Raises:
        ImportError: the storage's database driver is missing (e.g. ``relaxtune[postgres]``).
    """

    def __init__(
        self,
        url: str,
        heartbeat: int,
        stale_after: int,
        worker: str,
        on_stale: Callable[[optuna.Study, FrozenTrial, bool], None] | None = None,
    ) -> None:
        self.lock = storage_lock(url)
        self.heartbeat_interval, self.worker, self.on_stale = heartbeat, worker, on_stale
        self.plans: dict[str, Plan] = {}
        self._seen: set[tuple[str, int]] = set()  # the running trials the last claim saw (wait)
        engine_kwargs: dict = {"pool_pre_ping": True}
        if self.lock.kind == "sqlite":
            engine_kwargs["connect_args"] = {"timeout": 120}  # workers wait for each other's writes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
            rdb = open_rdb(
                url,
                self.lock,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat,
                grace_period=stale_after,
                heartbeat_stale_trial_callback=self._stale,
            )
        if self.lock.kind == "sqlite":
            write_ahead_log(rdb.engine)
        # Optuna's cache around it, shared by every Study object of this worker (a Trial only
        # works through a cache that has seen it), as create_study/load_study would wrap it
        self.storage = optuna.storages.get_storage(rdb)

    def open(
        self,
        name: str,
        sampler: optuna.samplers.BaseSampler,
        plan: Plan | None,
        attrs: dict | None = None,
        problems: str | None = None,
    ) -> optuna.Study:
        """Create or load the study ``name`` (two objectives, maximised); with a
        ``plan``, set its user ``attrs`` and then top its queue up to the plan (without:
        read only). Under the lock, attrs first: whoever sees the study's trials sees
        its attrs (e.g. ``search_problems``, which a worker starting later checks).
        With ``problems`` (a ``search_digest``), a study holding trials searched on other
        problems is refused under the same lock (``check_problems``), so of two workers
        starting together on other problems the second is refused, not mixed in.
        A study that already holds those attrs and its plan's queue is loaded without
        the lock (reads only), so workers starting together do not queue behind each
        other once the first has set the study up.

        Raises:
            SearchProblemsError: as ``check_problems``.
        """
        if plan is not None:
            try:
                study = optuna.load_study(study_name=name, storage=self.storage, sampler=sampler)
            except KeyError:  # not created yet
                study = None
            if (
                study is not None
                and all(study.user_attrs.get(k) == v for k, v in (attrs or {}).items())
                and not self._lacking(study, plan)
            ):
                self.plans[name] = plan
                return study
        with self.lock():
            study = optuna.create_study(
                storage=self.storage,
                sampler=sampler,
                study_name=name,
                directions=["maximize", "maximize"],
                load_if_exists=True,
            )
            if problems is not None:
                check_problems(study, problems)
            if plan is not None:
                for key, value in (attrs or {}).items():
                    if study.user_attrs.get(key) != value:
                        study.set_user_attr(key, value)
                self.plans[name] = plan
                self._top_up(study, plan)
        return study

    def _top_up(self, study: optuna.Study, plan: Plan) -> bool:
        """Enqueue what the study lacks to reach ``plan.wanted`` live trials; False (and
        nothing enqueued) once its failures reach ``plan.budget``: it takes no more trials."""
        lacking = self._lacking(study, plan)
        if lacking is None:
            return False
        for point in lacking:
            study.enqueue_trial(point)
        return True

    @staticmethod
    def _lacking(study: optuna.Study, plan: Plan) -> list[dict] | None:
        """The points ``_top_up`` would enqueue (the grid's untried points first, then
        empty ones) to bring the study to ``plan.wanted`` live trials; None once its
        failures reach ``plan.budget``."""
        trials = study.get_trials(deepcopy=False)
        if failures(trials) >= plan.budget:
            return None
        missing = plan.wanted - sum(t.state in LIVE for t in trials)
        tried = [t.system_attrs.get("fixed_params", t.params) for t in trials]

        def done(point: dict) -> bool:  # tried already (a tried point may lack plan.optional's keys)
            return any(
                set(t) <= set(point) and all(t[k] == v if k in t else k in plan.optional for k, v in point.items())
                for t in tried
            )

        return ([p for p in plan.grid if not done(p)] + [{}] * max(missing, 0))[: max(missing, 0)]

    def _stale(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Optuna's stale-trial callback (runs under the lock, in ``fail_stale``)."""
        retried = len(_retry_history(trial)) < MAX_RETRY
        self._retry(study, trial)
        _log.warning(
            "trial %d of %s went stale (no heartbeat from %s); %s",
            trial.number,
            study.study_name,
            trial.user_attrs.get(WORKER_ATTR, "an unknown worker"),
            "retried with the same parameters" if retried else "already retried once: replaced",
        )
        if self.on_stale is not None:
            self.on_stale(study, trial, retried)

    def _fail_stale(self, study: optuna.Study) -> None:
        """Fail the study's stale trials (heartbeat older than the grace period, or none
        kept at all) and hand each to ``_stale``; under the lock."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if WORKER_ATTR not in t.user_attrs:  # no worker keeps its heartbeat: left by a killed older run
                self._stale(study, study.tell(t.number, state=TrialState.FAIL))

    def claim(
        self, studies: dict[str, optuna.Study], sampler_for: Callable[[str, int], optuna.samplers.BaseSampler]
    ) -> tuple[str, optuna.Trial] | str | None:
        """Take the next trial of the study with the fewest running trials (ties: in
        order) among those with one waiting, so the workers spread over the studies:
        each study's sampler and speed bar then see more finished trials before they
        draw or prune the next (with 4 workers on 2 studies, 2 trials of each run at
        once, not 4 of the first).

        Under the lock: fail stale trials (they come back as retries), top every
        queue up to its plan, pop a WAITING trial (none from a study whose failures
        spent its budget), record its first heartbeat, mark it with this worker and
        draw its parameters (with ``sampler_for(key, number)``).

        Returns:
            ``(key, trial)``; ``"wait"`` when no trial is waiting but some still run
            (a stale one may come back); None when every study is finished.
        """
        with self.lock():
            for study in studies.values():
                self._fail_stale(study)
            running = {key: self._running({key: study}) for key, study in studies.items()}
            self._seen = set().union(*running.values())
            for key in sorted(studies, key=lambda k: len(running[k])):  # stable: ties keep the studies' order
                study = studies[key]
                plan = self.plans.get(study.study_name)
                open_ = plan is None or self._top_up(study, plan)
                trial_id = self.pop(study) if open_ else None
                if trial_id is None:  # (the others' running trials still end before the studies are done)
                    continue
                self.storage.record_heartbeat(trial_id)
                number = self.storage.get_trial_number_from_id(trial_id)
                own = optuna.load_study(
                    study_name=study.study_name, storage=self.storage, sampler=sampler_for(key, number)
                )
                trial = optuna.Trial(own, trial_id)
                trial.set_user_attr(WORKER_ATTR, self.worker)
                if plan is not None:
                    plan.suggest(trial)
                return key, trial
        return "wait" if self._seen else None

    @contextmanager
    def heartbeat(self, trial: optuna.Trial) -> Iterator[None]:
        """Record ``trial``'s heartbeat when the block starts and every ``heartbeat`` seconds
        while it runs (the first at once: the time since the claim's beat, a cold sampler's
        first draw included, never adds to a full interval)."""
        stop = threading.Event()
        trial_id = self.trial_id(trial.study.study_name, trial.number)

        def beat() -> None:
            while True:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as err:
                    _log.warning("heartbeat of trial %d failed: %s", trial.number, err)
                if stop.wait(self.heartbeat_interval):
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def wait(self, studies: dict[str, optuna.Study] | None = None) -> None:
        """Sleep between two looks at a queue with nothing waiting: a fraction of a
        heartbeat, cut short as soon as a running trial of ``studies`` ends (its worker
        told it, or it was failed as stale), so that waiting workers take a retry, or
        see the studies finished, within ``_WATCH`` seconds (one small read each). The
        trials the last ``claim`` saw running count too: one that ended between that
        claim and this wait ends it at the first read."""
        interval = min(5.0, max(0.2, self.heartbeat_interval / 2))
        if not studies:
            time.sleep(interval)
            return
        seen, deadline = self._seen | self._running(studies), time.monotonic() + interval
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(_WATCH, left))
            now = self._running(studies)
            if not seen <= now:  # one ended
                return
            seen = now

    def _running(self, studies: dict[str, optuna.Study]) -> set[tuple[str, int]]:
        """``(study name, trial number)`` of the RUNNING trials of ``studies`` (read without the lock)."""
        return {
            (study.study_name, t.number)
            for study in studies.values()
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        }

    def trial_id(self, study_name: str, number: int) -> int:
        """The storage's id of trial ``number`` of the study ``study_name`` (public storage API)."""
        return self.storage.get_trial_id_from_study_id_trial_number(
            self.storage.get_study_id_from_name(study_name), number
        )

    def pop(self, study: optuna.Study) -> int | None:
        """Take the first WAITING trial of ``study`` (RUNNING now) and return its id; None when
        none waits. Atomic between workers: the storage moves a trial to RUNNING only from
        WAITING (``RDBStorage.set_trial_state_values`` returns False, or raises for a finished
        one, when another worker took it first), as Optuna's own queue pop does."""
        study_id = self.storage.get_study_id_from_name(study.study_name)
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            try:
                if self.storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                    return trial_id
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        return None
