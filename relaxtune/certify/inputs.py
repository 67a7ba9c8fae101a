"""Checks of what a bound is given: counts, confidences and margins, each refused with
a ``ValueError`` that names the argument (an infinite, NaN or fractional count, a NaN
margin or a confidence outside (0, 1) would otherwise reach ``int()`` or a root finder
and fail somewhere else, or give a number that means nothing)."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_count", "check_confidence", "check_finite", "check_probability"]


def check_count(name: str, value, minimum: int = 0) -> int:
    """``value`` as an int: a finite integer-valued number >= ``minimum`` (bools refused).

    Raises:
        ValueError: ``"<name> must be an integer >= <minimum>, got <value>"``.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and float(value).is_integer() and value >= minimum
    if not ok:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_confidence(value, name: str = "confidence") -> float:
    """``value`` as a float in the open interval (0, 1).

    Raises:
        ValueError: ``"<name> must be in (0, 1), got <value>"`` (NaN and infinities too).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


def check_probability(value, name: str) -> float:
    """``value`` as a float in the closed interval [0, 1].

    Raises:
        ValueError: ``"<name> must be in [0, 1], got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def check_finite(value, name: str) -> float:
    """``value`` as a finite float.

    Raises:
        ValueError: ``"<name> must be a finite number, got <value>"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)
