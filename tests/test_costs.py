"""Cost profiles that survive a busy machine: interleaved timing until the spread is
small, spreads and flags kept with the profile, the saved profile compared with a
new measurement, --remeasure-costs, and the cautions of the summary."""

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from relaxtune.backends.costs import JOB_MAX_PASSES, JOB_MIN_PASSES, job_costs, measure_profile
from relaxtune.decoding.serving import ServingProfile
from relaxtune.decoding.speed import COST_MARGIN, SPREAD_TOLERANCE, CostProfile, measure_interleaved
from relaxtune.job.run import run_tune_job
from relaxtune.report.export import cautions
from relaxtune.tasks.spec import build_prompt_ids, load_problems, load_task
from relaxtune.tune.point_records import DecodeConfig, records_path
from relaxtune.tune.settings import TuneSettings

from .clocks import SquareClock, timed
from .synthetic import Synthetic
from .tiny_models import tiny_tokenizer
from .tiny_task import write_tiny_task


class ScriptedClock:
    """A clock that jobs advance by scripted durations (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def job(self, name: str, durations, calls: list):
        it = iter(durations)

        def run():
            calls.append(name)
            self.now += next(it)

        return run


def test_quiet_timings_stop_after_the_minimum_passes():
    clock, calls = ScriptedClock(), []
    jobs = {
        "a": clock.job("a", [9.0] + [1.0, 1.02, 1.01, 1.0, 1.03] + [5.0] * 20, calls),
        "b": clock.job("b", [9.0] + [2.0, 2.1, 2.05, 2.0, 2.2] + [5.0] * 20, calls),
    }
    fastest, spread, passes = measure_interleaved(jobs, min_passes=5, max_passes=10, clock=clock)
    assert passes == 5 and fastest == {"a": 1.0, "b": 2.0}
    assert spread["a"] == pytest.approx(0.01) and spread["b"] == pytest.approx(0.025)
    assert calls == ["a", "b"] + ["a", "b"] * 5  # one untimed warm-up each, then interleaved passes


def test_a_disturbance_is_outlasted_or_reported():
    clock, calls = ScriptedClock(), []
    # a burst of other work disturbs passes 1-4 of both jobs; quiet afterwards: more passes, then a small spread
    a = [1.0] + [3.0, 1.5, 4.0, 2.0] + [1.0] * 10
    b = [1.0] + [6.0, 3.0, 8.0, 4.0] + [2.0] * 10
    fastest, spread, passes = measure_interleaved(
        {"a": clock.job("a", a, calls), "b": clock.job("b", b, calls)}, min_passes=3, max_passes=12, clock=clock
    )
    assert fastest == {"a": 1.0, "b": 2.0} and passes == 8 and max(spread.values()) <= SPREAD_TOLERANCE
    # a machine that never quiets down: all passes run, the spread says so
    clock = ScriptedClock()
    noisy = [1.0] + [1.0, 2.0, 1.5, 3.0] * 5
    fastest, spread, passes = measure_interleaved(
        {"a": clock.job("a", noisy, [])}, min_passes=3, max_passes=8, clock=clock
    )
    assert passes == 8 and fastest == {"a": 1.0} and spread["a"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="min_passes"):
        measure_interleaved({"a": lambda: None}, min_passes=4, max_passes=2)


def test_profile_round_trip_and_difference():
    prof = CostProfile(0.2, 0.06, {5: 0.21}, "here", {"t_ar": 0.02}, 7, ["noisy measurement: ..."])
    back = CostProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back == prof
    old = CostProfile.from_dict({"t_ar": 0.2, "t_draft": 0.06, "t_verify": {"5": 0.21}})  # saved before spreads
    assert old.spread == {} and old.passes == 0 and old.flags == []
    other = CostProfile(0.4, 0.09, {5: 0.42})  # twice as slow in absolute terms, cheaper drafter
    gap, ratio = other.difference(prof)
    assert ratio == "c_rel" and gap == pytest.approx(0.25)  # 0.225 against 0.3; verify/t_AR unchanged
    assert "spread up to 2%" in prof.summary() and "c_rel 0.300" in prof.summary()


class MeasuringPair:
    """A backend whose measurements are scripted profiles (counts its calls); a
    ``CostProfile`` is a measurement at batch size 1 alone."""

    name = "measuring-pair"

    def __init__(self, *profiles: CostProfile | ServingProfile):
        self.profiles, self.calls, self.sizes = list(profiles), [], []
        self.tokenizer = tiny_tokenizer()

    def cost_profile(self, prompt_ids, n_drafts, batch_sizes=(1,), min_passes=5, max_passes=15):
        self.calls.append(list(n_drafts))
        self.sizes.append((list(batch_sizes), min_passes, max_passes))
        out = self.profiles.pop(0)
        return ServingProfile.single(out) if isinstance(out, CostProfile) else out


def _setup(tmp_path, **over):
    spec = load_task(write_tiny_task(tmp_path))
    settings = TuneSettings(
        **{"task": spec.source_file, "output_dir": str(tmp_path / "runs"), "n_drafts": [4], "confirm": "seeds"} | over
    )
    return settings, spec, load_problems(spec, 2)


def _saved(settings, spec, pair) -> Path:
    return records_path(Path(settings.output_dir), spec, DecodeConfig(), pair.name).with_name("cost_profile.json")


def cost_profile(settings, spec, problems, pair, log, new_trials=True, batch_sizes=(1,)):
    """The job's cost step, as ``run_tune_job`` calls it."""
    return job_costs(
        pair,
        lambda: build_prompt_ids(pair.tokenizer, spec, problems[0]),
        settings.n_drafts,
        _saved(settings, spec, pair),
        batch_sizes=batch_sizes,
        c_rel=settings.c_rel,
        remeasure=settings.remeasure_costs,
        new_trials=new_trials,
        log=log,
    )


QUIET = CostProfile(0.2, 0.06, {5: 0.2}, spread={"t_ar": 0.02}, passes=5)


def test_the_saved_profile_is_compared_with_a_new_measurement(tmp_path):
    settings, spec, problems = _setup(tmp_path)
    logs: list[str] = []
    slower = CostProfile(0.4, 0.12, {5: 0.4})  # everything twice as slow: the same ratios
    cheaper = CostProfile(0.2, 0.03, {5: 0.2, 11: 0.5})  # the drafter halved: c_rel 0.15 against 0.3
    pair = MeasuringPair(QUIET, slower, cheaper, CostProfile(0.3, 0.03, {5: 0.3}))
    first = cost_profile(settings, spec, problems, pair, logs.append)
    assert first == ServingProfile.single(QUIET) and _read(settings, spec, pair) == first
    assert pair.sizes[0] == ([1], JOB_MIN_PASSES, JOB_MAX_PASSES)  # the job's passes, at the sizes asked
    assert cost_profile(settings, spec, problems, pair, logs.append) == first  # same ratios: reused, no flag
    wider = settings.model_copy(update={"n_drafts": [4, 10]})
    flagged = cost_profile(wider, spec, problems, pair, logs.append)
    assert flagged.c_rel == pytest.approx(0.3)  # priced with the saved profile ...
    assert flagged.at(1).t_verify == {5: 0.2, 11: 0.5}  # ... extended to N = 10 at the ratio measured now
    assert len(flagged.flags) == 1 and "batch 1: this run measured c_rel 50% off the saved profile" in flagged.flags[0]
    assert "--remeasure-costs" in flagged.flags[0] and f"{COST_MARGIN:.0%}" in flagged.flags[0]
    saved = _read(settings, spec, pair)
    assert saved.flags == [] and saved.at(1).t_verify == {5: 0.2, 11: 0.5}  # the flag is this run's, not the file's
    again = cost_profile(settings.model_copy(update={"remeasure_costs": True}), spec, problems, pair, logs.append)
    assert again.c_rel == pytest.approx(0.1) and again.flags == []
    assert _read(settings, spec, pair).c_rel == pytest.approx(0.1)
    assert any("replacing the saved profile" in line for line in logs)
    assert len(pair.calls) == 4 and pair.calls[2] == [4, 10]
    noisy = CostProfile(0.9, 0.05, {5: 0.9}, spread={"t_ar": 0.6}, flags=["noisy measurement: spread t_ar 60%"])
    unconfirmed = cost_profile(settings, spec, problems, MeasuringPair(noisy), logs.append)
    assert unconfirmed.c_rel == pytest.approx(0.1) and len(unconfirmed.flags) == 1  # no comparison with noise
    assert (
        "check of the saved profile was disturbed" in unconfirmed.flags[0]
        and "spread up to 60%" in unconfirmed.flags[0]
    )
    # an export never measures; a fixed --c-rel overrides everything
    assert cost_profile(
        settings, spec, problems, MeasuringPair(), logs.append, new_trials=False
    ).c_rel == pytest.approx(0.1)
    assert cost_profile(settings.model_copy(update={"c_rel": 0.2}), spec, problems, MeasuringPair(), logs.append) == 0.2


def _read(settings, spec, pair) -> ServingProfile:
    return ServingProfile.from_dict(json.loads(_saved(settings, spec, pair).read_text()))


def _at(b: int, t_ar: float, t_draft: float, t_verify: dict, **kw) -> CostProfile:
    return CostProfile(t_ar, t_draft, t_verify, f"here, batch {b}", batch_size=b, **kw)


def test_each_batch_size_is_compared_with_the_saved_one_and_new_ones_are_added(tmp_path):
    settings, spec, problems = _setup(tmp_path)
    logs: list[str] = []
    one, four = _at(1, 0.2, 0.06, {5: 0.2}), _at(4, 0.3, 0.12, {5: 0.6})
    # the second run: batch 1 as before; batch 4 verifies at 3 steps (2 saved): flagged there alone; batch 16 is new
    # and everything measured twice as slow (a slower moment): 16 is added on the saved scale (batch 1's t_AR)
    later = ServingProfile(
        {
            1: _at(1, 0.4, 0.12, {5: 0.4}),
            4: _at(4, 0.6, 0.24, {5: 1.8}),
            16: _at(16, 1.2, 0.6, {5: 4.8}),
        }
    )
    pair = MeasuringPair(ServingProfile({1: one, 4: four}), later)
    first = cost_profile(settings, spec, problems, pair, logs.append, batch_sizes=(1, 4))
    assert first.batch_sizes == [1, 4] and _read(settings, spec, pair) == first
    second = cost_profile(settings, spec, problems, pair, logs.append, batch_sizes=(1, 4, 16))
    assert pair.sizes[1][0] == [1, 4, 16]
    assert second.batch_sizes == [1, 4, 16] and second.at(1) == one  # within the margin: the saved one
    assert second.at(4).t_verify == {5: 0.6} and len(second.at(4).flags) == 1  # priced with the saved one, flagged
    assert second.flags == [second.at(4).flags[0].join(["batch 4: ", ""])]
    assert "t_verify[5]/t_ar 50% off the saved profile" in second.at(4).flags[0]
    added = second.at(16)
    assert (added.t_ar, added.t_draft, added.t_verify[5]) == pytest.approx((0.6, 0.3, 2.4)) and added.batch_size == 16
    assert any("cost profile extended to batch size 16" in line for line in logs)
    saved = _read(settings, spec, pair)
    assert saved.batch_sizes == [1, 4, 16] and saved.flags == [] and saved.at(16) == added
    # an export prices with the saved profile at the sizes it asks for (those saved), never measuring
    export = cost_profile(settings, spec, problems, MeasuringPair(), logs.append, new_trials=False, batch_sizes=(1, 4))
    assert export.batch_sizes == [1, 4] and export.at(4).t_verify == {5: 0.6}


def test_a_profile_saved_before_batch_sizes_reads_as_batch_1_and_is_extended(tmp_path):
    settings, spec, problems = _setup(tmp_path)
    pair = MeasuringPair(ServingProfile({1: QUIET, 4: _at(4, 0.3, 0.09, {5: 0.5})}))
    path = _saved(settings, spec, pair)
    path.parent.mkdir(parents=True)
    old = QUIET.to_dict()
    del old["batch_size"]  # as a job before issue 37 saved it
    path.write_text(json.dumps(old))
    logs: list[str] = []
    got = cost_profile(settings, spec, problems, pair, logs.append, batch_sizes=(1, 4))
    assert got.at(1) == QUIET and got.at(4).t_verify == {5: 0.5} and got.flags == []
    assert json.loads(path.read_text())["batch_sizes"].keys() == {"1", "4"}  # saved in the new form
    assert cost_profile(settings, spec, problems, MeasuringPair(), logs.append, new_trials=False).batch_sizes == [1]


def test_measure_profile_times_every_shape_of_every_batch_size_in_one_pass():
    calls: list = []
    clock = SquareClock()

    def job(model, k, b):
        return lambda: calls.append((model, k, b))

    serving = measure_profile(job, [4, 2], (4, 1), True, "here", min_passes=3, max_passes=3, clock=clock)
    order = [("verify", 1), ("draft", 1), ("verify", 3), ("verify", 5)]
    one_pass = [(m, k, b) for b in (1, 4) for m, k in order]
    assert calls == one_pass * 4  # a warm-up, then three passes, each over both batch sizes
    assert [p.batch_size for p in serving.profiles.values()] == [1, 4] and serving.declared == 1
    for i, (b, p) in enumerate(serving.profiles.items()):
        assert (p.t_ar, p.t_draft, p.t_verify[3], p.t_verify[5]) == pytest.approx([timed(4 * i + j) for j in range(4)])
        assert p.source.startswith(f"here, batch {b}, measured ") and p.passes == 3 and len(p.flags) == 1
        assert set(p.spread) == {"t_ar", "t_draft", "t_verify[3]", "t_verify[5]"}
    with pytest.raises(ValueError, match="integers >= 1"):
        measure_profile(job, [4], [], True, "here")


@pytest.mark.slow
def test_a_noisy_measurement_is_flagged_in_the_yaml_the_mlflow_run_and_the_summary(tmp_path):
    settings, spec, problems = _setup(
        tmp_path, methods=["cactus"], trials=1, limit=2, stage_size=2, mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"
    )
    noisy = CostProfile(
        0.2,
        0.2,
        {5: 0.21},
        spread={"t_ar": 0.4, "t_draft": 0.05, "t_verify[5]": 0.1},
        passes=15,
        flags=["noisy measurement: spread t_ar 40% after 15 interleaved passes"],
    )
    logs: list[str] = []
    config, path = run_tune_job(
        settings, MeasuringPair(noisy), evaluate_fn=Synthetic(), progress=False, log=logs.append
    )
    exported = yaml.safe_load(Path(path).read_text())
    at1 = exported["cost_profile"]["batch_sizes"]["1"]  # JSON's keys: a YAML of plain strings
    assert at1["flags"] == noisy.flags and at1["spread"]["t_ar"] == 0.4 and at1["batch_size"] == 1
    assert exported["serving_batch_sizes"] == [1] and exported["recommendation"]["batch_size"] == 1
    run = MlflowClient(settings.mlflow_uri).get_run(config.mlflow["run_id"])
    assert run.data.tags["relaxtune.cost_flags"] == f"batch 1: {noisy.flags[0]}"
    assert run.data.metrics["cost_spread_max"] == 0.4
    # c_rel 1: strict at N = 4 models (l + 1) / 5 < 1, slower than plain decoding: called out
    fast = config.recommendation.fastest_speculative
    assert config.recommendation.method == "plain" and fast.method == "strict" and fast.modeled_speedup < 1
    lines = cautions(config)
    assert lines[0] == f"cost profile: batch 1: {noisy.flags[0]}" and "slower than plain decoding" in lines[1]
    # the point is named as the fastest, never as what to deploy: the recommendation is plain decoding
    assert config.recommendation.decoding == "plain" and lines[1].startswith(
        f"the fastest speculative point (strict at N={fast.n_draft}) models "
    )
    assert "the recommendation is plain decoding (serve the verifier alone)" in lines[1]
    assert "remeasure_costs" not in yaml.safe_load((Path(settings.output_dir) / "tiny_math.job.yaml").read_text())


@pytest.mark.slow  # about 6-11 s: the default run stays under 8 minutes on 2 cores
def test_a_fast_recommendation_has_no_cautions(tmp_path):
    settings, spec, problems = _setup(tmp_path, methods=["cactus"], trials=1, limit=2, stage_size=2)
    config, _ = run_tune_job(
        settings,
        MeasuringPair(QUIET),
        evaluate_fn=Synthetic(strict_accept=0.5),
        progress=False,
        track=False,
        log=lambda m: None,
    )
    assert config.recommendation.modeled_speedup > 1 and cautions(config) == []


def test_the_search_prices_at_the_declared_batch_size_and_the_config_says_so(tmp_path):
    """--serving-batch-size 4: trials, recommendation and c_rel priced with batch 4's costs, every measured
    batch size in the config; an export declaring a batch size the saved profile lacks is refused by name."""
    import optuna

    from relaxtune.backends.costs import CostsError
    from relaxtune.job.steps import declared
    from relaxtune.tune.job_identity import study_name
    from relaxtune.tune.records import trial_metrics

    settings, spec, problems = _setup(
        tmp_path, methods=["cactus"], trials=1, limit=2, stage_size=2, serving_batch_sizes=[1, 16], serving_batch_size=4
    )
    assert settings.serving_batch_sizes == [1, 4, 16]
    # batch 1 verifies 5 tokens at one step's cost (speculation pays); batch 4 at 4 steps, batch 16 at 5
    measured = ServingProfile(
        {
            1: _at(1, 0.1, 0.01, {5: 0.1}),
            4: _at(4, 0.12, 0.03, {5: 0.48}),
            16: _at(16, 0.2, 0.08, {5: 1.0}),
        }
    )
    pair = MeasuringPair(measured)
    config, _ = run_tune_job(
        settings, pair, evaluate_fn=Synthetic(strict_accept=0.5), progress=False, track=False, log=lambda m: None
    )
    assert pair.sizes[0][0] == [1, 4, 16]
    assert config.serving_batch_sizes == [1, 4, 16] and config.recommendation.batch_size == 4
    assert config.c_rel == pytest.approx(0.25)  # batch 4's t_draft / t_AR
    back = ServingProfile.from_dict(config.cost_profile)
    assert back.batch_sizes == [1, 4, 16] and back.weights == {4: 1.0} and back.at(16) == measured.at(16)
    storage = f"sqlite:///{Path(settings.output_dir).resolve() / 'optuna.db'}"
    trial = optuna.load_study(study_name=study_name(spec.name, "cactus", pair.name), storage=storage).trials[0]
    m = trial_metrics(trial, "cactus")
    assert m.batch_size == 4 and m.c_rel == pytest.approx(0.25)
    assert m.speedup == pytest.approx(back.reweighted({4: 1.0}).speedup(m.l_accept, 4, 1.0, m.length_ratio))
    strict4 = config.strict_by_n_draft[4]
    assert strict4["modeled_speedup"] == pytest.approx(back.at(4).speedup(strict4["l_accept"], 4))
    # a job (an export) declaring a batch size the saved profile lacks is refused by name, before any trial is read
    with pytest.raises(CostsError, match=r"holds batch sizes 1, 4, 16, not 32: .*--serving-batch-sizes 1,4,16,32"):
        declared(back, settings.model_copy(update={"serving_batch_size": 32}), Path("cost_profile.json"))
    weighted = declared(
        back, settings.model_copy(update={"serving_batch_size": None, "serving_batch_weights": "1=1,16=3"}), Path("x")
    )
    assert (
        weighted.weights == {1: 1.0, 16: 3.0} and weighted.declared == 16 and declared(0.2, settings, Path("x")) == 0.2
    )
