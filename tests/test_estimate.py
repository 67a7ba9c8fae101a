"""The plan and time estimate a tuning job prints before its first generation."""

import json
from types import SimpleNamespace

import pytest

from relaxtune.decoding.serving import ServingProfile
from relaxtune.decoding.speed import CostProfile
from relaxtune.tune.estimate import (
    FIGURE_SECONDS,
    MLFLOW_SECONDS,
    estimate_job,
    figure_count,
    prefill_seconds,
    row_round,
)
from relaxtune.tune.progress import prior_length
from relaxtune.tune.settings import TuneSettings

SPEC = SimpleNamespace(repeats=1, max_new_tokens=384)


def groups(settings: TuneSettings) -> tuple:
    """What ``estimate_job`` reads of a job's settings: its search and statistics groups."""
    return settings.search, settings.stats


def readme_job(**over) -> TuneSettings:
    """The README's main job: humaneval, cactus and mentored, 8 problems, N = 4, 2 trials."""
    return TuneSettings(
        **{"task": "humaneval", "methods": ["cactus", "mentored"], "limit": 8, "n_drafts": [4], "trials": 2} | over
    )


def test_samples_tokens_and_seconds_per_phase():
    # one round at N = 4: 4 drafter steps of 50 ms and one verify pass of 200 ms = 0.4 s; at the
    # prior acceptance (0.6 N = 2.4 drafts) a round yields 3.4 tokens: 0.4 / 3.4 s per token of one row
    profile = CostProfile(t_ar=0.2, t_draft=0.05, t_verify={5: 0.2})
    est = estimate_job(*groups(readme_job()), SPEC, 8, 8, profile, length=(100.0, "given"), batch_size=8, load=(0.5, 2))
    per_token = 0.4 / 3.4
    rows = {p.name: (p.least_samples, p.samples, p.tokens) for p in est.phases}
    assert rows == {
        "strict N=4": (8, 8, 800),
        "cactus trials": (8, 16, 1600),
        "mentored trials": (8, 16, 1600),
        "confirmations": (0, 64, 6400),
    }  # 2 methods x 2 attempts x (8 relaxed + 8 strict)
    strict, cactus, _, confirm = est.phases
    assert strict.seconds == pytest.approx(800 * per_token / 8**0.66)  # 8 rows together
    assert cactus.seconds == pytest.approx(1600 * per_token / 4**0.66)  # stages of 4 problems: 4 rows
    assert cactus.least_seconds == pytest.approx(800 * per_token / 4**0.66)  # pruned after the first stage
    assert confirm.seconds == pytest.approx(6400 * per_token / 8**0.66) and confirm.least_seconds == 0
    assert est.seconds == pytest.approx(800 * per_token / 8**0.66 + 3200 * per_token / 4**0.66)
    assert est.least_seconds == pytest.approx(800 * per_token / 8**0.66 + 1600 * per_token / 4**0.66)
    assert est.confirm_seconds == confirm.seconds
    assert est.tokens_per_second == pytest.approx(3.4 / 0.4) and est.busy == []
    lines = est.lines()
    assert lines[0] == "plan: strict N=4: 8 samples, about 800 tokens (8 problems x 1)"
    assert lines[1].startswith(
        "plan: cactus trials: 8-16 samples, about 1,600 tokens (2 trials, each 8 samples in "
        "stages of 4 problems, 4 if pruned after the first)"
    )
    assert lines[4].startswith(
        f"estimate: about {_clock(est.seconds + 4)} for the job (0:00 so far, 0:04 for MLflow and the figures) of "
        f"which {_clock(est.seconds)} for strict and the trials ("
    )  # no figures, nothing spent before: the finish's MLflow prior alone
    assert len(lines) == 5  # an idle machine: no busy line
    # llama.cpp on a CPU gains little from rows (its README table): the README job on it took 6:28 for
    # strict and the trials against 3:10 estimated with the transformers exponent, 6:53 with its own
    llama = estimate_job(
        *groups(readme_job()),
        SPEC,
        8,
        8,
        profile,
        length=(100.0, "given"),
        batch_size=8,
        device="llamacpp",
        load=(0.5, 2),
    )
    assert llama.phases[0].seconds == pytest.approx(800 * per_token / 8**0.1)
    assert llama.phases[1].seconds == pytest.approx(1600 * per_token / 4**0.1)
    cuda = estimate_job(
        *groups(readme_job()), SPEC, 8, 8, profile, length=(100.0, "given"), device="cuda:1", load=(0.5, 2)
    )
    assert cuda.phases[0].seconds == pytest.approx(800 * per_token / 8**0.9)  # a device index prices as its kind
    done = estimate_job(
        *groups(readme_job()), SPEC, 8, 8, profile, length=(100.0, "given"), strict_done=100, load=(0.5, 2)
    )
    assert done.phases[0].samples == 0 and done.phases[0].seconds == 0.0  # more recorded than needed: none left
    for bad in (
        dict(n_search=-3),
        dict(strict_done=-5),
        dict(batch_size=0),
        dict(length=(-10.0, "x")),
        dict(length=(float("nan"), "x")),
        dict(length=(float("inf"), "x")),
    ):
        args = dict(n_search=8, n_confirm=8, length=(100.0, "given"), load=(0.5, 2)) | bad
        with pytest.raises(ValueError, match="estimate_job: "):
            estimate_job(*groups(readme_job()), SPEC, args.pop("n_search"), args.pop("n_confirm"), profile, **args)


def test_a_busy_machine_is_named_and_the_idle_time_given():
    saved = CostProfile(t_ar=0.2, t_draft=0.05, t_verify={5: 0.2})
    now = CostProfile(t_ar=2.6, t_draft=0.65, t_verify={5: 2.6})  # 13x slower: other work shares the cores
    est = estimate_job(*groups(readme_job()), SPEC, 8, 8, saved, now, saved, length=(100.0, "given"), load=(5.25, 2))
    assert est.slowdown == pytest.approx(13.0)
    idle = estimate_job(*groups(readme_job()), SPEC, 8, 8, saved, length=(100.0, "given"), load=(0.5, 2))
    assert est.seconds == pytest.approx(13 * idle.seconds)  # priced at the speed measured now
    busy = est.lines()[-1]
    assert busy.startswith(
        "machine looks busy: one forward step takes 13.0x the saved profile's (t_AR 2600 ms now, "
        "200 ms saved); load average 5.2 on 2 cores."
    )
    minutes, seconds = divmod(round(idle.seconds), 60)
    assert busy.endswith(
        f"at the saved profile's speed it would take about {minutes}:{seconds:02d}. For the "
        "README's timings run it on an idle machine."
    )
    assert (
        estimate_job(
            *groups(readme_job()), SPEC, 8, 8, saved, saved.__class__(0.22, 0.05, {5: 0.2}), saved, load=(1.0, 2)
        ).busy
        == []
    )  # 10 % off: within the margin


def test_more_draft_lengths_a_resumed_strict_and_no_profile():
    s = readme_job(n_drafts=[2, 4, 8], trials=6, stage_size=3)
    est = estimate_job(
        *groups(s), SimpleNamespace(repeats=2, max_new_tokens=100), 8, 4, 0.3, strict_done=6, load=(None, 2)
    )
    strict, cactus, mentored, confirm = est.phases
    assert (strict.samples, strict.seconds) == (10, None) and "already recorded" in strict.detail
    assert "up to 2 other N" in strict.detail  # cactus: 6 trials, 4 on its grid: 2 sampled ones may move N
    assert (cactus.samples, cactus.least_samples) == (6 * 16, 6 * 6)  # stages of 3 problems x 2 repeats
    assert confirm.samples == 2 * 2 * 2 * 8 and est.length == 50.0
    assert est.lines()[-1].startswith("estimate: no wall time")


def test_the_response_length_comes_from_the_pair_records(tmp_path):
    assert prior_length(tmp_path / "none", 384) == (192.0, "assumed: 50% of the task's 384-token budget")
    rows = [{"response_tokens": 90}, {"response_tokens": 110}, {"failed": True, "response_tokens": 0}]
    (tmp_path / "strict__N4__seed0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    assert prior_length(tmp_path, 384) == (100.0, "the mean of 2 recorded responses")


def test_the_whole_job_adds_what_was_spent_the_prefill_and_the_finish():
    # the README job on llama.cpp: 4 search problems (holdout), rows of 4, prompts of 150 tokens
    profile = CostProfile(t_ar=0.04, t_draft=0.02, t_verify={5: 0.15})
    base = dict(length=(130.0, "given"), batch_size=16, device="llamacpp", load=(0.5, 2))
    bare = estimate_job(*groups(readme_job()), SPEC, 4, 4, profile, **base)
    full = estimate_job(
        *groups(readme_job()),
        SPEC,
        4,
        4,
        profile,
        **base,
        prompt_tokens=150.0,
        elapsed=40.0,
        figures=figure_count(["cactus", "mentored"]),
    )
    per_prompt_token = 0.15 / 5 * (1 + 0.02 / 0.04)  # a verify token, and the drafter's half of it
    assert prefill_seconds(profile, 4) == pytest.approx(per_prompt_token)
    # strict: 4 samples in one batch of 4 rows; each trial: 4 samples; 2 methods x 2 trials
    gain = 4**0.1
    assert full.phases[0].seconds - bare.phases[0].seconds == pytest.approx(4 * 150 * per_prompt_token / gain)
    assert full.seconds - bare.seconds == pytest.approx(20 * 150 * per_prompt_token / gain)  # 20 samples prefilled
    assert figure_count(["cactus", "mentored"]) == 5  # combined + (Pareto, speed vs knob) per method
    assert figure_count(["strict"]) == 2 and figure_count(["cactus"], extra_per_method=1) == 4
    assert full.finish == pytest.approx(MLFLOW_SECONDS + 5 * FIGURE_SECONDS)
    assert full.job_seconds == pytest.approx(40.0 + full.seconds + full.finish)
    assert bare.job_seconds == pytest.approx(bare.seconds + MLFLOW_SECONDS)
    assert full.lines()[-1].startswith(
        f"estimate: about {_clock(full.job_seconds)} for the job (0:40 so far, 0:12 for MLflow and the figures) "
        f"of which {_clock(full.seconds)} for strict and the trials"
    )
    for bad in (dict(prompt_tokens=-1.0), dict(elapsed=float("nan"))):
        with pytest.raises(ValueError, match="estimate_job: prompt_tokens and elapsed"):
            estimate_job(*groups(readme_job()), SPEC, 4, 4, profile, **base, **bad)


def _clock(seconds):
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}:{s:02d}"


def test_a_serving_profile_prices_rows_at_the_measured_batch_sizes():
    def at(b, scale):
        return CostProfile(t_ar=0.04 * scale, t_draft=0.02 * scale, t_verify={5: 0.15 * scale}, batch_size=b)

    serving = ServingProfile({1: at(1, 1.0), 4: at(4, 3.0), 16: at(16, 9.0)})
    one = 4 * 0.02 + 0.15  # a round at batch 1: 4 drafter steps and a verify pass
    assert row_round(serving, 4, 1, 0.1) == (pytest.approx(one), 1.0)
    assert row_round(serving, 4, 4, 0.1) == (pytest.approx(one * 3 / 4), 1.0)  # a row's share of a batch of 4
    assert row_round(serving, 4, 8, 0.1) == (pytest.approx(one * 3 / 4), pytest.approx(2**0.1))  # beyond 4
    assert row_round(serving, 4, 16, 0.1) == (pytest.approx(one * 9 / 16), 1.0)
    assert row_round(at(1, 1.0), 4, 8, 0.1) == (pytest.approx(one), pytest.approx(8**0.1))  # a single profile
    with pytest.raises(ValueError, match="rows must be >= 1"):
        row_round(serving, 4, 0, 0.1)
    # the job priced with it: strict's 4 rows at batch 4's share, the prefill and the speed now at batch 1
    est = estimate_job(
        *groups(readme_job()), SPEC, 4, 4, serving, length=(100.0, "given"), device="llamacpp", load=(0.5, 2)
    )
    assert est.phases[0].seconds == pytest.approx(4 * 100 * (one * 3 / 4) / (0.6 * 4 + 1))
    assert est.tokens_per_second == pytest.approx((0.6 * 4 + 1) / one)


def test_the_estimate_revised_from_strict_prices_the_trials_at_its_measured_time_a_sample():
    profile = CostProfile(t_ar=0.04, t_draft=0.02, t_verify={5: 0.15})
    est = estimate_job(
        *groups(readme_job()), SPEC, 4, 4, profile, length=(130.0, "given"), device="llamacpp", load=(0.5, 2), figures=5
    )
    assert est.search_samples == 4 + 2 * 2 * 4  # strict, and 2 trials of 4 samples per method
    total, line = est.revised(elapsed=100.0, samples=4, seconds=48.0)
    assert total == pytest.approx(100.0 + 16 * 12.0 + MLFLOW_SECONDS + 5 * FIGURE_SECONDS)
    assert line == (
        f"estimate after strict: about {_clock(total)} for the job (1:40 so far; strict took 48 s for 4 samples, "
        "12.0 s a sample: the other 16 samples of the trials priced alike, plus 0:12 for MLflow and the figures; "
        "confirmations not counted)"
    )
    for bad in (dict(samples=0), dict(seconds=-1.0), dict(elapsed=-2.0)):
        with pytest.raises(ValueError, match="revised: "):
            est.revised(**(dict(elapsed=1.0, samples=4, seconds=1.0) | bad))
