"""Numbers that differ are never equal, whatever their notation (issue 38; grading policy
``numeric-tolerance``): one test per notation of a number, each with a pair a power of ten
apart (wrong, also where math-verify itself says equal) and the same value written another
way (correct); the tolerance's bounds and the reading of percentages exactly."""

from __future__ import annotations

import logging

import pytest

from relaxtune.graders.math import grade_math
from relaxtune.graders.mathtolerance import values_differ
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
    # notations math-verify misreads (1.2 e 5 as 1.2 * e * 5, 1.2x10^5 as 1.2 * x * 10^5...): read whole
    ("e-notation with \\mathrm{e}", r"\boxed{1.2\mathrm{e}5}", r"1.2\times10^{6}", r"\boxed{1.2\mathrm{e}6}"),
    ("siunitx \\num", r"\boxed{\num{1.2e5}}", "1200000", r"\boxed{\num{1.2e6}}"),
    ("x for times", r"\boxed{1.2x10^5}", r"1.2\times10^{6}", r"\boxed{1.2x10^6}"),
    ("middle dot", r"\boxed{1.2·10^5}", r"1.2\times10^{6}", r"\boxed{12·10^5}"),
    ("dot operator", r"\boxed{1.2⋅10^{-5}}", r"1.2\times10^{-6}", r"\boxed{1.2⋅10^{-6}}"),
    ("asterisk, exponent in parentheses", r"\boxed{1.2 * 10^(-5)}", r"1.2\times10^{-6}", r"\boxed{1.2*10^(-6)}"),
    ("superscript exponent", r"\boxed{1.2×10⁵}", "1200000", r"\boxed{1.2×10⁶}"),
    ("negative superscript exponent", r"\boxed{1.2×10⁻⁵}", "0.0000012", r"\boxed{1.2×10⁻⁶}"),
    ("a power of ten in superscript", r"\boxed{10⁵}", "1000000", r"\boxed{10⁶}"),
    ("in \\text", r"\boxed{\text{1.2 × 10^5}}", "1200000", r"\boxed{\text{1.2e6}}"),
    ("gold with x for times", r"\boxed{120000}", "1.2x10^6", r"\boxed{1200000}"),
    ("gold with a superscript exponent", r"\boxed{1.2\times10^{5}}", "1.2×10⁶", r"\boxed{1200000}"),
    ("gold in \\num", r"\boxed{1.2e5}", r"\num{1.2e6}", r"\boxed{1.2\times10^{6}}"),
    ("e-notation in a math span", r"The answer is $1.2e5$.", "1.2e6", r"The answer is $1.2e6$."),
    (
        "unboxed times ten to the power",
        r"The answer is 1.2 \times 10^{5}.",
        "1200000",
        r"The answer is 1.2 \times 10^{6}.",
    ),
    (
        "unboxed cdot, thin spaces",
        r"The answer is 1.2\,\cdot\,10^{-5}.",
        r"1.2\times10^{-6}",
        r"So it is 12\,\cdot\,10^{-7}.",
    ),
    ("unboxed e-notation", "The answer is 1.2e5.", "1.2e6", "The answer is 1.2E+06."),
    ("unboxed unicode times", "The answer is 1.2 × 10^5.", "1200000", "The answer is 1.2 × 10^6."),
    ("unboxed power of ten alone", r"The answer is 10^{5}.", "1000000", r"The answer is 10^{6}."),
    ("unboxed negative", r"The answer is -1.2 \times 10^{5}.", "-1200000", r"The answer is -1.2 \times 10^{6}."),
    ("LaTeX thousands separators", r"\boxed{120{,}000}", "1200000", r"\boxed{1{,}200{,}000}"),
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

# numbers inside an answer of several parts: math-verify compares each pair with the same
# rounding; (form, response off, gold, the same value in another notation)
STRUCTURES = [
    ("list", r"\boxed{0.00000001, 3}", "0.00000002, 3", r"\boxed{2\times10^{-8}, 3}"),
    ("tuple", r"\boxed{(1.2\times10^{-20}, 3)}", r"(1.2\times10^{-21}, 3)", r"\boxed{(12\times10^{-22}, 3)}"),
    ("set", r"\boxed{\{0.00000001, 3\}}", r"\{0.00000002, 3\}", r"\boxed{\{3, 0.00000002\}}"),
    ("closed interval", r"\boxed{[0.00000001, 1]}", "[0.00000002, 1]", r"\boxed{[2\times10^{-8}, 1]}"),
    ("half-open interval", r"\boxed{(0.00000001, 1]}", "(0.00000002, 1]", r"\boxed{(0.000000020, 1]}"),
    (
        "matrix",
        r"\boxed{\begin{pmatrix} 0.00000001 \\ 1 \end{pmatrix}}",
        r"\begin{pmatrix} 0.00000002 \\ 1 \end{pmatrix}",
        r"\boxed{\begin{pmatrix} 2\times10^{-8} \\ 1 \end{pmatrix}}",
    ),
    ("inequality", r"\boxed{x > 1.2\times10^{-20}}", r"x > 1.2\times10^{-21}", r"\boxed{x > 12\times10^{-22}}"),
    ("membership", r"\boxed{x \in [0.00000001, 1]}", "[0.00000002, 1]", r"\boxed{x \in [0.00000002, 1]}"),
    ("plus-minus", r"\boxed{\pm 1.2\times10^{-20}}", r"\pm 1.2\times10^{-21}", r"\boxed{\pm 12\times10^{-22}}"),
    ("a function's value", r"\boxed{f(3) = 0.00000001}", "0.00000002", r"\boxed{f(3) = 0.00000002}"),
    ("braces", r"\boxed{{0.00000001}}", "0.00000002", r"\boxed{{0.00000002}}"),
    ("several boxes", r"\boxed{0.00000001} and \boxed{3}", "0.00000002, 3", r"\boxed{0.00000002} and \boxed{3}"),
    (
        "alternatives",
        r"\boxed{x = 0.00000001 \text{ or } x = 3}",
        "0.00000002, 3",
        r"\boxed{x = 2e-8 \text{ or } x = 3}",
    ),
]


@pytest.mark.parametrize("form, off, gold, same", STRUCTURES, ids=[f[0] for f in STRUCTURES])
def test_numbers_inside_an_answer_are_held_to_the_tolerance(form, off, gold, same):
    assert _math_verify_says(off, gold)
    wrong = grade_math(off, gold)
    assert wrong.verdict == "wrong", wrong
    assert wrong.detail.startswith("numbers differ by more than the tolerance"), wrong
    right = grade_math(same, gold)
    assert (right.verdict, right.detail) == ("correct", ""), right


@pytest.mark.parametrize(
    "off, gold, same",
    [
        (r"\boxed{1, 2, \ldots, 0.00000001}", r"1, 2, \ldots, 0.00000002", r"\boxed{1, 2, \ldots, 2\times10^{-8}}"),
        (
            r"\boxed{0.00000001, 0.00000002, \ldots, n}",
            r"0.00000002, 0.00000003, \ldots, n",
            r"\boxed{2e-8, 3e-8, \ldots, n}",
        ),
    ],
)
def test_the_terms_of_a_list_with_an_ellipsis_are_held_to_the_tolerance(off, gold, same):
    assert _math_verify_says(off, gold)
    assert grade_math(off, gold).verdict == "wrong"
    assert grade_math(same, gold).verdict == "correct"


# an answer without a box, a power of ten outside math mode: math-verify reads the mantissa
MANTISSA_ONLY = [
    (r"The answer is 1.2 \times 10^{1}.", "1.2"),
    (r"The answer is 3\,\cdot\,10^{-1}.", "3"),
    ("The answer is 1.2e1.", "1.2"),
    ("The answer is 1.2x10^1.", "1.2"),
    ("The answer is 1.2·10^1.", "1.2"),
    ("The answer is 1.2×10¹.", "1.2"),
]


@pytest.mark.parametrize("response, gold", MANTISSA_ONLY)
def test_an_unboxed_power_of_ten_is_read_whole(response, gold):
    assert _math_verify_says(response, gold)
    assert grade_math(response, gold).verdict == "wrong"


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
def test_values_differ_bounds_and_percentages(a, b, differ):
    why = values_differ(_parsed(a)[0], _parsed(b)[0], TOL.relative, TOL.absolute)
    assert bool(why) == differ, why


def test_the_policy_file_states_the_tolerance_and_names_the_override():
    assert (TOL.relative, TOL.absolute) == (1e-4, 1e-12)
    assert "p/100" in TOL.percent
    row = next(r for r in policies() if r["id"] == "numeric-tolerance")
    assert "relative" in row["we_do"] and "absolute" in row["we_do"] and "percentage" in row["we_do"]
    assert "6 decimal places" in row["official"]
    for part in ("list", "ellipsis", "set", "tuple", "\\pm", "interval", "matrix", "relation", "f(3) = "):
        assert part in row["we_do"], part
    for notation in ("1.2x10^5", "1.2·10^5", "1.2×10⁵", "\\num{1.2e5}", "\\text{1.2e5}", "1.2\\mathrm{e}5"):
        assert notation in row["we_do"], notation
