"""A job that stops, by Ctrl-C, SIGTERM or a failure, says what it kept and how to go on.

- ``guarded(...)``: the context a job runs in (``relaxtune tune``, the synthetic worker).
  SIGINT and SIGTERM raise ``Stopped`` in the main thread (and ``STOP`` tells other
  threads: ``check_stop``, called after every decoded round); the job's running trial
  goes back to its study's queue (``Tuner``), so a resume runs it first with no
  grace-period wait; the callbacks registered with ``on_stop`` end the job's MLflow
  runs (KILLED on a stop, FAILED on a failure); then one short paragraph says what
  was kept (samples on disk, trials finished) and the command that resumes it. A
  failure's paragraph names the cause (``diagnose``: a full disk, a locked or corrupt
  database, a server gone) and what to do; the full traceback goes to a log file
  whose path it names.
- ``environmental(err)``: a failure of the machine, not of the trial (a trial that
  meets one is not failed: the job stops and keeps the trial for the resume).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from .settings import storage_url

__all__ = [
    "Stopped",
    "STOP",
    "check_stop",
    "on_stop",
    "guarded",
    "diagnose",
    "environmental",
    "kept_line",
    "first_line",
    "write_log",
]

STOP = threading.Event()  # set once a stop was asked for: threads other than the main one end their work
_callbacks: list[Callable[[str], None]] = []  # on_stop: called with "KILLED" or "FAILED"
_active = threading.Event()  # a guarded block runs (outside one, on_stop registers nothing)
_lock = threading.Lock()


class Stopped(KeyboardInterrupt):
    """The job was asked to stop (SIGINT / SIGTERM); ``args[0]`` names the signal."""


def check_stop() -> None:
    """Raise ``Stopped`` in a thread other than the main one once a stop was asked for
    (the main thread gets it from the signal itself)."""
    if STOP.is_set() and threading.current_thread() is not threading.main_thread():
        raise Stopped("stop requested")


def on_stop(callback: Callable[[str], None]) -> None:
    """Call ``callback(status)`` (``"KILLED"`` or ``"FAILED"``) when the guarded job stops
    or fails (e.g. ``Tracker.end``); registrations end with the ``guarded`` block, and
    outside one nothing is registered."""
    with _lock:
        if _active.is_set():
            _callbacks.append(callback)


@contextmanager
def _signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Stopped`` in the main thread while the block runs
    (nothing changes when called from another thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame) -> None:
        STOP.set()
        raise Stopped(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def diagnose(err: BaseException) -> tuple[str, str] | None:
    """``(cause, what to do)`` for a failure of the machine rather than of the job's
    logic: a full disk or quota, a read-only or forbidden folder, a locked or corrupt
    database, a server that is gone; None for anything else."""
    for e in _chain(err):
        text = str(e)
        low = text.lower()
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" writing {e.filename}" if e.filename else ""
            return (
                f"the disk is full (no space left on device{where})",
                "free some space (or give --output-dir on another disk), then run the same command again",
            )
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and e.filename:
            return (
                f"cannot write {e.filename} ({e.strerror})",
                "give --output-dir a folder you may write to, then run the same command again",
            )
        if "database is locked" in low or "database table is locked" in low:
            return (
                f"a database is locked by another process ({first_line(text)})",
                "let the other process finish (or stop it), then run the same command again",
            )
        if any(s in low for s in ("file is not a database", "database disk image is malformed", "malformed database")):
            return (
                f"a database file is corrupt ({first_line(text)})",
                "move the damaged file aside (the JSONL records stay: samples are not generated again) and run "
                "the same command again",
            )
        name = type(e).__name__
        if name in (
            "ConnectError",
            "ConnectTimeout",
            "RemoteProtocolError",
            "SGLangError",
            "ConnectionRefusedError",
            "ConnectionResetError",
        ) or isinstance(e, ConnectionError):
            return (
                f"a server is gone ({name}: {first_line(text)})",
                "restart the server it names (a generation server: `relaxtune serve`; an MLflow tracking server: "
                "`mlflow server`), then run the same command again",
            )
    return None


def environmental(err: BaseException) -> bool:
    """True when ``err`` is a failure of the machine (``diagnose`` knows it)."""
    return diagnose(err) is not None


def first_line(text: str, width: int = 160) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def kept_line(output_dir: str | Path, task_folder: str, storage_url: str | None, studies: list[str]) -> str:
    """What a job kept, in one clause: the finished samples in its records
    (``<output_dir>/<task_folder>/**/*.jsonl``) and the finished trials of ``studies``."""
    folder = Path(output_dir) / task_folder
    samples, files = 0, 0
    for path in folder.rglob("*.jsonl") if folder.is_dir() else []:
        done = set()
        with open(path, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by the stop: that sample runs again
                if not rec.get("failed"):
                    done.add((rec.get("problem_id"), rec.get("repeat")))
        samples, files = samples + len(done), files + 1
    out = f"{samples} samples in {files} record file{'s' if files != 1 else ''} under {folder}"
    if storage_url and studies:
        try:
            import optuna
            from optuna.trial import TrialState

            counts = []
            for name in studies:
                try:
                    trials = optuna.load_study(study_name=name, storage=storage_url).get_trials(deepcopy=False)
                except KeyError:
                    continue
                counts.append(
                    f"{name.split('__')[1]} {sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)}"
                )
            if counts:
                out += f"; trials finished: {', '.join(counts)}"
        except Exception as err:
            out += f"; the trials could not be counted ({type(err).__name__})"
    return out


def write_log(output_dir: str | Path, name: str, text: str) -> Path | None:
    """Write ``text`` to ``<output_dir>/logs/<name>-<time>.log``, else to the system's
    temporary folder (a full or read-only output disk); None when neither works."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for folder in (Path(output_dir) / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}-{stamp}.log"
            path.write_text(text)
            return path
        except OSError:
            continue
    return None


@contextmanager
def guarded(
    stores,
    task_folder: str,
    studies: Callable[[], list[str]],
    resume: str,
    say: Callable[[str], None],
    name: str = "relaxtune",
    passthrough: tuple[type[BaseException], ...] = (),
    exit_now: bool = False,
) -> Iterator[None]:
    """Run a job's block so that a stop or a failure ends it with one short paragraph.

    Args:
        stores: the job's ``StoreSettings`` (output folder, storage).
        task_folder: the task's records folder under the output folder (``<task>-v<N>``).
        studies: the names of the job's studies (called after the stop).
        resume: the command that resumes the job.
        say: where the paragraph goes.
        name: the log file's name prefix.
        passthrough: exceptions raised as they are (the caller reports them, e.g. a
            ``JobError`` refusal before any generation).
        exit_now: after a stop, end the process at once (``os._exit(130)``, once the
            runs are ended and the paragraph flushed): tearing down an interpreter
            that loaded torch, MLflow and datasets takes 10-20 s on a busy machine,
            and a stopped command must not look stuck. For a command's process only.

    Raises:
        SystemExit: 130 after a stop, 1 after a failure of the machine or any other
            error (the paragraph said why; the traceback is in the log file).
    """
    started = time.monotonic()
    STOP.clear()
    with _lock:
        _callbacks.clear()
        _active.set()
    try:
        with _signals():
            yield
    except passthrough:
        raise
    except KeyboardInterrupt as stop:
        STOP.set()
        _end_runs("KILLED")
        why = stop.args[0] if isinstance(stop, Stopped) and stop.args else "SIGINT"
        kept = kept_line(stores.output_dir, task_folder, storage_url(stores), _safe(studies))
        say(
            f"stopped ({why}) after {_clock(time.monotonic() - started)}. Kept: {kept}; a trial this job was running "
            f"goes back to its queue and runs first on resume, with no wait. Resume with: {resume}"
        )
        if exit_now:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(130)
        raise SystemExit(130) from None
    except Exception as err:
        STOP.set()
        _end_runs("FAILED")
        cause, todo = diagnose(err) or (
            f"{type(err).__name__}: {first_line(str(err))}",
            "read the log, fix the cause, then run the same command again",
        )
        log = write_log(stores.output_dir, name, "".join(traceback.format_exception(err)))
        where = f"full traceback is in {log}" if log is not None else "traceback could not be written anywhere"
        kept = kept_line(stores.output_dir, task_folder, storage_url(stores), _safe(studies))
        say(
            f"failed after {_clock(time.monotonic() - started)}: {cause}. Kept: {kept}. To go on: {todo} "
            f"({resume}); it resumes from what was kept. The {where}."
        )
        raise SystemExit(1) from None
    finally:
        STOP.clear()
        with _lock:
            _callbacks.clear()
            _active.clear()


def _safe(studies: Callable[[], list[str]]) -> list[str]:
    try:
        return list(studies())
    except Exception:
        return []


def _end_runs(status: str) -> None:
    with _lock:
        callbacks = list(_callbacks)
    for callback in reversed(callbacks):
        try:
            callback(status)
        except Exception:
            pass


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
