"""The tuner on a synthetic objective, with Optuna on sqlite (no models)."""

import math

import optuna
import pytest

from relaxtune.decoding.speed import speedup
from relaxtune.report.export import build_config, load_config, save_config
from relaxtune.tune.point_records import DecodeConfig
from relaxtune.tune.tuning import Tuner, TuneSettings, constraint_values, drop_ucb_at, point_metrics, study_name

from .synthetic import PROBLEMS, SPEC, Synthetic


class Pair:
    name = "synthetic-pair"


def make(tmp_path, synthetic, **over):
    fields = (
        dict(
            task="synthetic",
            methods=["cactus"],
            n_drafts=[4],
            trials=6,
            stage_size=50,
            output_dir=str(tmp_path),
            c_rel=0.2,
        )
        | over
    )
    settings = TuneSettings(**fields)
    return Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=synthetic, progress=False)


def test_finds_the_fastest_feasible_point(tmp_path):
    synthetic = Synthetic(cliff=1.0)
    tuner = make(tmp_path, synthetic, trials=10)
    outcome = tuner.tune_method("cactus")
    chosen = outcome.chosen
    assert chosen is not None
    knob = chosen.params["knob"]
    assert 0.5 <= knob <= 1.0  # the fastest point left of the cliff at 1 (the grid's 1.0 is there)
    feasible = [t for t in outcome.study.trials if t.params["knob"] <= 1.0 and t.state.name == "COMPLETE"]
    assert chosen.values[0] == max(t.values[0] for t in feasible)
    # the modeled speed-up follows the paper's formula
    m = chosen.user_attrs["metrics"]
    assert m["speedup"] == pytest.approx(speedup(m["l_accept"], 4, 0.2))
    assert all(t.params["knob"] > 1.0 for t in outcome.study.trials if t.state.name == "PRUNED")
    # strict ran once, on every problem, and every trial was paired against it
    assert [c for c in synthetic.calls if c[0] == "strict"] == [("strict", None, 4, 200, 0)]
    assert (
        outcome.study.study_name
        == study_name("synthetic", "cactus", "synthetic-pair", 2)
        == "synthetic-v2__cactus__synthetic-pair"
    )


def test_pruning_stops_bad_trials_after_the_first_stage(tmp_path):
    synthetic = Synthetic(cliff=1.0, drop=0.5)
    tuner = make(tmp_path, synthetic)
    outcome = tuner.tune_method("cactus")
    pruned = [t for t in outcome.study.trials if t.state.name == "PRUNED"]
    assert pruned  # the grid's 10.0 is beyond the cliff
    for t in pruned:
        calls = [c for c in synthetic.calls if c[0] == "cactus" and c[1] == t.params["knob"]]
        assert [c[3] for c in calls] == [50]  # one stage of 50 problems, not 200
        assert t.user_attrs["constraints"] == [1.0]


def test_all_infeasible_exports_use_strict(tmp_path):
    synthetic = Synthetic(cliff=-1.0, drop=0.25)  # every relaxed point loses a quarter
    tuner = make(tmp_path, synthetic, trials=4)
    outcome = tuner.tune_method("cactus")
    assert outcome.chosen is None
    config = build_config(tuner.result([outcome]))
    assert config.recommendation.method == "strict" and config.recommendation.n_draft == 4
    assert "no relaxed point was confirmed within the capability-loss budget" in config.recommendation.reason
    assert config.methods["cactus"].feasible is False
    assert config.methods["cactus"].note == "no trial met the capability-loss constraint in the search"
    closest = config.methods["cactus"].closest  # what was tried, and by how much it missed
    assert closest["drop_upper_bound"] > 0.05 and closest["accuracy"] == pytest.approx(0.75, abs=0.02)
    assert closest["l_accept"] > 0 and closest["length_ratio"] > 0
    path = save_config(config, tmp_path / "synthetic.tuned.yaml")
    assert load_config(path) == config  # round trip through the schema


def test_export_with_another_epsilon_redecides_from_stored_metrics(tmp_path):
    synthetic = Synthetic(cliff=-1.0, drop=0.25)
    assert make(tmp_path, synthetic, trials=4, stage_size=200).tune_method("cactus").chosen is None  # epsilon 0.05
    calls = len(synthetic.calls)
    looser = make(tmp_path, synthetic, trials=4, stage_size=200, epsilon=0.5)
    looser.new_trials = False  # what `relaxtune export --epsilon 0.5` does
    outcome = looser.tune_method("cactus")
    assert len(synthetic.calls) == calls  # nothing evaluated again
    assert outcome.chosen is not None and outcome.chosen.user_attrs["metrics"]["drop_ucb"] <= 0.5
    stricter = make(tmp_path, synthetic, trials=4, stage_size=200, epsilon=0.1)
    stricter.new_trials = False
    assert stricter.tune_method("cactus").chosen is None
    surer = make(tmp_path, synthetic, trials=4, stage_size=200, epsilon=0.5, confidence=0.99)
    surer.new_trials = False
    outcome = surer.tune_method("cactus")
    config = build_config(surer.result([outcome]))  # no confirmation: nothing exported as feasible
    result, metrics = config.methods["cactus"], outcome.chosen.user_attrs["metrics"]
    assert not result.feasible and result.drop_upper_bound is None and "not confirmed" in result.note
    assert result.search_drop_upper_bound == drop_ucb_at(metrics, 0.99) > metrics["drop_ucb"]  # at 99 %, not 90 %


def test_failing_evaluations_do_not_abort_the_study(tmp_path):
    synthetic = Synthetic(cliff=100.0, fail_above=0.5, strict_accept=0.05)  # strict slower than the grid
    tuner = make(tmp_path, synthetic, trials=5)
    outcome = tuner.tune_method("cactus")
    states = [t.state.name for t in outcome.study.trials]
    assert states.count("COMPLETE") >= 2  # the grid's 0.1 and 0.25
    assert states.count("FAIL") == 5  # the study stopped on its failure budget, not on an exception
    failed = [t for t in outcome.study.trials if t.state.name == "FAIL"]
    assert all("evaluation exploded" in t.user_attrs["error"] for t in failed)
    assert all(t.params["knob"] > 0.5 for t in failed)
    assert outcome.chosen is not None and outcome.chosen.params["knob"] <= 0.5


def test_killed_study_resumes_without_repeating_trials(tmp_path):
    first = Synthetic()
    tuner = make(tmp_path, first, trials=3)
    tuner.tune_method("cactus")
    study = optuna.load_study(
        study_name=study_name("synthetic", "cactus", "synthetic-pair", 2), storage=tuner.settings.storage_url
    )
    stale = study.ask()  # a trial that was running when the job was killed
    stale.suggest_categorical("n_draft", [4])
    stale.suggest_float("knob", 0.01, 100.0, log=True)
    done_knobs = [t.params["knob"] for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]

    second = Synthetic()
    resumed = make(tmp_path, second, trials=5)
    outcome = resumed.tune_method("cactus")
    trials = outcome.study.trials
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 5
    assert trials[stale.number].state.name == "FAIL"
    relaxed_calls = {c[1] for c in second.calls if c[0] == "cactus"}
    assert not relaxed_calls & set(done_knobs)  # finished trials were not evaluated again
    assert stale.params["knob"] in relaxed_calls  # the interrupted one was re-run


def test_point_metrics_never_nan(tmp_path):
    synthetic = Synthetic()
    strict = synthetic(
        SPEC, None, DecodeConfig("strict", None, 4), output_dir=tmp_path, problems=PROBLEMS, progress=False
    )
    relaxed = synthetic(
        SPEC, None, DecodeConfig("cactus", 2.0, 4), output_dir=tmp_path, problems=PROBLEMS, progress=False
    )
    m = point_metrics(strict, relaxed, 4, 0.2, 0.9)
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    assert m["drop"] == pytest.approx(0.5) and m["drop_lcb"] > 0.05
    assert set(f"speedup_c{c:g}" for c in (0.05, 0.2, 0.5)) <= set(m)


def test_constraints_rebuild_the_drop_bound_at_another_confidence(tmp_path):
    synthetic = Synthetic(drop=0.1)
    config = lambda method, knob: DecodeConfig(method, knob, 4)  # noqa: E731
    strict = synthetic(SPEC, None, config("strict", None), output_dir=tmp_path, problems=PROBLEMS, progress=False)
    relaxed = synthetic(SPEC, None, config("cactus", 2.0), output_dir=tmp_path, problems=PROBLEMS, progress=False)
    at_90 = point_metrics(strict, relaxed, 4, 0.2, 0.9)
    at_99 = point_metrics(strict, relaxed, 4, 0.2, 0.99)
    assert at_99["drop_ucb"] > at_90["drop_ucb"]
    rebuilt = constraint_values(at_90, TuneSettings(task="x", confidence=0.99, epsilon=0.05))
    assert rebuilt["drop_ucb_minus_epsilon"] == pytest.approx(at_99["drop_ucb"] - 0.05, abs=1e-12)
    same = constraint_values(at_90, TuneSettings(task="x", confidence=0.9, epsilon=0.05))
    assert same["drop_ucb_minus_epsilon"] == at_90["drop_ucb"] - 0.05


def test_settings_are_validated():
    with pytest.raises(ValueError, match="unknown method"):
        TuneSettings(task="x", methods=["nope"])
    with pytest.raises(ValueError, match="baseline"):
        TuneSettings(task="x", methods=["strict"])
    with pytest.raises(ValueError):
        TuneSettings(task="x", epsilon=1.5)
    with pytest.raises(ValueError, match="n_drafts"):
        TuneSettings(task="x", n_drafts=[0])
