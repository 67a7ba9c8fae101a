"""The math grader's normalisation layer (relaxtune/graders/mathnorm.py) and its truth
checks (mathcheck.truly_equal, compare_sequences): exact rewrites and verdicts."""

from __future__ import annotations

from fractions import Fraction

import pytest

from relaxtune.graders.math import final_boxes, scan_boxes
from relaxtune.graders.mathnorm import normalise_latex, normalise_plain, repeating_decimal


@pytest.mark.parametrize(
    "text, out",
    [
        (r"4\sqrt(2)", r"4\sqrt{2}"),
        (r"\sqrt(\sqrt(2)+1)", r"\sqrt{\sqrt{2}+1}"),
        (r"\sqrt(2", r"\sqrt(2"),  # unmatched: left alone
        (r"0.\overline{3}", r"\frac{1}{3}"),
        (r"1.2\overline{45}", r"\frac{137}{110}"),
        (r"-0.\overline{142857}", r"-\frac{1}{7}"),
        (r"0.\dot{6}", r"\frac{2}{3}"),
        (r"2.\overline{9}", "3"),
        (r"\sin 30^\circ", r"\sin\left(\frac{30\pi}{180}\right)"),
        (r"\cos(60°)", r"\cos\left(\frac{60\pi}{180}\right)"),
        (r"\tan\left(45^{\circ}\right)", r"\tan\left(\frac{45\pi}{180}\right)"),
        (r"\sin x + 30^\circ", r"\sin x + 30^\circ"),  # a symbolic angle is not converted
        ("The answer is 3.5.", "The answer is 3.5."),
    ],
)
def test_normalise_latex_rewrites_exactly(text, out):
    assert normalise_latex(text) == out


@pytest.mark.parametrize(
    "text, out",
    [
        ("pi/2", r"\pi /2"),
        ("2pi", r"2\pi "),
        ("exp(16)-1", r"\exp(16)-1"),
        ("sqrt(2)/2", r"\sqrt{2}/2"),
        ("arcsin(1)", r"\arcsin(1)"),
        ("1.5e3", r"1.5\times10^{3}"),
        ("2E-4", r"2\times10^{-4}"),
        ("spin", "spin"),
        ("epic", "epic"),
        (r"\pi/2", r"\pi/2"),
        ("3e", "3e"),
        ("x_1e3", "x_1e3"),
    ],
)
def test_normalise_plain_rewrites_answer_forms_only(text, out):
    assert normalise_plain(text) == out


def test_repeating_decimal_values():
    assert repeating_decimal("0", "", "3") == Fraction(1, 3)
    assert repeating_decimal("1", "2", "45") == Fraction(137, 110)
    assert repeating_decimal("", "1", "6") == Fraction(1, 6)
    assert repeating_decimal("0", "", "9") == 1


@pytest.mark.parametrize(
    "text, chain",
    [
        (r"\boxed{3} and \boxed{5}", ["3", "5"]),
        (r"$x = \boxed{3}$ or $x = \boxed{5}$.", ["3", "5"]),
        (r"\boxed{1}, \boxed{2}, and \boxed{3}", ["1", "2", "3"]),
        (r"\boxed{3}. Wait: \boxed{4}", ["4"]),
        (r"First \boxed{2}. Then \boxed{3} and \boxed{5}", ["3", "5"]),
        (r"\boxed{\frac{1}{2}} and \boxed{x}", [r"\frac{1}{2}", "x"]),
    ],
)
def test_final_boxes_joins_a_list_only(text, chain):
    assert final_boxes(text, scan_boxes(text)[0]) == chain


def test_truth_checks_on_parsed_answers():
    from math_verify import parse

    from relaxtune.graders.mathcheck import compare_sequences, truly_equal

    def p(s):
        return parse(f"\\boxed{{{s}}}", parsing_timeout=None)

    assert truly_equal(p(r"\sqrt{-4}"), p("2i"))
    assert truly_equal(p("2i"), p(r"\sqrt{-4}"))
    assert not truly_equal(p(r"\sqrt{-4}"), p("3i"))
    assert truly_equal(p("[2, 5]"), p(r"2 \le x \le 5"))
    assert not truly_equal(p("[2, 5]"), p(r"2 < x \le 5"))
    assert not truly_equal(p("x"), p("2"))
    assert compare_sequences(r"\boxed{1, 3, 5, \ldots, 2n-1}", r"\boxed{1, 2, \ldots, n}")[0] is False
    assert compare_sequences(r"\boxed{1, 2, 3, \dots, n}", r"\boxed{1, 2, \ldots, n}")[0] is True
    assert compare_sequences(r"\boxed{1, 2, \ldots, n}", r"\boxed{1, 2, \ldots, n, n+1}")[0] is False
    assert compare_sequences(r"\boxed{5}", r"\boxed{5}") is None
