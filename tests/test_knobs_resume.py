"""Rules with several named knobs, continued: one label for a point everywhere, points that
are the same rule sharing one identity (SGLang's single threshold at or above acc), studies
made before the further knobs were searched resuming (FLy's N = 1, SGLang's tied thresholds),
and TensorRT-LLM's ``relaxed_topk`` searched (synthetic objective, Optuna on sqlite, no models)."""

import optuna
import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from relaxtune.decoding.methods import get_method
from relaxtune.decoding.rules import _threshold_rej
from relaxtune.report.decision import study_summary
from relaxtune.report.export import build_config
from relaxtune.tune.confirm import confirm
from relaxtune.tune.job_identity import study_name
from relaxtune.tune.outcomes import trial_line
from relaxtune.tune.pareto import knob_text, point_label
from relaxtune.tune.point_records import DecodeConfig, records_path
from relaxtune.tune.records import metrics_attr, trial_metrics
from relaxtune.tune.search_problems import search_digest
from relaxtune.tune.tuning import Tuner

from .synthetic import PROBLEMS, SPEC, Synthetic
from .test_knobs_search import ACC, SINGLE, Pair
from .test_knobs_search import _settings as knobs_settings


def _settings(tmp_path, method, **over):
    return knobs_settings(tmp_path, method, **({"trials": 6} | over))


# ------------------------------------------------------------------ labels


def test_one_label_shows_every_named_knob_under_its_engine_name():
    apart = {"n_draft": 4, "knob": 0.5, SINGLE: 0.275}
    assert point_label("sglang_threshold", "threshold", 0.5, 4, apart) == (
        "sglang_threshold speculative_accept_threshold_acc=0.5, _single=0.275 N=4"
    )
    assert point_label("sglang_threshold", "threshold", 0.5, 4) == (
        "sglang_threshold speculative_accept_threshold_acc=0.5, _single=0.5 N=4"  # the tied alpha view
    )
    # FLy's derived window at its value at N (min(6, N - 1)), each further knob shortened after alpha's name
    assert knob_text("fly", None, 0.3, 4) == "fly_entropy_threshold=0.3, _window_size=3, _top_k=3"
    assert (
        knob_text("fly", None, 0.3, 8, {"fly_window_size": 2}) == "fly_entropy_threshold=0.3, _window_size=2, _top_k=3"
    )
    assert knob_text("trtllm_relaxed", None, 0.1, 4, (("relaxed_topk", 4),)) == "relaxed_delta=0.1, _topk=4"
    # the summary table's compact form: less the words all of the rule's knobs share
    assert knob_text("sglang_threshold", None, 0.5, 4, apart, compact=True) == "acc=0.5, single=0.275"
    assert knob_text("fly", None, 0.3, 4, compact=True) == "entropy_threshold=0.3, window_size=3, entropy_top_k=3"
    assert knob_text("cactus", "delta", 0.25, 4, compact=True) == "delta=0.25"
    # the paper's one-knob rules and the knob-less ones keep their labels
    assert point_label("cactus", "delta", 0.25, 4) == "cactus delta=0.25 N=4"
    # a point relaxed only while the model thinks says so (given, or from a trial's params); scope all is not shown
    assert point_label("cactus", "delta", 0.25, 4, scope="thinking") == "cactus delta=0.25 N=4 thinking"
    assert point_label("cactus", "delta", 0.25, 4, {"knob": 0.25, "scope": "thinking"}) == (
        "cactus delta=0.25 N=4 thinking"
    )
    assert point_label("cactus", "delta", 0.25, 4, {"scope": "all"}, "all") == "cactus delta=0.25 N=4"
    assert point_label("strict", None, None, 4) == "strict N=4" and knob_text("strict", None, None, 4) == ""
    # a trial's progress line takes its parameters as they are
    line = trial_line("sglang_threshold", 7, apart, {}, "FAIL", 3, 10)
    assert line == "[3/10] sglang_threshold speculative_accept_threshold_acc=0.5, _single=0.275 N=4 (trial 7): FAIL"


# -------------------------------------------------------- one rule, one point


def test_a_single_threshold_at_or_above_acc_is_the_tied_point(tmp_path):
    of = lambda single: DecodeConfig.of_point("sglang_threshold", {"knob": 0.5, "n_draft": 4, SINGLE: single}, 0)  # noqa: E731
    tied = DecodeConfig.of_point("sglang_threshold", {"knob": 0.5, "n_draft": 4}, 0)
    assert of(0.9) == of(1.0) == of(0.5) == tied and tied.label == "sglang_threshold-0.5__N4__seed0"
    assert of(0.3).extra == ((SINGLE, 0.3),)  # below acc: another rule
    # the same rule, bit for bit (SGLang's sampling.cuh: p >= single >= acc already passes u < p / acc)
    p = torch.rand(4096, generator=torch.Generator().manual_seed(0)) ** 3
    p[:7] = torch.tensor([0.0, 0.5, 0.49999, 0.9, 0.95, 1.0, 1e-12])
    for single in (0.5, 0.7, 0.9, 1.0):
        assert torch.equal(_threshold_rej(p, {SINGLE: single, ACC: 0.5}), _threshold_rej(p, 0.5))
    assert not torch.equal(_threshold_rej(p, {SINGLE: 0.3, ACC: 0.5}), _threshold_rej(p, 0.5))
    # at acc = 0 the kernel's floor (1e-9) keeps a higher single threshold another rule: not merged
    spec = get_method("sglang_threshold")
    assert spec.extra_of(0.0, {SINGLE: 0.5}, 4) == ((SINGLE, 0.5),)
    assert not torch.equal(_threshold_rej(p, {SINGLE: 0.5, ACC: 0.0}), _threshold_rej(p, 0.0))
    # one identity, one records file: the second point generates nothing
    synthetic = Synthetic(delay=1e-4)
    for config in (of(0.9), tied):
        synthetic(SPEC, Pair(), config, output_dir=str(tmp_path), problems=PROBLEMS[:5], progress=False)
    assert records_path(tmp_path, SPEC, of(0.9), Pair.name) == records_path(tmp_path, SPEC, tied, Pair.name)
    assert [label for _, label, _ in synthetic.generated] == ["sglang_threshold-0.5__N4__seed0"] * 5


# ------------------------------------------------------------------- resume


def _old_study(tuner, method, trials: list) -> optuna.Study:
    """A study as a run from before the further knobs were searched left it: only ``n_draft``
    and ``knob`` parameters, ``n_draft`` drawn from ``choices``; metrics stored by this code's
    own ``metrics_attr`` (v3) from a real evaluation of the synthetic objective."""
    tuner.queue
    study = optuna.create_study(
        storage=tuner.settings.storage_url,
        study_name=study_name(SPEC.name, method, Pair.name, SPEC.version),
        directions=["maximize", "maximize"],
    )
    study.set_user_attr("search_problems", search_digest(tuner.problems))  # searched on this job's problems
    for choices, knob, n, state in trials:
        dists = {"n_draft": CategoricalDistribution(choices), "knob": FloatDistribution(*get_method(method).search[:2])}
        attrs = {}
        if state == TrialState.COMPLETE:
            metrics, _ = tuner.evaluate_point(method, knob, n)
            attrs = {"metrics": metrics_attr(metrics, method, knob), "constraints": [-0.01]}
        study.add_trial(
            create_trial(
                params={"n_draft": n, "knob": knob},
                distributions=dists,
                state=state,
                values=[attrs["metrics"]["speedup"], attrs["metrics"]["accuracy"]] if attrs else None,
                user_attrs=attrs,
            )
        )
    return study


def test_a_fly_study_made_with_n_1_resumes_and_never_draws_it(tmp_path):
    settings = _settings(tmp_path, "fly", n_drafts=[1, 4, 6], trials=10)
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=Synthetic(cliff=100.0), progress=False)
    old = [
        ([1, 4, 6], 0.5, 1, TrialState.FAIL),  # FLy needs N >= 2: the old search drew N = 1 and failed there
        ([1, 4, 6], 0.9, 4, TrialState.COMPLETE),  # the grid's first points, at the alpha view
        ([1, 4, 6], 0.6, 4, TrialState.COMPLETE),
    ]
    _old_study(tuner, "fly", old)
    trials = tuner.tune_method("fly").study.get_trials(deepcopy=False)
    new = trials[len(old) :]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 10
    assert all(t.params["n_draft"] in (4, 6) for t in new)  # N = 1 stays a choice of the study, never drawn
    assert {t.distributions["n_draft"].choices for t in new} == {(1, 4, 6)}
    assert all(t.params["fly_window_size"] < t.params["n_draft"] for t in new)
    # the grid's points run before (0.9, 0.6 at the alpha view) count as done: only 0.3 is enqueued
    assert new[0].params == {"n_draft": 4, "knob": 0.3, "fly_window_size": 3, "fly_entropy_top_k": 3}
    labels = [DecodeConfig.of_point("fly", t.params, 0).label for t in trials]
    assert labels.count("fly-0.9__N4__seed0") == labels.count("fly-0.6__N4__seed0") == 1


def test_a_tied_sglang_run_loads_re_exports_and_resumes_with_the_same_points(tmp_path):
    settings = _settings(tmp_path, "sglang_threshold", trials=3)
    synthetic = Synthetic(cliff=100.0)
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=synthetic, progress=False)
    old = _old_study(tuner, "sglang_threshold", [([4], k, 4, TrialState.COMPLETE) for k in (0.2, 0.5, 0.8)])
    # loads: v3 metrics with both thresholds at t, the point's identity and label those of the one-knob view
    for t in old.get_trials(deepcopy=False):
        k = t.params["knob"]
        assert trial_metrics(t, "sglang_threshold").knobs == {SINGLE: k, ACC: k}
        assert DecodeConfig.of_point("sglang_threshold", t.params, 0).label == f"sglang_threshold-{k:g}__N4__seed0"
    # re-exports: the grid (3 trials) is done, nothing runs again; the blocks carry both thresholds at t
    outcome = tuner.tune_method("sglang_threshold")
    assert len(outcome.study.get_trials(deepcopy=False)) == 3
    assert outcome.chosen.params == {"n_draft": 4, "knob": 0.8}  # the synthetic pair accepts more as t grows
    confirmations = confirm(tuner, [outcome], PROBLEMS)
    result = build_config(tuner.result([outcome], confirmations)).methods["sglang_threshold"]
    assert result.knobs == {SINGLE: 0.8, ACC: 0.8}
    assert result.deploy["sglang"]["set_internal_state"] == {"server_args": {SINGLE: 0.8, ACC: 0.8}}
    assert study_summary(result, settings.epsilon)[0] == (
        "sglang_threshold study: speculative_accept_threshold_acc=0.8, _single=0.8 N=4 chosen "
        f"({result.modeled_speedup:.2f}x)"
    )
    # resumes with more trials: the new ones carry the single threshold; a tied one is an old point's identity
    more = Tuner(
        settings.model_copy(update={"trials": 6}), SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=synthetic, progress=False
    )
    trials = more.tune_method("sglang_threshold").study.get_trials(deepcopy=False)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 6
    assert all(SINGLE in t.params for t in trials[3:])
    labels = [DecodeConfig.of_point("sglang_threshold", t.params, 0).label for t in trials]
    assert labels[:3] == [
        "sglang_threshold-0.2__N4__seed0",
        "sglang_threshold-0.5__N4__seed0",
        "sglang_threshold-0.8__N4__seed0",
    ]


# -------------------------------------------------------------- TensorRT-LLM


def test_trtllm_relaxed_topk_is_searched_as_an_integer_at_temperature_zero(tmp_path):
    class TopK(Synthetic):
        def _record(self, config, problem):  # a larger top-k accepts more; top-k above 6 loses half the problems
            rec = super()._record(config, problem)
            if config.method == "trtllm_relaxed":
                k = dict(config.extra).get("relaxed_topk", 10)
                rec["stats"] = dict(rec["stats"], accepted=round(config.n_draft * (0.3 + 0.05 * k) * 10))
                rec.update(correct=not (k > 6 and int(problem.id) % 2 == 0))
                rec["verdict"] = "correct" if rec["correct"] else "wrong"
            return rec

    greedy = SPEC.model_copy(update={"sampling": SPEC.sampling.model_copy(update={"temperature": 0.0})})
    settings = _settings(tmp_path, "trtllm_relaxed", trials=12)
    tuner = Tuner(settings, greedy, PROBLEMS, Pair(), 0.2, evaluate_fn=TopK(cliff=100.0), progress=False)
    outcome = tuner.tune_method("trtllm_relaxed")
    trials = outcome.study.get_trials(deepcopy=False)
    assert [t.params for t in trials[:3]] == [
        {"n_draft": 4, "knob": 0.6, "relaxed_topk": 10},  # the grid, strongest delta first, at the preset top-k
        {"n_draft": 4, "knob": 0.1, "relaxed_topk": 10},
        {"n_draft": 4, "knob": 0.01, "relaxed_topk": 10},
    ]
    tops = [t.params["relaxed_topk"] for t in trials]
    assert all(isinstance(k, int) for k in tops) and len(set(tops)) >= 2
    chosen = outcome.chosen
    assert chosen.params["relaxed_topk"] <= 6  # every top-k above 6 loses half the problems
    assert chosen.user_attrs["metrics"]["knobs"] == {
        "relaxed_topk": float(chosen.params["relaxed_topk"]),
        "relaxed_delta": chosen.params["knob"],
    }


def test_a_draft_length_fly_cannot_run_at_is_refused_before_anything_runs():
    """FLy needs N >= 2 (its window W < N): a job whose draft lengths are all 1, and a single
    point at N = 1, are refused by name before any model loads; a list holding a valid N runs."""
    import pytest

    from relaxtune.engine.generation import check_decode
    from relaxtune.tune.checks import check_methods

    with pytest.raises(
        ValueError, match=r"--methods fly with --n-drafts 1: method 'fly' cannot run at draft length N=1"
    ):
        check_methods(["fly"], 0.6, [1])
    check_methods(["fly", "cactus"], 0.6, [1, 4])  # N = 1 left out for fly only
    with pytest.raises(ValueError, match=r"method 'fly' cannot run at draft length N=1: fly_window_size"):
        check_decode("fly", 0.5, 1, 0.6)
    assert check_decode("fly", 0.5, 2, 0.6) == 0.5


def test_a_draft_length_list_fly_runs_only_part_of_tunes_at_the_lengths_it_runs(tmp_path):
    """``--methods fly --n-drafts 2,1``: the middle draft length is 1, where FLy cannot run; its
    grid sits at the nearest one it runs at (2) and the study completes (it failed with
    "'1' not in (2,)" when the grid kept N = 1)."""
    settings = _settings(tmp_path, "fly", n_drafts=[2, 1], trials=2)
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=Synthetic(cliff=100.0), progress=False)
    assert {p["n_draft"] for p in tuner.grid_points("fly")} == {2}
    outcome = tuner.tune_method("fly")
    trials = outcome.study.get_trials(deepcopy=False)
    assert len(trials) == 2 and all(t.params["n_draft"] == 2 and t.state.name == "COMPLETE" for t in trials)
