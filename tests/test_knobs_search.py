"""Rules with several named knobs searched as several dimensions (``relaxtune.tune.search``):
SGLang's two thresholds, FLy's window W (< N) and top-k beside its threshold; the
records, the confirmation and the deploy blocks carry every knob as searched
(synthetic objective, Optuna on sqlite, no models)."""

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from relaxtune.cli.tune import _summary
from relaxtune.decoding.speed import speedup
from relaxtune.report.export import build_config
from relaxtune.tune.confirm import confirm
from relaxtune.tune.point_records import DecodeConfig
from relaxtune.tune.records import RecordError, knob_of, knobs_of
from relaxtune.tune.search import RelaxationSampler
from relaxtune.tune.tuning import Tuner, TuneSettings

from .synthetic import PROBLEMS, SPEC, Synthetic

SINGLE, ACC = "speculative_accept_threshold_single", "speculative_accept_threshold_acc"


class Pair:
    name = "synthetic-pair"


class TwoThresholds(Synthetic):
    """SGLang's thresholds on the synthetic task: a lower acc threshold accepts more and
    loses half the problems below ``acc_cliff``; a single threshold below acc accepts more
    still and loses nothing (what a search on the tied view alone cannot find)."""

    acc_cliff = 0.4

    def _record(self, config, problem):
        rec = super()._record(config, problem)
        if config.method == "strict":
            return rec
        k = config.knobs
        share = 0.2 + 0.4 * (1 - k[ACC]) + 0.3 * max(0.0, k[ACC] - k[SINGLE])
        correct = not (k[ACC] < self.acc_cliff and int(problem.id) % 2 == 0)
        rec.update(correct=correct, verdict="correct" if correct else "wrong")
        rec["stats"] = dict(rec["stats"], accepted=round(config.n_draft * share * 10))
        return rec


def _settings(tmp_path, method, **over):
    return TuneSettings(
        **(
            dict(
                task="synthetic",
                methods=[method],
                n_drafts=[4],
                trials=10,
                stage_size=200,
                output_dir=str(tmp_path),
                c_rel=0.2,
            )
            | over
        )
    )


def test_sglang_thresholds_are_searched_apart_recorded_confirmed_and_deployed(tmp_path, capsys, monkeypatch):
    synthetic = TwoThresholds()
    tuner = Tuner(_settings(tmp_path, "sglang_threshold"), SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=synthetic)
    tuner.progress = False
    outcome = tuner.tune_method("sglang_threshold")
    trials = outcome.study.get_trials(deepcopy=False)
    points = [(round(t.params["knob"], 6), round(t.params[SINGLE], 6)) for t in trials]
    # the grid at the tied view (strongest first), then the acc threshold bisected towards its cliff,
    # then the single threshold bisected below the fastest feasible acc threshold
    assert points[:3] == [(0.2, 0.2), (0.5, 0.5), (0.8, 0.8)]
    assert any(single < acc for acc, single in points[3:])
    chosen = outcome.chosen
    assert chosen.params[SINGLE] < chosen.params["knob"] and chosen.params["knob"] >= 0.4
    # the trial's metrics and its records carry both thresholds as searched
    knobs = chosen.user_attrs["metrics"]["knobs"]
    assert knobs == {SINGLE: chosen.params[SINGLE], ACC: chosen.params["knob"]}
    point = DecodeConfig.of_point("sglang_threshold", chosen.params, 0)
    assert point.extra == ((SINGLE, chosen.params[SINGLE]),)
    assert point.label == f"sglang_threshold-{chosen.params['knob']:g}+{SINGLE}={chosen.params[SINGLE]:g}__N4__seed0"
    # a tied point keeps the label (and records) of the one-knob view
    tied = DecodeConfig.of_point("sglang_threshold", {"knob": 0.5, SINGLE: 0.5, "n_draft": 4}, 0)
    assert tied.extra == () and tied.label == "sglang_threshold-0.5__N4__seed0"
    with pytest.raises(RecordError):
        knob_of(knobs)  # two knobs have no single v2 value
    # confirmed on fresh seeds at the same point (both thresholds), then exported with both in the blocks
    confirmations = confirm(tuner, [outcome], PROBLEMS)
    attempt = confirmations["sglang_threshold"].confirmed
    assert attempt is not None and attempt.extra == point.extra
    relaxed = [c for c in synthetic.calls if c[0] == "sglang_threshold" and c[4] != 0]
    assert relaxed and all(c[1] == chosen.params["knob"] for c in relaxed)
    config = build_config(tuner.result([outcome], confirmations))
    result = config.methods["sglang_threshold"]
    assert result.knobs == knobs
    block = result.deploy["sglang"]
    single, acc = f"{knobs[SINGLE]:g}", f"{knobs[ACC]:g}"
    args = block["launch_args"]
    assert args[args.index("--speculative-accept-threshold-single") + 1] == single
    assert args[args.index("--speculative-accept-threshold-acc") + 1] == acc
    assert block["set_internal_state"] == {"server_args": {SINGLE: knobs[SINGLE], ACC: knobs[ACC]}}
    # the summary table's knob column and the recommendation line show both thresholds (one label function)
    monkeypatch.setenv("COLUMNS", "200")
    _summary(config, tmp_path / "t.yaml")
    raw = capsys.readouterr().out
    row = [" ".join(line.replace("│", " ").split()) for line in raw.splitlines() if line.startswith("│ sglang")]
    assert row[0].startswith(f"sglang_threshold yes (try 1) acc={knobs[ACC]:.3g}, single={knobs[SINGLE]:.3g} 4 ")
    shown = f"speculative_accept_threshold_acc={knobs[ACC]:.3g}, _single={knobs[SINGLE]:.3g}"
    assert f"recommendation: sglang_threshold {shown} N=4, modeled" in " ".join(raw.split())


def _trial(number, knob, single, *, l_accept, ok=True):
    speed = speedup(l_accept, 4, 0.2)  # as the sampler's model prices it
    t = create_trial(
        params={"n_draft": 4, "knob": knob, SINGLE: single},
        state=TrialState.COMPLETE,
        user_attrs={"metrics": {"l_accept": l_accept, "length_ratio": 1.0}, "constraints": [-0.01 if ok else 0.05]},
        values=[speed, 0.5],
        distributions={
            "n_draft": CategoricalDistribution([4]),
            "knob": FloatDistribution(0.05, 1.0),
            SINGLE: FloatDistribution(0.05, 1.0),
        },
    )
    t.number = number
    return t


def test_the_sampler_bisects_acc_on_the_tied_line_then_single_below_the_best():
    sampler = RelaxationSampler(
        "sglang_threshold", [4], lambda a, n, r: speedup(min(a, n), n, 0.2, 1.0, r), optuna.samplers.RandomSampler(0)
    )
    grid = [
        _trial(0, 0.2, 0.2, l_accept=2.4, ok=False),
        _trial(1, 0.5, 0.5, l_accept=2.0),
        _trial(2, 0.8, 0.8, l_accept=1.5),
    ]
    # the tied line: acc bisected between the feasible 0.5 and the infeasible 0.2, single following it
    assert sampler.propose(grid) == {"n_draft": 4, "knob": 0.35, SINGLE: 0.35}
    # a point off the tied line is not on it: it neither bounds nor counts as tried there
    off = _trial(3, 0.35, 0.2, l_accept=1.0, ok=False)
    assert sampler.propose([*grid, off]) == {"n_draft": 4, "knob": 0.35, SINGLE: 0.35}
    # a single threshold at or above acc IS the tied rule (one identity): it bounds the line as the tied point would
    same = _trial(3, 0.35, 0.9, l_accept=2.2, ok=False)
    tied = _trial(3, 0.35, 0.35, l_accept=2.2, ok=False)
    next_tied = {"n_draft": 4, "knob": 0.425, SINGLE: 0.425}
    assert sampler.propose([*grid, same]) == sampler.propose([*grid, tied]) == next_tied
    # acc resolved on the tied line (0.35 infeasible, narrowed to the resolution): single below the best's acc
    resolved = [*grid] + [
        _trial(3 + i, k, k, l_accept=1.9, ok=False) for i, k in enumerate((0.35, 0.425, 0.4625, 0.48125))
    ]
    resolved += [_trial(7 + i, k, k, l_accept=1.9, ok=False) for i, k in enumerate((0.490625,))]
    assert sampler.propose(resolved) == {"n_draft": 4, "knob": 0.5, SINGLE: 0.275}
    # then the single threshold's own bisection, below the fastest feasible point's
    apart = [*resolved, _trial(9, 0.5, 0.275, l_accept=2.2)]
    assert sampler.propose(apart) == {"n_draft": 4, "knob": 0.5, SINGLE: 0.1625}


def test_fly_window_stays_below_the_draft_length_and_varies(tmp_path):
    class Fly(Synthetic):
        def _record(self, config, problem):  # a smaller W and a larger k flip more rejections
            rec = super()._record(config, problem)
            if config.method == "fly":
                k = config.point_knob if config.extra else {"fly_window_size": None}
                w = k.get("fly_window_size") or min(6, config.n_draft - 1)
                rec["stats"] = dict(rec["stats"], accepted=round(config.n_draft * (0.3 + 0.1 / w) * 10))
            return rec

    settings = _settings(tmp_path, "fly", n_drafts=[1, 4, 6], trials=14)
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=Fly(cliff=100.0), progress=False)
    trials = tuner.tune_method("fly").study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert all(t.params["n_draft"] >= 2 and t.params["fly_window_size"] < t.params["n_draft"] for t in done)
    assert len({t.params["fly_window_size"] for t in done}) >= 2
    assert trials[0].params == {
        "n_draft": 4,
        "knob": 0.3,
        "fly_window_size": 3,
        "fly_entropy_top_k": 3,
    }  # the grid: alpha view
    assert knobs_of("fly", {"fly_window_size": None, "fly_entropy_threshold": 0.5, "fly_entropy_top_k": 3}) == {
        "fly_entropy_threshold": 0.5,
        "fly_entropy_top_k": 3.0,
    }
