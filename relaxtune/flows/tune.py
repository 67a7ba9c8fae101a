"""Prefect 3 flows: ``evaluate_point``, ``tune_task``, ``tune_all``, ``tune_new``.

Thin wrappers over the library (``relaxtune.job.run_tune_job``,
``relaxtune.tune.evaluation.evaluate``, ``relaxtune.tune.schedule.untuned``); the Prefect
tasks are in ``flows/steps.py``. ``tune_task`` is one worker of a tuning job: it
submits the job's trials as concurrent task runs (``parallel_trials`` at a time,
taken from the methods' study queues) and each evaluation as task runs over
ranges of problems (``range_size``), merged into one result. Run ``tune_task``
with the same parameters on several workers (one per GPU host or SGLang
deployment, against one PostgreSQL storage): they share the studies, finish
exactly ``trials`` trials per method, and each exports the same config.
``tune_all`` and ``tune_new`` fan tasks out the same way (``parallel_tasks`` at a
time); ``tune_new`` tunes every task spec whose data loads and that has no tuned
config for its version and pair yet, or whose spec changed since (deployed daily
by ``prefect.yaml``, bounded by its ``limit``, ``trials`` and ``n_drafts``).
"""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from relaxtune.flows.params import FROM_SETTINGS, SETTING, from_settings
from relaxtune.flows.steps import (
    as_future,
    backend_tag,
    fan_out,
    generate_and_grade,
    load_backend,
    problems_of,
    register,
    run_trial,
    unregister,
)
from relaxtune.tasks.spec import list_tasks
from relaxtune.tune.point_records import DecodeConfig
from relaxtune.tune.ranges import merge, split
from relaxtune.tune.settings import TuneSettings, field_info
from relaxtune.tune.studies import default_worker


def _ranges_runner(settings: TuneSettings):
    """``Tuner.run_ranges`` for a flow: one ``generate_and_grade`` task run per range, concurrently."""
    as_dict = settings.model_dump()
    tagged = generate_and_grade.with_options(tags=[backend_tag(settings.pair)])

    def run_ranges(config: DecodeConfig, problems: list, ranges: list[range]):
        futures = [
            tagged.submit(
                as_dict,
                config.method,
                config.knob,
                config.n_draft,
                config.seed,
                tuple(p.id for p in problems[r.start : r.stop]),
                **({} if config.scope == "all" else {"scope": config.scope}),
                **({"extra": config.extra} if config.extra else {}),  # a point off alpha's view: every knob
            )
            for r in ranges
        ]
        return [f.result() for f in futures]

    return run_ranges


@flow(name="evaluate_point", log_prints=True)
@from_settings
def evaluate_point(
    task: str = SETTING,
    method: str = "strict",
    alpha: float | None = None,
    n_draft: int = 4,
    seed: int = SETTING,
    limit: int | None = SETTING,
    drafter: str = SETTING,
    verifier: str = SETTING,
    dtype: str = SETTING,
    output_dir: str = SETTING,
    range_size: int | None = SETTING,
) -> dict:
    """Evaluate one (method, alpha, N) point on a task, in ranges of ``range_size``
    problems run as concurrent task runs; returns the merged result's summary.

    Args:
        method: method id, or 'ar'
        alpha: the method's knob
        n_draft: draft length N
    """
    s = TuneSettings(
        task=task,
        limit=limit,
        dtype=dtype,
        output_dir=output_dir,
        range_size=range_size,
        **{k: v for k, v in dict(drafter=drafter, verifier=verifier).items() if v},
    )
    problems = list(problems_of(task, limit))
    ranges = split(len(problems), s.range_size)
    summary = merge(_ranges_runner(s)(DecodeConfig(method, alpha, n_draft, seed), problems, ranges)).summary()
    print(
        f"{task} {method} {alpha} N={n_draft}: accuracy {summary['accuracy']:.3f} "
        f"[{summary['ci_low']:.3f}, {summary['ci_high']:.3f}], l_accept {summary['l_accept']:.2f}"
    )
    return summary


@flow(name="tune_task", log_prints=True)
@from_settings
def tune_task(
    task: str = SETTING,
    methods: list[str] | None = FROM_SETTINGS,
    limit: int | None = SETTING,
    epsilon: float = SETTING,
    trials: int = SETTING,
    n_drafts: list[int] | None = FROM_SETTINGS,
    settings: dict | None = None,
) -> dict:
    """Tune every method on one task (the same job as ``relaxtune tune``), as one
    worker of it; returns the exported config as a dict.

    Args:
        settings: any other setting by its flat name (``storage``, ``parallel_trials``, ``range_size``, ...)
    """
    from prefect.runtime import flow_run

    from relaxtune.job.run import run_tune_job
    from relaxtune.report.decision import decide
    from relaxtune.report.export import cautions

    fields = dict(settings or {}) | {"task": task, "epsilon": epsilon, "trials": trials, "limit": limit}
    if methods:
        fields["methods"] = methods
    if n_drafts:
        fields["n_drafts"] = n_drafts
    s = TuneSettings(**fields)
    logger = get_run_logger()
    worker = f"{default_worker()}/{flow_run.name or 'flow'}"
    key = f"{worker}/{uuid.uuid4().hex[:8]}"

    def submit_trial(next_trial):
        return as_future(run_trial.submit(register(key, next_trial)))

    try:
        config, path = run_tune_job(
            s,
            load_backend(s.pair),
            progress=False,
            run_ranges=_ranges_runner(s),
            submit_trial=submit_trial,
            worker=worker,
            log=logger.info,
        )
    finally:
        unregister(key)
    logger.info(f"tuned config written to {path}: recommend {decide(config).label}")
    for line in cautions(config):
        logger.warning(line)
    return config.model_dump(mode="json")


@task(cache_policy=NONE, task_run_name="tune {task}")
def tune_one(task: str, kwargs: dict) -> dict:
    """The ``tune_task`` flow of one task (a subflow run), as a task run (so
    ``tune_all`` and ``tune_new`` can run several tasks at once)."""
    return tune_task(task=task, **kwargs)


def _tune_many(tasks: dict[str, str], parallel_tasks: int, **kwargs) -> dict[str, str]:
    """``tune_task`` for each of ``tasks`` (name -> name or YAML path), ``parallel_tasks``
    at a time; name -> recommended method."""
    configs = fan_out(list(tasks.values()), lambda task: as_future(tune_one.submit(task, kwargs)), parallel_tasks)
    return {name: cfg["recommendation"]["method"] for name, cfg in zip(tasks, configs)}


@flow(name="tune_all", log_prints=True)
@from_settings
def tune_all(
    tasks: list[str] | None = None,
    methods: list[str] | None = FROM_SETTINGS,
    limit: int | None = SETTING,
    epsilon: float = SETTING,
    trials: int = SETTING,
    settings: dict | None = None,
    parallel_tasks: int = 1,
) -> dict[str, str]:
    """Tune every task of ``evals/`` (or the given ones), ``parallel_tasks`` at a
    time; returns task -> recommended method.

    Args:
        tasks: task names or YAML paths (default: every task of evals/)
        settings: any other setting by its flat name
        parallel_tasks: tasks tuned at once
    """
    return _tune_many(
        {t: t for t in tasks or list_tasks()},
        parallel_tasks,
        methods=methods,
        limit=limit,
        epsilon=epsilon,
        trials=trials,
        settings=settings,
    )


@flow(name="tune_new", log_prints=True)
@from_settings
def tune_new(
    folders: list[str] | None = None,
    methods: list[str] | None = FROM_SETTINGS,
    limit: int | None = SETTING,
    epsilon: float = SETTING,
    trials: int = SETTING,
    n_drafts: list[int] | None = FROM_SETTINGS,
    settings: dict | None = None,
    parallel_tasks: int = 1,
) -> dict[str, str]:
    """Tune every task spec of ``evals/`` and ``folders`` that has no tuned config
    for its version and the settings' model pair in the output folder yet, or whose
    spec changed after its config was made (``relaxtune.tune.schedule.untuned``), and
    that can be tuned: a spec whose data cannot load, or whose response budget is
    shorter than a draft length, is skipped with a one-line reason before any model
    loads; returns task -> recommended method.

    Args:
        folders: folders of task specs besides evals/
        settings: any other setting by its flat name
        parallel_tasks: tasks tuned at once
    """
    from relaxtune.tune.schedule import unavailable, untuned

    given = settings or {}
    output_dir = given.get("output_dir", field_info("output_dir").default)
    pair = (given.get("drafter", field_info("drafter").default), given.get("verifier", field_info("verifier").default))
    drafts = n_drafts or given.get("n_drafts") or field_info("n_drafts").default
    logger = get_run_logger()
    pending = []
    for p in untuned(folders, output_dir, pair):
        why = unavailable(p, drafts)
        if why is None:
            logger.info(f"{p.name} ({p.path}): {p.reason}")
            pending.append(p)
        else:
            logger.warning(f"skipping {p.name} ({p.path}): {why}")
    if not pending:
        logger.info("every task spec with loadable data has a current tuned config: nothing to tune")
    return _tune_many(
        {p.name: p.path for p in pending},
        parallel_tasks,
        methods=methods,
        limit=limit,
        epsilon=epsilon,
        trials=trials,
        n_drafts=n_drafts,
        settings=settings,
    )
