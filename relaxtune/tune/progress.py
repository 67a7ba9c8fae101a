"""Progress of long work: a tqdm bar on a terminal, plain lines anywhere else
(a pipe, a log file, a CI job), so a piped job keeps saying how far it is.

Plain lines come from a timer, not from finished samples: while an evaluation
runs, a line every ``RELAXTUNE_PROGRESS_SECONDS`` (default ``DEFAULT_INTERVAL``,
30 s; 0: a line per step) says the samples done, the tokens decoded so far and
the throughput, so a batch that decodes for minutes before any sample ends
still shows it moves. The time left comes from throughput (tokens per second)
and the tokens still to decode, never from the time per finished sample: the
samples of a batch end together, so the first one to finish says nothing of the
others.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

__all__ = [
    "progress",
    "LineProgress",
    "BarProgress",
    "DEFAULT_INTERVAL",
    "interval_seconds",
    "prior_length",
    "LENGTH_PRIOR",
]

DEFAULT_INTERVAL = 30.0  # seconds between plain progress lines
MIN_ETA_SECONDS = 5.0  # throughput measured over less than this gives no time left
LENGTH_PRIOR = 0.5  # share of max_new_tokens a response takes, before any record exists


def interval_seconds() -> float:
    """Seconds between plain lines: ``$RELAXTUNE_PROGRESS_SECONDS`` or ``DEFAULT_INTERVAL``.

    Raises:
        ValueError: the variable is not a number >= 0.
    """
    raw = os.environ.get("RELAXTUNE_PROGRESS_SECONDS")
    if raw is None or not raw.strip():
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"RELAXTUNE_PROGRESS_SECONDS must be a number of seconds >= 0, got {raw!r}")
    return value


def prior_length(folder: Path, max_new_tokens: int, limit: int = 5000) -> tuple[float, str]:
    """Expected response tokens per sample: the mean ``response_tokens`` of the
    finished records in ``folder`` (the pair's records of this task; at most ``limit``
    read), else ``LENGTH_PRIOR * max_new_tokens``. Returns ``(tokens, where from)``."""
    lengths: list[int] = []
    for path in sorted(Path(folder).glob("*.jsonl")) if Path(folder).is_dir() else []:
        with open(path, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not rec.get("failed") and isinstance(rec.get("response_tokens"), int):
                    lengths.append(rec["response_tokens"])
                if len(lengths) >= limit:
                    break
        if len(lengths) >= limit:
            break
    if lengths:
        return sum(lengths) / len(lengths), f"the mean of {len(lengths)} recorded responses"
    return LENGTH_PRIOR * max_new_tokens, f"assumed: {LENGTH_PRIOR:.0%} of the task's {max_new_tokens}-token budget"


class _Counts:
    """Samples and tokens done, with the time left estimated from throughput."""

    def __init__(self, total: int, length: float | None, clock: Callable[[], float]) -> None:
        self.total, self.n, self.tokens, self.finished_tokens = total, 0, 0, 0
        self.length = length  # expected tokens per sample before any has finished
        self.clock = clock
        self.start = clock()
        self.lock = threading.Lock()

    def add_tokens(self, n: int) -> None:
        with self.lock:
            self.tokens += n

    def finish(self, n: int, tokens: int | None) -> None:
        """``n`` samples done; ``tokens``: their response tokens (None: unknown)."""
        with self.lock:
            self.n += n
            if tokens is not None:
                self.finished_tokens += tokens
                self.tokens = max(self.tokens, self.finished_tokens)

    def left(self) -> float | None:
        """Seconds left: the tokens still to decode over the tokens per second so far.
        Tokens still to decode: each unfinished sample's expected length (the mean of
        the finished ones once at least half are done, else the larger of that and the
        prior) less what is in flight. None before ``MIN_ETA_SECONDS`` of decoding."""
        elapsed = self.clock() - self.start
        if self.tokens <= 0 or elapsed < MIN_ETA_SECONDS or self.n >= self.total:
            return None
        mean = self.finished_tokens / self.n if self.n else None
        if mean is not None and (self.n * 2 >= self.total or self.length is None):
            expected = mean
        else:
            expected = max(v for v in (mean, self.length) if v is not None) if (mean or self.length) else None
        if expected is None:
            return None
        in_flight = self.tokens - self.finished_tokens
        still = max((self.total - self.n) * expected - in_flight, 0.0)
        return still / (self.tokens / elapsed)

    def line(self, unit: str) -> str:
        elapsed = self.clock() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        left = self.left()
        return (
            f"{self.n}/{self.total} {unit}s, {self.tokens:,} tokens decoded ({rate:.1f} tokens/s), "
            f"{_clock(elapsed)} elapsed" + ("" if left is None else f", about {_clock(left)} left")
        )


class LineProgress:
    """Progress as plain lines: one when it starts, then one every ``interval``
    seconds while it runs (from a timer thread; ``tick`` prints one when due), and
    one when it ends, e.g.
    ``humaneval strict__N4__seed0: 3/8 samples, 1,234 tokens decoded (9.8 tokens/s), 2:06 elapsed, about 3:10 left``.
    Each line is flushed at once.

    Args:
        total: samples expected; desc: what runs; unit: what a step is.
        file: where the lines go (default stderr, as tqdm's bar).
        interval: seconds between lines (default ``interval_seconds()``; 0: a line per step).
        clock: seconds, monotonic (for tests).
        length: expected tokens per sample (the time left before half the samples end).
        timer: print from a timer thread (tests drive ``tick`` themselves).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "sample",
        file: TextIO | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        length: float | None = None,
        timer: bool = True,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file or sys.stderr
        self.interval = interval_seconds() if interval is None else float(interval)
        self.counts = _Counts(total, length, clock)
        self.last = self.counts.start
        self._stop = threading.Event()
        self._print(f"{total} {unit}s to do")
        self._thread = None
        if timer and self.interval > 0:
            self._thread = threading.Thread(target=self._run, name=f"progress {desc}", daemon=True)
            self._thread.start()

    @property
    def n(self) -> int:
        """Steps done."""
        return self.counts.n

    def _print(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=self.file, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval, 1.0)):
            self.tick()

    def tick(self) -> None:
        """Print a line when ``interval`` seconds passed since the last one."""
        now = self.counts.clock()
        if self.counts.n < self.total and now - self.last >= self.interval:
            self.last = now
            self._print(self.counts.line(self.unit))

    def add_tokens(self, n: int) -> None:
        """``n`` more tokens decoded (any thread)."""
        self.counts.add_tokens(n)

    def update(self, n: int = 1, tokens: int | None = None) -> None:
        """``n`` more steps done; ``tokens``: their response tokens, when known."""
        self.counts.finish(n, tokens)
        if self.interval == 0:
            self.last = float("-inf")
        self.tick()

    def close(self, final: bool = True) -> None:
        """Stop the timer; the final line (unless ``final`` is False, for work that
        stopped half-way): steps done, tokens and the time taken."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if not final:
            return
        c = self.counts
        elapsed = c.clock() - c.start
        self._print(
            f"{c.n}/{self.total} {self.unit}s done in {_clock(elapsed)}, {c.tokens:,} tokens"
            + (f" ({c.tokens / elapsed:.1f} tokens/s)" if elapsed > 0 else "")
        )


class BarProgress:
    """A tqdm bar over samples whose postfix shows the tokens decoded and their rate,
    refreshed at most once a second as tokens arrive (so a batch that has not
    finished a sample still moves)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "sample",
        file: TextIO | None = None,
        length: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, unit=unit, file=file or sys.stderr)
        self.counts = _Counts(total, length, clock)
        self._shown = self.counts.start
        self._lock = threading.Lock()

    @property
    def n(self) -> int:
        return self.counts.n

    def _postfix(self, force: bool = False) -> None:
        now = self.counts.clock()
        with self._lock:
            if not force and now - self._shown < 1.0:
                return
            self._shown = now
            elapsed = max(now - self.counts.start, 1e-9)
            left = self.counts.left()
            self.bar.set_postfix_str(
                f"{self.counts.tokens:,} tok, {self.counts.tokens / elapsed:.1f} tok/s"
                + ("" if left is None else f", ~{_clock(left)} left"),
                refresh=True,
            )

    def add_tokens(self, n: int) -> None:
        self.counts.add_tokens(n)
        self._postfix()

    def update(self, n: int = 1, tokens: int | None = None) -> None:
        self.counts.finish(n, tokens)
        self.bar.update(n)
        self._postfix(force=True)

    def close(self, final: bool = True) -> None:
        self.bar.close()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def progress(total: int, desc: str, unit: str = "sample", file: TextIO | None = None, length: float | None = None):
    """A progress object with ``update(n, tokens)``, ``add_tokens(n)`` and ``close()``: a
    tqdm bar when ``file`` (default stderr) is a terminal, else ``LineProgress``.
    ``length``: expected tokens per sample, for the time left."""
    file = file or sys.stderr
    if file.isatty():
        return BarProgress(total, desc, unit, file, length)
    return LineProgress(total, desc, unit, file, length=length)
