"""Temporary files and folders that an interrupt never leaves behind.

Converting the embedded models writes a 2.9 GB ``hf-*`` folder, and assembling a
GGUF a ``*.part`` file, beside their final names before an atomic rename. ``scratch``
makes such a path so that

- an exception, Ctrl-C (``KeyboardInterrupt``) or SIGTERM removes it: in the main
  thread, where SIGTERM would otherwise end the process at once (its default
  action runs no ``finally``), SIGTERM raises ``Terminated`` for the block's
  duration and is delivered again, with its default action, once the path is gone
  (a job that handles SIGTERM itself, ``relaxtune.tune.stopping``, keeps its handler:
  it raises, and the block's cleanup runs);
- what a killed process (SIGKILL, or SIGTERM in another thread) left is swept at
  the next start: the name holds the writer's process id, and ``sweep`` removes the
  paths of processes that no longer run (a name without a process id, from an
  earlier version, once it is an hour old).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["scratch", "sweep", "Terminated"]

LEGACY_AGE = 3600.0  # seconds after which an untagged leftover counts as abandoned


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a scratch path was being written."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(parent: Path, prefix: str, suffix: str = "") -> list[Path]:
    """Remove the scratch paths ``<prefix><pid>-*<suffix>`` in ``parent`` whose process
    no longer runs, and untagged ``<prefix>*<suffix>`` ones older than an hour.

    Returns:
        The paths removed."""
    tagged = re.compile(re.escape(prefix) + r"(\d+)-")
    gone = []
    if not parent.is_dir():
        return gone
    for path in parent.glob(f"{prefix}*{suffix}"):
        m = tagged.match(path.name)
        try:
            stale = not _alive(int(m.group(1))) if m else time.time() - path.stat().st_mtime > LEGACY_AGE
        except OSError:
            continue
        if stale and int(m.group(1) if m else 0) != os.getpid():
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            gone.append(path)
    return gone


@contextmanager
def _sigterm_raises() -> Iterator[list[int]]:
    """In the main thread with SIGTERM's default action: SIGTERM raises ``Terminated``
    while the block runs; the list yielded receives the signal's number."""
    got: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield got
        return

    def handler(signum, _frame) -> None:
        got.append(signum)
        raise Terminated("SIGTERM")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def scratch(parent: Path, prefix: str, suffix: str = "", directory: bool = True) -> Iterator[Path]:
    """A new temporary folder (``directory``) or file ``<prefix><pid>-<random><suffix>``
    in ``parent``, removed when the block ends unless the block renamed it away.
    Leftovers of dead processes are swept first (``sweep``).

    SIGTERM during the block (main thread, default action) raises ``Terminated``
    there; after the cleanup the signal is delivered again and ends the process.
    """
    parent.mkdir(parents=True, exist_ok=True)
    sweep(parent, prefix, suffix)
    tag = f"{prefix}{os.getpid()}-"
    if directory:
        path = Path(tempfile.mkdtemp(dir=parent, prefix=tag, suffix=suffix))
    else:
        fd, name = tempfile.mkstemp(dir=parent, prefix=tag, suffix=suffix)
        os.close(fd)
        path = Path(name)
    with _sigterm_raises() as got:
        try:
            yield path
        finally:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink(missing_ok=True)
            if got:  # the path is gone: end as SIGTERM's default action would have
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
