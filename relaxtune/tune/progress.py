"""Progress of long work: a tqdm bar on a terminal, plain lines anywhere else
(a pipe, a log file, a CI job), so a piped job keeps saying how far it is.

``RELAXTUNE_PROGRESS_SECONDS`` sets the seconds between plain lines (default 30;
0: a line per step).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

__all__ = ["progress", "LineProgress"]


class LineProgress:
    """Progress as plain lines: one when it starts, then after a step at most every
    ``interval`` seconds, and one when it ends, e.g.
    ``humaneval strict N=4: 3/8 samples (38 %), 0:45 elapsed, about 1:15 left``.
    Each line is flushed at once.

    Args:
        total: steps expected; desc: what runs; unit: what a step is.
        file: where the lines go (default stderr, as tqdm's bar).
        interval: seconds between lines (default ``$RELAXTUNE_PROGRESS_SECONDS`` or 30).
        clock: seconds, monotonic (for tests).
    """

    def __init__(self, total: int, desc: str, unit: str = "sample", file: TextIO | None = None,
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.file = file or sys.stderr
        self.interval = float(os.environ.get("RELAXTUNE_PROGRESS_SECONDS", 30)) if interval is None else interval
        self.clock = clock
        self.start = self.last = clock()
        self._line(f"{total} {unit}s to do")

    def _line(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=self.file, flush=True)

    def update(self, n: int = 1) -> None:
        """``n`` more steps done."""
        self.n += n
        now = self.clock()
        if self.n < self.total and now - self.last >= self.interval:
            self.last = now
            elapsed = now - self.start
            left = elapsed / self.n * (self.total - self.n)
            self._line(f"{self.n}/{self.total} {self.unit}s ({self.n / self.total:.0%}), {_clock(elapsed)} elapsed, "
                       f"about {_clock(left)} left")

    def close(self) -> None:
        """The final line: steps done and the time taken."""
        self._line(f"{self.n}/{self.total} {self.unit}s done in {_clock(self.clock() - self.start)}")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def progress(total: int, desc: str, unit: str = "sample", file: TextIO | None = None):
    """A progress object with ``update(n)`` and ``close()``: a tqdm bar when ``file``
    (default stderr) is a terminal, else ``LineProgress``."""
    file = file or sys.stderr
    if file.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file)
    return LineProgress(total, desc, unit, file)
