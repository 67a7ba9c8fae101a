"""Number notations that math-verify 0.9 misreads, rewritten before it parses.

- Mixed numbers: a whole number, a space (plain, ``\\ ``, ``\\,``, ``\\;``,
  ``\\:``, ``~``) and a proper fraction ``n/d`` mean ``whole + n/d``: ``1 1/4``
  becomes ``\\frac{5}{4}`` and ``-2\\ 3/5`` becomes ``-\\frac{13}{5}`` (math-verify
  reads ``1 1/4`` as 1/2 and ``2\\ 3/5`` as 1); a ``\\frac`` so that what follows
  (``1 1/2\\%``) applies to the whole number. LaTeX ``1\\frac{1}{4}`` it already
  reads as 5/4.
- LaTeX thousands separators between digit groups: ``9{,}500``, ``9\\,500``,
  ``9\\ 500``, ``9,\\!500`` become ``9500`` (math-verify reads 9 and 509). Plain
  ``9,500`` it already reads.
- An escaped dollar before a number is a currency sign and is dropped:
  ``The answer is \\$9,500.`` becomes ``The answer is 9,500.`` (math-verify reads
  nothing after ``\\$`` outside math mode; inside ``$...$`` it reads both).

A fraction whose numerator is not below its denominator, or a number glued to
a letter, dot, comma, slash or caret, or following a space-separated digit
group, is left alone (``x^2 1/2``, ``1/2 1/3``, ``3 5/4``, ``1 000 1/4`` are not
mixed numbers).
"""

from __future__ import annotations

import re

__all__ = ["normalise_numbers"]

_SPACE = r"(?:[ \t]|\\[ ,;:]|~)+"
_MIXED = re.compile(rf"(?<![\w.,/^])(?<!\d )(0|[1-9]\d*){_SPACE}(\d+)[ \t]*/[ \t]*(\d+)(?!\d|\.\d|[ \t]*/)")
_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\ |,\\!)(?=\d{3}(?!\d))")
_CURRENCY = re.compile(r"\\\$\s*(?=[-−]?(?:\d|\.\d))")


def _mixed(match: re.Match) -> str:
    whole, num, den = (int(g) for g in match.groups())
    if not 0 < num < den:
        return match.group(0)
    return f"\\frac{{{whole * den + num}}}{{{den}}}"


def normalise_numbers(text: str) -> str:
    """``text`` with mixed numbers as improper fractions, LaTeX thousands
    separators and escaped currency dollars removed (see module doc)."""
    return _CURRENCY.sub("", _THOUSANDS.sub("", _MIXED.sub(_mixed, text)))
