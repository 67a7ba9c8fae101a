"""The two jobs, ``tune_job`` and ``export_job``, composed from the shared steps of
``relaxtune.job.steps``, and ``run_tune_job``, the CLI's and the flow's entry point that
runs one or the other; a tuning job's phase table and its time line against the estimate
it announced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..report.config_schema import TunedConfig
from ..report.reexport import check_outcomes, export_path, read_cost_profile, reprice, save_job, tuning_settings
from ..tune.estimate_announce import announce, keep_measures
from ..tune.estimate_plan import clock
from ..tune.phases import activate, phase
from ..tune.phases import active as timer_now
from ..tune.settings import TuneSettings
from .steps import (
    choose_and_confirm,
    export_run,
    job_tracker,
    make_tuner,
    run_studies,
    start_job,
    write_config,
)

__all__ = ["run_tune_job", "tune_job", "export_job"]


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
        keep_measures(estimate, timer.to_dict())  # for the next job's first estimate
    return config, path


def _tune_job(settings, backend, progress, evaluate_fn, track, log, submit_trial, run_ranges, worker):
    """``tune_job``'s steps, each a phase of the active timer (``relaxtune.tune.phases``);
    returns ``(config, path, the job's JobEstimate)``."""
    with phase("start"):
        job = start_job(settings, backend, True, log, track)
        settings = job.settings  # the auto runtime resolved: what the job records
        path = Path(settings.export or Path(settings.output_dir) / f"{job.spec.name}.tuned.yaml")
        tracker = job_tracker(settings, job, log) if track else None
        tuner = make_tuner(job, tracker, evaluate_fn, progress, True, log, run_ranges, worker)
        save_job(settings.output_dir, job.spec.name, settings.model_dump())
        estimate = announce(
            settings.search,
            settings.stats,
            Path(settings.output_dir),
            settings.batch_size,
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
        outcomes = run_studies(job, tuner, "tuning", submit_trial, log)
    with phase("MLflow"):
        if tracker is not None:  # its calls were queued (BackgroundTracker): the study runs are known once they ran
            for outcome in outcomes:
                outcome.mlflow_run_id = tracker.wait().study_runs.get(outcome.method)
    with phase("confirmations"):
        confirmations = choose_and_confirm(job, tuner, outcomes, [settings.mid_n_draft], new_trials=True, log=log)
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
        config, path = write_config(result, mlflow_info, path)
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
    job = start_job(settings, backend, False, log, track)
    settings = job.settings
    tuning = tuning_settings(settings.output_dir, job.spec.name)  # the job it reads
    path = export_path(settings, job.spec, tuning)
    exporter = export_run(settings, job, tuning) if track else None
    tuner = make_tuner(job, None, evaluate_fn, progress, False, log, run_ranges, worker)
    outcomes = run_studies(job, tuner, "reading the study of", submit_trial, log)
    pinned = {o.method for o in outcomes if tuner.pinned(o.method) is not None}
    check_outcomes(outcomes, job.problems, job.profile, settings.n_drafts, pinned)
    confirmations = choose_and_confirm(job, tuner, outcomes, [], new_trials=False, log=log)
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
        config, path = write_config(result, mlflow_info, path, costs)
        if exporter is not None:
            exporter.finish(result, config, path)
    except Exception as err:
        if exporter is not None:
            exporter.fail(f"{type(err).__name__}: {err}")
        raise
    return config, path
