"""Numbers that differ are never equal, whatever their notation (issue 38; grading policy
``numeric-tolerance``): one test per notation of a number, each with a pair a power of ten
apart (wrong, also where math-verify itself says equal) and the same value written another
way (correct); the tolerance's bounds and the reading of percentages exactly."""

from __future__ import annotations

import logging

import pytest

from relaxtune.graders.math import grade_math
from relaxtune.graders.mathcheck import numbers_differ
from relaxtune.graders.policy import numeric_tolerance, policies

logging.getLogger("math_verify").setLevel(logging.ERROR)
TOL = numeric_tolerance()


def _math_verify_says(response: str, gold: str) -> bool:
    from math_verify import parse, verify

    gold_text = gold if ("$" in gold or "\\boxed" in gold) else f"\\boxed{{{gold}}}"
    return bool(
        verify(parse(gold_text, parsing_timeout=None), parse(response, parsing_timeout=None), timeout_seconds=None)
    )


# (form, response a power of ten off, gold, the same value in another notation)
FORMS = [
    ("e-notation", r"\boxed{1.2e5}", "1.2e6", r"\boxed{1.2e6}"),
    ("E-notation with a sign", r"\boxed{1.2E+05}", "1200000", r"\boxed{1.2E+06}"),
    ("negative exponent", r"\boxed{1.2e-7}", "0.000000012", r"\boxed{1.2e-8}"),
    ("times ten to the power", r"\boxed{1.2\times10^{-20}}", r"1.2\times10^{-21}", r"\boxed{12\times10^{-22}}"),
    ("cdot ten to the power", r"\boxed{1.2 \cdot 10^{-20}}", r"1.2 \cdot 10^{-21}", r"\boxed{0.12 \cdot 10^{-20}}"),
    ("plain decimal", r"\boxed{0.00000001}", "0.00000002", r"\boxed{0.000000020}"),
    ("decimal against scientific", r"\boxed{0.00000012}", r"1.2\times10^{-8}", r"\boxed{0.000000012}"),
    ("fraction with a power", r"\boxed{0.000000012}", r"\frac{12}{10^{8}}", r"\boxed{0.00000012}"),
    ("unboxed math span", r"The answer is $0.00000012$.", r"1.2\times 10^{-8}", r"The answer is $0.000000012$."),
    ("large plain integer", r"\boxed{120000}", "1200000", r"\boxed{1,200,000}"),
    (
        "an equation's right side",
        r"\boxed{x = 1.2\times10^{-20}}",
        r"1.2\times10^{-21}",
        r"\boxed{x = 1.2\times10^{-21}}",
    ),
    ("percentage", r"\boxed{0.000001\%}", "0.0000001", r"\boxed{0.000001\%}"),
]


@pytest.mark.parametrize("form, off, gold, same", FORMS, ids=[f[0] for f in FORMS])
def test_a_power_of_ten_apart_is_wrong_in_every_notation(form, off, gold, same):
    wrong = grade_math(off, gold)
    assert wrong.verdict == "wrong", wrong
    right = grade_math(same, gold if form != "percentage" else "0.00000001")
    assert right.verdict == "correct", right


# where math-verify itself says equal: each such override names its policy in the detail
OVERRIDES = [
    (r"\boxed{0.00000001}", "0.00000002"),
    (r"\boxed{1.2\times10^{-20}}", r"1.2\times10^{-21}"),
    (r"\boxed{1.2\times10^{-7}}", "0.000000012"),
    (r"\boxed{0.000001\%}", "0.0000001"),
]


@pytest.mark.parametrize("response, gold", OVERRIDES)
def test_math_verify_says_equal_and_the_tolerance_vetoes_it(response, gold):
    assert _math_verify_says(response, gold)
    verdict = grade_math(response, gold)
    assert verdict.verdict == "wrong"
    assert "numbers differ by more than the tolerance" in verdict.detail


def _parsed(text: str):
    from math_verify import parse

    return parse(f"\\boxed{{{text}}}", parsing_timeout=None)


@pytest.mark.parametrize(
    "a, b, differ",
    [
        ("1", "1.00009", False),  # within the relative bound
        ("1", "1.00011", True),
        ("1000000", "1000100", False),  # 100 apart, within 1e-4 of the larger (100.01)
        ("1000000", "1000101", True),
        ("0", "0.0000000000009", False),  # within the absolute bound, against an exact zero only
        ("0", "0.0000000000011", True),
        ("1.2\\times10^{-30}", "1.2\\times10^{-31}", True),  # no absolute bound away from zero
        ("1.2\\times10^{-30}", "1.20001\\times10^{-30}", False),
        ("-5", "5", True),
        ("10\\%", "0.1", False),  # a percentage reads as p/100 ...
        ("10\\%", "10", False),  # ... or as p (math-verify's two readings)
        ("10\\%", "1", True),
        ("10\\%", "1000\\%", True),  # two percentages compare p with q
        ("2\\%", "2\\%", False),
        ("x", "1", False),  # not a number: not ours to decide
        ("\\{1, 2\\}", "1", False),
    ],
)
def test_numbers_differ_bounds_and_percentages(a, b, differ):
    why = numbers_differ(_parsed(a), _parsed(b), TOL.relative, TOL.absolute)
    assert bool(why) == differ, why


def test_the_policy_file_states_the_tolerance_and_names_the_override():
    assert (TOL.relative, TOL.absolute) == (1e-4, 1e-12)
    assert "p/100" in TOL.percent
    row = next(r for r in policies() if r["id"] == "numeric-tolerance")
    assert "relative" in row["we_do"] and "absolute" in row["we_do"] and "percentage" in row["we_do"]
    assert "6 decimal places" in row["official"]
