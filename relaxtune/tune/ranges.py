"""Problem ranges: one evaluation split into ranges of problems that run apart
(concurrent Prefect task runs, or different workers) and merge into the result
of one evaluation in a piece.

Ranges are aligned to multiples of ``size`` from the first problem, so the
stages of a trial (growing prefixes of the problems) share their full ranges.
Merging concatenates the per-sample records in problem order and aggregates
them again (``relaxtune.tune.point_records.summarize``): every statistic, the paired
ones against strict included (they pair records by problem and repeat), comes
from the same records as an evaluation in one piece.
"""

from __future__ import annotations

import random

from .point_records import EvalResult, summarize

__all__ = ["split", "merge", "worker_order", "stage_ends", "current_stage"]


def split(n: int, size: int | None) -> list[range]:
    """``[0, n)`` in ranges of ``size`` problems (the last may be shorter); one
    range when ``size`` is None.

    Raises:
        ValueError: ``n < 1`` or ``size < 1``.
    """
    if n < 1:
        raise ValueError(f"nothing to split: {n} problems")
    if size is not None and size < 1:
        raise ValueError(f"range size must be >= 1, got {size}")
    size = size or n
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def stage_ends(n: int, size: int) -> list[int]:
    """The problem counts after which a trial's stages end (``relaxtune.tune.tuning``: stage
    ``k`` evaluates the first ``ends[k]`` problems): every ``size`` problems, and ``n``.

    Raises:
        ValueError: ``n < 1`` or ``size < 1``.
    """
    if n < 1 or size < 1:
        raise ValueError(f"stages need n >= 1 and size >= 1, got n={n}, size={size}")
    return list(range(size, n, size)) + [n]


def current_stage(done: set[int], n: int, size: int) -> int:
    """The end of the stage a running trial evaluates now: the first of ``stage_ends(n, size)``
    not in ``done`` (the stage ends it has reported), ``n`` when all are."""
    return next((end for end in stage_ends(n, size) if end not in done), n)


def worker_order(ranges: list[range], worker: str) -> list[range]:
    """``ranges`` in an order drawn from ``worker``'s label, so workers evaluating the
    same configuration one range at a time start in different places and do not
    follow each other range by range (each skips what the others recorded)."""
    return random.Random(worker).sample(ranges, len(ranges))


def merge(results: list[EvalResult]) -> EvalResult:
    """One ``EvalResult`` from the results of consecutive ranges, in problem order
    (records concatenated, then summarised again; the first result's path).

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no range results to merge")
    return summarize([r for result in results for r in result.records], results[0].path)
