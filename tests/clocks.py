"""A scripted clock for interleaved timings (``relaxtune.decoding.speed.measure_interleaved``'s
``clock``): its n-th reading is ``n**2`` microseconds, so the timed job that starts at reading
2m measures ``4m + 1`` microseconds. A job's time thus says where it ran in ONE sequence of
timings: the m-th timed call of a measurement, counted over every shape of every batch size."""

from __future__ import annotations

UNIT = 1e-6


class SquareClock:
    """Readings 0, 1, 4, 9, ... microseconds (seconds returned)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> float:
        value = self.n * self.n * UNIT
        self.n += 1
        return value


def timed(m: int) -> float:
    """The seconds the m-th timed call (from 0) measures."""
    return (4 * m + 1) * UNIT
