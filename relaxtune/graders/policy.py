"""The grading policy (``policy.yaml``): the deliberate deviations from the official graders,
one row each, and the numeric tolerance the math grader applies.

The file is data so that the conformance tests (every case's ``policy`` must be a row, every
row needs a case) and the docs read the same table the graders follow.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["POLICY_FILE", "NumericTolerance", "policies", "numeric_tolerance"]

POLICY_FILE = Path(__file__).with_name("policy.yaml")


@dataclass(frozen=True)
class NumericTolerance:
    """Two numbers ``a``, ``b`` are different when ``|a - b| > max(relative * max(|a|, |b|), absolute)``
    (both unitless; ``percent`` says how a percentage is read)."""

    relative: float
    absolute: float
    percent: str

    def to_dict(self) -> dict:
        """``{"relative", "absolute"}``, as the math worker takes them."""
        return {"relative": self.relative, "absolute": self.absolute}


@functools.lru_cache(maxsize=1)
def _load() -> dict:
    data = yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("policies"), list):
        raise ValueError(f"{POLICY_FILE}: needs a 'policies' list")
    return data


def policies() -> list[dict]:
    """The rows: ``{"id", "we_do", "official", "why"}`` (Markdown), in the file's order.

    Raises:
        ValueError: a row lacks a field, or an id repeats.
    """
    rows = _load()["policies"]
    seen = set()
    for row in rows:
        missing = {"id", "we_do", "official", "why"} - set(row)
        if missing or row["id"] in seen:
            raise ValueError(f"{POLICY_FILE}: row {row.get('id')!r} lacks {sorted(missing)} or repeats")
        seen.add(row["id"])
    return list(rows)


def numeric_tolerance() -> NumericTolerance:
    """The ``numeric`` tolerance of the policy (row ``numeric-tolerance``).

    Raises:
        ValueError: a bound that is not a finite number >= 0, or a relative one >= 1.
    """
    raw = _load().get("numeric") or {}
    tol = NumericTolerance(
        float(raw.get("relative", "nan")), float(raw.get("absolute", "nan")), str(raw.get("percent", ""))
    )
    if not (
        math.isfinite(tol.relative) and 0 <= tol.relative < 1 and math.isfinite(tol.absolute) and tol.absolute >= 0
    ):
        raise ValueError(f"{POLICY_FILE}: numeric tolerance {raw!r} must be finite, >= 0 (relative < 1)")
    return tol
