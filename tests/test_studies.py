"""Several workers on one study (threads here, each with its own storage objects, on
one SQLite file): exact trial counts, live trials never failed, stale trials retried
once, the storage lock."""

import threading
import time

import optuna
import pytest

from relaxtune.tune.ranges import merge, split, worker_order
from relaxtune.tune.storage import StorageLock
from relaxtune.tune.studies import TrialQueue, failures
from relaxtune.tune.tuning import Tuner, TuneSettings

from .synthetic import PROBLEMS, SPEC, Synthetic, SyntheticPair

NAME = "synthetic-v2__cactus__synthetic-pair"


def make(tmp_path, worker: str, synthetic=None, **over) -> Tuner:
    fields = (
        dict(
            task="synthetic",
            methods=["cactus"],
            n_drafts=[4],
            trials=6,
            stage_size=20,
            output_dir=str(tmp_path),
            c_rel=0.2,
            heartbeat=1,
            grace_period=3,
            epsilon=0.1,
        )
        | over
    )  # 40 problems certify no smaller drop (1 - 0.1 ** (1 / 40) = 0.056)
    return Tuner(
        TuneSettings(**fields),
        SPEC,
        PROBLEMS[:40],
        SyntheticPair(),
        0.2,
        progress=False,
        worker=worker,
        evaluate_fn=synthetic or Synthetic(cliff=1.0, delay=0.01),
    )


def run_together(tuners: list[Tuner], method: str = "cactus") -> list:
    """Each tuner's ``tune_method`` in its own thread; their outcomes."""
    outcomes: list = [None] * len(tuners)
    errors: list = []
    all_started = threading.Barrier(len(tuners), timeout=120)  # no worker runs ahead before the others exist

    def work(i: int) -> None:
        try:
            all_started.wait()
            outcomes[i] = tuners[i].tune_method(method)
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(tuners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return outcomes


def trials_of(tmp_path) -> list:
    return optuna.load_study(study_name=NAME, storage=f"sqlite:///{tmp_path / 'optuna.db'}").trials


def test_workers_finish_exactly_the_wanted_trials_and_agree(tmp_path):
    tuners = [make(tmp_path, f"w{i}", trials=7) for i in range(3)]
    tuners[2].settings.parallel_trials = 2  # a worker running two trials at once
    outcomes = run_together(tuners)
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials].count("FAIL") == 0
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == len(trials) == 7
    grid = [t.params["knob"] for t in trials if "fixed_params" in t.system_attrs and t.system_attrs["fixed_params"]]
    assert sorted(grid) == [0.1, 0.25, 1.0, 10.0]  # the grid once each, then 3 sampled points
    assert len({t.params["knob"] for t in trials}) == 7  # seeded per trial number: no two workers drew the same point
    assert {t.user_attrs["worker"] for t in trials} == {"w0", "w1", "w2"}
    assert len({o.chosen.number for o in outcomes}) == 1  # every worker's summary agrees


def test_a_worker_joining_never_fails_a_live_trial(tmp_path):
    first = make(tmp_path, "first", Synthetic(delay=0.05), trials=2)
    first.open_study("cactus")  # the storage exists before this thread looks into it
    thread = threading.Thread(target=first.tune_method, args=("cactus",))
    thread.start()
    deadline = time.time() + 60
    while not any(t.state.name == "RUNNING" for t in trials_of(tmp_path)):
        assert time.time() < deadline
        time.sleep(0.05)
    second = make(tmp_path, "second", Synthetic(delay=0.05), trials=2)
    second.open_study("cactus")  # what made `tell` raise "Cannot tell a FAIL trial" in the first worker
    second.tune_method("cactus")
    thread.join(timeout=60)
    states = [t.state.name for t in trials_of(tmp_path)]
    assert states.count("FAIL") == 0 and len(states) == 2


def _ghost(tmp_path, tuner: Tuner):
    """A worker that takes the next trial and dies (no heartbeat after the first)."""
    queue = TrialQueue(tuner.settings.storage_url, tuner.settings.heartbeat, tuner.settings.stale_after, "ghost")
    study = optuna.load_study(study_name=NAME, storage=queue.storage)
    queue.plans[NAME] = tuner.queue.plans[NAME]
    method, trial = queue.claim({"cactus": study}, tuner.sampler)
    return trial


def test_a_stale_trial_is_retried_once_with_its_parameters_then_replaced(tmp_path):
    tuner = make(tmp_path, "live", trials=3, grace_period=2)
    tuner.open_study("cactus")
    dead = _ghost(tmp_path, tuner)  # takes the first grid point (the strongest, 10.0) and dies
    time.sleep(3.5)  # older than the grace period (SQLite keeps heartbeats to the second)
    tuner.queue.claim({"cactus": tuner.open_study("cactus")}, tuner.sampler)  # the live worker notices: retry queued
    trials = trials_of(tmp_path)
    assert trials[dead.number].state.name == "FAIL"
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retry) == 1 and retry[0].params == dead.params == {"n_draft": 4, "knob": 10.0}
    assert failures(trials) == 0  # a retried stale trial is not a failure


@pytest.mark.slow
def test_a_stale_retry_is_not_retried_again_and_the_study_still_ends_exactly(tmp_path):
    tuner = make(tmp_path, "live", trials=2, grace_period=2)
    tuner.open_study("cactus")
    first = _ghost(tmp_path, tuner)  # grid point 10.0, dies
    time.sleep(3.5)
    second = _ghost(tmp_path, tuner)  # finds the first stale (retry queued), takes grid point 1.0, dies
    third = _ghost(tmp_path, tuner)  # takes the retry of the first, dies
    assert third.params == first.params and second.params["knob"] == 1.0
    time.sleep(3.5)
    outcome = tuner.tune_method("cactus")  # the second is retried; the third, a retry already, is not
    trials = outcome.study.trials
    assert [t.number for t in trials if t.state.name == "FAIL"] == [first.number, second.number, third.number]
    retries = {t.number: t.system_attrs["retry_history"] for t in trials if "failed_trial" in t.system_attrs}
    assert sorted(retries.values()) == [[first.number], [second.number]]  # the third (a retry) has no retry
    assert retries[third.number] == [first.number]
    assert failures(trials) == 1  # the retry's death used up a slot, replaced by the next grid point
    done = sorted(t.params["knob"] for t in trials if t.state.name in ("COMPLETE", "PRUNED"))
    assert done == [0.25, 1.0]  # exactly --trials finished: the retried 1.0 and the replacement


def test_failures_are_replaced_until_the_budget_is_spent(tmp_path):
    tuner = make(tmp_path, "w", Synthetic(fail_above=-1.0), trials=3)  # every relaxed evaluation fails
    outcome = tuner.tune_method("cactus")
    states = [t.state.name for t in outcome.study.trials]
    # each failure queued a replacement; the third spent the budget: the study took no more trials
    assert states == ["FAIL"] * 3 + ["WAITING"] * 2 and failures(outcome.study.trials) == 3
    assert outcome.chosen is None


def test_storage_lock_excludes_other_holders_and_is_reentrant(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    a, b = StorageLock(url), StorageLock(url)  # two holders, as two processes would be
    events = []

    def hold() -> None:
        with a():
            events.append(("a in", time.monotonic()))
            with a():  # re-entrant within a thread
                time.sleep(0.3)
            events.append(("a out", time.monotonic()))

    thread = threading.Thread(target=hold)
    thread.start()
    while not events:
        time.sleep(0.01)
    with b():
        events.append(("b in", time.monotonic()))
    thread.join()
    assert [e[0] for e in events] == ["a in", "a out", "b in"]
    with pytest.warns(UserWarning, match="no cross-process lock"):
        StorageLock("oracle://u:p@h/db")


def test_storage_locks_of_other_purposes_are_independent(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    queue, finish, other_finish = StorageLock(url), StorageLock(url, "finish"), StorageLock(url, "finish")
    entered = threading.Event()

    def try_finish() -> None:
        with other_finish():
            entered.set()

    with queue(), finish():  # both held by one holder: independent locks
        assert (tmp_path / "x.db.finish.lock").exists() and (tmp_path / "x.db.lock").exists()
        thread = threading.Thread(target=try_finish)
        thread.start()
        assert not entered.wait(0.3)  # the same purpose excludes another holder
    thread.join(5)
    assert entered.is_set()


def test_ranges_split_merge_and_spread():
    assert split(10, 4) == [range(0, 4), range(4, 8), range(8, 10)] and split(3, None) == [range(0, 3)]
    with pytest.raises(ValueError, match="range size"):
        split(3, 0)
    ranges = split(64, 4)
    orders = [worker_order(ranges, f"host:{pid}") for pid in range(4)]
    assert all(sorted(o, key=lambda r: r.start) == ranges for o in orders)
    assert len({o[0].start for o in orders}) > 1  # workers start in different places
    config = type("C", (), {"method": "cactus", "knob": 2.0, "n_draft": 4, "seed": 0, "label": "r"})()
    whole = Synthetic(cliff=1.0)(SPEC, None, config, output_dir="/nonexistent", problems=PROBLEMS[:30], progress=False)
    parts = [
        Synthetic(cliff=1.0)(
            SPEC, None, config, output_dir="/nonexistent", problems=PROBLEMS[r.start : r.stop], progress=False
        )
        for r in split(30, 7)
    ]
    assert merge(parts).summary() == whole.summary() and merge(parts).records == whole.records


def test_a_worker_joining_a_running_holdout_job_is_not_refused(tmp_path):
    """``--confirm holdout`` refuses a study that searched other problems. A study records
    its search problems before its first trial, so a worker that starts (or restarts) while
    the others run the job's first trials joins it; another ``--limit`` is still refused."""
    from relaxtune.tune.checks import check_search_problems
    from relaxtune.tune.search_problems import SearchProblemsError

    first = make(tmp_path, "w0")
    study = first.open_study("cactus")  # the first worker's queue: grid trials waiting, none finished
    assert study.get_trials(deepcopy=False) and not any(t.state.is_finished() for t in study.trials)
    url, problems = first.settings.storage_url, first.problems
    check_search_problems(url, ["cactus"], SPEC, SyntheticPair.name, problems, "holdout")  # a second worker joins
    with pytest.raises(SearchProblemsError, match="holds trials searched on other problems.*--confirm seeds"):
        check_search_problems(url, ["cactus"], SPEC, SyntheticPair.name, problems[:-1], "holdout")
    check_search_problems(url, ["cactus"], SPEC, SyntheticPair.name, problems[:-1], "seeds")  # fresh seeds: any study


def test_an_idle_worker_generates_free_ranges_of_a_running_trials_stage_and_nothing_twice(tmp_path):
    """With no trial waiting, a worker helps a running trial (``help_running``): it takes
    ranges of the trial's current stage that nobody holds or has recorded, under the claim
    the trial's worker takes for that range, one per call; never the next stage before the
    trial reports the current one done. The trial's worker then generates only the rest."""
    from relaxtune.tune.claims import claim, claim_path
    from relaxtune.tune.helping import help_running, stage_attr
    from relaxtune.tune.point_records import DecodeConfig, records_path

    mine, theirs = Synthetic(cliff=20.0, delay=0.001), Synthetic(cliff=20.0, delay=0.001)
    owner = make(tmp_path, "owner", theirs, trials=1, stage_size=10, range_size=4)
    helper = make(tmp_path, "helper", mine, trials=1, stage_size=10, range_size=4)
    studies = {"cactus": owner.open_study("cactus")}
    _, trial = owner.queue.claim(studies, owner.sampler)  # the only trial: RUNNING, the owner's
    config = DecodeConfig("cactus", trial.params["knob"], trial.params["n_draft"], 0)
    records = records_path(tmp_path, SPEC, config, "synthetic-pair")
    ids = lambda r: [p.id for p in PROBLEMS[r.start : r.stop]]  # noqa: E731
    held, release = threading.Event(), threading.Event()

    def owner_generating(r: range) -> None:  # the owner holds [4, 8) as while it generates it
        with claim(claim_path(records, ids(r))):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=owner_generating, args=(range(4, 8),))
    holder.start()
    held.wait(30)
    tried: set = set()
    helper_studies = {"cactus": helper.open_study("cactus")}
    assert help_running(helper, helper_studies, tried) and help_running(helper, helper_studies, tried)
    assert not help_running(helper, helper_studies, tried)  # stage 1's free ranges are done; [4, 8) is held
    generated = lambda s: [g[2] for g in s.generated]  # noqa: E731
    assert generated(mine) == ids(range(0, 4)) + ids(range(8, 10))
    trial.set_user_attr(stage_attr(10), {})  # the owner reports stage 1 (after its [4, 8)): stage 2 may be helped
    release.set()
    holder.join()
    assert help_running(helper, helper_studies, tried)
    assert generated(mine)[6:] == ids(range(4, 8))  # free now, and still not recorded: stage 2's first range
    assert help_running(helper, helper_studies, tried)  # [8, 12): 10 and 11 are new
    assert generated(mine)[10:] == ids(range(10, 12))
    owner._evaluate(config, PROBLEMS[:20])  # the owner's stage 2 generates only what nobody helped with
    assert generated(theirs) == ids(range(12, 20))
    assert sorted(generated(mine) + generated(theirs), key=int) == ids(range(0, 20))  # each sample once
    unranged = make(tmp_path, "whole", Synthetic(delay=0.001), trials=1, stage_size=10)  # no range_size: one piece
    assert not help_running(unranged, helper_studies, set())


def test_a_trial_whose_worker_died_before_drawing_its_point_goes_stale_without_a_run(tmp_path):
    """A worker killed between taking a trial (RUNNING, its heartbeat and worker mark
    recorded) and drawing its point leaves a trial with no parameters. The worker that
    finds it stale retries it and logs no MLflow run for it (nothing ran): logging it
    once raised KeyError 'n_draft' on the tracking thread and failed a soak worker's job
    at its end. The study still ends with exactly its trials."""
    from relaxtune.tune.studies import WORKER_ATTR

    logged = []

    class Tracker:
        def start_study(self, method, study):
            return "run"

        def log_trial(self, method, number, params, metrics, state, result, note=None):
            logged.append((number, state, params["n_draft"]))

    tuner = make(tmp_path, "live", trials=2, grace_period=2)
    tuner.tracker = Tracker()
    study = tuner.open_study("cactus")
    with tuner.queue.lock():  # what claim does before drawing the point; then the worker is killed
        trial_id = tuner.queue.pop(study)
        tuner.queue.storage.record_heartbeat(trial_id)
        tuner.queue.storage.set_trial_user_attr(trial_id, WORKER_ATTR, "ghost")
    time.sleep(3.5)  # older than the grace period
    outcome = tuner.tune_method("cactus")
    trials = outcome.study.trials
    dead = next(t for t in trials if tuner.queue.trial_id(study.study_name, t.number) == trial_id)
    assert dead.state.name == "FAIL" and dead.params == {}
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 2
    assert sorted(n for n, _, _ in logged) == sorted(t.number for t in trials if t.state.name in ("COMPLETE", "PRUNED"))


def test_claims_spread_over_the_studies_by_their_running_trials(tmp_path):
    # 4 workers on 2 studies: 2 trials of each run at once (each study's sampler and speed bar see
    # more finished trials), not 4 of the first; ties keep the methods' order
    tuner = make(tmp_path, "w", methods=["cactus", "mentored"], trials=4)
    studies = {m: tuner.open_study(m) for m in ("cactus", "mentored")}
    taken = [tuner.queue.claim(studies, tuner.sampler) for _ in range(4)]
    assert [key for key, _ in taken] == ["cactus", "mentored", "cactus", "mentored"]
    _, first = taken[0]
    first.study.tell(first, [1.0, 1.0])  # cactus: 1 running, mentored: 2
    assert tuner.queue.claim(studies, tuner.sampler)[0] == "cactus"


def test_a_waiting_worker_wakes_when_a_running_trial_ends_not_after_its_interval(tmp_path):
    tuner = make(tmp_path, "w", heartbeat=10, grace_period=40)  # a wait of min(5, heartbeat / 2) = 5 s
    studies = {"cactus": tuner.open_study("cactus")}
    _, trial = tuner.queue.claim(studies, tuner.sampler)
    timer = threading.Timer(0.3, lambda: trial.study.tell(trial, [1.0, 1.0]))  # another worker's trial ends
    timer.start()
    began = time.monotonic()
    tuner.queue.wait(studies)
    waited = time.monotonic() - began
    timer.join()
    assert 0.25 <= waited < 3.0  # (the timer starts a moment before the wait)
    quick = TrialQueue(tuner.settings.storage_url, 1, 4, "other")  # nothing running: the whole 0.5 s
    began = time.monotonic()
    quick.wait(studies)
    assert time.monotonic() - began >= 0.5


def test_a_study_already_set_up_opens_without_the_lock(tmp_path):
    first = make(tmp_path, "first", methods=["cactus", "mentored"])
    first.open_study("cactus")  # created, attrs set, queue topped up
    held, release, opened = threading.Event(), threading.Event(), {}

    def hold() -> None:
        with first.queue.lock():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()  # another thread of this process holds the storage lock (the same StorageLock)
    assert held.wait(20)
    second = make(tmp_path, "second", methods=["cactus", "mentored"])

    def open_(method: str) -> None:
        opened[method] = second.open_study(method)

    ready, fresh = threading.Thread(target=open_, args=("cactus",)), threading.Thread(target=open_, args=("mentored",))
    ready.start(), fresh.start()
    ready.join(timeout=20)
    assert "cactus" in opened  # read only: no wait for the lock
    fresh.join(timeout=1)
    assert fresh.is_alive() and "mentored" not in opened  # not created yet: under the lock
    release.set()
    fresh.join(timeout=20)
    holder.join(timeout=20)
    assert "mentored" in opened
    assert len(opened["cactus"].get_trials(deepcopy=False)) == 6  # the plan's queue, enqueued once


def test_a_worker_on_other_problems_starting_with_the_first_is_refused_as_it_opens_the_study(tmp_path):
    # both passed the start's check (no study yet); the second must not relabel the first's study
    from relaxtune.tune.search_problems import SearchProblemsError, search_digest

    first, second = make(tmp_path, "w0"), make(tmp_path, "w1")
    second.problems = second.problems[:-1]  # another --limit
    study = first.open_study("cactus")
    with pytest.raises(SearchProblemsError, match="holds trials searched on other problems.*--confirm seeds"):
        second.open_study("cactus")
    assert study.user_attrs["search_problems"] == search_digest(first.problems)  # not overwritten
    seeds = make(tmp_path, "w2", confirm="seeds")  # fresh seeds: any study, as the start's check allows
    seeds.problems = seeds.problems[:-1]
    assert seeds.open_study("cactus").user_attrs["search_problems"] == search_digest(seeds.problems)


def test_a_trial_that_ended_between_the_claim_and_the_wait_ends_the_wait_at_once(tmp_path):
    tuner = make(tmp_path, "w", heartbeat=10, grace_period=40, trials=1)  # a wait of 5 s
    studies = {"cactus": tuner.open_study("cactus")}
    other = TrialQueue(tuner.settings.storage_url, 10, 40, "other")
    other.plans = tuner.queue.plans
    _, trial = other.claim({"cactus": optuna.load_study(study_name=NAME, storage=other.storage)}, tuner.sampler)
    assert tuner.queue.claim(studies, tuner.sampler) == "wait"  # the only trial runs on the other worker
    trial.study.tell(trial, [1.0, 1.0])  # and ends before this worker's wait begins
    began = time.monotonic()
    tuner.queue.wait(studies)
    assert time.monotonic() - began < 2.0
