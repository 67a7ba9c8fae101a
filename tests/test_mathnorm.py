"""The math grader's normalisation layer (relaxtune/graders/mathnorm.py, numbers.py) and its
truth checks (mathcheck.truly_equal, compare_sequences): exact rewrites and verdicts."""

from __future__ import annotations

from fractions import Fraction

import pytest

from relaxtune.graders.math import final_boxes, scan_boxes
from relaxtune.graders.mathnorm import normalise_latex, normalise_plain, repeating_decimal
from relaxtune.graders.numbers import expand_prose_powers, normalise_numbers


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
        ("spin", "spin"),
        ("epic", "epic"),
        (r"\pi/2", r"\pi/2"),
        ("3e", "3e"),
        ("x_1e3", "x_1e3"),
    ],
)
def test_normalise_plain_rewrites_answer_forms_only(text, out):
    assert normalise_plain(text) == out


@pytest.mark.parametrize(
    "text, out",
    [
        ("1.5e3", r"1.5\times10^{3}"),
        ("2E-4", r"2\times10^{-4}"),
        ("1.2e+05", r"1.2\times10^{5}"),
        ("−1.2e−5", r"−1.2\times10^{-5}"),
        (r"1.2\mathrm{e}5", r"1.2\times10^{5}"),
        (r"1.2\text{e}-5", r"1.2\times10^{-5}"),
        (r"\num{1.2e5}", r"1.2\times10^{5}"),
        (r"\num[round-precision=2]{1.2e-5}", r"1.2\times10^{-5}"),
        ("1.2x10^5", r"1.2\times10^{5}"),
        ("1.2 X 10^{-5}", r"1.2\times10^{-5}"),
        ("1.2 × 10^5", r"1.2\times10^{5}"),
        ("1.2·10^5", r"1.2\times10^{5}"),
        ("1.2⋅10^{-5}", r"1.2\times10^{-5}"),
        ("1.2 * 10^5", r"1.2\times10^{5}"),
        ("1.2*10^(-5)", r"1.2\times10^{-5}"),
        ("1.2×10⁵", r"1.2\times10^{5}"),
        (r"1.2\times10⁻⁵", r"1.2\times10^{-5}"),
        ("10⁵", "10^{5}"),
        (r"\text{1.2e5}", r"1.2\times10^{5}"),
        (r"\text{1.2 × 10^5}", r"1.2\times10^{5}"),
        (r"\mathrm{1.2\times 10^{5}}", r"1.2\times 10^{5}"),
        ("The answer is 1.2x10^5.", r"The answer is 1.2\times10^{5}."),
        (r"1.2 \times 10^{5}", r"1.2 \times 10^{5}"),  # math-verify reads LaTeX's own
        ("1.5e3.5", "1.5e3.5"),
        ("3e", "3e"),
        ("x_1e3", "x_1e3"),
        (r"\sqrt2e5", r"\sqrt2e5"),
        ("2e^{x}", "2e^{x}"),
        ("3e-2x", "3e-2x"),
        ("0x10^2", "0x10^2"),
        ("x10^5", "x10^5"),
    ],
)
def test_normalise_numbers_reads_scientific_notation_exactly(text, out):
    assert normalise_numbers(text) == out


@pytest.mark.parametrize(
    "text, out",
    [
        (r"The answer is 1.2 \times 10^{5}.", "The answer is 120000."),
        (r"The answer is -1.2\times10^{-5}.", "The answer is -0.000012."),
        (r"It is 1.2\,\cdot\,10^{-5}, or 10^{5}, or 10^5.", "It is 0.000012, or 100000, or 100000."),
        (
            r"So $1.2 \times 10^{5}$ and \(10^{5}\) and \[10^5\].",
            r"So $1.2 \times 10^{5}$ and \(10^{5}\) and \[10^5\].",
        ),
        ("It costs $5, so 10^{5}.", "It costs $5, so 100000."),  # a $ never closed opens nothing
        (r"It costs \$5 and $x$, so 10^{5}.", r"It costs \$5 and $x$, so 100000."),
        (r"It is 10^{200}, or 2^{10}, or x10^{5}.", r"It is 10^{200}, or 2^{10}, or x10^{5}."),
    ],
)
def test_expand_prose_powers_outside_math_mode_exactly(text, out):
    assert expand_prose_powers(text) == out


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
