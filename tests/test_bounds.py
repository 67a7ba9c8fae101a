"""The drop bound: exact values against independent computations, coverage, clustering, validation."""

import math

import numpy as np
import pytest
from scipy import special, stats

from relaxtune.certify.cluster_bound import BET_CAP, ORDERINGS, betting_upper
from relaxtune.certify.paired_bound import exact_pvalue, exact_pvalue_table, exact_upper, tango_score, tango_upper
from relaxtune.certify.stats import drop_bound, paired_counts, smallest_certifiable_drop
from relaxtune.tune.judge import stored_bound


def pooled(n: int, b: int, c: int) -> list[tuple[int, int, int]]:
    """One sample per problem: b strict-only, c relaxed-only, the rest concordant."""
    return [(1, 1, 0)] * b + [(1, 0, 1)] * c + [(1, 0, 0)] * (n - b - c)


# ------------------------------------------------------------------ independent computation


def brute_tango_upper(b, c, n: int, confidence: float):
    """Tango's bound by plain bisection on the score (no root finder), elementwise."""
    b, c = np.asarray(b), np.asarray(c)
    z, lo, hi = stats.norm.ppf(confidence), np.full(b.shape, -1.0), np.full(b.shape, 1.0)
    for _ in range(80):
        mid = (lo + hi) / 2
        above = tango_score(b, c, n, mid) > -z
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(b == n, 1.0, hi)


def brute_tail(n: int, b: int, c: int, confidence: float) -> np.ndarray:
    """The outcomes ranked at or below (b, c) by Tango's bound, ``[T, 2]``."""
    cells = np.array([(i, j) for i in range(n + 1) for j in range(n + 1 - i)])
    ranks = brute_tango_upper(cells[:, 0], cells[:, 1], n, confidence)
    return cells[ranks <= brute_tango_upper(b, c, n, confidence) + 1e-9]


def brute_pvalue(n: int, tail: np.ndarray, d0: float, grid: int = 2001) -> float:
    """Direct trinomial sum over the tail (no decomposition in m), maximised over a
    fine grid of discordance."""
    bi, ci = tail[:, 0], tail[:, 1]
    log_c = (
        special.gammaln(n + 1) - special.gammaln(bi + 1) - special.gammaln(ci + 1) - special.gammaln(n - bi - ci + 1)
    )
    delta = np.linspace(max(abs(d0), 1e-12), 1.0, grid)[:, None]
    p10, p01 = (delta + d0) / 2, np.maximum((delta - d0) / 2, 0.0)
    log_p = (
        log_c + special.xlogy(bi, p10) + special.xlogy(ci, p01) + special.xlogy(n - bi - ci, np.maximum(1 - delta, 0))
    )
    return float(np.exp(log_p).sum(axis=1).max())


def brute_upper(n: int, b: int, c: int, confidence: float) -> float:
    """The bound by bisection on the brute-force p-value (monotone in the drop)."""
    tail, lo, hi = brute_tail(n, b, c, confidence), -1.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if brute_pvalue(n, tail, mid) > 1 - confidence else (lo, mid)
    return hi


# -------------------------------------------------------------------------- fixed cases


def test_fixed_cases_have_their_exact_values():
    # no discordant pair in 8: the supremum sits at no relaxed-only pair, 1 - 0.1^(1/8) by hand
    assert exact_upper(8, 0, 0, 0.9) == pytest.approx(1 - 0.1 ** (1 / 8), abs=1e-6)
    assert smallest_certifiable_drop(8, 1, 0.9) == pytest.approx(0.2501058, abs=1e-6)
    assert exact_upper(8, 0, 0, 0.975) == pytest.approx(1 - 0.025 ** (1 / 8), abs=1e-6)
    # HumanEval-sized: 10 strict-only and 4 relaxed-only pairs in 164
    assert exact_upper(164, 10, 4, 0.9) == pytest.approx(0.070730, abs=2e-6)
    assert -exact_upper(164, 4, 10, 0.9) == pytest.approx(0.0036239, abs=2e-6)  # the lower bound
    # 1000 pairs, one direction only (relaxed better by 5 points, and the mirror image)
    assert exact_upper(1000, 0, 50, 0.9) == pytest.approx(-0.041343, abs=2e-6)
    assert exact_upper(1000, 50, 0, 0.9) == pytest.approx(0.060025, abs=2e-6)
    bound = drop_bound(pooled(164, 10, 4), 0.9)
    assert (bound.method, bound.n, bound.problems, bound.strict_only, bound.relaxed_only) == (
        "exact-score",
        164,
        164,
        10,
        4,
    )
    assert bound.drop == pytest.approx(6 / 164) and bound.upper == exact_upper(164, 10, 4, 0.9)
    assert bound.lower == pytest.approx(-exact_upper(164, 4, 10, 0.9))


def test_fixed_cases_invert_an_independent_p_value():
    """The direct trinomial p-value crosses 1 - c exactly at the bound (n = 164: 10/4)."""
    u, tail = exact_upper(164, 10, 4, 0.9), brute_tail(164, 10, 4, 0.9)
    assert brute_pvalue(164, tail, u - 2e-4) > 0.1 > brute_pvalue(164, tail, u + 2e-4)
    # exact bounds are at least Tango's asymptotic ones here (the discreteness costs width)
    assert u > tango_upper(10, 4, 164, 0.9) > 6 / 164


def test_the_score_orders_outcomes_as_the_exact_bound_assumes():
    """Tango's score rises with strict-only pairs at a fixed number of discordant pairs (the
    tail is a prefix in b for each m) and falls with the drop tested (ranking by the score at
    the observed bound is ranking by Tango's bound)."""
    d0 = np.linspace(-0.999, 0.999, 301)
    for n in (2, 7, 30, 60):
        for m in range(n + 1):
            b = np.arange(m + 1)
            z = tango_score(b[:, None], (m - b)[:, None], n, d0[None, :])
            assert np.all(np.diff(z, axis=0) >= -1e-12) and np.all(np.diff(z, axis=1) <= 1e-12), (n, m)


@pytest.mark.parametrize("n", [1, 3, 6])
def test_every_outcome_matches_brute_force(n):
    for b in range(n + 1):
        for c in range(n + 1 - b):
            assert exact_upper(n, b, c, 0.9) == pytest.approx(brute_upper(n, b, c, 0.9), abs=1e-3), (n, b, c)


def test_p_value_and_bound_agree_and_the_table_never_exceeds_the_p_value():
    rng = np.random.default_rng(3)
    b, c, table = exact_pvalue_table(25, 0.05, 0.9)
    for i in rng.choice(len(b), size=12, replace=False):
        p = exact_pvalue(25, int(b[i]), int(c[i]), 0.05, 0.9)
        assert table[i] <= p + 1e-12 and table[i] == pytest.approx(p, abs=1e-3)
        u = exact_upper(25, int(b[i]), int(c[i]), 0.9)
        if -0.99 < u < 0.99:  # the p-value falls through 1 - c at the bound
            assert exact_pvalue(25, int(b[i]), int(c[i]), u - 1e-4, 0.9) > 0.1
            assert exact_pvalue(25, int(b[i]), int(c[i]), u + 1e-4, 0.9) <= 0.1 + 1e-9


def test_exact_coverage_is_at_least_nominal_by_enumeration():
    """Coverage summed over every outcome, not simulated: nominal holds at the drops and
    discordances where the Student t and Tango's asymptotic bounds fall short."""
    n = 30
    for delta, drop in [(0.05, 0.025), (0.1, 0.05), (0.2, 0.2), (0.4, 0.0)]:
        tb, tc, p = exact_pvalue_table(n, drop, 0.9)
        p10, p01 = (delta + drop) / 2, (delta - drop) / 2
        log_w = (
            special.gammaln(n + 1)
            - special.gammaln(tb + 1)
            - special.gammaln(tc + 1)
            - special.gammaln(n - tb - tc + 1)
            + special.xlogy(tb, p10)
            + special.xlogy(tc, p01)
            + special.xlogy(n - tb - tc, 1 - delta)
        )
        assert np.exp(log_w)[p > 0.1].sum() >= 0.9, (delta, drop)


# --------------------------------------------------------------------------- coverage


@pytest.mark.slow
def test_coverage_in_the_strong_pairing_regime():
    """4000 simulated datasets of 100 problems, 5 % discordance, true drop 0.025 = epsilon:
    the product's bound covers at >= nominal - 3 SE; the old Student t bound does not."""
    from relaxtune.bench.coverage import old_t_upper, simulate

    rng, datasets, confidence = np.random.default_rng(11), 4000, 0.9
    b, c = simulate(rng, datasets, 100, 1, 0.05, 0.025)
    bt, ct = b.sum(1), c.sum(1)
    se = math.sqrt(confidence * (1 - confidence) / datasets)
    covered = [drop_bound(pooled(100, int(x), int(y)), confidence).upper >= 0.025 for x, y in zip(bt, ct)]
    assert np.mean(covered) >= confidence - 3 * se
    assert np.mean(old_t_upper(bt, ct, 100, confidence) >= 0.025) < confidence - 3 * se


def test_cluster_coverage_when_harm_concentrates():
    """30 problems x 48 repeats, flips concentrated in a few problems: the cluster bound
    covers; treating the 1440 samples as independent does not."""
    from relaxtune.bench.coverage import old_t_upper, simulate

    rng, datasets, confidence = np.random.default_rng(5), 2000, 0.9
    b, c = simulate(rng, datasets, 30, 48, 0.1, 0.05)
    se = math.sqrt(confidence * (1 - confidence) / datasets)
    d = (b - c) / 48
    upper = 2 * betting_upper((1 + d) / 2, confidence) - 1
    assert np.mean(upper >= 0.05) >= confidence - 3 * se
    assert np.mean(old_t_upper(b.sum(1), c.sum(1), 1440, confidence) >= 0.05) < confidence - 3 * se
    legacy = drop_bound([(48, int(x), int(y)) for x, y in zip(b[0], c[0])], confidence)  # stored without a first repeat
    assert legacy.method == "cluster-betting" and legacy.upper == pytest.approx(upper[0], abs=1e-6)


# ---------------------------------------------------------------------------- clustering


def test_clustered_bound_is_wider_than_the_per_sample_one_when_harm_concentrates():
    counts = [(48, 24, 0, 1)] * 3 + [(48, 0, 0, 0)] * 27  # 3 of 30 problems lose half their samples, the first too
    cluster = drop_bound(counts, 0.9)
    per_sample = drop_bound(pooled(1440, 72, 0), 0.9)
    assert cluster.method == "exact-first-repeat" and per_sample.method == "exact-score"
    assert cluster.upper == exact_upper(30, 3, 0, 0.9)
    assert cluster.drop == pytest.approx(per_sample.drop) == pytest.approx(0.05)
    assert cluster.upper > 1.5 * per_sample.upper  # the samples of a problem are not independent
    spread = drop_bound([(48, 2, 0, 0)] * 18 + [(48, 3, 0, 0)] * 12, 0.9)  # the same 72 losses spread, none first
    assert spread.upper < cluster.upper


def test_betting_bound_is_the_smallest_mean_whose_capital_reaches_one_over_alpha():
    """An independent loop over the capital process of Waudby-Smith and Ramdas,
    averaged over the given order and ORDERINGS - 1 seeded shuffles of it."""
    x, confidence = [0.5, 0.45, 0.55, 0.5, 0.3, 0.5, 0.6, 0.5, 0.5, 0.45], 0.9
    orders = [list(range(len(x)))] + [list(np.random.default_rng(i).permutation(len(x))) for i in range(1, ORDERINGS)]

    def capital(m: float) -> float:
        total = 0.0
        for order in orders:
            k, mean, var, wealth, sum_x, sum_sq = len(x), 0.5, 0.25, 1.0, 0.0, 0.0
            for i, xi in enumerate((x[j] for j in order), 1):
                bet = min(math.sqrt(2 * math.log(1 / (1 - confidence)) / (k * var)), BET_CAP / (1 - m))
                wealth *= 1 + bet * (m - xi)
                sum_sq, sum_x = sum_sq + (xi - mean) ** 2, sum_x + xi
                mean, var = (0.5 + sum_x) / (i + 1), (0.25 + sum_sq) / (i + 1)
            total += wealth
        return total / len(orders)

    u = betting_upper(x, confidence)
    assert capital(u - 1e-5) < 10 <= capital(u + 1e-5)
    assert np.mean(x) < u < 1
    shuffled = betting_upper([x[i] for i in np.random.default_rng(99).permutation(len(x))], confidence)
    assert shuffled == pytest.approx(u, abs=0.01)  # the averaged capital hardly depends on the order


def test_smallest_certifiable_drop_falls_with_more_problems_and_repeats():
    assert smallest_certifiable_drop(8, 1, 0.9) > smallest_certifiable_drop(30, 1, 0.9) > 0.07
    assert smallest_certifiable_drop(30, 48, 0.9) < smallest_certifiable_drop(8, 48, 0.9)
    assert smallest_certifiable_drop(30, 48, 0.9) >= 1 - 0.1 ** (1 / 30)  # no valid bound beats this with 30 problems


def test_repeats_never_loosen_the_floor():
    """With r repeats the floor is exactly the one-sample floor of the same problems, which
    no valid bound beats (the betting bound it replaced gave 0.0859 for 30 x 16)."""
    one = 1 - 0.1 ** (1 / 30)  # 0.073881
    for repeats in (1, 2, 16, 48):
        assert smallest_certifiable_drop(30, repeats, 0.9) == pytest.approx(one, abs=1e-6), repeats
    assert smallest_certifiable_drop(30, 16, 0.9) == pytest.approx(0.073881, abs=1e-6)
    assert 2 * betting_upper([0.5] * 30, 0.9) - 1 == pytest.approx(0.0859, abs=5e-4)  # what repeats used to give
    assert smallest_certifiable_drop(164, 4, 0.95) == smallest_certifiable_drop(164, 1, 0.95)


def test_the_first_repeat_is_the_lowest_paired_one():
    strict = [{"problem_id": "a", "repeat": r, "correct": True} for r in range(3)]
    relaxed = [
        {"problem_id": "a", "repeat": 2, "correct": False},
        {"problem_id": "a", "repeat": 0, "failed": True},
        {"problem_id": "a", "repeat": 1, "correct": False},
    ]
    assert paired_counts(strict, relaxed) == [(2, 2, 0, 1)]  # repeat 0 failed: repeat 1 is the first paired
    with pytest.raises(ValueError, match="first repeat's outcome 1 does not fit"):
        drop_bound([(3, 0, 1, 1)], 0.9)


def test_first_repeat_bound_covers_when_five_percent_of_problems_lose_every_repeat():
    """Harm concentrated: each of 100 problems loses all 16 repeats with probability 0.05
    (true drop 0.05). 2000 datasets: coverage at >= 0.9 - 3 SE, read from the exact p-value
    table (the bound covers D exactly when its p-value at D exceeds 1 - c)."""
    rng, datasets, confidence = np.random.default_rng(7), 2000, 0.9
    lost = (rng.random((datasets, 100)) < 0.05).sum(1)
    tb, tc, p = exact_pvalue_table(100, 0.05, confidence)
    covered = np.array([p[(tb == k) & (tc == 0)][0] > 1 - confidence for k in lost])
    assert covered.mean() >= confidence - 3 * math.sqrt(confidence * (1 - confidence) / datasets)
    row = [(16, 16, 0, 1)] * int(lost[0]) + [(16, 0, 0, 0)] * (100 - int(lost[0]))
    assert drop_bound(row, confidence).upper == exact_upper(100, int(lost[0]), 0, confidence)


BAD_INPUTS = [
    (lambda: drop_bound([(1, 0, 0), (math.inf, 0, 0)], 0.9), "problem 1: n must be an integer >= 0, got inf"),
    (lambda: drop_bound([(4, math.nan, 0)], 0.9), "problem 0: strict_only must be an integer >= 0, got nan"),
    (lambda: drop_bound([(4, 0, 1.5)], 0.9), "problem 0: relaxed_only must be an integer >= 0, got 1.5"),
    (lambda: drop_bound([(4, True, 0)], 0.9), "problem 0: strict_only must be an integer >= 0, got True"),
    (lambda: drop_bound([(1, 0, 0)], math.nan), "confidence must be in (0, 1), got nan"),
    (lambda: drop_bound([(1, 0, 0)], 1.0), "confidence must be in (0, 1), got 1.0"),
    (lambda: exact_upper(10.5, 1, 0, 0.9), "n must be an integer >= 1, got 10.5"),
    (lambda: exact_upper(10, math.inf, 0, 0.9), "b must be an integer >= 0, got inf"),
    (lambda: exact_upper(10, 1, 0, -0.1), "confidence must be in (0, 1), got -0.1"),
    (lambda: exact_pvalue(10, 1, 0, math.nan, 0.9), "margin must be a finite number, got nan"),
    (lambda: exact_pvalue(10, 1, math.nan, 0.05, 0.9), "c must be an integer >= 0, got nan"),
    (lambda: exact_pvalue_table(10, math.nan, 0.9), "margin must be a finite number, got nan"),
    (lambda: exact_pvalue_table(10, 0.05, 0.0), "confidence must be in (0, 1), got 0.0"),
    (lambda: tango_upper(1, 0, 10, math.nan), "confidence must be in (0, 1), got nan"),
    (lambda: betting_upper([0.5], math.inf), "confidence must be in (0, 1), got inf"),
    (lambda: smallest_certifiable_drop(30.5, 1, 0.9), "problems must be an integer >= 1, got 30.5"),
    (lambda: smallest_certifiable_drop(30, math.nan, 0.9), "repeats must be an integer >= 1, got nan"),
    (
        lambda: stored_bound({"n": math.nan, "strict_only": 0, "relaxed_only": 0}, 0.9),
        "stored n must be an integer >= 0, got nan",
    ),
]


@pytest.mark.parametrize("call,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_inputs_a_bound_cannot_take_raise_naming_the_argument(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_paired_counts_group_by_problem_and_skip_failures():
    strict = [
        {"problem_id": p, "repeat": r, "correct": ok}
        for p, r, ok in [("a", 0, True), ("a", 1, True), ("b", 0, False), ("b", 1, True), ("c", 0, True)]
    ]
    relaxed = [
        {"problem_id": "b", "repeat": 0, "correct": True},
        {"problem_id": "a", "repeat": 0, "correct": False},
        {"problem_id": "a", "repeat": 1, "correct": True},
        {"problem_id": "b", "repeat": 1, "failed": True},
        {"problem_id": "c", "repeat": 0, "correct": False},
    ]
    assert paired_counts(strict, relaxed) == [(2, 1, 0, 1), (1, 0, 1, -1), (1, 1, 0, 1)]  # strict's problem order
