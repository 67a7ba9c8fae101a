"""The grading policy's numeric tolerance (``policy.yaml``: ``numeric``, row
``numeric-tolerance``) on two values math-verify equates numerically.

Two numbers ``a``, ``b`` differ when ``|a - b| > relative * max(|a|, |b|)`` and, when one of
them is zero, ``|a - b| > absolute`` (no relative bound compares with zero; elsewhere none
is absolute: ``1.2e-20`` and ``1.2e-21`` differ). A percentage ``p\\%`` (math-verify's
``p * UnevaluatedExpr(1/100)``) reads as ``p/100`` and as ``p`` (math-verify's two
readings); two percentages compare ``p`` with ``q``. Two expressions that differ only by a
constant term (``x - 1.2e-20`` and ``x - 1.2e-21``, the sides of ``x > 1.2e-20``) compare
their constants. Imports only sympy and the standard library: it runs in the math worker
(``mathcheck``).
"""

from __future__ import annotations

__all__ = ["values_differ"]


def _finite(v: float) -> bool:
    return v == v and abs(v) != float("inf")


def _readings(x) -> tuple[list[complex], bool] | None:
    """The complex values (40 digits) a single finite number stands for, and whether it is a
    percentage (``p\\%`` reads as ``p/100`` and ``p``); None when ``x`` is no single finite
    number (a symbol left, a set, an infinity, too large for a float)."""
    import sympy

    if not isinstance(x, sympy.Expr) or x.free_symbols:
        return None
    percent = sympy.UnevaluatedExpr(sympy.Rational(1, 100))
    pct = x.args[0] if isinstance(x, sympy.Mul) and len(x.args) == 2 and x.args[1] == percent else None
    try:
        value = complex(sympy.N(pct if pct is not None else x, 40))
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(map(_finite, (value.real, value.imag))):
        return None
    return ([value / 100, value], True) if pct is not None else ([value], False)


def _constants(gold, pred):
    """The constant terms of two expressions with symbols that are otherwise the same
    (``x - 1.2e-20``, ``x - 1.2e-21``: ``-1.2e-20``, ``-1.2e-21``); None when they are not."""
    symbols = gold.free_symbols | pred.free_symbols
    try:
        (g, g_rest), (p, p_rest) = (e.as_independent(*symbols, as_Add=True) for e in (gold, pred))
    except (TypeError, ValueError, AttributeError):
        return None
    return (g, p) if g_rest == p_rest else None


def _shown(v: complex) -> str:
    return f"{v.real if not v.imag else v:.6g}"


def values_differ(gold, pred, relative: float, absolute: float) -> str:
    """Why two sympy values that math-verify's numeric comparison equates are farther
    apart than the tolerance (module doc), or "" (close enough, or not numbers: not ours
    to decide).

    Args:
        gold, pred: sympy objects, as ``math_verify.grader.sympy_numeric_eq`` gets them.
        relative, absolute: the bounds (unitless, ``policy.numeric_tolerance()``).

    Source: grading policy ``numeric-tolerance`` (``relaxtune/graders/policy.yaml``);
    math-verify 0.9.0 ``grader.py`` ``sympy_numeric_eq`` rounds floats to 6 decimal places
    (``0.00000001`` = ``0.00000002``) and chops below 15 digits (``1.2e-20`` = ``1.2e-21``).
    """
    import sympy

    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return ""
    if gold.free_symbols or pred.free_symbols:
        pair = _constants(gold, pred)
        if pair is None:
            return ""
        gold, pred = pair
    g, p = _readings(gold), _readings(pred)
    if g is None or p is None:
        return ""
    (gv, g_pct), (pv, p_pct) = g, p
    if g_pct and p_pct:
        gv, pv = gv[1:], pv[1:]
    for a in gv:
        for b in pv:
            if abs(a - b) <= relative * max(abs(a), abs(b)) or (a == 0 or b == 0) and abs(a - b) <= absolute:
                return ""
    return (
        f"numbers differ by more than the tolerance (relative {relative:g}, absolute {absolute:g}): "
        f"{_shown(pv[-1])} vs {_shown(gv[-1])}"
    )
