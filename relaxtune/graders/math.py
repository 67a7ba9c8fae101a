"""Math answers with math-verify, in worker processes that stop at a deadline.

math-verify and sympy evaluate what they parse, in C and holding the GIL (a
``\\boxed{10^{10^{10}}}`` would run for hours): no thread can stop them, so
parsing and verifying run in worker processes (``mathcheck``, the rules of the
verdict itself, through ``workers.WorkerPool``), each killed past ``timeout``
(the verdict is then "grader_error"). Here, in the caller's thread, only text is
handled; thread-safe.

Rules: the answer is read from the text after the thinking block; the LAST
non-empty ``\\boxed{}`` wins over earlier, retracted ones, together with the
boxes joined to it by a list's connectives only (``\\boxed{3} and \\boxed{5}``
is the list 3, 5, as math-verify joins them: ``final_boxes``); an empty
``\\boxed{}`` says nothing. Without a box, math-verify's own
extraction is used unless the response was truncated (a truncated response
with no boxed answer, or cut off inside its last ``\\boxed{``, is "no_answer",
never rescued by the last number in the text or an earlier box). A period that
ends the box's number (``\\boxed{204.}``) is punctuation. Gold answers without
``$...$`` are boxed before parsing, and an empty gold parse is an error.

Notations math-verify misreads are rewritten to equal LaTeX first
(``mathnorm``: ``\\sqrt(2)``, repeating decimals, trigonometric functions of
degrees everywhere; plain-text ``pi/2``, ``exp(16)-1`` inside a box and in the
gold), and ``mathcheck`` adds the truth checks math-verify misses
(README "Grading policy": ``math-notation``, ``math-truth``, ``ellipsis-lists``).

Number notations math-verify misparses are rewritten first, in response and
gold alike (``numbers.normalise_numbers``): mixed numbers (``1 1/4`` = 5/4,
``2\\ 3/5`` = 13/5; math-verify reads 1/2 and 1), LaTeX thousands separators
(``9{,}500``, ``9\\,500`` = 9500; math-verify reads 9 and 509), escaped
currency dollars (``\\$9,500``, after which math-verify reads nothing) and
scientific notation (``1.2e5``, ``1.2x10^5``, ``1.2·10^5``, ``1.2×10⁵``,
``\\num{1.2e5}``: ``1.2\\times10^{5}``); in an answer without a box, a power of ten
outside math mode is its decimal expansion (``numbers.expand_prose_powers``:
math-verify reads ``1.2 \\times 10^{5}`` there as 1.2). The verdict itself
(``mathcheck.check``) keeps every equivalence math-verify accepts and adds only
strictness: exact numbers compared exactly, numbers farther apart than the grading
policy's numeric tolerance different whatever their notation and wherever
math-verify compares them (alone, in a list, set, tuple, interval, matrix or
relation; ``policy.yaml``: ``numeric-tolerance``), and integer answers for integer
tasks (AIME).
"""

from __future__ import annotations

import re
from pathlib import Path

from .base import Verdict, answer_section
from .mathnorm import normalise_latex, normalise_plain
from .numbers import expand_prose_powers, normalise_numbers
from .policy import numeric_tolerance
from .workers import WorkerPool

DEFAULT_TIMEOUT = 20.0  # wall seconds of math-verify work per response
WORKER_MEMORY_MB = 2048  # address space of a math-verify worker

__all__ = ["grade_math", "boxes", "scan_boxes", "last_boxed", "final_boxes", "gsm8k_gold"]

_POOL = WorkerPool(Path(__file__).with_name("mathcheck.py"), args=(str(WORKER_MEMORY_MB),))
_BOX_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_BOX_PERIOD = re.compile(r"(?<=\d)\.\s*$")
_BLANK = re.compile(r"(?:\s|~|\\[ ,;:!]|\\q?quad\b)*")
# between two boxes of one answer: spaces, math delimiters, ",", ";", "and", "or", "\text{ and }", "x ="
_JOINER = re.compile(
    r"(?:\s|\$|\\[()\[\]]|\\q?quad\b|[,;]|\b(?:and|or)\b|\\text\s*\{\s*(?:and|or|,)?\s*\}"
    r"|\b[A-Za-z](?:_\{?\w+\}?)?\s*=)*"
)


def scan_boxes(text: str) -> tuple[list[tuple[int, str]], list[int]]:
    """Every ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``, braces matched, in one pass:
    ``(position, content)`` of the closed ones in order of position, and the
    positions of those never closed."""
    closed, stack = [], []
    for match in _BOX_TOKENS.finditer(text):
        token = match.group()
        if token == "}":
            if stack:
                start, inner = stack.pop()
                if start >= 0:
                    closed.append((start, text[inner : match.start()]))
        else:
            stack.append((match.start(), match.end()) if token != "{" else (-1, -1))
    return sorted(closed), [start for start, _ in stack if start >= 0]


def boxes(text: str) -> list[tuple[int, str]]:
    """``(position, content)`` of every closed ``\\boxed{...}`` or ``\\fbox{...}`` in
    ``text``, braces matched, in order of position."""
    return scan_boxes(text)[0]


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (or ``\\fbox{...}``), stripped; None if none."""
    found = boxes(text)
    return found[-1][1].strip() if found else None


def gsm8k_gold(answer: str) -> str:
    """The final number of a GSM8K rationale (after ``####``), commas removed."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def final_boxes(text: str, closed: list[tuple[int, str]]) -> list[str]:
    """The contents of the final answer's boxes: the last box, and the boxes before
    it joined to it by a list's connectives only (``\\boxed{3} and \\boxed{5}``,
    ``$\\boxed{3}$, $\\boxed{5}$``, ``x = \\boxed{3} or x = \\boxed{5}``), as
    math-verify joins them; a box after other text (``\\boxed{3}. Wait: \\boxed{4}``)
    is a correction and ends the chain.

    Args:
        text: the answer section; closed: ``scan_boxes(text)[0]``, non-empty, in order.
    """
    chain = [closed[-1]]
    for at, inner in reversed(closed[:-1]):
        end = text.index("{", at) + 1 + len(inner)  # the box's closing brace
        if not _JOINER.fullmatch(text, end + 1, chain[0][0]):
            break
        chain.insert(0, (at, inner))
    return [inner for _, inner in chain]


def _gold_text(gold: str) -> str:
    """The gold as math-verify reads it: notations normalised (``numbers``,
    ``mathnorm``), boxed unless it holds ``$`` or a box."""
    text = normalise_numbers(gold)
    if "$" in text or "\\boxed" in text:
        return normalise_latex(text)
    return f"\\boxed{{{normalise_plain(text)}}}"


def grade_math(
    response: str,
    gold: str,
    *,
    truncated: bool = False,
    integer_range: tuple[int, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """Grade a math response (rules in the module doc and ``mathcheck``).

    Args:
        response: the model's full output.
        gold: the reference answer (LaTeX or plain).
        truncated: the response hit the token budget.
        integer_range: e.g. ``(0, 999)`` for AIME: the answer must be an integer in it.
        timeout: wall seconds for math-verify's work on this response.

    Returns:
        ``Verdict`` ("correct", "wrong", "no_answer" or "grader_error": math-verify
        passed ``timeout``, or the gold does not parse); ``detail`` says why a
        verdict differs from math-verify's own.
    """
    section = answer_section(response)
    if section is None:
        return Verdict(False, "no_answer", None, "thinking never closed")
    closed, unclosed = scan_boxes(section)
    closed = [(at, inner) for at, inner in closed if not _BLANK.fullmatch(inner)]  # an empty \boxed{} says nothing
    if truncated and unclosed and (not closed or unclosed[-1] > closed[-1][0]):
        return Verdict(False, "no_answer", None, "truncated inside its last \\boxed{}")
    if not closed and truncated:
        return Verdict(False, "no_answer", None, "truncated without a boxed answer")
    if closed:
        chain = [_BOX_PERIOD.sub("", inner.strip()) for inner in final_boxes(section, closed)]
        boxed = ", ".join(chain)
        text = normalise_numbers(", ".join(f"\\boxed{{{normalise_plain(inner)}}}" for inner in chain))
    else:
        boxed, text = None, expand_prose_powers(normalise_numbers(normalise_latex(section)))
    request = {
        "text": text,
        "gold": _gold_text(gold),
        "integer_range": list(integer_range) if integer_range is not None else None,
        "tolerance": numeric_tolerance().to_dict(),
    }
    try:
        reply = _POOL.ask(request, timeout)
    except (TimeoutError, RuntimeError) as err:
        return Verdict(False, "grader_error", boxed, f"math-verify: {err}")
    if "error" in reply:
        return Verdict(False, "grader_error", boxed, reply["error"])
    verdict = reply["verdict"]
    shown = reply["shown"] if verdict != "no_answer" else boxed
    return Verdict(verdict == "correct", verdict, shown, reply["detail"])
