"""Multiple-choice answers (GPQA-style letters).

Explicit anchors first ("the answer is (X)", "ANSWER: X", "Answer: X"), the
last one winning; then a boxed single letter (``\\boxed{C}``, ``\\boxed{\\text{C}}``);
never a stray letter elsewhere. "cannot determine" (or similar) is no answer.
"""

from __future__ import annotations

import re

from .base import Verdict, answer_section
from .math import last_boxed

__all__ = ["grade_choice", "extract_choice"]

_ANCHORS = [
    r"answer\s+is\s*:?\s*\(?\**\s*([A-J])\b\)?",
    r"answer\s*[:：]\s*\(?\**\s*([A-J])\b\)?",
]
_REFUSAL = re.compile(r"cannot\s+(?:be\s+)?determine|can't\s+determine|cannot\s+be\s+determined|none\s+of\s+the", re.I)


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The chosen letter, or None."""
    hits = []
    for pattern in _ANCHORS:
        hits += [(m.start(), m.group(1).upper()) for m in re.finditer(pattern, text, flags=re.I)]
    hits = [h for h in hits if h[1] in letters]
    if hits:
        return max(hits)[1]
    boxed = last_boxed(text)
    if boxed is not None:
        inner = re.sub(r"\\text(?:bf)?\{([^}]*)\}", r"\1", boxed).strip(" ()$")
        if len(inner) == 1 and inner.upper() in letters:
            return inner.upper()
    return None


def grade_choice(response: str, gold: str, *, truncated: bool = False, letters: str = "ABCD") -> Verdict:
    """Grade a multiple-choice response against the gold letter."""
    section = answer_section(response)
    if section is None:
        return Verdict(False, "no_answer", None, "thinking never closed")
    choice = extract_choice(section, letters)
    if choice is None:
        detail = "refused" if _REFUSAL.search(section) else ("truncated" if truncated else "no letter found")
        return Verdict(False, "no_answer", None, detail)
    ok = choice == gold.strip().upper()
    return Verdict(ok, "correct" if ok else "wrong", choice)
