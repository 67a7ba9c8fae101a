"""Study points, the decision as MLflow fields, and the figures: intervals on every
point, the epsilon budget, strict / AR / chosen / closest marked and labelled
legibly where they coincide, speed-up against the knob."""

import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import optuna
import pytest
from matplotlib.colors import to_rgba
from matplotlib.text import Annotation, Text

from relaxtune.certify.stats import drop_bound, wilson_interval
from relaxtune.report.decision import decide, study_summary
from relaxtune.report.export import build_config
from relaxtune.report.figures import combined_figure, knob_figure, method_figure
from relaxtune.tune.confirm import confirm
from relaxtune.tune.judge import drop_ucb_at
from relaxtune.tune.pareto import Point, baseline_points, study_points
from relaxtune.tune.tuning import Tuner, TuneSettings, choose

from .synthetic import PROBLEMS, SPEC, Lucky, Synthetic


class Pair:
    name = "synthetic-pair"


def tuned(tmp_path, cliff: float, epsilon: float = 0.05, confidence: float = 0.9):
    """A finished synthetic job on 40 problems (cactus, 5 trials at N=4, its point
    confirmed on fresh seeds) and its config."""
    s = TuneSettings(
        task="synthetic",
        methods=["cactus"],
        n_drafts=[4],
        trials=5,
        stage_size=40,
        c_rel=0.2,
        output_dir=str(tmp_path),
        epsilon=epsilon,
        confidence=confidence,
        confirm="seeds",
    )
    tuner = Tuner(s, SPEC, PROBLEMS[:40], Pair(), 0.2, evaluate_fn=Synthetic(cliff=cliff, drop=0.25), progress=False)
    outcome = tuner.tune_method("cactus")
    tuner.baseline(4)
    outcome.chosen = choose(outcome.study, s, tuner.strict_points())
    confirmations = confirm(tuner, [outcome], PROBLEMS[:40])
    return tuner, outcome, build_config(tuner.result([outcome], confirmations))


def test_study_points_mark_the_exported_point_and_judge_at_the_exports_confidence(tmp_path):
    tuner, outcome, config = tuned(tmp_path, cliff=20.0, epsilon=0.2)
    result = config.methods["cactus"]
    points = study_points("cactus", "delta", outcome.study, result, tuner.settings)
    chosen = [p for p in points if p.chosen]
    assert [(p.knob, p.n_draft, p.trial) for p in chosen] == [(result.knob, 4, result.trial)] and result.knob == 10.0
    assert not any(p.closest for p in points)
    for p in points:  # every point carries its accuracy interval and its paired drop bounds
        m = next(t for t in outcome.study.trials if t.number == p.trial).user_attrs["metrics"]
        assert (p.ci_low, p.ci_high) == (m["accuracy_ci_low"], m["accuracy_ci_high"]) and p.ci_low < p.accuracy
        assert p.drop_lcb <= p.drop <= p.drop_ucb == m["drop_ucb"]
    surer = tuner.settings.model_copy(update={"confidence": 0.99})  # an export at another confidence
    rejudged = study_points("cactus", "delta", outcome.study, result, surer)
    for p, q in zip(points, rejudged):
        m = next(t for t in outcome.study.trials if t.number == p.trial).user_attrs["metrics"]
        assert q.drop_ucb == drop_ucb_at(m, 0.99) > p.drop_ucb

    tuner, outcome, config = tuned(tmp_path / "none", cliff=-1.0)  # every point loses a quarter: none feasible
    result = config.methods["cactus"]
    points = study_points("cactus", "delta", outcome.study, result, tuner.settings)
    assert not any(p.chosen for p in points) and [p.trial for p in points if p.closest] == [result.closest["trial"]]
    base = baseline_points(tuner)
    assert [(p.kind, p.n_draft, p.drop_ucb) for p in base] == [("strict", 4, 0.0), ("ar", None, 0.0)]
    assert (base[0].ci_low, base[0].ci_high) == wilson_interval(40, 40) and base[1].speedup == 1.0


def test_the_decision_reads_as_params_metrics_tags_and_one_sentence(tmp_path):
    _, _, config = tuned(tmp_path, cliff=20.0, epsilon=0.2)
    rec, r = config.recommendation, config.methods["cactus"]
    d = decide(config)
    assert d.label == "cactus delta=10 N=4" and rec.method == "cactus" and rec.knob == 10.0
    assert config.confirmation["planned"] == 2  # two candidates: the confidence split in halves, 0.95 each
    what_ran = {"runtime": "-", "dtype": "-", "drafter_weights": "-", "verifier_weights": "-"}  # this machine's
    assert d.params | {"drafter": "-", "verifier": "-"} | what_ran == what_ran | {
        "recommended_method": "cactus",
        "recommended_knob_name": "delta",
        "recommended_knob": "10",
        "recommended_n_draft": "4",
        "recommended_drop_ucb": f"{r.drop_upper_bound:.4g}",
        "recommended_search_drop_ucb": f"{r.search_drop_upper_bound:.4g}",
        "confirm_confidence": "0.95",
        "epsilon": "0.2",
        "confidence": "0.9",
        "n": "40",
        "problems": "40",
        "repeats": "1",
        "task": "synthetic",
        "task_version": "2",
        "drafter": "-",
        "verifier": "-",
        "c_rel": "0.2",
    }
    assert d.metrics["recommended_search_drop_ucb"] == r.search_drop_upper_bound  # both bounds: search, confirmation
    assert d.metrics["recommended_speedup"] == rec.modeled_speedup == r.modeled_speedup
    assert d.metrics["recommended_drop_ucb"] == r.drop_upper_bound <= 0.2 and d.metrics["recommended_accuracy"] == 1.0
    assert d.metrics["strict_speedup"] == config.strict_by_n_draft[4]["modeled_speedup"] < rec.modeled_speedup
    assert (d.metrics["epsilon"], d.metrics["confidence"], d.metrics["n"]) == (0.2, 0.9, 40.0)
    assert d.metrics["cactus.feasible"] == 1.0 and d.metrics["cactus.drop_ucb"] == r.drop_upper_bound
    assert d.tags == {
        "relaxtune.recommended": "cactus delta=10 N=4",
        "relaxtune.recommended_method": "cactus",
        "relaxtune.task": "synthetic",
        "relaxtune.feasible_methods": "cactus",
        "relaxtune.epsilon": "0.2",
        "relaxtune.confirm": "seeds",
        "relaxtune.promise": config.confirmation["promise"],
    }
    assert config.confirmation["promise"].startswith("about these 40 problems, not new ones")
    assert not re.search(r"[.;:!?]\s+[A-Z]", d.description) and d.description.endswith(".")  # one sentence
    assert d.description.startswith("Use cactus delta=10 N=4 on synthetic v2 (modeled ")
    assert f"accuracy drop vs strict <= {r.drop_upper_bound:.3f} on fresh samples" in d.description
    name, about = study_summary(r, 0.2)
    assert name == f"cactus study: delta=10 N=4 chosen ({r.modeled_speedup:.2f}x)"
    assert about.startswith("5 trials (0 pruned, 0 failed); chosen cactus delta=10 N=4: modeled ")
    assert f"at most {r.drop_upper_bound:.3f} on fresh samples (search: {r.search_drop_upper_bound:.3f})" in about

    _, _, config = tuned(tmp_path / "none", cliff=-1.0)
    d, r = decide(config), config.methods["cactus"]
    assert (
        d.label == "strict N=4" and d.params["recommended_knob"] == "-" and d.params["recommended_method"] == "strict"
    )
    assert d.metrics["recommended_drop_ucb"] == 0.0 and d.metrics["cactus.feasible"] == 0.0
    assert d.metrics["cactus.drop_ucb"] == r.closest["drop_upper_bound"] > 0.05
    assert d.tags["relaxtune.feasible_methods"] == "none"
    closest = f"cactus delta={r.closest['knob']:.3g} N=4"
    assert d.description.startswith("Use strict N=4 on synthetic v2 (modeled ") and d.description.endswith(".")
    assert not re.search(r"[.;:!?]\s+[A-Z]", d.description)
    assert "no relaxed point was confirmed within the capability-loss budget" in d.description
    assert (
        f"the closest tried point, {closest}, has a drop of at most {r.closest['drop_upper_bound']:.3f}"
        in d.description
    )
    name, about = study_summary(r, 0.05)
    assert name == "cactus study: none within eps 0.05" and f"no point exported ({r.note})" in about


def point(label, kind, speedup, k, n=8, s_only=0, r_only=0, **kw) -> Point:
    """A point of ``n`` problems with ``k`` right (the paired drop from discordant counts)."""
    lo, hi = wilson_interval(k, n)
    counts = [(1, 1, 0)] * s_only + [(1, 0, 1)] * r_only + [(1, 0, 0)] * (n - s_only - r_only)
    b = drop_bound(counts, 0.9)
    drop, dl, du = (b.drop, b.lower, b.upper) if kind == "trial" else (0.0, 0.0, 0.0)
    return Point(label, kind, speedup, k / n, ci_low=lo, ci_high=hi, drop=drop, drop_lcb=dl, drop_ucb=du, **kw)


def crowded() -> tuple[list[Point], list[Point]]:
    """Strict N=4, the chosen point and the closest infeasible one at the same place, AR beside them."""
    trials = [
        point("cactus delta=0.25 N=4", "trial", 1.8, 7, chosen=True, knob=0.25, n_draft=4, method="cactus"),
        point(
            "cactus delta=1 N=4",
            "trial",
            1.8,
            7,
            s_only=1,
            r_only=1,
            feasible=False,
            closest=True,
            knob=1.0,
            n_draft=4,
            method="cactus",
        ),
        point(
            "cactus delta=10 N=4",
            "trial",
            2.2,
            4,
            s_only=3,
            feasible=False,
            knob=10.0,
            n_draft=4,
            method="cactus",
            state="PRUNED",
        ),
        point("cactus delta=0.1 N=2", "trial", 1.5, 7, knob=0.1, n_draft=2, method="cactus"),
    ]
    base = [
        point("strict N=2", "strict", 1.5, 7, n_draft=2, method="strict"),
        point("strict N=4", "strict", 1.8, 7, n_draft=4, method="strict"),
        point("AR", "ar", 1.0, 7, method="ar"),
    ]
    return trials, base


def labels(fig) -> list[tuple[str, object]]:
    """The figure's point labels and their boxes (display coordinates), after drawing."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [
        (a.get_text(), Text.get_window_extent(a, renderer))
        for ax in fig.axes
        for a in ax.texts
        if isinstance(a, Annotation)
    ]


def test_coinciding_points_keep_distinct_legible_labels():
    trials, base = crowded()
    fig = method_figure(trials, base, 0.25, "t")
    found = labels(fig)
    texts = [t for t, _ in found]
    assert sorted(t.split("\n")[0] for t in texts) == sorted(
        ["chosen: cactus delta=0.25 N=4", "closest (infeasible): cactus delta=1 N=4", "strict N=2", "strict N=4", "AR"]
    )
    top = fig.axes[0].get_window_extent()
    for i, (text, box) in enumerate(found):
        assert top.x0 <= box.x0 and box.x1 <= top.x1 and top.y0 <= box.y0 and box.y1 <= top.y1, text
        for other, box2 in found[i + 1 :]:
            assert not box.overlaps(box2), (text, other)
    chosen = next(t for t in texts if t.startswith("chosen"))
    assert f"drop <= {trials[0].drop_ucb:.3f}" in chosen
    closest = next(t for t in texts if t.startswith("closest"))
    assert closest == f"closest (infeasible): cactus delta=1 N=4\ndrop <= {trials[1].drop_ucb:.3f} > eps 0.25"
    plt.close(fig)

    trials[1].feasible, trials[1].drop_ucb = True, 0.2  # it passed the search, yet its method exports no point
    fig = method_figure(trials, base, 0.25, "t")
    assert "closest (not exported): cactus delta=1 N=4\ndrop <= 0.200" in [t for t, _ in labels(fig)]
    plt.close(fig)


def hlines(ax) -> set[float]:
    return {round(line.get_ydata()[0], 6) for line in ax.get_lines() if len(set(line.get_ydata())) == 1}


def test_every_point_has_its_interval_and_the_budget_is_drawn():
    trials, base = crowded()
    fig = method_figure(trials, base, 0.25, "t")
    top, bottom = fig.axes[:2]
    assert round(7 / 8 - 0.25, 6) in hlines(top)  # the budget under strict N=4 (the chosen point's N)
    assert 0.25 in hlines(bottom) and 0.0 in hlines(bottom)  # drop = epsilon, and strict's zero
    bars = [c for c in top.collections if isinstance(c, matplotlib.collections.LineCollection)]
    spans = sorted((round(seg[0][1], 6), round(seg[1][1], 6)) for c in bars for seg in c.get_segments())
    expected = sorted((round(p.ci_low, 6), round(p.ci_high, 6)) for p in trials + base)
    assert spans == expected  # accuracy intervals on every trial, strict and AR
    drops = [c for c in bottom.collections if isinstance(c, matplotlib.collections.LineCollection)]
    dspans = sorted((round(seg[0][1], 6), round(seg[1][1], 6)) for c in drops for seg in c.get_segments())
    assert dspans == sorted((round(p.drop_lcb, 6), round(p.drop_ucb, 6)) for p in trials)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {
        "chosen point",
        "closest point (none exported)",
        "strict (per N)",
        "AR (strict's distribution)",
        "budget: strict N=4 - eps (0.25)",
        "drop = eps (0.25)",
    } <= set(legend)
    plt.close(fig)

    trials[0].confirm_drop_ucb = 0.11  # a confirmation run's bound, drawn beside the search's
    fig = method_figure(trials, base, 0.25, "t")
    assert "confirmation bound (fresh samples)" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("confirmed <= 0.110" in t for t, _ in labels(fig))
    plt.close(fig)

    fig = combined_figure(
        {
            "cactus": trials,
            "mentored": [point("mentored alpha=0.3 N=4", "trial", 1.2, 7, knob=0.3, n_draft=4, method="mentored")],
        },
        base,
        0.25,
        "t",
    )
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "cactus (front)" in legend and "mentored (front)" in legend
    plt.close(fig)


def test_a_point_that_failed_confirmation_shows_its_search_and_fresh_bounds(tmp_path):
    """The search prefers delta=10, lossless on its seed only (``Lucky``); its confirmation
    fails and delta=1's passes: both keep their confirmation bound beside the search's."""
    s = TuneSettings(
        task="synthetic",
        methods=["cactus"],
        n_drafts=[4],
        trials=4,
        stage_size=500,
        c_rel=0.2,
        output_dir=str(tmp_path),
        epsilon=0.1,
    )
    tuner = Tuner(s, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=Lucky(), progress=False)
    outcome = tuner.tune_method("cactus")
    result = build_config(tuner.result([outcome], confirm(tuner, [outcome], PROBLEMS))).methods["cactus"]
    failed, passed = result.confirmation["attempts"]
    points = {p.trial: p for p in study_points("cactus", "delta", outcome.study, result, s)}
    f, c = points[failed["trial"]], points[passed["trial"]]
    assert (f.knob, f.chosen, f.confirm_passed, f.confirm_drop_ucb) == (10.0, False, False, failed["drop_upper_bound"])
    assert (c.knob, c.chosen, c.confirm_passed, c.confirm_drop_ucb) == (1.0, True, True, result.drop_upper_bound)
    assert f.feasible and f.drop_ucb == failed["search_drop_upper_bound"] < 0.1 < f.confirm_drop_ucb
    assert [p.confirm_drop_ucb for t, p in points.items() if t not in (f.trial, c.trial)] == [None] * (len(points) - 2)

    fig = method_figure(list(points.values()), baseline_points(tuner), 0.1, "t")
    texts = [t for t, _ in labels(fig)]
    assert (
        f"failed confirmation: cactus delta=10 N=4\ndrop <= {f.drop_ucb:.3f}, fresh <= {f.confirm_drop_ucb:.3f} "
        "> eps 0.1" in texts
    )
    assert f"chosen: cactus delta=1 N=4\ndrop <= {c.drop_ucb:.3f}, confirmed <= {c.confirm_drop_ucb:.3f}" in texts
    bars = {
        (round(float(x), 6), round(float(y), 6)): tuple(col.get_edgecolor()[0])
        for col in fig.axes[1].collections
        for x, y in col.get_offsets()
        if getattr(col, "get_paths", None) and col.get_offsets().size
    }
    assert bars[round(f.speedup, 6), round(f.confirm_drop_ucb, 6)] == to_rgba("crimson")
    assert bars[round(c.speedup, 6), round(c.confirm_drop_ucb, 6)] == to_rgba("tab:green")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"confirmation bound (fresh samples)", "failed confirmation (fresh bound)"} <= set(legend)
    plt.close(fig)
    fig = combined_figure({"cactus": list(points.values())}, baseline_points(tuner), 0.1, "t")
    assert not any(t.startswith("failed") for t, _ in labels(fig))  # the combined figure labels the decision only
    plt.close(fig)


@pytest.mark.parametrize("knobs, scale", [((0.1, 1.0, 10.0), "log"), ((0.0, 0.3, 0.9), "symlog")])
def test_speed_against_the_knob(knobs, scale):
    trials = [
        point(f"cactus delta={k} N=4", "trial", 1.2 + k / 10, 7, knob=k, n_draft=n, method="cactus")
        for k in knobs
        for n in (2, 4)
    ]
    trials[-1].chosen = True
    fig = knob_figure(trials, crowded()[1], 0.1, "delta", True, "t")
    top, bottom = fig.axes[:2]
    assert top.get_xscale() == scale and top.get_xlabel() == "" and "delta" in bottom.get_xlabel()
    assert {1.5, 1.8} <= hlines(top)  # strict's modeled speed-up at N=2 and N=4
    speeds = sorted(round(y, 6) for c in top.collections for _, y in c.get_offsets() if c.get_offsets().size)
    assert all(round(p.speedup, 6) in speeds for p in trials)
    assert [t for t, _ in labels(fig)] == [f"chosen: {trials[-1].label}\ndrop <= {trials[-1].drop_ucb:.3f}"]
    plt.close(fig)
    assert knob_figure([point("always_accept N=4", "trial", 2.0, 5, n_draft=4)], [], 0.1, "x", False, "t") is None
    assert not math.isnan(trials[0].drop_ucb)


def test_a_study_whose_trials_all_failed_still_draws(tmp_path):
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    assert study_points("cactus", "delta", study) == []
    fig = method_figure([], crowded()[1], 0.05, "t")
    assert len(fig.axes) == 2
    plt.close(fig)
