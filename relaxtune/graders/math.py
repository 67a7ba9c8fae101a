"""Math answers with math-verify, safe in worker threads.

math-verify's own timeouts use signals, which only work in the main thread:
they are disabled here (``parsing_timeout=None``, ``timeout_seconds=None``) and
each parse/verify runs under a timeout of ours (a daemon thread that is
abandoned when it overruns; the verdict is then "grader_error").

Rules: the answer is read from the text after the thinking block; the LAST
``\\boxed{}`` wins over earlier, retracted ones; without a box, math-verify's own
extraction is used unless the response was truncated (a truncated response
with no boxed answer is "no_answer", never rescued by the last number in the
text). Gold answers without ``$...$`` are boxed before parsing, and an empty
gold parse is an error.

The verdict is ``math_verify.verify``'s: every equivalence it accepts is kept
(percent ``10\\%`` = ``10``, ``\\infty`` = ``\\infty``, ``n = 204`` = ``204``...).
Our additions only make it stricter or read what it misreads, each documented
and tested (README, "Grading policy"):

- number notations math-verify misparses are rewritten first, in response and
  gold alike (``numbers.normalise_numbers``): mixed numbers (``1 1/4`` = 5/4,
  ``2\\ 3/5`` = 13/5; math-verify reads 1/2 and 1) and LaTeX thousands
  separators (``9{,}500``, ``9\\,500`` = 9500; math-verify reads 9 and 509);
- two exact finite numbers (no float, no percent) that sympy proves different
  are different, although math-verify's numeric check chops ``1/2^98 - 1/2^99``
  to 0;
- integer tasks (AIME, ``integer_range``): besides math-verify's verdict, the
  answer's value (the right side of ``n = 204``; a decimal when integral,
  ``204.0``) must be an integer in the range.
"""

from __future__ import annotations

import functools
import logging
import re
import threading

from .base import Verdict, answer_section
from .numbers import normalise_numbers

DEFAULT_TIMEOUT = 10.0  # seconds per parse/verify call

__all__ = ["grade_math", "boxes", "last_boxed", "parse_gold", "gsm8k_gold"]

# math-verify warns on every call that its signal timeouts are off: ours replace them
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _run_with_timeout(fn, timeout: float):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - reported as a grader error
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"math-verify took longer than {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def boxes(text: str) -> list[tuple[int, str]]:
    """``(position, content)`` of every closed ``\\boxed{...}`` or ``\\fbox{...}`` in
    ``text``, braces matched, in order of position."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth = 1
        for i in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append((match.start(), text[match.end():i]))
                break
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last closed ``\\boxed{...}`` (or ``\\fbox{...}``), stripped; None if none."""
    found = boxes(text)
    return found[-1][1].strip() if found else None


def gsm8k_gold(answer: str) -> str:
    """The final number of a GSM8K rationale (after ``####``), commas removed."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def _parse(text: str, timeout: float):
    from math_verify import parse

    return _run_with_timeout(lambda: parse(text, parsing_timeout=None), timeout)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str, timeout: float = DEFAULT_TIMEOUT):
    """Parse a gold answer (number notations normalised, boxed when it has no ``$``
    or box); cached, as every sample of every trial grades against the same golds.

    Raises:
        ValueError: when math-verify reads nothing from it.
    """
    text = normalise_numbers(gold)
    text = text if ("$" in text or "\\boxed" in text) else f"\\boxed{{{text}}}"
    parsed = _parse(text, timeout)
    if not parsed:
        raise ValueError(f"gold answer {gold!r} does not parse")
    return parsed


def _exactly_different(gold, pred) -> bool:
    """Both first parses are finite exact numbers (no float, no percent) that sympy
    proves unequal (math-verify's numeric check would chop a tiny difference to 0)."""
    import sympy

    def exact(x) -> bool:
        return (isinstance(x, sympy.Expr) and bool(x.is_number) and bool(x.is_finite)
                and not x.atoms(sympy.Float, sympy.UnevaluatedExpr))

    g, p = gold[0], pred[0]
    return exact(g) and exact(p) and sympy.simplify(g - p).is_zero is False


def _integer_value(expr) -> int | None:
    """The integer an answer stands for: the right side of its last relation
    (``n = 204``), a percent's number, a number sympy proves integral, or an
    integral decimal (``204.0``); else None."""
    import sympy
    from sympy.logic.boolalg import And

    while isinstance(expr, (sympy.core.relational.Relational, And)):  # a chain a = b = c is an And, in order
        expr = expr.rhs if not isinstance(expr, And) else getattr(expr, "_unsorted_args", expr.args)[-1]
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    pct = [a for a in expr.atoms(sympy.UnevaluatedExpr) if a == sympy.UnevaluatedExpr(sympy.Rational(1, 100))]
    if pct and isinstance(expr, sympy.Mul):
        expr = expr / pct[0]
    expr = expr.doit()
    if expr.atoms(sympy.Float):
        value = float(expr)
        return int(value) if abs(value) < 2**53 and value.is_integer() else None
    return int(expr) if expr.is_integer else None


def grade_math(
    response: str, gold: str, *, truncated: bool = False, integer_range: tuple[int, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """Grade a math response (rules in the module doc).

    Args:
        response: the model's full output.
        gold: the reference answer (LaTeX or plain).
        truncated: the response hit the token budget.
        integer_range: e.g. ``(0, 999)`` for AIME: the answer must be an integer in it.
        timeout: seconds per math-verify call.

    Returns:
        ``Verdict`` ("correct", "wrong", "no_answer" or "grader_error"); ``detail``
        says why a verdict differs from math-verify's own.
    """
    from math_verify import verify

    section = answer_section(response)
    if section is None:
        return Verdict(False, "no_answer", None, "thinking never closed")
    boxed = last_boxed(section)
    if boxed is None and truncated:
        return Verdict(False, "no_answer", None, "truncated without a boxed answer")
    try:
        gold_parsed = parse_gold(gold, timeout)
        text = f"\\boxed{{{boxed}}}" if boxed is not None else section
        pred = _parse(normalise_numbers(text), timeout)
        if not pred:
            return Verdict(False, "no_answer", boxed, "no parsable answer")
        shown = str(pred[-1]) if len(pred) > 1 else str(pred[0])
        ok = _run_with_timeout(lambda: verify(gold_parsed, pred, timeout_seconds=None), timeout)
        detail = ""
        if ok and _exactly_different(gold_parsed, pred):
            ok, detail = False, "exactly different (math-verify compares these only to 15 digits)"
        if integer_range is not None:
            value = _integer_value(pred[0])
            lo, hi = integer_range
            if value is None:
                ok, detail = False, "not an integer"
            elif not lo <= value <= hi:
                ok, detail = False, f"outside [{lo}, {hi}]"
    except (TimeoutError, ValueError) as err:
        return Verdict(False, "grader_error", boxed, str(err))
    return Verdict(bool(ok), "correct" if ok else "wrong", shown, detail)
