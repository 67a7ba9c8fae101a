"""Rambling guards: signs that a relaxation made the model loop or run on.

Weak drafters make most relaxations ramble (repetition loops, longer
responses; ``docs/concepts/relaxed-rules.md``, findings), which costs speed
through ``L_AR / L_relax`` and capability through truncation.
"""

from __future__ import annotations

__all__ = ["ends_in_loop", "loop_rate"]


def ends_in_loop(text: str, min_repeats: int = 3, max_period: int = 200, min_span: int = 30) -> bool:
    """True when ``text`` ends in a run of at least ``min_repeats`` copies of one
    block of 1 to ``max_period`` characters covering at least ``min_span``
    characters (trailing whitespace ignored)."""
    s = text.rstrip()
    for period in range(1, max_period + 1):
        span = period * min_repeats
        if span > len(s):
            break
        if span < min_span:
            continue
        block = s[-period:]
        if s[-span:] == block * min_repeats:
            return True
    return False


def loop_rate(texts: list[str]) -> float:
    """Share of texts that end in a repetition loop (0 for no texts)."""
    return sum(ends_in_loop(t) for t in texts) / len(texts) if texts else 0.0
