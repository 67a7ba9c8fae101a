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
- Scientific notation math-verify misreads becomes ``m\\times10^{k}``: ``1.2e5``,
  ``2E-4``, ``1.2e+05``, ``1.2\\mathrm{e}5`` (read as ``1.2 \\cdot e \\cdot 5``),
  ``1.2x10^5``, ``1.2·10^5``, ``1.2⋅10^5``, ``1.2 * 10^(-5)``, ``1.2×10⁵`` (superscript
  digits; ``10⁵`` alone becomes ``10^{5}``), siunitx's ``\\num{1.2e5}``, and such a
  number alone in ``\\text{}``, ``\\mathrm{}`` (``\\text{1.2 × 10^5}``, a string to
  math-verify). A number glued to a letter, dot, backslash, caret or underscore is left
  alone (``x_1e3``, ``\\sqrt2e5``).
- Outside math mode (``$...$``, ``\\(...\\)``, ``\\[...\\]``), in an answer
  without a box: a power of ten (``1.2 \\times 10^{5}``,
  ``1.2\\,\\cdot\\,10^{-5}``, ``10^{5}``) becomes its decimal expansion (``120000``,
  ``0.000012``, ``100000``; ``expand_prose_powers``): math-verify reads only the
  mantissa there (``1.2 \\times 10^{1}`` = ``1.2``).

A fraction whose numerator is not below its denominator, or a number glued to
a letter, dot, comma, slash or caret, or following a space-separated digit
group, is left alone (``x^2 1/2``, ``1/2 1/3``, ``3 5/4``, ``1 000 1/4`` are not
mixed numbers).
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["normalise_numbers", "expand_prose_powers"]

_SPACE = r"(?:[ \t]|\\[ ,;:]|~)+"
_MIXED = re.compile(rf"(?<![\w.,/^])(?<!\d )(0|[1-9]\d*){_SPACE}(\d+)[ \t]*/[ \t]*(\d+)(?!\d|\.\d|[ \t]*/)")
_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\ |,\\!)(?=\d{3}(?!\d))")
_CURRENCY = re.compile(r"\\\$\s*(?=[-−]?(?:\d|\.\d))")
_GAP = r"(?:\s|\\[,;:! ]|~)*"
_MANTISSA = r"(?<![\w.\\^_])(?P<m>\d+(?:\.\d*)?|\.\d+)"
_EXPONENT = r"[-+−]?\d+"
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_POWER_OF_TEN = rf"10{_GAP}\^{_GAP}(?:\{{\s*(?P<b>{_EXPONENT})\s*\}}|(?P<d>{_EXPONENT})(?!\d|\.\d))"
_SIUNITX = re.compile(r"\\num\s*(?:\[[^\]]*\])?\s*\{([^{}]*)\}")
_SCIENTIFIC = re.compile(
    _MANTISSA + r"(?:(?:[eE]|\\(?:mathrm|textrm|text|rm)\s*\{\s*[eE]\s*\})(?P<e>" + _EXPONENT + r")(?!\w|\.\d)"
    rf"|{_GAP}(?P<op>[xX×·⋅*]){_GAP}(?:{_POWER_OF_TEN}|10{_GAP}\^{_GAP}\(\s*(?P<p>{_EXPONENT})\s*\))"
    rf"|{_GAP}(?:[xX×·⋅*]|\\times|\\cdot){_GAP}10(?P<s>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))"
)
_SUPERSCRIPT_POWER = re.compile(r"(?<![\w.\\^_])10(?P<s>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)")
_LATEX_SCIENTIFIC = rf"[-−]?(?:\d+(?:\.\d*)?|\.\d+){_GAP}(?:\\times|\\cdot){_GAP}{_POWER_OF_TEN}"
_TEXT_SCIENTIFIC = re.compile(rf"\\(?:text|textrm|mathrm|rm)\s*\{{\s*({_LATEX_SCIENTIFIC})\s*\}}")
_PROSE_POWER = re.compile(
    rf"(?<![\w.\\^_{{}}])(?:(?P<m>\d+(?:\.\d*)?|\.\d+){_GAP}(?:\\times|\\cdot){_GAP})?{_POWER_OF_TEN}"
)
_DELIMITER = re.compile(r"\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
MAX_EXPANDED_EXPONENT = 100  # a prose power of ten beyond 10^±100 is left as it is


def _mixed(match: re.Match) -> str:
    whole, num, den = (int(g) for g in match.groups())
    if not 0 < num < den:
        return match.group(0)
    return f"\\frac{{{whole * den + num}}}{{{den}}}"


def _exponent(text: str) -> int:
    """An exponent as written (``-5``, ``−5``, ``+05``, superscript ``⁻⁵``) as an int."""
    return int(text.translate(_SUPERSCRIPTS).replace("−", "-"))


def _scientific(match: re.Match) -> str:
    if match["op"] in ("x", "X") and match["m"] == "0":
        return match.group(0)  # 0x10^2: a hexadecimal prefix, not a product
    mantissa = match["m"].rstrip(".") or "0"
    k = next(match[g] for g in ("e", "b", "d", "p", "s") if match[g] is not None)
    return f"{mantissa}\\times10^{{{_exponent(k)}}}"


def scientific_as_latex(text: str) -> str:
    """``text`` with the scientific notations math-verify misreads as ``m\\times10^{k}``
    (module doc): ``1.2e5``, ``1.2x10^5``, ``1.2·10^5``, ``1.2×10⁵``, ``\\num{1.2e5}``,
    ``\\text{1.2e5}`` all become ``1.2\\times10^{5}``."""
    text = _SCIENTIFIC.sub(_scientific, _SIUNITX.sub(r"\1", text))
    text = _SUPERSCRIPT_POWER.sub(lambda m: f"10^{{{_exponent(m['s'])}}}", text)
    return _TEXT_SCIENTIFIC.sub(r"\1", text)


def _expanded(match: re.Match) -> str:
    k = _exponent(match["b"] if match["b"] is not None else match["d"])
    if abs(k) > MAX_EXPANDED_EXPONENT:
        return match.group(0)
    return format(Decimal(match["m"] or "1").scaleb(k), "f")


def outside_math(text: str, rewrite) -> str:
    """``text`` with ``rewrite(part)`` applied to each part outside math mode (``$...$``,
    ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``; an escaped ``\\$`` opens nothing; an opener
    never closed opens nothing), in one pass (linear in ``len(text)``)."""
    out, pos, closer, opened = [], 0, None, 0
    for match in _DELIMITER.finditer(text):
        token = match.group(0)
        if closer is None and token in _CLOSER:
            out.append(rewrite(text[pos : match.start()]))
            pos, opened, closer = match.start(), match.end(), _CLOSER[token]
        elif token == closer:
            out.append(text[pos : match.end()])
            pos, closer = match.end(), None
    if closer is not None:  # never closed: its opener is text
        out.append(text[pos:opened])
        pos = opened
    return "".join(out) + rewrite(text[pos:])


def expand_prose_powers(text: str) -> str:
    """``text`` with each power of ten outside math mode (``1.2 \\times 10^{5}``,
    ``1.2\\,\\cdot\\,10^{-5}``, ``10^{5}``) as its decimal expansion (``120000``,
    ``0.000012``, ``100000``), exactly; for an answer without a box, after
    ``normalise_numbers`` (module doc). Exponents beyond ``MAX_EXPANDED_EXPONENT`` are
    left as written."""
    return outside_math(text, lambda part: _PROSE_POWER.sub(_expanded, part))


def normalise_numbers(text: str) -> str:
    """``text`` with mixed numbers as improper fractions, LaTeX thousands
    separators and escaped currency dollars removed, and the scientific notations
    math-verify misreads as LaTeX (``scientific_as_latex``; see module doc)."""
    return scientific_as_latex(_CURRENCY.sub("", _THOUSANDS.sub("", _MIXED.sub(_mixed, text))))
