"""Contract of ``relaxtune.graders.mathverify_compat``: what relaxtune relies on beyond
math-verify's public API (its numeric comparison ``grader.sympy_numeric_eq``, the one
function through which it equates numbers at every depth of an answer). A failure here
names the math-verify version that broke it: adapt the compat module, nothing else."""

from __future__ import annotations

import inspect
import logging
from importlib.metadata import version

import pytest
from math_verify import grader, parse, verify

from relaxtune.graders.mathverify_compat import NUMERIC_EQ_PARAMS, verify_refusing

VERSION = f"math-verify {version('math-verify')}"
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parsed(text: str):
    return parse(f"\\boxed{{{text}}}", parsing_timeout=None)


def test_the_numeric_comparison_is_where_and_what_we_wrap():
    assert tuple(inspect.signature(grader.sympy_numeric_eq).parameters) == NUMERIC_EQ_PARAMS, VERSION


# math-verify equates each pair only through its numeric comparison (floats 1e-9 apart, rounded
# to 6 places; differences below 1e-15, chopped)
PATHS = [
    ("a number", "0.1", "0.100000001"),
    ("an equation's right side", "x = 0.1", "0.100000001"),
    ("list elements", "0.1, 3", "0.100000001, 3"),
    ("tuple elements", "(0.1, 3)", "(0.100000001, 3)"),
    ("set elements", r"\{0.1, 3\}", r"\{3, 0.100000001\}"),
    ("interval ends", "[0.1, 1]", "[0.100000001, 1]"),
    ("matrix elements", r"\begin{pmatrix} 0.1 \\ 1 \end{pmatrix}", r"\begin{pmatrix} 0.100000001 \\ 1 \end{pmatrix}"),
    ("a relation's sides", r"x > 1.2\times10^{-20}", r"x > 1.2\times10^{-21}"),
    ("plus-minus", r"\pm 1.2\times10^{-20}", r"\pm 1.2\times10^{-21}"),
]


@pytest.mark.parametrize("path, gold, pred", PATHS, ids=[p[0] for p in PATHS])
def test_every_numeric_equality_passes_the_veto(path, gold, pred):
    g, p = _parsed(gold), _parsed(pred)
    assert verify(g, p, timeout_seconds=None), VERSION
    assert verify_refusing(g, p, lambda a, b: "") == (True, []), VERSION
    seen = []

    def refuse(a, b):
        seen.append((a, b))
        return "no"

    ok, refused = verify_refusing(g, p, refuse)
    assert not ok and refused and set(refused) == {"no"}, (VERSION, seen)
    assert grader.sympy_numeric_eq.__name__ == "sympy_numeric_eq"  # restored


def test_the_comparison_is_restored_when_the_veto_raises():
    original = grader.sympy_numeric_eq

    def boom(a, b):
        raise KeyError("boom")

    assert verify_refusing(_parsed("0.1"), _parsed("0.100000001"), boom)[0] is False  # math-verify swallows it
    assert grader.sympy_numeric_eq is original
