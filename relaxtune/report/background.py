"""A tuning job's MLflow tracking off its critical path.

Creating a fresh MLflow store runs MLflow's ~50 schema migrations (2-4 s on
SQLite), and every log call is a round trip to the store or tracking server
(0.1-0.3 s for a trial run with its table). ``BackgroundTracker`` makes the
``Tracker`` (store prepared first: ``relaxtune.report.stores.prepare_mlflow``)
and runs its calls on one thread of its own, in the order they were made, so
neither holds the backend, a trial or the queue: the job's first samples are
generated while the store is migrated. Calls that only write (``start_study``,
``log_trial``) return at once; everything else (``log_confirmation``,
``finish``, the run ids) is called on ``wait()``, which waits for every queued call first. A queued call that
failed is raised by the next call made to the tracker; a store that could not be
made is raised as ``JobError``, with what to do (a job tracking to a server, with
nothing to migrate, waits for the making: a wrong address fails before any
sample). A stopped or failed job waits for the thread (up to a minute: it never
exits in the middle of a migration), then ends its runs. A worker killed with
queued calls loses only their runs: ``Tracker.finish`` logs every ended trial
that has none (whichever worker finishes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for

from ..tune.phases import phase
from ..tune.stopping import on_stop
from .reexport import JobError
from .stores import StoreError

__all__ = ["BackgroundTracker"]

SETTLE = 60.0  # seconds a stopped job waits for the tracker's thread


class BackgroundTracker:
    """A ``Tracker`` made by ``make()`` and called on one thread of its own, in call order.

    ``start_study`` and ``log_trial`` are queued and return None; everything else is read
    from ``wait()``, the ``Tracker`` once every queued call has run.

    Args:
        make: builds the ``Tracker`` (and prepares its store); runs on the tracker's thread.

    Raises (from the next call after a failure):
        JobError: the store could not be made (``StoreError``'s message: what to do).
        Exception: what a queued call raised (e.g. the tracking server went away).
    """

    def __init__(self, make: Callable[[], object]) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mlflow")
        self._made: Future = self._pool.submit(_timed, make)
        self._queued: list[Future] = []
        self._guard = threading.Lock()
        on_stop(self._end)  # a job stopped or failed (relaxtune.tune.stopping): settle, then end the runs

    def _end(self, status: str) -> None:
        """Let the making and the queued calls finish (an exit in the middle of MLflow's
        migration would leave the store half-made), up to ``SETTLE`` s, then end the
        tracker's runs as ``status`` (``Tracker.end``)."""
        with self._guard:
            calls = [self._made, *self._queued]
        done, _ = wait_for(calls, timeout=SETTLE)
        if self._made in done and self._made.exception() is None:
            self._made.result().end(status)

    def start_study(self, method: str, study) -> None:
        """Queue ``Tracker.start_study`` (its run id is read later from ``wait().study_runs``)."""
        self._queue("start_study", (method, study), {})

    def log_trial(self, *args, **kwargs) -> None:
        """Queue ``Tracker.log_trial`` with these arguments."""
        self._queue("log_trial", args, kwargs)

    def _queue(self, name: str, args: tuple, kwargs: dict) -> None:
        self._raise_failed(wait=False)
        with self._guard:
            self._queued.append(self._pool.submit(_timed, lambda: getattr(self._made.result(), name)(*args, **kwargs)))

    def wait(self):
        """The tracker, once it is made and every queued call has run.

        Raises:
            JobError, Exception: as the class says.
        """
        self._raise_failed(wait=True)
        return self._made.result()

    def close(self) -> None:
        """Wait for the queued calls (raising a failure, as ``wait``), then end the tracker's
        thread: a process that runs many jobs (a Prefect worker) keeps no idle thread per job.

        Raises:
            JobError, Exception: as the class says.
        """
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def _raise_failed(self, wait: bool) -> None:
        """Raise the failure of the tracker's making, else of the first failed queued call
        (waiting for all of them with ``wait``); calls that ran are forgotten."""
        if wait or self._made.done():
            err = self._made.exception()
            if isinstance(err, StoreError):
                raise JobError(str(err)) from None
            if err is not None:
                raise err
        while True:
            with self._guard:  # one thread takes a failure (lanes call the tracker at once), calls that ran go
                failed = next((c for c in self._queued if c.done() and c.exception() is not None), None)
                self._queued = [
                    c for c in self._queued if c is not failed and (not c.done() or c.exception() is not None)
                ]
                pending = [c for c in self._queued if not c.done()]
            if failed is not None:
                raise failed.exception()
            if not (wait and pending):
                return
            wait_for(pending, return_when=FIRST_EXCEPTION)  # the calls run in order: those before a failure ran


def _timed(call: Callable[[], object]) -> object:
    """``call()`` as the phase ``MLflow (tracker thread)`` (beside the job: ``relaxtune.tune.phases``)."""
    with phase("MLflow (tracker thread)"):
        return call()
