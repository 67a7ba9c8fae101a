"""Where a job's time goes: wall and CPU seconds per phase, and counts of the work done.

The main job runs in phases: imports, model load, cost profile, strict, trials,
confirmations, MLflow, figures, export. ``PhaseTimer`` keeps, per phase name, its
wall seconds, the process's CPU seconds (every thread: llama.cpp's and torch's
threads included) and how many times it ran; and counters of the work done
(samples generated, tokens decoded, figures drawn, MLflow calls). Times are
*exclusive*: a phase entered inside another (strict run by the first trial, the
figures drawn while the runs are finished) is taken off the outer one, so the
phases of the job's thread add up to its wall time. A phase that runs on
another thread (the MLflow tracker's, ``relaxtune.report.background``) is kept
apart as *overlapped*: its time runs beside the job's thread, not on its path.

On a busy machine wall seconds measure the other work too; CPU seconds and the
counts do not (llama.cpp on 2 cores uses about 2 CPU seconds per wall second
when idle, single-threaded Python about 1). ``imports`` is the time from the
process's start to the job's start, read from ``/proc`` (None elsewhere).

One timer is active per process at a time (``activate``); ``phase`` and ``count``
are no-ops without one, so library code may call them unconditionally.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PhaseTimer",
    "PhaseTime",
    "phase",
    "count",
    "activate",
    "active",
    "process_age",
]


@dataclass
class PhaseTime:
    """One phase's totals.

    Attributes:
        name: e.g. ``model load``.
        wall / cpu: exclusive seconds (cpu: the whole process's, every thread).
        calls: times it was entered.
        overlapped: it ran on a thread beside the job's (not on its critical path).
    """

    name: str
    wall: float = 0.0
    cpu: float = 0.0
    calls: int = 0
    overlapped: bool = False


class PhaseTimer:
    """Wall and CPU seconds per phase, and work counters (see the module doc).

    Args:
        clock / cpu_clock: seconds (default ``time.perf_counter`` / ``time.process_time``);
            tests pass their own.
        main: the job's thread (default: the thread that makes the timer); phases on
            any other thread are overlapped.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
        main: threading.Thread | None = None,
    ) -> None:
        self.clock, self.cpu_clock = clock, cpu_clock
        self.main = main or threading.current_thread()
        self.phases: dict[str, PhaseTime] = {}
        self.counts: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stacks = threading.local()
        self.started = clock()

    def add(self, name: str, wall: float, cpu: float = 0.0, overlapped: bool = False) -> None:
        """Add ``wall`` / ``cpu`` seconds to phase ``name`` (one call)."""
        with self._lock:
            p = self.phases.setdefault(name, PhaseTime(name, overlapped=overlapped))
            p.wall += wall
            p.cpu += cpu
            p.calls += 1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name``, less any phase nested in it on this thread."""
        stack = getattr(self._stacks, "stack", None)
        if stack is None:
            stack = self._stacks.stack = []
        frame = [self.clock(), self.cpu_clock(), 0.0, 0.0]  # start, cpu start, nested wall, nested cpu
        stack.append(frame)
        try:
            yield
        finally:
            stack.pop()
            wall, cpu = self.clock() - frame[0], self.cpu_clock() - frame[1]
            if stack:  # the outer phase loses what this one took
                stack[-1][2] += wall
                stack[-1][3] += cpu
            overlapped = threading.current_thread() is not self.main
            self.add(name, max(wall - frame[2], 0.0), max(cpu - frame[3], 0.0), overlapped)

    def count(self, name: str, n: float = 1) -> None:
        """Add ``n`` to counter ``name`` (e.g. ``tokens decoded``; seconds are counted too,
        e.g. ``verify forward s``: the generation's own accounting)."""
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + n

    @property
    def wall(self) -> float:
        """Wall seconds since the timer was made."""
        return self.clock() - self.started

    def to_dict(self) -> dict:
        """``{"wall": s, "phases": [{name, wall, cpu, calls, overlapped}...], "counts": {...}}``,
        phases in the order they first ran."""
        with self._lock:
            return {
                "wall": round(self.wall, 3),
                "phases": [
                    {
                        "name": p.name,
                        "wall": round(p.wall, 3),
                        "cpu": round(p.cpu, 3),
                        "calls": p.calls,
                        "overlapped": p.overlapped,
                    }
                    for p in self.phases.values()
                ],
                "counts": {k: round(v, 3) for k, v in self.counts.items()},
            }

    def lines(self) -> list[str]:
        """The table as text: one line per phase (wall s, share of the job's wall, CPU s), then the counts."""
        data = self.to_dict()
        total = sum(p["wall"] for p in data["phases"] if not p["overlapped"]) or 1.0
        out = [f"{'phase':<22} {'wall s':>8} {'share':>6} {'cpu s':>8} {'calls':>6}"]
        for p in data["phases"]:
            share = "beside" if p["overlapped"] else f"{p['wall'] / total:.0%}"
            out.append(f"{p['name']:<22} {p['wall']:8.1f} {share:>6} {p['cpu']:8.1f} {p['calls']:6d}")
        out.append(f"{'total (job thread)':<22} {total:8.1f}")
        if data["counts"]:
            out.append("work: " + ", ".join(f"{k} {v:,.6g}" for k, v in data["counts"].items()))
        return out

    def save(self, path: Path) -> Path:
        """Write ``to_dict()`` as JSON at ``path`` (its folder made); returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


_active: PhaseTimer | None = None


def active() -> PhaseTimer | None:
    """The process's active timer, or None."""
    return _active


@contextmanager
def activate(timer: PhaseTimer | None = None) -> Iterator[PhaseTimer]:
    """Make ``timer`` (default: a new one) the process's active timer for the block;
    a timer already active stays so (a job run inside another's keeps the outer's)."""
    global _active
    if _active is not None:
        yield _active
        return
    _active = timer or PhaseTimer()
    try:
        yield _active
    finally:
        _active = None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """``PhaseTimer.phase`` on the active timer; nothing without one."""
    timer = _active
    if timer is None:
        yield
        return
    with timer.phase(name):
        yield


def count(name: str, n: float = 1) -> None:
    """``PhaseTimer.count`` on the active timer; nothing without one."""
    timer = _active
    if timer is not None:
        timer.count(name, n)


def process_age() -> tuple[float, float] | None:
    """``(wall, cpu)`` seconds of a command's start: since relaxtune was first imported
    (``relaxtune._started.STARTED``; the interpreter's own start-up before it, a few tens of
    milliseconds, is not counted), and the process's CPU seconds (``os.times``' user + system);
    None when relaxtune's clock is not there."""
    from .. import _started

    t = os.times()
    return max(time.monotonic() - _started.STARTED, 0.0), t.user + t.system
