"""Answer notations that math-verify 0.9 misreads, rewritten to LaTeX it reads right.

The normalisation layer of the math grader's "mathematical truth" policy (README,
"Grading policy", ``math-notation`` and ``math-truth``): each rewrite turns a
notation into an equal expression math-verify parses, in response and gold alike.

- ``\\sqrt(2)`` (parentheses, as typed by many models) becomes ``\\sqrt{2}``:
  math-verify drops a boxed ``4\\sqrt(2)`` altogether and reads an unboxed
  ``$4\\sqrt(2)$`` as 4.
- Repeating decimals ``0.\\overline{3}``, ``1.2\\overline{45}``, ``0.\\dot{6}``
  become the exact fraction (``\\frac{1}{3}``): math-verify cannot parse them.
- Trigonometric functions of degrees (``\\sin 30^\\circ``, ``\\cos(60°)``,
  ``\\tan\\left(45^{\\circ}\\right)``) take the angle in radians
  (``\\sin\\left(\\frac{30\\pi}{180}\\right)``): math-verify reads ``\\sin 30^\\circ``
  as the sine of 30 radians.
- Plain-text forms, only inside a box or a gold answer (where the text is an
  answer, not prose): ``pi`` is ``\\pi``; ``sqrt(``, ``exp(``, ``ln(``, ``log(``,
  ``sin(`` and the other named functions are their LaTeX commands (math-verify reads
  ``p \\cdot i`` and ``E \\cdot x \\cdot p``). Scientific notation (``1.5e3``,
  ``1.2x10^5``...) is ``numbers``' (everywhere, response and gold).

Every rewrite produces an equal value; none changes text that already parses
as meant (a ``\\pi`` keeps its backslash, a word such as "epic" or "spin" is
left alone: a name must stand on its own).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["normalise_latex", "normalise_plain", "repeating_decimal"]

_SQRT_PAREN = re.compile(r"\\sqrt\s*\(")
_REPEAT = re.compile(r"(?<![\d.])(\d*)\.(\d*)(?:\\overline\s*\{\s*(\d+)\s*\}|\\dot\s*\{\s*(\d)\s*\}|\\dot\s*(\d))")
_NUM = r"(-?\d+(?:\.\d+)?)"
_DEG = r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)"
_TRIG = re.compile(
    r"\\(sin|cos|tan|cot|sec|csc)\s*(?:\\left\s*\(\s*" + _NUM + _DEG + r"\s*\\right\s*\)"
    r"|\(\s*" + _NUM + _DEG + r"\s*\)|\{\s*" + _NUM + _DEG + r"\s*\}|" + _NUM + _DEG + ")"
)
_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_FUNCTION = re.compile(
    r"(?<![\\A-Za-z])(arcsin|arccos|arctan|sqrt|exp|ln|log|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc)"
    r"(?=\s*\()"
)


def _closing(text: str, open_at: int) -> int | None:
    """Index of the ``)`` that closes the ``(`` at ``open_at``, or None."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None


def _sqrt_braces(text: str) -> str:
    """``\\sqrt(x)`` as ``\\sqrt{x}`` (parentheses matched; an unmatched one is left)."""
    out, pos = [], 0
    for m in _SQRT_PAREN.finditer(text):
        if m.start() < pos:
            continue
        close = _closing(text, m.end() - 1)
        if close is None:
            continue
        out += [text[pos : m.start()], r"\sqrt{", _sqrt_braces(text[m.end() : close]), "}"]
        pos = close + 1
    return "".join(out) + text[pos:]


def repeating_decimal(whole: str, fixed: str, repeat: str) -> Fraction:
    """The value of ``whole.fixed(repeat repeating)``: ``("0", "", "3")`` is 1/3,
    ``("1", "2", "45")`` is 1.2454545... = 137/110."""
    scale = 10 ** len(fixed)
    period = 10 ** len(repeat) - 1
    return Fraction(int(whole or "0")) + Fraction(int(fixed or "0"), scale) + Fraction(int(repeat), scale * period)


def _repeat(m: re.Match) -> str:
    value = repeating_decimal(m.group(1), m.group(2), m.group(3) or m.group(4) or m.group(5))
    return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _trig(m: re.Match) -> str:
    angle = next(g for g in m.groups()[1:] if g is not None)
    return f"\\{m.group(1)}\\left(\\frac{{{angle}\\pi}}{{180}}\\right)"


def normalise_latex(text: str) -> str:
    """``text`` with ``\\sqrt(...)``, repeating decimals and trigonometric functions
    of degrees rewritten (module doc); safe on prose and whole responses."""
    return _TRIG.sub(_trig, _REPEAT.sub(_repeat, _sqrt_braces(text)))


def normalise_plain(answer: str) -> str:
    """An answer's plain-text forms as LaTeX (``pi/2``, ``exp(16)-1``, ``sqrt(2)``),
    then ``normalise_latex``; for the content of a box or a gold answer."""
    text = _FUNCTION.sub(lambda m: "\\" + m.group(1), _PI.sub(r"\\pi ", answer))
    return normalise_latex(text)
