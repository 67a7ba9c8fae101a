"""The tuning benchmark's simulation (surfaces, samples, truth) and accounting (model tokens per
strategy, the pick after each trial, the table's target line), on small simulated tasks."""

import math
import re

import numpy as np
import pytest

from relaxtune.bench.simulated import PAPER_N, SimTask, truncated_geometric
from relaxtune.bench.tuning import oracle, reached, run_strategy, summarize
from relaxtune.decoding.methods import get_method
from relaxtune.decoding.speed import speedup
from relaxtune.tune.search import accepted_per_round


@pytest.fixture(scope="module")
def task() -> SimTask:
    return SimTask.draw("gpqa", 3, ("cactus", "ens"))


def tokens(task: SimTask, method, knob, n_draft: int, problems: int, seed: int = 0) -> int:
    """Response tokens of a point's samples on the first ``problems`` problems, read from the simulation."""
    per_problem = task._samples(method, knob, n_draft, seed)
    return sum(r["response_tokens"] for rows in per_problem[:problems] for r in rows)


def test_truncated_geometric_matches_its_definition_and_a_monte_carlo():
    beta = np.array([0.0, 0.3, 0.8, 0.97])
    mean, var = truncated_geometric(beta, 5)
    assert mean == pytest.approx([accepted_per_round(b, 5) for b in beta])
    rng = np.random.default_rng(1)
    draws = (rng.random((200_000, 5)) < 0.8).cumprod(1).sum(1)  # accepted until the first rejection
    assert draws.mean() == pytest.approx(mean[2], abs=4 * draws.std() / math.sqrt(len(draws)))
    assert draws.var() == pytest.approx(var[2], rel=0.02)
    assert mean[0] == var[0] == 0.0


def test_surfaces_rise_saturate_and_fall_past_the_cliff(task):
    surface, spec = task.surfaces["cactus"], get_method("cactus")
    knobs = np.geomspace(*spec.search[:2], 40)
    gains = [surface.gain(k) for k in knobs]
    assert all(0.0 <= g < 1.0 for g in gains) and gains == sorted(gains)  # rising, saturating below 1
    drops = [task.truth("cactus", float(k), 5).drop for k in knobs]
    assert drops == pytest.approx(sorted(drops), abs=1e-12)  # a stronger relaxation loses no less
    assert drops[0] < 0.01 < drops[-1]  # flat, then past the cliff
    accept = [task.truth("cactus", float(k), 5).l_accept for k in knobs]
    assert accept == sorted(accept) and accept[-1] > accept[0]


def test_the_strict_point_is_strict_and_the_truth_follows_the_paper_speed_model(task):
    strict = task.truth(None, None, 10)
    assert task.truth("ens", 0.0, 10) == strict and strict.drop == 0.0 and strict.length_ratio == 1.0
    assert task._samples("ens", 0.0, 10, 7) is task._samples(None, None, 10, 7)  # one trajectory per point
    t = task.truth("ens", 0.3, 3)
    assert t.speedup == pytest.approx(speedup(t.l_accept, 3, task.c_rel, 1.0, t.length_ratio))
    assert t.length_ratio >= 1.0  # ens rambles, never shortens


def test_samples_average_to_the_surfaces_they_are_drawn_from(task):
    """Over many seeds the records' accuracy and acceptance converge to the point's
    per-problem probabilities on the task's own problems (exact expectations)."""
    knob, n, seeds = 1.0, 5, 120
    point = task._point("cactus", knob, n, task._problems)
    want_accuracy = float(point["success"].mean())
    records = [r for s in range(seeds) for rows in task._samples("cactus", knob, n, s) for r in rows]
    accuracy = np.mean([r["correct"] for r in records])
    se = math.sqrt(want_accuracy * (1 - want_accuracy) / len(records))
    assert accuracy == pytest.approx(want_accuracy, abs=4 * se)
    mean, _ = truncated_geometric(point["beta"], n)
    rounds = np.array([r["stats"]["rounds"] for r in records])
    accepted = np.array([r["stats"]["accepted"] for r in records])
    per_problem = np.repeat(np.tile(mean, seeds), task.family.repeats)  # records are problem-major per seed
    assert accepted.sum() == pytest.approx((rounds * per_problem).sum(), rel=0.01)
    assert all(r["response_tokens"] <= 36864 for r in records)


def test_draws_are_reproducible_and_bad_names_are_refused():
    a, b = SimTask.draw("aime", 5), SimTask.draw("aime", 5)
    assert (a.c_rel, a.beta0, a.surfaces) == (b.c_rel, b.beta0, b.surfaces)
    assert len({SimTask.draw("aime", s).beta0 for s in range(5)}) == 5
    with pytest.raises(ValueError, match="unknown task family"):
        SimTask.draw("mmlu", 0)
    with pytest.raises(ValueError, match="no simulated surfaces"):
        SimTask.draw("aime", 0, ("r_fuzzy",))


def test_grid_spends_exactly_its_points_on_every_problem_plus_strict(task, tmp_path):
    task.calls.clear()
    run = run_strategy(task, "cactus", "grid", 0, str(tmp_path))
    grid = get_method("cactus").grid
    p = task.family.problems
    want = sum(tokens(task, None, None, n, p) for n in PAPER_N) + sum(
        tokens(task, "cactus", k, n, p) for n in PAPER_N for k in grid
    )
    assert run.tokens == want and run.trials == len(grid) * len(PAPER_N)
    assert sorted((c[1], c[2]) for c in task.calls if c[0] == "cactus") == sorted((k, n) for n in PAPER_N for k in grid)
    assert all(c[3] == p for c in task.calls)  # one stage: every problem, no pruning
    assert [s[0] for s in run.steps] == sorted(s[0] for s in run.steps) and run.steps[-1][0] == run.tokens
    best = oracle(task, "cactus")
    assert best.speedup >= run.truth.speedup or run.truth.drop > task.family.epsilon  # nothing feasible beats the scan


@pytest.mark.slow
def test_search_counts_each_trial_up_to_its_last_stage(task, tmp_path):
    task.calls.clear()
    run = run_strategy(task, "cactus", "search", 0, str(tmp_path))
    # one worker: a trial's stages are consecutive calls on growing prefixes; its tokens are its last stage's
    want, last = 0, None
    for method, knob, n, problems, _ in task.calls + [(None, None, None, 0, None)]:
        point = (method, knob, n)
        if last is not None and (point != last[0] or problems <= last[1]):
            want += tokens(task, None if last[0][0] == "strict" else last[0][0], last[0][1], last[0][2], last[1])
        last = (point, problems)
    assert run.tokens == want
    assert run.trials == 8  # TuneSettings' default trials
    assert any(c[3] < task.family.problems for c in task.calls if c[0] == "cactus")  # some trial stopped early


def test_reached_needs_the_speed_and_the_feasibility_of_the_target():
    from relaxtune.bench.simulated import Truth

    target = Truth(0.05, 3.0, 2.0, 1.0)
    assert reached(Truth(0.0, 2.98, 2.0, 1.0), target, 0.1)  # within 1 %
    assert not reached(Truth(0.0, 2.9, 2.0, 1.0), target, 0.1)
    assert not reached(Truth(0.2, 4.0, 2.0, 1.0), target, 0.1)  # faster but infeasible
    assert reached(Truth(0.3, 3.0, 2.0, 1.0), Truth(0.2, 3.0, 2.0, 1.0), 0.1)  # an infeasible target asks speed only


def _result(reach: float | None, infeasible: bool = False) -> dict:
    grid = {"tokens": 100, "to_reach": 100, "regret": 0.1, "infeasible": False}
    side = {
        "tokens": 50,
        "to_reach": None if reach is None else round(reach * 100),
        "regret": 0.0,
        "infeasible": infeasible,
    }
    return {"grid": grid, "search": side, "random": side}


def test_target_line_counts_runs_within_40_percent_of_the_grid_tokens():
    met = summarize([_result(0.1), _result(0.4), _result(0.3), _result(0.2), _result(None)])
    assert met[-1].startswith("target:") and "in 4 of 5 runs" in met[-1] and met[-1].endswith(": met")
    missed = summarize([_result(0.41), _result(0.1), _result(0.1), _result(0.1), _result(0.1, True)])
    assert "in 4 of 5 runs" in missed[-1] and "MISSED" not in missed[-1]
    missed = summarize([_result(0.41), _result(0.5), _result(0.1), _result(0.1), _result(0.1)])
    assert "in 3 of 5 runs" in missed[-1] and missed[-1].endswith("MISSED")
    row = next(line for line in met if line.startswith("| search"))
    assert "| 0.50 |" in row and row.split("|")[-2].strip().startswith("0% (")  # half the grid's tokens, all feasible


@pytest.mark.slow
def test_the_command_prints_a_row_per_strategy_and_the_target_line(capsys):
    from relaxtune.bench.tuning import main

    assert main(["--tasks", "1", "--families", "gpqa", "--methods", "ens", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "strategy" not in line]
    assert rows == ["search", "grid", "random"]
    assert re.search(r"^target: .* in [01] of 1 runs \(.*\); wanted >= 80%: (met|MISSED)$", out, re.M)
    with pytest.raises(SystemExit):
        main(["--families", "mmlu"])
    assert "unknown family 'mmlu'" in capsys.readouterr().err
