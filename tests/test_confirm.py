"""Confirmation on fresh samples, the confidence split, strict dominance and the recommendation's speed margin."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from relaxtune.certify.stats import drop_bound
from relaxtune.cli.app import console
from relaxtune.cli.tune import _summary
from relaxtune.job.run import run_tune_job
from relaxtune.job.steps import prepare
from relaxtune.report.export import build_config, load_config, save_config
from relaxtune.tune.confirm import confirm, confirmation_seed, holdout_split, split_confidence
from relaxtune.tune.evaluation import sample_seed
from relaxtune.tune.judge import feasible
from relaxtune.tune.settings import TuneSettings
from relaxtune.tune.tuning import Tuner, candidates, choose

from .synthetic import PROBLEMS, SPEC, Lucky, Synthetic


class Pair:
    name = "synthetic-pair"


def make(tmp_path, fn, problems=PROBLEMS, **over) -> Tuner:
    fields = (
        dict(
            task="synthetic",
            methods=["cactus"],
            n_drafts=[4],
            trials=4,
            stage_size=500,
            output_dir=str(tmp_path),
            c_rel=0.2,
            epsilon=0.1,
        )
        | over
    )
    return Tuner(TuneSettings(**fields), SPEC, problems, Pair(), 0.2, evaluate_fn=fn, progress=False)


def test_a_point_that_passes_the_search_by_luck_fails_confirmation(tmp_path):
    """The paper's grid: delta = 10 loses 30 % of its samples but none on the search's seed;
    delta = 1 loses nothing. The search prefers the lucky point; confirmation rejects it and
    confirms the next candidate, whose exported bound comes from the fresh samples alone."""
    lucky = Lucky()
    tuner = make(tmp_path, lucky)
    outcome = tuner.tune_method("cactus")
    assert outcome.chosen.params["knob"] == 10.0  # the fastest point that passed the search
    assert [t.params["knob"] for t in candidates(outcome.study, tuner.settings, tuner.strict_points())] == [10.0, 1.0]
    confirmations = confirm(tuner, [outcome], PROBLEMS)
    result = confirmations["cactus"]
    assert result.planned == 2 and result.confidence == pytest.approx(0.95)  # 0.1 split over two confirmations
    first, second = result.attempts
    assert (first.knob, first.passed, second.knob, second.passed) == (10.0, False, 1.0, True)
    assert first.metrics["drop"] == pytest.approx(0.3, abs=0.07) and first.metrics["drop_ucb"] > 0.1
    assert first.search_drop_upper_bound < 0.1  # it had passed the search
    seeds = {c[4] for c in lucky.calls}
    assert seeds == {0, confirmation_seed(0, 1), confirmation_seed(0, 2)}  # the search's, then one per attempt
    assert ("strict", None, 4, 200, confirmation_seed(0, 1)) in lucky.calls  # strict re-run at the same N

    config = build_config(tuner.result([outcome], confirmations))
    exported = config.methods["cactus"]
    assert exported.feasible and exported.knob == 1.0 and exported.drop == 0.0
    assert (
        exported.drop_upper_bound
        == second.metrics["drop_ucb"]
        == pytest.approx(drop_bound([(1, 0, 0)] * 200, 0.95).upper)
    )  # the confirmation's bound, at the split confidence
    assert exported.search_drop_upper_bound == second.search_drop_upper_bound
    assert [a["passed"] for a in exported.confirmation["attempts"]] == [False, True]
    assert config.confirmation["planned"] == 2 and config.confirmation["confidence_each"] == pytest.approx(0.95)
    assert "Bonferroni" in config.confirmation["rule"]
    assert load_config(save_config(config, tmp_path / "c.yaml")) == config


def test_with_one_confirmation_the_lucky_point_is_not_exported(tmp_path):
    tuner = make(tmp_path, Lucky(), confirmations=1)
    outcome = tuner.tune_method("cactus")
    confirmations = confirm(tuner, [outcome], PROBLEMS)
    assert confirmations["cactus"].confidence == pytest.approx(0.9)  # one planned: the whole confidence
    config = build_config(tuner.result([outcome], confirmations))
    exported = config.methods["cactus"]
    assert not exported.feasible and exported.knob is None and exported.drop_upper_bound is None
    assert "failed confirmation" in exported.note
    assert config.recommendation.method == "strict"


def test_an_export_replays_confirmations_from_records_and_never_generates(tmp_path):
    lucky = Lucky()
    tuner = make(tmp_path, lucky)
    outcome = tuner.tune_method("cactus")
    tuner.new_trials = False
    calls = len(lucky.calls)
    confirmations = confirm(tuner, [outcome], PROBLEMS, new_trials=False)  # the stand-in wrote no records
    assert len(lucky.calls) == calls
    assert "no confirmation records" in confirmations["cactus"].missing and not confirmations["cactus"].attempts
    assert build_config(tuner.result([outcome], confirmations)).methods["cactus"].feasible is False


def test_holdout_split_is_seeded_disjoint_and_keeps_the_task_order():
    search, held = holdout_split(PROBLEMS, 0)
    assert len(held) == 100 and len(search) == 100 and not {p.id for p in search} & {p.id for p in held}
    assert [p.id for p in search] == [p.id for p in PROBLEMS if p in search]
    assert holdout_split(PROBLEMS, 0) == (search, held) and holdout_split(PROBLEMS, 1) != (search, held)


def test_holdout_confirms_on_problems_the_search_never_saw(tmp_path):
    search, held = holdout_split(PROBLEMS, 0)
    seen: list[tuple] = []

    def evaluate_fn(spec, backend, config, *, output_dir, problems, progress):
        seen.append((config.seed, {p.id for p in problems}))
        return Lucky(lucky_from=100)(spec, backend, config, output_dir=output_dir, problems=problems, progress=progress)

    tuner = make(tmp_path, evaluate_fn, problems=search, confirm="holdout")
    outcome = tuner.tune_method("cactus")
    confirmations = confirm(tuner, [outcome], held)
    assert confirmations["cactus"].confirmed.knob == 1.0
    assert all(ids <= {p.id for p in search} for s, ids in seen if s == 0)
    assert all(ids == {p.id for p in held} for s, ids in seen if s != 0)


def test_confirmation_seeds_differ_from_every_search_seed():
    for seed in (0, 1, 7, 12345):
        for attempt in (1, 2, 3):
            derived = confirmation_seed(seed, attempt)
            assert derived != seed and derived == confirmation_seed(seed, attempt)
            assert all(sample_seed(derived, p.id, 0) != sample_seed(seed, p.id, 0) for p in PROBLEMS[:50])
    assert len({confirmation_seed(0, k) for k in range(1, 6)}) == 5
    assert split_confidence(0.9, 4) == pytest.approx(0.975) and split_confidence(0.9, 1) == pytest.approx(0.9)


def test_a_point_strict_dominates_is_never_chosen(tmp_path):
    """Strict accepts as much as delta = 1 (N * 0.5 drafts per round) at full accuracy: every
    relaxed point up to delta = 1 is no faster and no more accurate, so none is chosen."""
    tuner = make(tmp_path, Synthetic(cliff=1.0, strict_accept=0.5), trials=4)
    outcome = tuner.tune_method("cactus")
    passed = sorted(t.params["knob"] for t in outcome.study.trials if feasible(t, tuner.settings))
    assert passed == [0.1, 0.25, 1.0]  # they passed the loss constraint ...
    assert outcome.chosen is None  # ... but strict at N=4 dominates each of them
    assert choose(outcome.study, tuner.settings) is not None  # without strict's point the old rule picked one
    config = build_config(tuner.result([outcome], confirm(tuner, [outcome], PROBLEMS)))
    assert config.methods["cactus"].note.startswith("3 trial(s) met the capability-loss constraint, but strict at some")
    assert config.recommendation.reason.endswith(  # the reason says why, as the method's note does
        f"; cactus had points within it, but strict (modeled {config.recommendation.modeled_speedup:.2f}x at N=4) is "
        "as fast and as accurate as each"
    )
    slower = make(tmp_path / "slower", Synthetic(cliff=1.0, strict_accept=0.3), trials=4)
    assert slower.tune_method("cactus").chosen.params["knob"] == 1.0  # 0.5 N beats strict's 0.3 N


@pytest.mark.slow
def test_job_confirms_logs_to_mlflow_and_exports_both_bounds(tmp_path):
    """The whole job on a written task of 60 problems with the synthetic evaluation (no models)."""
    data = tmp_path / "synth.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(60)))
    task = tmp_path / "synth.yaml"
    task.write_text(
        f"name: synth\nversion: 1\ndataset: {{path: json, data_files: {data}}}\n"
        "grader: {kind: math}\nmax_new_tokens: 8\n"
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = TuneSettings(
        task=str(task),
        methods=["cactus"],
        n_drafts=[4],
        trials=4,
        stage_size=100,
        c_rel=0.2,
        epsilon=0.15,
        output_dir=str(tmp_path / "runs"),
        mlflow_uri=uri,
    )
    lucky, lines = Lucky(), []
    config, path = run_tune_job(settings, Pair(), progress=False, evaluate_fn=lucky, log=lines.append)
    result = config.methods["cactus"]
    assert result.feasible and result.knob == 1.0 and result.drop_upper_bound <= 0.15
    assert result.search_drop_upper_bound is not None and len(result.confirmation["attempts"]) == 2
    assert any("FAILED" in line for line in lines) and any("confirmed" in line for line in lines)
    assert load_config(path).methods["cactus"].drop_upper_bound == result.drop_upper_bound
    assert config.recommendation.method == "cactus" and "speed margin" in config.recommendation.reason
    with console.capture() as captured:  # the summary `relaxtune tune` prints
        _summary(config, path)
    text = " ".join(captured.get().split())
    assert (
        "yes (try 2)" in text
        and "confirmation on the held-out problems (30 problems): 2 allowed, each at 95.0%" in text
    )  # the default: half of the 60 problems held out before any generation
    assert (
        "promise: over problems like this task's, the true accuracy drop vs strict of every exported point is at "
        "most 0.15 with confidence 0.9: the 30 confirmation problems were held out before any generation" in text
    )
    assert config.confirmation["samples"] == "holdout" and "every method, knob and N" in config.confirmation["promise"]
    assert f"{result.search_drop_upper_bound:.3f} │ {result.drop_upper_bound:.3f}" in text  # search and confirm UCB
    assert config.sample["problems"] == 60 and config.sample["smallest_certifiable"] < 0.15
    client = MlflowClient(uri)
    study = next(
        r
        for r in client.search_runs([client.get_experiment_by_name("relaxtune-synth").experiment_id])
        if r.data.tags.get("relaxtune.kind") == "study"
    )
    assert study.data.metrics["confirm_drop_ucb"] == pytest.approx(result.drop_upper_bound)
    assert study.data.metrics["search_drop_ucb"] == pytest.approx(result.search_drop_upper_bound)
    assert study.data.tags["relaxtune.confirmed"].endswith("(attempt 2)")
    assert "confirmation.json" in {a.path for a in client.list_artifacts(study.info.run_id)}
    task_run = next(
        r
        for r in client.search_runs([client.get_experiment_by_name("relaxtune-synth").experiment_id])
        if r.data.tags.get("relaxtune.kind") == "task"
    )
    assert task_run.data.tags["relaxtune.promise"] == config.confirmation["promise"]
    assert Path(path).exists()

    # --confirm seeds: the same job states the weaker promise in the YAML, the summary and the task run
    seeds = settings.model_copy(
        update={
            "confirm": "seeds",
            "output_dir": str(tmp_path / "seeds"),
            "mlflow_uri": f"sqlite:///{tmp_path / 'seeds.db'}",
        }
    )
    config, path = run_tune_job(seeds, Pair(), progress=False, evaluate_fn=Lucky(), log=lambda m: None)
    assert config.confirmation["problems"] == 60 and config.confirmation["promise"].startswith(
        "about these 60 problems, not new ones: the confirmation re-ran the search's own problems with fresh seeds"
    )
    with console.capture() as captured:
        _summary(config, path)
    assert "promise: about these 60 problems, not new ones" in " ".join(captured.get().split())
    client = MlflowClient(seeds.mlflow_uri)
    task_run = next(
        r
        for r in client.search_runs([client.get_experiment_by_name("relaxtune-synth").experiment_id])
        if r.data.tags.get("relaxtune.kind") == "task"
    )
    assert task_run.data.tags["relaxtune.promise"].startswith("about these 60 problems, not new ones")


def write_synth(tmp_path, n: int) -> str:
    data = tmp_path / f"synth{n}.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(n)))
    task = tmp_path / f"synth{n}.yaml"
    task.write_text(
        f"name: synth{n}\nversion: 1\ndataset: {{path: json, data_files: {data}}}\n"
        "grader: {kind: math}\nmax_new_tokens: 8\n"
    )
    return str(task)


def test_checks_judge_at_the_confirmations_confidence_before_any_generation(tmp_path):
    """100 problems, epsilon 0.05, two methods x two confirmations: the search's 50 problems
    could certify 0.05 at 0.9 (floor 0.045), but each confirmation is judged at 0.975 on the
    other 50 (floor 0.077): refused, naming the sample that would do. 8 problems (the README's
    demo): neither can, so the job runs with a warning and recommends strict."""
    from relaxtune.certify.planning import fewest_problems
    from relaxtune.tune.checks import ConfirmationError

    settings = TuneSettings(
        task=write_synth(tmp_path, 100),
        methods=["cactus", "mentored"],
        n_drafts=[4],
        trials=4,
        output_dir=str(tmp_path / "runs"),
        epsilon=0.05,
    )
    with pytest.raises(ConfirmationError) as err:
        prepare(settings, Pair())
    assert fewest_problems(0.05, 0.975) == 81
    assert str(err.value) == (
        "no confirmation can pass: --confirm holdout keeps 50 of the 100 problems for confirmation, judged at 0.975 "
        "one-sided (0.9 split over 4 planned confirmation(s)), and their smallest certifiable drop is 0.077 > "
        "epsilon 0.05; at least 162 problems (--limit) would let a confirmation pass (fewer methods or "
        "--confirmations split the confidence less), or a larger --epsilon; `relaxtune plan` says what certifies "
        "with a given power"
    )
    lines: list[str] = []
    demo = settings.model_copy(update={"limit": 8})
    prepare(demo, Pair(), log=lines.append)
    assert lines == [
        "warning: no confirmation can pass: --confirm holdout keeps 4 of the 8 problems for confirmation, judged at "
        "0.975 one-sided (0.9 split over 4 planned confirmation(s)), and their smallest certifiable drop is 0.612 > "
        "epsilon 0.05; at least 162 problems (--limit) would let a confirmation pass (fewer methods or "
        "--confirmations split the confidence less), or a larger --epsilon; `relaxtune plan` says what certifies "
        "with a given power. The search cannot certify epsilon either (its 4 problems: 0.438 at 0.9): "
        "this job explores "
        "and will recommend strict"
    ]
    seeds = settings.model_copy(update={"confirm": "seeds", "methods": ["cactus"], "confirmations": 1})
    assert prepare(seeds, Pair(), log=lines.append) and len(lines) == 1  # 100 problems at 0.9: floor 0.023
