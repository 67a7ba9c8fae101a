"""The Prefect tasks of the flows, their cache key, and fan-out helpers.

- ``generate_and_grade``: one configuration on one range of problems. Cached on
  its inputs plus what they only name: the task's version and a digest of its
  spec, the backend's identity (the in-process pair's model files and dtype, or
  the SGLang servers and the models they report) and relaxtune's version, so a
  bumped task, edited spec, replaced model or relaunched server is never served
  a stale result. Retried on transient backend errors; tagged
  ``relaxtune-backend:<host or server>`` for a per-backend concurrency limit
  (``prefect concurrency-limit create relaxtune-backend:<host> 2``).
- ``run_trial``: takes the next trial of a tuning job's studies and runs it, one
  task run per trial (``Tuner.next_trial``).

``tune_one``, one task's ``tune_task`` flow as a task run, lives beside that flow in
``flows/tune.py`` (this module imports nothing of the flows).
"""

from __future__ import annotations

import functools
import hashlib
import json
import socket
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from urllib.parse import urlsplit

from prefect import task
from prefect.cache_policies import NONE

from relaxtune.tasks.spec import load_problems, load_task
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.job_identity import spec_digest
from relaxtune.tune.point_records import DecodeConfig, EvalResult
from relaxtune.tune.setting_groups import PairSettings
from relaxtune.tune.settings import TuneSettings

__all__ = [
    "generate_and_grade",
    "run_trial",
    "evaluation_cache_key",
    "backend_identity",
    "backend_tag",
    "as_future",
    "fan_out",
    "load_backend",
    "problems_of",
    "register",
    "unregister",
]

TRANSIENT = (OSError,)  # connection errors and timeouts included
MODEL_FILES = {".json", ".safetensors", ".bin", ".gguf", ".model", ".txt", ".jinja"}


def _transient(task, task_run, state) -> bool:
    """Retry only transient backend faults, not bad input."""
    try:
        state.result()
    except TRANSIENT:
        return True
    except Exception:
        return False
    return False


def load_backend(pair: PairSettings):
    """The backend of the job's model pair settings (in-process pair or SGLang), loaded
    once per process whatever the task (a transfer evaluates several tasks on one pair)."""
    return _cached_backend(tuple(pair.backend.items()))


@functools.lru_cache(maxsize=4)
def _cached_backend(fields: tuple):
    from relaxtune.backends.load import load_backend

    return load_backend(**dict(fields))


def problems_of(task: str, limit: int | None) -> tuple:
    """The task's problems, loaded once per process and spec content (every range of
    every trial asks; an edited spec loads them anew)."""
    spec = load_task(task)
    return _problems(task, spec_digest(spec), limit)


@functools.lru_cache(maxsize=16)
def _problems(task: str, digest: str, limit: int | None) -> tuple:
    return tuple(load_problems(load_task(task), limit))


@functools.lru_cache(maxsize=32)
def _server(url: str) -> dict:
    """An SGLang server: its URL and the model it reports (``/get_model_info``), once per process."""
    import httpx

    try:
        info = httpx.get(url.rstrip("/") + "/get_model_info", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        info = None  # unreachable: the evaluation itself will fail and say so
    return {"url": url, "model": info}


def _model(model: str) -> object:
    """A model's identity: a local folder's model files (name, bytes, modification
    time), else the name (an embedded model or a hub id)."""
    path = Path(model)
    if not path.is_dir():
        return model
    return [model] + sorted(
        [f.name, f.stat().st_size, f.stat().st_mtime_ns]
        for f in path.iterdir()
        if f.is_file() and f.suffix in MODEL_FILES
    )


def backend_identity(pair: PairSettings) -> dict:
    """What serves the evaluations (``pair``: the job's model pair settings): the SGLang
    servers (URL and reported model) and the tokenizer, or the in-process drafter and
    verifier (model files) and dtype."""
    if pair.verifier_url:
        urls = (pair.drafter_url, pair.verifier_url, pair.native_url)
        return {"servers": [_server(u) for u in urls if u], "tokenizer": pair.tokenizer or pair.verifier}
    return {"drafter": _model(pair.drafter), "verifier": _model(pair.verifier), "dtype": pair.dtype}


def backend_tag(pair: PairSettings) -> str:
    """``relaxtune-backend:<verifier server host:port>`` or ``relaxtune-backend:<this host>``
    (in-process models; ``pair``: the job's model pair settings): one tag per machine that generates."""
    where = urlsplit(pair.verifier_url).netloc if pair.verifier_url else socket.gethostname()
    return f"relaxtune-backend:{where}"


def evaluation_cache_key(context, parameters: dict) -> str:
    """``generate_and_grade``'s cache key: SHA-256 of its inputs, the task's name,
    version and spec digest, the backend's identity, relaxtune's version and the
    code identity (``relaxtune.tune.identity.code_identity``)."""
    from importlib import metadata

    from relaxtune.tune.identity import code_identity

    settings = TuneSettings(**parameters["settings"])
    spec = load_task(settings.task)
    key = {
        "inputs": parameters,
        "task": [spec.name, spec.version, spec_digest(spec)],
        "backend": backend_identity(settings.pair),
        "relaxtune": metadata.version("relaxtune"),
        "code": code_identity(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


@task(
    cache_key_fn=evaluation_cache_key,
    retries=2,
    retry_delay_seconds=10,
    retry_condition_fn=_transient,
    persist_result=True,
    task_run_name="{method} {knob} N={n_draft}, problems {problem_ids[0]}..",
)
def generate_and_grade(
    settings: dict,
    method: str,
    knob: float | None,
    n_draft: int,
    seed: int,
    problem_ids: tuple[str, ...],
    scope: str = "all",
    extra: tuple[tuple[str, float], ...] = (),
) -> EvalResult:
    """Generate and grade one configuration on the problems ``problem_ids`` (a range
    of the tuner's problems: a prefix of the task's, or of its search half with
    ``--confirm holdout``); records resume from disk, so a retry redoes only
    unfinished samples. ``scope`` and ``extra`` (the point's further named knobs,
    ``DecodeConfig.extra``) complete the point.

    Raises:
        KeyError: an id that is not among the task's first ``settings.limit`` problems.
    """
    s = TuneSettings(**settings)
    by_id = {p.id: p for p in problems_of(s.task, s.limit)}
    problems = [by_id[i] for i in problem_ids]
    return evaluate(
        load_task(s.task),
        load_backend(s.pair),
        DecodeConfig(method, knob, n_draft, seed, scope, tuple((name, value) for name, value in extra)),
        output_dir=s.output_dir,
        problems=problems,
        progress=False,
    )


_CALLS: dict[str, Callable] = {}  # what run_trial runs, by key (task runs take names, not objects)


def register(key: str, fn: Callable) -> str:
    """Make ``fn`` callable by ``run_trial(key)`` in this process; returns ``key``."""
    _CALLS[key] = fn
    return key


def unregister(key: str) -> None:
    """Forget what ``register`` made callable under ``key``."""
    _CALLS.pop(key, None)


@task(cache_policy=NONE, task_run_name="trial ({key})")
def run_trial(key: str) -> dict | None:
    """Take the next trial of a tuning job and run it (``Tuner.next_trial``); its
    report as a dict, or None when the job's studies are finished."""
    report = _CALLS[key]()
    return None if report is None else vars(report)


def as_future(prefect_future) -> Future:
    """A ``concurrent.futures.Future`` that resolves with a Prefect future's result
    (or its exception), whatever the task runner."""
    out: Future = Future()

    def done(f) -> None:
        try:
            out.set_result(f.result())
        except BaseException as err:
            out.set_exception(err)

    prefect_future.add_done_callback(done)
    return out


def fan_out(items: list, start: Callable[[object], Future], limit: int) -> list:
    """``start(item)`` for every item, at most ``limit`` in flight; the results in item order.

    Raises:
        the first failed item's exception, once every item has run (one failing
        task does not stop the others).
    """
    results: dict[int, object] = {}
    pending: dict[Future, int] = {}
    queue = list(enumerate(items))
    while queue or pending:
        while queue and len(pending) < max(1, limit):
            i, item = queue.pop(0)
            pending[start(item)] = i
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            results[pending.pop(future)] = future
    return [results[i].result() for i in range(len(items))]
