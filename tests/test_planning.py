"""The sample-size planner: exact power against enumeration and simulation, and ``relaxtune plan``."""

import json
import math

import numpy as np
import pytest
from scipy import special
from typer.testing import CliRunner

from relaxtune.certify.paired_bound import exact_upper
from relaxtune.certify.planning import (
    certified_power,
    fewest_problems,
    plan,
    problems_needed,
    sample_power,
    split_confidence,
)
from relaxtune.certify.stats import drop_bound, smallest_certifiable_drop
from relaxtune.cli import app

from .tiny_task import write_tiny_task


def enumerated_power(n: int, epsilon: float, confidence: float, drop: float, delta: float) -> float:
    """P(exact bound <= epsilon), every outcome (b, c) bounded with ``exact_upper`` and weighted by its trinomial."""
    p10, p01, total = (delta + drop) / 2, (delta - drop) / 2, 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if exact_upper(n, b, c, confidence) <= epsilon:
                total += math.exp(
                    special.gammaln(n + 1)
                    - special.gammaln(b + 1)
                    - special.gammaln(c + 1)
                    - special.gammaln(n - b - c + 1)
                    + special.xlogy(b, p10)
                    + special.xlogy(c, p01)
                    + special.xlogy(n - b - c, 1 - delta)
                )
    return total


@pytest.mark.parametrize("n,epsilon,confidence,drop,delta", [(8, 0.3, 0.9, 0.0, 0.1), (20, 0.2, 0.95, 0.02, 0.3)])
def test_certified_power_is_the_enumerated_one(n, epsilon, confidence, drop, delta):
    assert certified_power(n, epsilon, confidence, drop, delta) == pytest.approx(
        enumerated_power(n, epsilon, confidence, drop, delta), abs=1e-9
    )


def test_certified_power_fixed_values():
    # 8 problems at 0.9 certify 0.3 for exactly the outcomes without a strict-only pair and a few with one:
    # P(b = 0) = 0.95^8 = 0.66342 is most of it
    assert certified_power(8, 0.3, 0.9, 0.0, 0.1) == pytest.approx(0.677040, abs=1e-6)
    assert certified_power(8, 0.3, 0.9, 0.0, 0.1) > 0.95**8
    # the sample the old normal approximation named (181 problems, 0.05 at 0.9, discordance 0.1) certifies 73 %
    assert certified_power(181, 0.05, 0.9, 0.0, 0.1) == pytest.approx(0.726955, abs=1e-6)
    # below the floor only outcomes with many relaxed-only pairs certify: 4 of 4 relaxed-only, 0.05^4
    assert certified_power(4, 0.05, 0.9, 0.0, 0.1) == pytest.approx(0.05**4 + 4 * 0.05**3 * 0.9, abs=1e-9)


def test_problems_needed_reach_the_power_exactly():
    k = problems_needed(0.05, 0.9, 0.1)
    assert k == 210 and certified_power(210, 0.05, 0.9, 0.0, 0.1) >= 0.8 > certified_power(209, 0.05, 0.9, 0.0, 0.1)
    # a point with almost no discordance needs only what a perfect sample needs: ln 0.1 / ln 0.95 = 44.9 -> 45
    assert problems_needed(0.05, 0.9, 0.001) == fewest_problems(0.05, 0.9) == 45
    assert problems_needed(0.05, 0.9, 0.1, true_drop=0.05) is None  # at epsilon: must not be certified
    with pytest.raises(ValueError, match="discordance"):
        problems_needed(0.05, 0.9, 0.01, true_drop=0.02)
    with pytest.raises(ValueError, match="power must be in \\(0, 1\\), got 1.0"):
        problems_needed(0.05, 0.9, 0.1, power=1.0)


def test_repeats_change_neither_the_need_nor_the_floor():
    assert problems_needed(0.05, 0.9, 0.1, repeats=48) == problems_needed(0.05, 0.9, 0.1) == 210
    assert fewest_problems(0.05, 0.9, 48) == fewest_problems(0.05, 0.9, 1) == 45  # repeats never loosen the floor


def test_simulated_power_of_the_product_bound_matches_with_repeats():
    """30 problems x 16 (discordance 0.2 per sample, true drop 0, spread evenly): 400 simulated
    samples bounded by ``drop_bound`` certify 0.25 at 0.9 as often as ``sample_power`` says."""
    from relaxtune.certify.stats import paired_counts

    rng, sims = np.random.default_rng(3), 400
    exact = sample_power(30, 16, 0.25, 0.9, 0.0, 0.2)
    hits = []
    for _ in range(sims):
        draw = rng.choice(3, p=[0.1, 0.1, 0.8], size=(30, 16))  # 0 strict-only, 1 relaxed-only, 2 concordant
        strict = [{"problem_id": str(j), "repeat": r, "correct": draw[j, r] != 1} for j in range(30) for r in range(16)]
        relaxed = [
            {"problem_id": str(j), "repeat": r, "correct": draw[j, r] != 0} for j in range(30) for r in range(16)
        ]
        hits.append(drop_bound(paired_counts(strict, relaxed), 0.9).upper <= 0.25)
    assert abs(np.mean(hits) - exact) <= 3 * math.sqrt(exact * (1 - exact) / sims)


def test_plan_is_at_the_exports_confidence_and_split():
    p = plan(164, 1, 0.05, 0.9, planned=4)
    assert (p.confirm_problems, p.confidence_each, p.holdout) == (82, pytest.approx(0.975), True)
    assert p.smallest_certifiable == pytest.approx(0.046794, abs=1e-6) == smallest_certifiable_drop(82, 1, 0.975)
    assert p.smallest_certifiable > 1 - 0.025 ** (1 / 82)  # 0.0440: at 97.5 % the exact floor sits above it
    assert p.needed == 2 * problems_needed(0.05, 0.975, 0.1)  # the held-out half must hold the sample
    assert p.power_now == pytest.approx(certified_power(82, 0.05, 0.975, 0.0, 0.1))
    assert "on the held-out half" in p.assumptions() and "0.975 one-sided" in p.assumptions()
    seeds = plan(8, 1, 0.05, 0.9, holdout=False)
    assert seeds.smallest_certifiable == pytest.approx(1 - 0.1 ** (1 / 8), abs=1e-6)  # 0.250
    assert seeds.line() == (
        "with 8 problems x 1 a confirmation (8 problems, 90.0% one-sided) certifies no drop below "
        "0.250; 210 problems x 1 (--limit) would certify 0.05 80% of the time for a point with "
        "true drop 0 and discordance 0.10 (this sample: 0%)"
    )
    assert "not new ones" in seeds.assumptions()
    assert split_confidence(0.9, 4) == pytest.approx(0.975) and split_confidence(0.9, 0) == pytest.approx(0.9)


def test_plan_command_for_humaneval_without_models(tmp_path):
    out = CliRunner().invoke(
        app,
        [
            "plan",
            "--task",
            "humaneval",
            "--epsilon",
            "0.1",
            "--output-dir",
            str(tmp_path),
            "--methods",
            "1",
            "--confirmations",
            "1",
        ],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "sample: 164 problems x 1, from the task's problems" in text
    assert "assumes: the exported bound is a confirmation's: on the held-out half" in text
    need = 2 * problems_needed(0.1, 0.9, 0.1)
    assert f"{need} problems x 1 (--limit) would certify 0.1 80% of the time" in text
    full = json.loads(
        CliRunner()
        .invoke(
            app,
            [
                "plan",
                "--task",
                "humaneval",
                "--epsilon",
                "0.1",
                "--discordance",
                "0.15",
                "--output-dir",
                str(tmp_path),
                "--confirm",
                "seeds",
                "--power",
                "0.9",
                "--json",
            ],
        )
        .output
    )
    assert full["plan"]["problems"] == 164 and full["plan"]["confidence_each"] == pytest.approx(0.975)
    assert full["plan"]["needed"] == problems_needed(0.1, 0.975, 0.15, 0.0, 0.9, 1)
    assert full["plan"]["power_now"] == pytest.approx(certified_power(164, 0.1, 0.975, 0.0, 0.15))


def test_plan_command_reads_strict_records(tmp_path):
    task = write_tiny_task(tmp_path)
    folder = tmp_path / "runs" / "tiny_math-v1" / "pair"
    folder.mkdir(parents=True)
    rows = [{"problem_id": str(i), "repeat": 0, "failed": i == 5, "correct": True} for i in range(6)]
    (folder / "strict__N4__seed0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    out = CliRunner().invoke(
        app,
        [
            "plan",
            "--task",
            task,
            "--epsilon",
            "0.5",
            "--output-dir",
            str(tmp_path / "runs"),
            "--confirm",
            "seeds",
            "--methods",
            "1",
            "--confirmations",
            "1",
        ],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "sample: 5 problems x 1, from strict's records" in text  # the failed sample and the cut line left out
    assert f"certifies no drop below {smallest_certifiable_drop(5, 1, 0.9):.3f}" in text
    bad = CliRunner().invoke(
        app,
        ["plan", "--task", task, "--epsilon", "0.05", "--discordance", "0.01", "--drop", "0.02"],
        env={"COLUMNS": "250"},
    )
    assert bad.exit_code != 0 and "discordance must lie in" in " ".join(bad.output.split())


@pytest.mark.parametrize("epsilon, confidence", [(0.05, 0.9), (0.05, 0.975), (0.1, 0.95), (0.2, 0.99), (0.03, 0.9)])
def test_the_fewest_problems_is_where_the_search_finds_a_perfect_sample_first_certifies_epsilon(epsilon, confidence):
    """The answer certifies epsilon and one problem fewer does not, by the bound itself
    (``smallest_certifiable_drop``: the root of the bound, not the test the search asks)."""
    k = fewest_problems(epsilon, confidence)
    assert smallest_certifiable_drop(k, 1, confidence) <= epsilon < smallest_certifiable_drop(k - 1, 1, confidence)
    assert k >= math.log(1 - confidence) / math.log(1 - epsilon)  # no valid bound does better


def test_the_planning_discordance_is_an_upper_bound_never_a_lucky_zero():
    from scipy.stats import binom

    from relaxtune.certify.planning import DEFAULT_DISCORDANCE, planning_discordance

    assert planning_discordance(0, 16, 0.9) == pytest.approx(1 - 0.1 ** (1 / 16))  # 0.1340
    assert planning_discordance(0, 0, 0.9) == DEFAULT_DISCORDANCE and planning_discordance(5, 5, 0.9) == 1.0
    ucb = planning_discordance(10, 100, 0.9)
    assert binom.cdf(10, 100, ucb) == pytest.approx(0.1)  # Clopper-Pearson: P(X <= 10 | ucb) = 1 - c
    assert 0.10 < ucb < 0.15 and planning_discordance(2.5, 16, 0.9) > planning_discordance(2, 16, 0.9)
    for bad in [(-1, 4), (5, 4), (float("nan"), 4), (0, -1), (0, 2.5)]:
        with pytest.raises(ValueError):
            planning_discordance(*bad, 0.9)
    with pytest.raises(ValueError):
        planning_discordance(1, 4, 1.0)
    # what the README job's export advised from 16 agreeing pairs: 162 problems (discordance 1e-6); now more
    # than the default's 702, as 0.134 is above 0.10
    from relaxtune.certify.planning import plan

    assert plan(8, 1, 0.05, 0.9, discordance=planning_discordance(0, 16, 0.9), planned=4).needed > 702
