"""The one place relaxtune calls math-verify's private functions (contract test:
``tests/test_mathverify_compat.py``).

``verify_refusing`` is ``math_verify.verify`` with a veto on its numeric comparison,
``math_verify.grader.sympy_numeric_eq(a, b, float_rounding, numeric_precision)``
(math-verify 0.9.0, ``grader.py`` :124-183): the one function through which it
equates two numbers: two single numbers, and the elements of two sets, tuples or
matrices, the ends of two intervals, the sides of two relations (``lhs - rhs``) once
its structural comparison (``sympy_expr_eq``) has paired them. It rounds floats to 6
decimal places and chops differences below its 15-digit precision, at every depth, so
a veto must sit there to see every pair. Imports only math-verify and the standard
library: it runs in the math worker (``mathcheck``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

__all__ = ["NUMERIC_EQ_PARAMS", "verify_refusing"]

NUMERIC_EQ_PARAMS = ("a", "b", "float_rounding", "numeric_precision")


def _grader():
    """math-verify's ``grader`` module, its ``sympy_numeric_eq`` checked against the
    signature relaxtune wraps.

    Raises:
        RuntimeError: the function is missing or its parameters changed (naming the
            installed math-verify version).
    """
    from importlib.metadata import version

    from math_verify import grader

    fn = getattr(grader, "sympy_numeric_eq", None)
    if fn is None:
        raise RuntimeError(f"math-verify {version('math-verify')} has no grader.sympy_numeric_eq")
    params = tuple(inspect.signature(fn).parameters)
    if params != NUMERIC_EQ_PARAMS:
        raise RuntimeError(
            f"math-verify {version('math-verify')}: sympy_numeric_eq takes {params}, "
            f"relaxtune was written for {NUMERIC_EQ_PARAMS}"
        )
    return grader


def verify_refusing(gold, pred, refuse: Callable[[object, object], str]) -> tuple[bool, list[str]]:
    """``math_verify.verify(gold, pred)`` (its defaults, no signal timeout) in which every
    numeric equality it grants must also pass ``refuse``.

    Args:
        gold, pred: ``math_verify.parse`` results.
        refuse: ``refuse(a, b)`` for two sympy objects math-verify's numeric comparison
            equates (gold's side first): why they are not equal, or "" to let them be.
            Must not raise (math-verify would read an error as "different").

    Returns:
        The verdict with the veto, and the reasons of the equalities refused in order
        (empty: the verdict is math-verify's own). Not thread-safe: it swaps the
        function in math-verify's module for the call (the worker is one thread).

    Raises:
        RuntimeError: math-verify's numeric comparison is not the one this wraps.
    """
    from math_verify import verify

    grader = _grader()
    numeric_eq = grader.sympy_numeric_eq
    refused: list[str] = []

    def checked(a, b, float_rounding, numeric_precision):
        if not numeric_eq(a, b, float_rounding, numeric_precision):
            return False
        why = refuse(a, b)
        if why:
            refused.append(why)
        return not why

    grader.sympy_numeric_eq = checked
    try:
        return bool(verify(gold, pred, timeout_seconds=None)), refused
    finally:
        grader.sympy_numeric_eq = numeric_eq
