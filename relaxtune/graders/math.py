"""Math answers with math-verify, safe in worker threads.

math-verify's own timeouts use signals, which only work in the main thread:
they are disabled here (``parsing_timeout=None``, ``timeout_seconds=None``) and
each parse/verify runs under a timeout of ours (a daemon thread that is
abandoned when it overruns; the verdict is then "grader_error").

Rules: the answer is read from the text after the thinking block; the LAST
``\\boxed{}`` wins over earlier, retracted ones; without a box, math-verify's own
extraction is used unless the response was truncated (a truncated response
with no boxed answer is "no_answer", never rescued by the last number in the
text). Exact numbers are compared exactly (math-verify rounds floats to 6
places, so ``1/2^98`` would equal ``1/2^99``); everything else goes to
``math_verify.verify``. Gold answers without ``$...$`` are boxed before parsing,
and an empty gold parse is an error.
"""

from __future__ import annotations

import functools
import logging
import re
import threading

from .base import Verdict, answer_section

DEFAULT_TIMEOUT = 10.0  # seconds per parse/verify call

__all__ = ["grade_math", "last_boxed", "parse_gold", "gsm8k_gold"]

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


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def gsm8k_gold(answer: str) -> str:
    """The final number of a GSM8K rationale (after ``####``), commas removed."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def _parse(text: str, timeout: float):
    from math_verify import parse

    return _run_with_timeout(lambda: parse(text, parsing_timeout=None), timeout)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str, timeout: float = DEFAULT_TIMEOUT):
    """Parse a gold answer (boxing it when it has no ``$`` or box); cached, as
    every sample of every trial grades against the same golds.

    Raises:
        ValueError: when math-verify reads nothing from it.
    """
    text = gold if ("$" in gold or "\\boxed" in gold) else f"\\boxed{{{gold}}}"
    parsed = _parse(text, timeout)
    if not parsed:
        raise ValueError(f"gold answer {gold!r} does not parse")
    return parsed


def _exact_equal(gold, pred) -> bool | None:
    """Exact comparison when both first parses are exact numbers; None otherwise."""
    import sympy

    g, p = gold[0], pred[0]
    if not (isinstance(g, sympy.Basic) and isinstance(p, sympy.Basic)):
        return None
    if not (g.is_number and p.is_number) or g.atoms(sympy.Float) or p.atoms(sympy.Float):
        return None
    return bool(sympy.simplify(g - p) == 0)


def grade_math(
    response: str, gold: str, *, truncated: bool = False, integer_range: tuple[int, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """Grade a math response.

    Args:
        response: the model's full output.
        gold: the reference answer (LaTeX or plain).
        truncated: the response hit the token budget.
        integer_range: e.g. ``(0, 999)`` for AIME: the answer must be an integer in it.
        timeout: seconds per math-verify call.

    Returns:
        ``Verdict`` ("correct", "wrong", "no_answer" or "grader_error").
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
        pred = _parse(f"\\boxed{{{boxed}}}" if boxed is not None else section, timeout)
        if not pred:
            return Verdict(False, "no_answer", boxed, "no parsable answer")
        shown = str(pred[-1]) if len(pred) > 1 else str(pred[0])
        if integer_range is not None:
            try:
                value = int(str(pred[0]))
            except ValueError:
                return Verdict(False, "wrong", shown, "not an integer")
            lo, hi = integer_range
            if not lo <= value <= hi:
                return Verdict(False, "wrong", shown, f"outside [{lo}, {hi}]")
            ok = value == int(str(gold_parsed[0]))
        else:
            exact = _exact_equal(gold_parsed, pred)
            ok = exact if exact is not None else _run_with_timeout(
                lambda: verify(gold_parsed, pred, timeout_seconds=None), timeout
            )
    except (TimeoutError, ValueError) as err:
        return Verdict(False, "grader_error", boxed, str(err))
    return Verdict(bool(ok), "correct" if ok else "wrong", shown)
