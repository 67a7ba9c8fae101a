import math

import pytest

from relaxtune.decoding.speed import PAPER_C_REL, CostProfile, speedup


@pytest.mark.parametrize(
    "l_accept, n, c, expected",
    [(2.5, 3, 0.2, 3.5 / 1.6), (5, 8, 0.2, 6 / 2.6), (5, 8, 0.5, 1.2)],
)
def test_spec_sanity_values(l_accept, n, c, expected):
    # the sanity values of relaxed-methods.md: 2.19, 2.31, 1.2
    assert speedup(l_accept, n, c) == pytest.approx(expected, rel=1e-12)
    assert round(speedup(l_accept, n, c), 2) == {3.5 / 1.6: 2.19, 6 / 2.6: 2.31, 1.2: 1.2}[expected]


def test_length_ratio_penalises_rambling():
    assert speedup(5, 8, 0.2, L_ar=1000, L_relax=2000) == pytest.approx(speedup(5, 8, 0.2) / 2)
    assert PAPER_C_REL == (0.05, 0.2, 0.5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(l_accept=1, n_draft=0, c_rel=0.2), "n_draft"),
        (dict(l_accept=4, n_draft=3, c_rel=0.2), "l_accept"),
        (dict(l_accept=-0.1, n_draft=3, c_rel=0.2), "l_accept"),
        (dict(l_accept=1, n_draft=3, c_rel=-0.1), "c_rel"),
        (dict(l_accept=1, n_draft=3, c_rel=math.nan), "c_rel"),
        (dict(l_accept=1, n_draft=3, c_rel=0.2, L_relax=0), "L_relax"),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        speedup(**kwargs)


def test_cost_profile_paper_gb200():
    prof = CostProfile(t_ar=12.45e-3, t_draft=3.93e-3, source="GB200 batch 1")
    assert prof.c_rel == pytest.approx(0.3157, abs=1e-4)
    assert prof.speedup(2.5, 3) == pytest.approx(speedup(2.5, 3, prof.c_rel))


def test_cost_profile_measured_verify_cost():
    # CPU-like: verifying 4 tokens costs 3.8 single steps
    prof = CostProfile(t_ar=0.221, t_draft=0.076, t_verify={4: 0.843})
    expected = 3.5 * 0.221 / (3 * 0.076 + 0.843)
    assert prof.speedup(2.5, 3) == pytest.approx(expected)
    assert prof.round_seconds(5) == pytest.approx(5 * 0.076 + 0.221)  # no measurement for 6 tokens
    with pytest.raises(ValueError, match="t_draft"):
        CostProfile(t_ar=1.0, t_draft=0.0)
    with pytest.raises(ValueError, match="t_verify"):
        CostProfile(t_ar=1.0, t_draft=0.1, t_verify={0: 1.0})
