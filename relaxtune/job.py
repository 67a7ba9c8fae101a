"""The main job, end to end, as the README's "What the main job does" tells it:

1. ``prepare``: every check before generation, then the task's problems and the pair;
   the stores, created and migrated once whoever starts first (``relaxtune.report.stores``);
   the forward costs (``relaxtune.backends.costs``);
2. strict as the baseline, at every draft length a trial used;
3. one Optuna study per method (``relaxtune.tune.tuning.Tuner``);
4. confirmation of each method's chosen point on samples the search never saw
   (``relaxtune.tune.confirm``);
5. MLflow runs (``relaxtune.report.tracking``);
6. the tuned config (``relaxtune.report.export``).

``tune_job`` and ``export_job`` are two short compositions of the shared steps below
(``_start``, ``_tuner``, ``_studies``, ``_choose``, ``_write``); ``report/`` receives the
finished job frozen (``Tuner.result``: ``relaxtune.tune.result.JobResult``), never the
live tuner. The CLI (``relaxtune tune`` / ``export``) and the Prefect flow
(``flows/tune.py``) call ``run_tune_job``, which runs one or the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .backends.costs import CostsError, job_costs
from .backends.load import backend_name, load_backend
from .report.config_schema import TunedConfig
from .report.export import build_config, cautions, save_config
from .report.reexport import (
    JobError,
    check_exportable,
    check_outcomes,
    export_path,
    export_storage,
    job_file,
    read_cost_profile,
    reprice,
    save_job,
    tuning_settings,
)
from .report.stores import StoreError, prepare_stores, reach_storage, reach_tracking
from .tasks.spec import Problem, build_prompt_ids, load_problems, load_task
from .tune.checks import SearchProblemsError, check_confirmable, check_methods, check_search_problems
from .tune.confirm import confirm, holdout_split, planned_confirmations
from .tune.estimate import announce, clock
from .tune.evaluation import DecodeConfig, check_spec_unchanged, records_path
from .tune.job_identity import job_id
from .tune.phases import activate, phase
from .tune.phases import active as timer_now
from .tune.settings import TuneSettings, start
from .tune.tuning import Tuner, choose

__all__ = [
    "run_tune_job",
    "deployable",
    "declared",
    "tune_job",
    "export_job",
    "prepare",
    "load_backend",
    "backend_name",
    "job_file",
    "tuning_settings",
    "export_path",
    "check_exportable",
    "JobError",
    "cautions",
    "fit_contexts",
]


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
    spec = load_task(settings.task)
    check_methods(settings.methods, spec.sampling.temperature)
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
        from .decoding.methods import get_method
        from .engine.sequence import native_server

        pinned = (
            {m for m in settings.methods if native_server(backend, m) is not None}
            if backend is not None
            else {m for m in settings.methods if settings.native_url and get_method(m).server_native}
        )
        planned = planned_confirmations(settings, pinned)
        warning = check_confirmable(len(problems), settings.stats, spec.repeats, planned)
        if warning:
            log(f"warning: {warning}")
    check_spec_unchanged(Path(settings.output_dir) / f"{spec.name}-v{spec.version}", spec)
    if not new_trials:  # the trials searched the first half with --confirm holdout
        search = holdout_split(problems, settings.seed)[0] if settings.confirm == "holdout" else problems
        check_exportable(settings, spec, search, getattr(backend, "name", None) or backend_name(**settings.backend))
    if backend is None:
        with phase("model load"):
            backend = load_backend(**settings.backend)
    return spec, problems, backend


def run_tune_job(
    settings: TuneSettings, backend=None, *, new_trials: bool = True, **kwargs
) -> tuple[TunedConfig, Path]:
    """``tune_job(settings, backend, **kwargs)``, or with ``new_trials=False``
    ``export_job(settings, backend, **kwargs)``: the CLI's and the flow's entry point."""
    return (tune_job if new_trials else export_job)(settings, backend, **kwargs)


def tune_job(
    settings: TuneSettings,
    backend=None,
    *,
    progress: bool = True,
    evaluate_fn: Callable | None = None,
    track: bool = True,
    log: Callable[[str], None] = print,
    submit_trial: Callable | None = None,
    run_ranges: Callable | None = None,
    worker: str | None = None,
) -> tuple[TunedConfig, Path]:
    """Tune every method of ``settings`` on its task and export the tuned config.
    Any number of workers (processes, hosts, Prefect flow runs) may run the same
    job against one storage: they share the studies' trials and each exports the
    same config.

    Args:
        settings: the job.
        backend: a loaded backend (default: ``load_backend`` of the settings' models).
        progress: progress bars.
        evaluate_fn: evaluation override (the Prefect flow's task).
        track: log to MLflow (the job's runs: ``Tracker``, on a thread of its own).
        log: where one-line progress messages go.
        submit_trial, run_ranges, worker: how trials and problem ranges run
            (``Tuner.tune``'s ``submit``, ``Tuner.run_ranges``), and this worker's label.

    Returns:
        ``(config, path)`` of the exported YAML (``settings.export`` or
        ``<output_dir>/<task>.tuned.yaml``).

    After the studies, each method's chosen point is confirmed on samples the
    search never saw (the held-out half of the problems, split before any
    generation, or fresh seeds with ``--confirm seeds``); only confirmed points
    are exported as feasible.

    Raises:
        JobError: a store that cannot be reached, or a study searched other problems.
    """
    with activate() as timer:
        config, path, estimate = _tune_job(
            settings, backend, progress, evaluate_fn, track, log, submit_trial, run_ranges, worker
        )
        timing = _timing_path(settings, config)
        timer.save(timing)
        log(_timing_line(timer, estimate, timing))
    return config, path


def _tune_job(settings, backend, progress, evaluate_fn, track, log, submit_trial, run_ranges, worker):
    """``tune_job``'s steps, each a phase of the active timer (``relaxtune.tune.phases``);
    returns ``(config, path, the job's JobEstimate)``."""
    with phase("start"):
        job = _start(settings, backend, True, log, track)
        settings = job.settings  # the auto runtime resolved: what the job records
        path = Path(settings.export or Path(settings.output_dir) / f"{job.spec.name}.tuned.yaml")
        tracker = _tracker(settings, job, log) if track else None
        tuner = _tuner(job, tracker, evaluate_fn, progress, True, log, run_ranges, worker)
        save_job(settings.output_dir, job.spec.name, settings.model_dump())
        estimate = announce(
            settings,
            job.spec,
            job.problems,
            job.held_out,
            job.backend,
            job.profile,
            (job.measured or [None])[0],
            job.saved,
            log,
        )  # the plan and its expected wall time, before the first generation
        tuner.on_baseline = _reviser(settings, timer_now(), estimate, log)
    with phase("trials"):
        outcomes = _studies(job, tuner, "tuning", submit_trial, log)
    with phase("MLflow"):
        if tracker is not None:  # its calls were queued (BackgroundTracker): the study runs are known once they ran
            for outcome in outcomes:
                outcome.mlflow_run_id = tracker.wait().study_runs.get(outcome.method)
    with phase("confirmations"):
        confirmations = _choose(job, tuner, outcomes, [settings.mid_n_draft], new_trials=True, log=log)
    mlflow_info = None
    with phase("MLflow"):
        if tracker is not None:
            made = tracker.wait()
            for method, confirmation in confirmations.items():
                made.log_confirmation(method, confirmation)
            mlflow_info = {
                "tracking_uri": made.uri,
                "experiment": f"relaxtune-{job.spec.name}",
                "experiment_id": made.experiment_id,
                "run_id": made.task_run_id,
            }
    with phase("export"):
        result = tuner.result(outcomes, confirmations, len(job.held_out))
        config, path = _write(result, mlflow_info, path)
    with phase("MLflow"):
        if tracker is not None:  # figures once strict is known at every N the trials used
            tracker.wait().finish(result, config, path)
            tracker.close()
    return config, path, estimate


def _reviser(settings: TuneSettings, timer, estimate, log: Callable[[str], None]):
    """``Tuner.on_baseline``: once strict at the middle N ran, the estimate revised from its
    measured wall time (``JobEstimate.revised``), said once; None without a timer."""
    if timer is None or estimate is None or estimate.seconds is None:
        return None
    said = []

    generated = estimate.phases[0].samples  # strict's samples this job generates (a resumed one reads the rest)

    def revise(n_draft: int, result, seconds: float) -> None:
        if said or n_draft != settings.mid_n_draft or generated < 1:
            return
        imports = timer.phases.get("imports")
        elapsed = timer.wall + (imports.wall if imports is not None else 0.0)
        total, line = estimate.revised(elapsed, generated, seconds)
        estimate.revised_seconds = total
        said.append(total)
        log(line)

    return revise


def _timing_path(settings: TuneSettings, config: TunedConfig) -> Path:
    """Where a tuning job keeps its phase table: ``<output_dir>/<task>.phases.json``."""
    return Path(settings.output_dir) / f"{config.task}.phases.json"


def _timing_line(timer, estimate, saved: Path) -> str:
    """One line: the job's wall time by phase (seconds), against the estimate it announced."""
    data = timer.to_dict()
    parts = ", ".join(f"{p['name']} {p['wall']:.0f}" for p in data["phases"] if not p["overlapped"])
    total = sum(p["wall"] for p in data["phases"] if not p["overlapped"])
    said = getattr(estimate, "job_seconds", None)
    after = getattr(estimate, "revised_seconds", None)
    versus = (f"; estimated {clock(said)}" if said else "") + (f", {clock(after)} after strict" if after else "")
    return f"time: {clock(total)} ({parts} s){versus}; phases and work counts: {saved}"


def export_job(
    settings: TuneSettings,
    backend=None,
    *,
    progress: bool = True,
    evaluate_fn: Callable | None = None,
    track: bool = True,
    log: Callable[[str], None] = print,
    submit_trial: Callable | None = None,
    run_ranges: Callable | None = None,
    worker: str | None = None,
    cost_profile: str | Path | None = None,
) -> tuple[TunedConfig, Path]:
    """Export the tuned config again from what the studies and records of a tuning job
    hold (another epsilon or confidence, say): it never generates, and never modifies
    the tuning run's files, MLflow artifacts, tables or status. Arguments as
    ``tune_job``'s; with ``track``, it logs to an MLflow run of its own (``ExportRun``),
    nested under the tuning run it reads. With ``cost_profile`` (a cost table measured on
    the serving host: ``relaxtune.report.reexport.read_cost_profile``), the confirmed points
    and strict are re-priced with it and the recommendation chosen again
    (``relaxtune.report.reexport.reprice``), without running any trial.

    Returns:
        ``(config, path)`` of the exported YAML (``export_path``).

    Raises:
        JobError: an export with nothing to export (``check_exportable``: before the
            backend loads), or one that would mix runs, or a study searched other problems,
            or a ``cost_profile`` that cannot price the job (before its MLflow run starts).
    """
    serving = None if cost_profile is None else read_cost_profile(cost_profile)  # before anything loads
    job = _start(settings, backend, False, log, track)
    settings = job.settings
    tuning = tuning_settings(settings.output_dir, job.spec.name)  # the job it reads
    path = export_path(settings, job.spec, tuning)
    exporter = _export_run(settings, job, tuning) if track else None
    tuner = _tuner(job, None, evaluate_fn, progress, False, log, run_ranges, worker)
    outcomes = _studies(job, tuner, "reading the study of", submit_trial, log)
    pinned = {o.method for o in outcomes if tuner.pinned(o.method) is not None}
    check_outcomes(outcomes, job.problems, job.profile, settings.n_drafts, pinned)
    confirmations = _choose(job, tuner, outcomes, [], new_trials=False, log=log)
    mlflow_info = costs = None
    if exporter is not None:
        for outcome in outcomes:  # the tuning job's study runs, read only
            outcome.mlflow_run_id = exporter.study_run(outcome.study.study_name)
    result = tuner.result(outcomes, confirmations, len(job.held_out))
    if serving is not None:  # refused here, before the export's MLflow run starts
        result, costs = reprice(result, serving, cost_profile)
        log(f"re-priced with {cost_profile}: {serving.summary()}")
    if exporter is not None:
        mlflow_info = {
            "tracking_uri": exporter.uri,
            "experiment": f"relaxtune-{job.spec.name}",
            "experiment_id": exporter.experiment_id,
            "run_id": exporter.start(),
            "tuning_run_id": exporter.tuning_run_id,
        }
    try:
        config, path = _write(result, mlflow_info, path, costs)
        if exporter is not None:
            exporter.finish(result, config, path)
    except Exception as err:
        if exporter is not None:
            exporter.fail(f"{type(err).__name__}: {err}")
        raise
    return config, path


# ------------------------------------------------------------------ the shared steps


@dataclass
class _Job:
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
    from .decoding.deployable import deployable_methods

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


def _start(settings: TuneSettings, backend, new_trials: bool, log: Callable[[str], None], track: bool) -> _Job:
    """Checks, problems and the pair (``prepare``), the stores, the holdout split, the
    studies' problems (``check_search_problems``) and the forward costs (``job_costs``)."""
    if new_trials and settings.deployable_on:
        settings = deployable(settings, log)
    spec, everything, backend = prepare(settings, backend, new_trials, log, track)
    if new_trials:
        fit_contexts(backend, spec, everything, settings.n_drafts, settings.parallel_trials)
    settings = start(settings)  # the output folder made, the auto runtime resolved: what the job records
    try:  # before any Optuna storage or MLflow client of this worker opens them (a tuning job's MLflow
        # store is prepared by its tracker's thread, while the first samples are generated: _tracker)
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
        check_search_problems(settings.storage_url, settings.methods, spec, pair, problems, settings.confirm)
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
    return _Job(settings, spec, everything, problems, held_out, backend, pair, profile, saved, measured)


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


def _tuner(job: _Job, tracker, evaluate_fn, progress: bool, new_trials: bool, log, run_ranges, worker) -> Tuner:
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


def _studies(job: _Job, tuner: Tuner, verb: str, submit_trial, log: Callable[[str], None]) -> list:
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


def _choose(
    job: _Job, tuner: Tuner, outcomes: list, default_n: list[int], new_trials: bool, log: Callable[[str], None]
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


def _write(result, mlflow_info: dict | None, path: Path, costs: dict | None = None) -> tuple[TunedConfig, Path]:
    """The tuned config of a finished job, written (atomically) at ``path`` (``costs``: a
    re-priced export's, ``relaxtune.report.reexport.reprice``)."""
    config = build_config(result, mlflow_info, costs)
    return config, save_config(config, path)


def _tracker(settings: TuneSettings, job: _Job, log: Callable[[str], None] = print):
    """A tuning job's MLflow runs, its store prepared and its cost profile logged on a
    thread of its own (``BackgroundTracker``)."""
    from .report.background import BackgroundTracker
    from .report.stores import DEFAULT_URI, is_database, prepare_mlflow
    from .report.tracking import Tracker
    from .tune.studies import storage_lock

    def make() -> Tracker:
        prepare_mlflow(settings.mlflow_uri or DEFAULT_URI, log)
        tracker = Tracker(
            settings.mlflow_uri,
            job.spec,
            job.pair,
            settings.model_dump(),
            job.everything,
            job_id(settings, job.spec, job.pair),
            storage_lock(settings.storage_url, "mlflow"),
            storage_lock(settings.storage_url, "finish"),
            end_on_stop=False,
        )
        tracker.log_costs(job.profile)
        return tracker

    tracker = BackgroundTracker(make)
    if not is_database(settings.mlflow_uri or DEFAULT_URI):
        tracker.wait()  # a tracking server: nothing to migrate, and a wrong address fails before any sample
    return tracker


def _export_run(settings: TuneSettings, job: _Job, tuning: TuneSettings | None):
    """An export's MLflow run of its own, nested under the tuning run (job ``tuning``) it reads."""
    from .report.tracking import ExportRun

    return ExportRun(
        settings.mlflow_uri,
        job.spec,
        job.pair,
        settings.model_dump(),
        job.everything,
        job_id(tuning, job.spec, job.pair) if tuning is not None else None,
    )
