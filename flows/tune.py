"""Prefect 3 flows: ``evaluate_point``, ``tune_task``, ``tune_all``.

Thin wrappers over the library (``relaxtune.job.run_tune_job`` and
``relaxtune.evaluation.evaluate``): every evaluation of a tuning trial runs as
the Prefect task ``generate_and_grade``, which takes ids and settings (never
model objects: models load once per process through a cached loader), is
cached on its inputs, retries transient backend errors, and carries a
``relaxtune-backend:<pair>`` tag for a concurrency limit
(``prefect concurrency-limit create relaxtune-backend:<pair> 1``).
"""

from __future__ import annotations

import functools

from prefect import flow, get_run_logger, task
from prefect.cache_policies import INPUTS

from relaxtune.evaluation import DecodeConfig, EvalResult, evaluate
from relaxtune.tasks import list_tasks, load_problems, load_task
from relaxtune.settings import TuneSettings

TRANSIENT = (OSError,)  # connection errors and timeouts included


def _transient(task, task_run, state) -> bool:
    """Retry only transient backend faults, not bad input."""
    try:
        state.result()
    except TRANSIENT:
        return True
    except Exception:  # noqa: BLE001
        return False
    return False


BACKEND_FIELDS = ("drafter", "verifier", "dtype", "drafter_url", "verifier_url", "tokenizer", "native_url", "concurrency",
                  "batch_size")


def _backend(settings: TuneSettings):
    """The settings' backend (in-process pair or SGLang), loaded once per process."""
    return _cached_backend(settings.task, tuple((k, getattr(settings, k)) for k in BACKEND_FIELDS))


@functools.lru_cache(maxsize=4)
def _cached_backend(task: str, fields: tuple):
    from relaxtune.job import load_backend

    return load_backend(TuneSettings(task=task, **dict(fields)))


@functools.lru_cache(maxsize=16)
def _problems(task: str, limit: int | None) -> tuple:
    """The task's problems, loaded once per process (every stage of every trial asks)."""
    return tuple(load_problems(load_task(task), limit))


@task(cache_policy=INPUTS, retries=2, retry_delay_seconds=10, retry_condition_fn=_transient, persist_result=True)
def generate_and_grade(settings: dict, method: str, knob: float | None, n_draft: int, seed: int, n_problems: int) -> EvalResult:
    """Generate and grade one configuration on the first ``n_problems`` problems
    (records resume from disk, so a retry redoes only unfinished samples)."""
    s = TuneSettings(**settings)
    spec = load_task(s.task)
    problems = list(_problems(s.task, s.limit)[:n_problems])
    return evaluate(spec, _backend(s), DecodeConfig(method, knob, n_draft, seed), output_dir=s.output_dir,
                    problems=problems, progress=False)


def _tagged(settings: dict, pair: str):
    return generate_and_grade.with_options(tags=[f"relaxtune-backend:{pair}"])


@flow(name="evaluate_point", log_prints=True)
def evaluate_point(task: str, method: str = "strict", alpha: float | None = None, n_draft: int = 4, seed: int = 0,
                   limit: int | None = None, drafter: str | None = None, verifier: str | None = None,
                   dtype: str = "bfloat16", output_dir: str = "relaxtune-runs") -> dict:
    """Evaluate one (method, alpha, N) point on a task; returns the result summary."""
    s = TuneSettings(task=task, limit=limit, dtype=dtype, output_dir=output_dir,
                     **{k: v for k, v in dict(drafter=drafter, verifier=verifier).items() if v})
    n = len(_problems(task, limit))
    result = _tagged(s.model_dump(), "point")(s.model_dump(), method, alpha, n_draft, seed, n)
    summary = result.summary()
    print(f"{task} {method} {alpha} N={n_draft}: accuracy {summary['accuracy']:.3f} "
          f"[{summary['ci_low']:.3f}, {summary['ci_high']:.3f}], l_accept {summary['l_accept']:.2f}")
    return summary


@flow(name="tune_task", log_prints=True)
def tune_task(task: str, methods: list[str] | None = None, limit: int | None = None, epsilon: float = 0.05,
              trials: int = 8, n_drafts: list[int] | None = None, settings: dict | None = None) -> dict:
    """Tune every method on one task (the same job as ``relaxtune tune``);
    returns the exported config as a dict. ``settings`` holds any other
    ``TuneSettings`` field."""
    from relaxtune.job import cautions, prepare, run_tune_job

    fields = dict(settings or {}) | {"task": task, "epsilon": epsilon, "trials": trials, "limit": limit}
    if methods:
        fields["methods"] = methods
    if n_drafts:
        fields["n_drafts"] = n_drafts
    s = TuneSettings(**fields)
    logger = get_run_logger()
    spec, problems, backend = prepare(s, _backend(s))
    pair = backend.name
    as_dict = s.model_dump()

    def evaluate_fn(spec, backend, config, *, output_dir, problems, progress):
        return _tagged(as_dict, pair)(as_dict, config.method, config.knob, config.n_draft, config.seed, len(problems))

    config, path = run_tune_job(s, backend, progress=False, evaluate_fn=evaluate_fn, log=logger.info)
    logger.info(f"tuned config written to {path}: recommend {config.recommendation.method} "
                f"(alpha {config.recommendation.knob}, N {config.recommendation.n_draft})")
    for line in cautions(config):
        logger.warning(line)
    return config.model_dump(mode="json")


@flow(name="tune_all", log_prints=True)
def tune_all(tasks: list[str] | None = None, methods: list[str] | None = None, limit: int | None = None,
             epsilon: float = 0.05, trials: int = 8, settings: dict | None = None) -> dict[str, str]:
    """Tune every task of ``evals/`` (or the given ones); returns task -> recommended method."""
    out = {}
    for name in tasks or list_tasks():
        cfg = tune_task(name, methods=methods, limit=limit, epsilon=epsilon, trials=trials, settings=settings)
        out[name] = cfg["recommendation"]["method"]
    return out
