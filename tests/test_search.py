"""Where a study looks after the grid (``relaxtune.tune.search``), the speed-up's upper bound and
the tuner's pruning by speed."""

import math

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from relaxtune.bench.simulated import SimTask
from relaxtune.decoding.speed import speedup
from relaxtune.tune.judge import point_metrics, speedup_upper
from relaxtune.tune.point_records import summarize
from relaxtune.tune.records import load_record
from relaxtune.tune.search import (
    PRUNED_BY,
    RelaxationSampler,
    accepted_per_round,
    knob_at,
    per_token_acceptance,
    strength,
)
from relaxtune.tune.tuning import Tuner, TuneSettings

from .synthetic import PROBLEMS, SPEC, Lucky

N_DRAFTS = [3, 5, 10, 20]


@pytest.mark.parametrize(
    "method, strict, strongest",
    [("cactus", 0.01, 100.0), ("mentored", 0.0, 0.99), ("ens", 0.0, 0.5), ("sglang_threshold", 1.0, None)],
)
def test_strength_runs_from_the_strict_end_and_knob_at_inverts_it(method, strict, strongest):
    assert strength(method, strict) == 0.0
    if strongest is not None:
        assert strength(method, strongest) == 1.0
    for s in (0.0, 0.13, 0.5, 0.87, 1.0):
        assert strength(method, knob_at(method, s)) == pytest.approx(s, abs=1e-5)
    assert strength("cactus", 0.1) == pytest.approx(0.25)  # log scale: 0.01 .. 100 spans four decades


def test_per_token_acceptance_inverts_accepted_per_round():
    for n in (1, 3, 20):
        for beta in (0.0, 0.2, 0.75, 0.97):
            assert per_token_acceptance(accepted_per_round(beta, n), n) == pytest.approx(beta, abs=1e-9)
    assert accepted_per_round(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert per_token_acceptance(5.0, 5) == 1.0


def _trial(
    number: int,
    knob: float,
    n: int,
    *,
    speed: float = 0.0,
    l_accept: float = 1.0,
    ok: bool = True,
    state: TrialState = TrialState.COMPLETE,
    pruned_by: str | None = None,
):
    attrs = {"metrics": {"l_accept": l_accept, "length_ratio": 1.0}, "constraints": [-0.01 if ok else 0.05]}
    if pruned_by:
        attrs[PRUNED_BY] = pruned_by
    t = create_trial(
        params={"n_draft": n, "knob": knob},
        state=state,
        user_attrs=attrs,
        values=[speed, 0.5] if state == TrialState.COMPLETE else None,
        distributions={"n_draft": CategoricalDistribution(N_DRAFTS), "knob": FloatDistribution(0.01, 100.0, log=True)},
    )
    t.number = number
    return t


def _sampler(c_rel: float = 0.05, n_drafts: list[int] = N_DRAFTS) -> RelaxationSampler:
    return RelaxationSampler(
        "cactus",
        n_drafts,
        lambda acc, n, r: speedup(min(acc, n), n, c_rel, 1.0, r),
        optuna.samplers.RandomSampler(seed=0),
    )


def test_a_feasible_point_moves_to_the_draft_length_its_acceptance_predicts_fastest():
    l5 = accepted_per_round(0.9, 5)  # per-token acceptance 0.9: at c_rel 0.05, N = 10 is fastest
    best = _trial(0, 1.0, 5, speed=speedup(l5, 5, 0.05), l_accept=l5)
    want = max(N_DRAFTS, key=lambda n: speedup(accepted_per_round(0.9, n), n, 0.05))
    assert want == 10 and _sampler().propose([best]) == {"n_draft": 10, "knob": 1.0}
    # a transfer already running on another worker is not proposed twice
    running = _trial(1, 1.0, 10, state=TrialState.RUNNING)
    assert _sampler().propose([best, running]) == {"n_draft": 20, "knob": 1.0}  # the next fastest
    # at c_rel 0.2 the same acceptance is fastest at N = 5 itself, and one measured strength predicts
    # nothing faster elsewhere: the fallback draws
    assert _sampler(0.2).propose([_trial(0, 1.0, 5, speed=speedup(l5, 5, 0.2), l_accept=l5)]) is None


def test_bisection_splits_the_widest_gap_between_feasible_and_infeasible_strengths():
    l_ok, l_strong = accepted_per_round(0.5, 5), accepted_per_round(0.7, 5)
    sampler = lambda: _sampler(0.2, [5])  # noqa: E731
    good = _trial(0, knob_at("cactus", 0.25), 5, speed=speedup(l_ok, 5, 0.2), l_accept=l_ok)
    bad = _trial(1, knob_at("cactus", 0.75), 5, l_accept=l_strong, ok=False)
    point = sampler().propose([good, bad])
    assert point["n_draft"] == 5 and strength("cactus", point["knob"]) == pytest.approx(0.5, abs=1e-5)
    done = _trial(2, point["knob"], 5, speed=speedup(l_ok, 5, 0.2) + 0.01, l_accept=l_ok)
    # the middle is feasible: the next cut is between it and the infeasible end
    assert strength("cactus", sampler().propose([good, bad, done])["knob"]) == pytest.approx(0.625, abs=1e-5)
    # a trial pruned for its drop bounds the search; one stopped only for being slow says nothing about the loss
    for pruned_by, want in (("drop", 0.325), ("speed", 0.7)):
        stopped = _trial(1, knob_at("cactus", 0.4), 5, l_accept=l_strong, state=TrialState.PRUNED, pruned_by=pruned_by)
        assert strength("cactus", sampler().propose([good, stopped])["knob"]) == pytest.approx(want, abs=1e-5)


def test_a_feasible_strongest_relaxation_leaves_nothing_to_bisect():
    l5 = accepted_per_round(0.9, 5)
    top = _trial(0, 100.0, 5, speed=speedup(l5, 5, 0.2), l_accept=l5)  # strength 1: the range's end
    assert _sampler(0.2, [5]).propose([top]) is None


def test_a_proposal_the_trial_cannot_take_is_left_to_the_fallback():
    l5 = accepted_per_round(0.9, 5)
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.add_trial(_trial(0, 1.0, 5, speed=speedup(l5, 5, 0.05), l_accept=l5))
    sampler, new = _sampler(), _trial(1, 1.0, 5, state=TrialState.RUNNING)
    assert sampler.sample_independent(study, new, "n_draft", CategoricalDistribution(N_DRAFTS)) == 10  # the transfer
    assert sampler.sample_independent(study, new, "n_draft", CategoricalDistribution([5])) == 5  # a pinned point's N
    assert sampler.sample_relative(study, new, {"n_draft": CategoricalDistribution([3, 5])}) == {}  # RandomSampler's


def test_nothing_left_to_propose_falls_back():
    l_ok = accepted_per_round(0.5, 5)
    trials = [
        _trial(i, knob_at("cactus", s), n, speed=speedup(l_ok, 5, 0.5) - 1, l_accept=l_ok, ok=s < 0.5)
        for i, (s, n) in enumerate((s, n) for s in np.arange(0, 1.0001, 0.0125) for n in N_DRAFTS)
    ]
    assert _sampler(0.5).propose(trials) is None


def test_speedup_upper_is_the_jackknife_over_problems():
    task = SimTask.draw("gpqa", 1, ("cactus",))
    strict, relaxed = (task._samples(m, k, 5, 0) for m, k in ((None, None), ("cactus", 1.0)))
    flat = lambda rows: [r for p in rows for r in p]  # noqa: E731
    m = point_metrics(summarize(flat(strict), None), summarize(flat(relaxed), None), 5, 0.2, 0.9)
    loo = [
        point_metrics(
            summarize(flat(strict[:j] + strict[j + 1 :]), None),
            summarize(flat(relaxed[:j] + relaxed[j + 1 :]), None),
            5,
            0.2,
            0.9,
        )["speedup"]
        for j in range(len(strict))
    ]
    k = len(loo)
    se = math.sqrt((k - 1) / k * sum((x - np.mean(loo)) ** 2 for x in loo))
    assert m["speedup_ucb"] == pytest.approx(m["speedup"] + 1.2815515655446004 * se, rel=1e-9)
    assert se > 0
    one = [(load_record(s), load_record(r)) for s, r in zip(flat(strict[:1]), flat(relaxed[:1]))]
    assert speedup_upper(one, 2.0, 5, 0.2, 0.9) == math.inf  # one problem: no spread to measure


def _tuner(tmp_path, evaluate_fn, **over) -> Tuner:
    fields = (
        dict(
            task="synthetic",
            methods=["cactus"],
            n_drafts=[4],
            trials=4,
            stage_size=50,
            output_dir=str(tmp_path),
            c_rel=0.2,
            epsilon=0.1,
        )
        | over
    )
    return Tuner(
        TuneSettings(**fields),
        SPEC,
        PROBLEMS,
        type("Pair", (), {"name": "pair"})(),
        0.2,
        evaluate_fn=evaluate_fn,
        progress=False,
    )


# strict accepts as much as 0.25: never a candidate, so with 3 to confirm no bar is ever set
@pytest.mark.parametrize("confirmations, pruned", [(2, [0.1, 0.25]), (3, [])])
def test_a_trial_slower_than_the_points_to_confirm_stops_after_one_stage(tmp_path, confirmations, pruned):
    lucky = Lucky(loss=lambda k: 0.0)  # every point feasible, faster as the knob grows: grid 10, 1, 0.25, 0.1
    outcome = _tuner(tmp_path, lucky, confirmations=confirmations).tune_method("cactus")
    trials = {t.params["knob"]: t for t in outcome.study.trials}
    assert sorted(k for k, t in trials.items() if t.state.name == "PRUNED") == pruned
    for k in pruned:
        assert trials[k].user_attrs[PRUNED_BY] == "speed"
        assert [c[3] for c in lucky.calls if c[1] == k] == [50]  # one stage of 50 problems, not 200
    assert outcome.chosen.params["knob"] == 10.0
