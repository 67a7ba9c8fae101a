"""A pool of worker processes for grading work that must be stoppable (``mathcheck``).

A worker is a Python script run with this interpreter: it prints ``ready`` once
started, then answers each request line (JSON) with one reply line (JSON). Each
request holds one idle worker; a worker that passes its deadline is killed (so a
computation that holds the GIL or eats memory ends with it) and a new one starts
on the next request. Thread-safe: at most ``size`` workers run, further requests
wait for one. Workers end with the process that started them (their stdin closes);
a forked copy of that process starts workers of its own.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["WorkerPool"]

START_TIMEOUT = 120.0  # seconds for a worker to import its libraries (a loaded machine is slow)


class _Worker:
    """One worker process: its pipes, a buffer of what it wrote past the last reply,
    its stderr in a temporary file (read back when it fails)."""

    def __init__(self, argv: list[str]):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.buffer = b""

    def read_line(self, deadline: float) -> bytes:
        """The next line it writes, without its newline.

        Raises:
            TimeoutError: nothing complete before ``deadline`` (``time.monotonic()``).
            EOFError: it ended.
        """
        fd = self.proc.stdout.fileno()
        poll = select.poll()  # not select.select: a busy process's descriptors pass FD_SETSIZE
        poll.register(fd, select.POLLIN)
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(left * 1000):
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def failure(self) -> str:
        """Why it ended: its exit status and the tail of its stderr (it is stopped)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 2000))
        tail = self.stderr.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        self.stop()
        return f"exit status {self.proc.returncode}: {tail[0]}".rstrip(": ")

    def stop(self) -> None:
        """Kill it and reap it (nothing of it is left)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        self.stderr.close()


class WorkerPool:
    """Up to ``size`` workers running ``script`` (see module doc).

    Args:
        script: the worker script.
        size: the most workers alive at once (default: the number of CPUs, at most 8).
        args: extra command-line arguments for the script.
    """

    def __init__(self, script: Path, size: int | None = None, args: tuple[str, ...] = ()):
        self.argv = [sys.executable, str(script), *args]
        self.size = size or min(8, os.cpu_count() or 1)
        self._forget()
        os.register_at_fork(after_in_child=self._forget)  # a forked copy must not share the parent's workers

    def _forget(self) -> None:
        self._slots = threading.BoundedSemaphore(self.size)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def _start(self) -> _Worker:
        worker = _Worker(self.argv)
        try:
            line = worker.read_line(time.monotonic() + START_TIMEOUT)
        except (TimeoutError, EOFError):
            raise RuntimeError(f"a worker of {self.argv[1]} did not start ({worker.failure()})") from None
        if line != b"ready":
            worker.stop()
            raise RuntimeError(f"a worker of {self.argv[1]} did not start: {line[:200]!r}")
        return worker

    def ask(self, request: dict, timeout: float) -> dict:
        """Send ``request`` to an idle worker (started when none is idle) and return its
        reply; waits for a free worker first when ``size`` are busy.

        Args:
            request: a JSON-serialisable dict.
            timeout: wall seconds for the reply (a worker's start is not counted).

        Raises:
            TimeoutError: no reply within ``timeout``; the worker was killed.
            RuntimeError: a worker could not start, or ended without replying.
        """
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or self._start()
            try:
                worker.proc.stdin.write(json.dumps(request).encode() + b"\n")
                worker.proc.stdin.flush()
                reply = json.loads(worker.read_line(time.monotonic() + timeout))
            except TimeoutError:
                worker.stop()
                raise TimeoutError(f"no answer within {timeout:g} s (the worker was stopped)") from None
            except (EOFError, OSError, ValueError):
                raise RuntimeError(f"the worker ended without an answer ({worker.failure()})") from None
            except BaseException:
                worker.stop()
                raise
            with self._lock:
                self._idle.append(worker)
            return reply

    def close(self) -> None:
        """Stop every idle worker (busy ones stop when their request ends)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()
