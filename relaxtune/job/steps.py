"""The shared steps of the two jobs (``relaxtune.job.run``): the checks and loading before
any generation (``prepare``, ``start_job``: problems, pair, stores, holdout split, forward
costs), the tuner and its studies, each method's chosen point and its confirmation, the
tuned config written, and the MLflow runs of a tuning job (``job_tracker``) or of an export
(``export_run``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..backends.costs import CostsError, job_costs
from ..backends.load import backend_name, load_backend
from ..report.config_schema import TunedConfig
from ..report.export import build_config, save_config
from ..report.reexport import JobError, check_exportable, export_storage
from ..report.stores import StoreError, prepare_stores, reach_storage, reach_tracking
from ..tasks.spec import Problem, TaskSpec, build_prompt_ids, load_problems, load_task
from ..tune.checks import (
    check_confirmable,
    check_draft_lengths,
    check_methods,
    check_search_problems,
)
from ..tune.confirm import confirm, holdout_split, planned_confirmations
from ..tune.job_identity import job_id, study_name
from ..tune.phases import phase
from ..tune.point_records import DecodeConfig, check_spec_unchanged, records_path
from ..tune.search_problems import SearchProblemsError
from ..tune.settings import TuneSettings, start
from ..tune.stopping import guarded
from ..tune.tuning import Tuner, choose

__all__ = [
    "Job",
    "check_request",
    "guarded_job",
    "prepare",
    "deployable",
    "fit_contexts",
    "start_job",
    "declared",
    "make_tuner",
    "run_studies",
    "choose_and_confirm",
    "write_config",
    "job_tracker",
    "export_run",
]


def check_request(settings: TuneSettings, new_trials: bool = True) -> TaskSpec:
    """What the job's flags ask, checked against its task in milliseconds (no store, no
    data, no model): the task loads, each method runs at the task's temperature and at
    every draft length, and, for a tuning job, every draft length fits the task's
    response budget (an export reads what its trials ran). Returns the task's spec.

    Raises:
        FileNotFoundError / ValueError: an unknown task, an invalid spec, a method the
            task's temperature or a draft length refuses, a draft length beyond the budget.
    """
    spec = load_task(settings.task)
    check_methods(settings.methods, spec.sampling.temperature, settings.n_drafts)
    if new_trials:
        check_draft_lengths(settings.n_drafts, spec.max_new_tokens)
    return spec


@contextmanager
def guarded_job(
    settings: TuneSettings, spec: TaskSpec, pair: str, resume: str, log: Callable[[str], None], **kwargs
) -> Iterator[None]:
    """The context a tuning job of ``settings`` on ``spec`` runs in (``tune.stopping.guarded``):
    a stop or a failure ends it with one short paragraph naming what it kept of its task
    folder and its studies (one per method, on the pair named ``pair``, at the job's
    relaxation scope) and the command ``resume`` that resumes it; ``kwargs`` go to ``guarded``.

    Raises:
        SystemExit: as ``guarded``.
    """

    def studies() -> list[str]:
        return [study_name(spec.name, m, pair, spec.version, settings.relaxation_scope) for m in settings.methods]

    with guarded(settings.stores, f"{spec.name}-v{spec.version}", studies, resume, log, **kwargs):
        yield


def prepare(
    settings: TuneSettings,
    backend=None,
    new_trials: bool = True,
    log: Callable[[str], None] = print,
    track: bool = True,
):
    """Validate and load everything before any generation: the task, the stores
    (``reach_tracking`` when ``track``, ``reach_storage`` for a tuning job: answered
    in seconds, before any model loads), for an
    export its Optuna storage (``export_storage``, before the problems load), its
    problems, method/temperature compatibility, the task's records (same spec
    under the same version), for an export (``new_trials=False``) what it reads
    (``check_exportable``), then the backend, and, for a tuning job, whether a
    confirmation can certify epsilon at the confidence it is judged at
    (``check_confirmable``: refused when only the search could, a warning to
    ``log`` when neither can). Returns ``(spec, problems, backend)``.

    Raises:
        FileNotFoundError / ValueError / RuntimeError: unknown task, invalid spec,
            missing data, a method that collapses at the task's temperature, a
            task edited under the same version, a job whose search could pass
            points no confirmation can (``ConfirmationError``).
        JobError: a store that cannot be reached (naming its flag), or an export with
            nothing to export, before any model (or, for a missing storage, any problem) loads.
    """
    spec = check_request(settings, new_trials)
    try:  # MLflow's first: nothing (not even the default storage's output folder) is made for a wrong address
        if track:
            reach_tracking(settings.mlflow_uri)
        if new_trials:
            reach_storage(settings.storage_url, settings.output_dir)
    except StoreError as err:
        raise JobError(str(err)) from None
    if not new_trials:
        export_storage(settings, spec)  # before the problems load (the hub, for a task not cached yet)
    problems = load_problems(spec, settings.limit)
    if not problems:
        raise ValueError(f"task {spec.name} has no problems")
    if new_trials:  # before anything is written or loaded: too few problems is refused at once
        from ..decoding.methods import get_method
        from ..engine.sequence import native_server

        pinned = (
            {m for m in settings.methods if native_server(backend, m) is not None}
            if backend is not None
            else {m for m in settings.methods if settings.native_url and get_method(m).server_native}
        )
        planned = planned_confirmations(settings.methods, settings.confirmations, settings.trials, pinned)
        warning = check_confirmable(len(problems), settings.stats, spec.repeats, planned)
        if warning:
            log(f"warning: {warning}")
    check_spec_unchanged(Path(settings.output_dir) / f"{spec.name}-v{spec.version}", spec, record=False)
    if not new_trials:  # the trials searched the first half with --confirm holdout
        search = holdout_split(problems, settings.seed)[0] if settings.confirm == "holdout" else problems
        check_exportable(settings, spec, search, getattr(backend, "name", None) or backend_name(**settings.backend))
    if backend is None:
        with phase("model load"):
            backend = load_backend(**settings.backend)
    return spec, problems, backend


@dataclass
class Job:
    """What the first step found: the task, its problems (all, the search's, the
    confirmations'), the pair and its costs."""

    settings: TuneSettings
    spec: object
    everything: list
    problems: list
    held_out: list
    backend: object
    pair: str
    profile: object  # ServingProfile (weighted as the search prices) or a fixed c_rel
    saved: Path  # the cost profile's file
    measured: list  # this run's own cost measurement, for the estimate


def deployable(settings: TuneSettings, log: Callable[[str], None] = print) -> TuneSettings:
    """``settings`` with only the methods one of ``settings.deployable_on``'s engines runs
    at the task's sampling (``relaxtune.decoding.deployable.deployable_methods``); each
    refused method is named with why, before anything loads.

    Raises:
        JobError: no method left (each refusal named).
    """
    from ..decoding.deployable import deployable_methods

    spec = load_task(settings.task)
    kept, refused = deployable_methods(settings.deployable_on, settings.methods, spec.sampling.temperature)
    for why in refused.values():
        log(f"--deployable-on {','.join(settings.deployable_on)}: refused {why}")
    if not kept:
        raise JobError(
            f"--deployable-on {','.join(settings.deployable_on)}: no method of --methods "
            f"{','.join(settings.methods)} runs there ({'; '.join(refused.values())})"
        )
    return settings.model_copy(update={"methods": kept, "deployable_on": None})  # applied: not again at the start


def fit_contexts(backend, spec, problems: Sequence[Problem], n_drafts: Sequence[int], lanes: int = 1) -> int | None:
    """Size a backend's KV caches to the job's longest sequence, where it can
    (``fit_context``: llama.cpp, whose caches take ``slots x 4096`` cells otherwise):
    the longest prompt of ``problems``, the task's budget and the longest N; and to
    the most sequences the job runs at once (an evaluation's ``problems x repeats``
    in each of ``lanes`` parallel trials). Returns the cells per sequence, or None
    for a backend that sizes its own."""
    fit = getattr(backend, "fit_context", None)
    if fit is None or not problems:
        return None
    longest = max(len(build_prompt_ids(backend.tokenizer, spec, p)) for p in problems)
    return fit(longest, spec.max_new_tokens, max(n_drafts), len(problems) * spec.repeats * lanes)


def start_job(settings: TuneSettings, backend, new_trials: bool, log: Callable[[str], None], track: bool) -> Job:
    """Checks, problems and the pair (``prepare``), the stores, the holdout split, the
    studies' problems (``check_search_problems``) and the forward costs (``job_costs``)."""
    if new_trials and settings.deployable_on:
        settings = deployable(settings, log)
    if settings.relaxation_scope != "all":  # before the pair loads (the CLI refuses it earlier, with exit 2)
        from ..decoding.scope import check_scope

        task = load_task(settings.task)
        try:
            check_scope(settings.relaxation_scope, task.name, task.thinks)
        except ValueError as err:
            raise JobError(str(err)) from None
    spec, everything, backend = prepare(settings, backend, new_trials, log, track)
    if new_trials:
        fit_contexts(backend, spec, everything, settings.n_drafts, settings.parallel_trials)
    settings = start(settings)  # the output folder made, the auto runtime resolved: what the job records
    try:  # before any Optuna storage or MLflow client of this worker opens them (a tuning job's MLflow
        # store is prepared by its tracker's thread, while the first samples are generated: job_tracker)
        with phase("stores"):
            prepare_stores(
                settings.storage_url, settings.mlflow_uri, track=track and not new_trials, optuna=new_trials, log=log
            )
    except StoreError as err:
        raise JobError(str(err)) from None
    pair = getattr(backend, "name", "backend")
    holdout = settings.confirm == "holdout"
    problems, held_out = holdout_split(everything, settings.seed) if holdout else (everything, everything)
    measured: list = []
    try:
        check_search_problems(
            settings.storage_url, settings.methods, spec, pair, problems, settings.confirm, settings.relaxation_scope
        )
        saved = records_path(Path(settings.output_dir), spec, DecodeConfig(), pair).with_name("cost_profile.json")
        with phase("cost profile"):
            profile = job_costs(
                backend,
                lambda: build_prompt_ids(backend.tokenizer, spec, problems[0]),
                settings.n_drafts,
                saved,
                batch_sizes=settings.serving_batch_sizes,
                c_rel=settings.c_rel,
                remeasure=settings.remeasure_costs,
                new_trials=new_trials,
                log=log,
                on_measured=measured.append,
            )
        profile = declared(profile, settings, saved)
    except (SearchProblemsError, CostsError) as err:
        raise JobError(str(err)) from None
    return Job(settings, spec, everything, problems, held_out, backend, pair, profile, saved, measured)


def declared(profile, settings: TuneSettings, saved: Path):
    """The job's serving profile weighted as the search prices (``--serving-batch-size``,
    or ``--serving-batch-weights``: ``StatsSettings.serving_weights``); a fixed c_rel as is.

    Raises:
        CostsError: a weighted batch size the profile lacks (an export of a job that
            never measured it).
    """
    if isinstance(profile, int | float):
        return profile
    weights = settings.stats.serving_weights
    lacking = sorted(set(weights) - set(profile.batch_sizes))
    if lacking:
        raise CostsError(
            f"the cost profile at {saved} holds batch sizes {', '.join(map(str, profile.batch_sizes))}, not "
            f"{', '.join(map(str, lacking))}: price at one it holds (--serving-batch-size), or run `relaxtune tune` "
            f"with --serving-batch-sizes {','.join(map(str, sorted(set(profile.batch_sizes) | set(lacking))))}"
        )
    return profile.reweighted(weights)


def make_tuner(job: Job, tracker, evaluate_fn, progress: bool, new_trials: bool, log, run_ranges, worker) -> Tuner:
    return Tuner(
        job.settings,
        job.spec,
        job.problems,
        job.backend,
        job.profile,
        tracker,
        evaluate_fn,
        progress,
        new_trials,
        log,
        run_ranges=run_ranges,
        **({"worker": worker} if worker else {}),
    )


def run_studies(job: Job, tuner: Tuner, verb: str, submit_trial, log: Callable[[str], None]) -> list:
    """One study per method (a trial runs strict's baseline at its N first, when no record holds it)."""
    s = job.settings
    for method in s.methods:
        log(
            f"{verb} {method} on {job.spec.name} ({len(job.problems)} problems x {job.spec.repeats}, "
            f"epsilon {s.epsilon:g})"
        )
    try:
        return tuner.tune(s.methods, submit_trial)
    except SearchProblemsError as err:  # a worker on other problems that started with the first (open_study)
        raise JobError(str(err)) from None


def choose_and_confirm(
    job: Job, tuner: Tuner, outcomes: list, default_n: list[int], new_trials: bool, log: Callable[[str], None]
) -> dict:
    """Strict at every N a trial used (``default_n`` when none: read back from its records
    when resuming or exporting), each method's chosen point (no point strict dominates),
    and its confirmation on samples the search never saw (method -> ``Confirmation``)."""
    used = sorted(
        {
            t.params["n_draft"]
            for o in outcomes
            for t in o.study.get_trials(deepcopy=False)
            if t.state.name in ("COMPLETE", "PRUNED")
        }
    )
    for n in used or default_n:
        tuner.baseline(n)
    for outcome in outcomes:
        outcome.chosen = choose(outcome.study, job.settings.stats, tuner.strict_points())
    return confirm(tuner, outcomes, job.held_out, new_trials=new_trials, log=log)


def write_config(result, mlflow_info: dict | None, path: Path, costs: dict | None = None) -> tuple[TunedConfig, Path]:
    """The tuned config of a finished job, written (atomically) at ``path`` (``costs``: a
    re-priced export's, ``relaxtune.report.reexport.reprice``)."""
    config = build_config(result, mlflow_info, costs)
    return config, save_config(config, path)


def job_tracker(settings: TuneSettings, job: Job, log: Callable[[str], None] = print):
    """A tuning job's MLflow runs, its store prepared and its cost profile logged on a
    thread of its own (``BackgroundTracker``)."""
    from ..report.background import BackgroundTracker
    from ..report.stores import DEFAULT_URI, is_database, prepare_mlflow
    from ..report.tracking import Tracker
    from ..tune.storage import storage_lock

    def make() -> Tracker:
        prepare_mlflow(settings.mlflow_uri or DEFAULT_URI, log)
        tracker = Tracker(
            settings.mlflow_uri,
            job.spec,
            job.pair,
            settings.model_dump(),
            job.everything,
            job_id(settings.stores, settings.stats, settings.search, job.spec, job.pair),
            storage_lock(settings.storage_url, "mlflow"),
            storage_lock(settings.storage_url, "finish"),
            end_on_stop=False,
            claims_dir=settings.output_dir,
        )
        tracker.log_costs(job.profile)
        return tracker

    tracker = BackgroundTracker(make)
    if not is_database(settings.mlflow_uri or DEFAULT_URI):
        tracker.wait()  # a tracking server: nothing to migrate, and a wrong address fails before any sample
    return tracker


def export_run(settings: TuneSettings, job: Job, tuning: TuneSettings | None):
    """An export's MLflow run of its own, nested under the tuning run (job ``tuning``) it reads."""
    from ..report.export_run import ExportRun

    return ExportRun(
        settings.mlflow_uri,
        job.spec,
        job.pair,
        settings.model_dump(),
        job.everything,
        job_id(tuning.stores, tuning.stats, tuning.search, job.spec, job.pair) if tuning is not None else None,
    )
