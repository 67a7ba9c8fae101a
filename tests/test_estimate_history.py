"""The first estimate rests on what earlier runs of the task and pair measured, kept in the cache."""

import json
from types import SimpleNamespace

import pytest

from relaxtune.decoding.speed import CostProfile
from relaxtune.tune.estimate import MLFLOW_SECONDS, estimate_job
from relaxtune.tune.estimate_announce import keep_measures
from relaxtune.tune.estimate_history import KEEP, SEEDS, RunMeasure, history_path, measure_run, recall, remember
from relaxtune.tune.settings import TuneSettings

SPEC = SimpleNamespace(repeats=1, max_new_tokens=384)
HOST = "Test CPU, 2 cores"

# the README job's phase table on a 2-core host (relaxtune-runs/humaneval.phases.json, trimmed)
TIMER = {
    "wall": 207.3,
    "phases": [
        {"name": "cost profile", "wall": 55.0, "overlapped": False},
        {"name": "MLflow (tracker thread)", "wall": 4.4, "overlapped": True},
        {"name": "strict", "wall": 32.0, "overlapped": False},
        {"name": "trials", "wall": 112.0, "overlapped": False},
        {"name": "MLflow", "wall": 0.3, "overlapped": False},
        {"name": "confirmations", "wall": 0.0, "overlapped": False},
        {"name": "export", "wall": 1.2, "overlapped": False},
        {"name": "figures", "wall": 1.3, "overlapped": False},
    ],
    "counts": {"samples generated": 20, "tokens decoded": 2666, "rounds": 546, "drafted tokens": 2184},
}


def groups(settings: TuneSettings) -> tuple:
    """What ``estimate_job`` reads of a job's settings: its search and statistics groups."""
    return settings.search, settings.stats


def readme_job() -> TuneSettings:
    return TuneSettings(task="humaneval", methods=["cactus", "mentored"], limit=8, n_drafts=[4], trials=2)


def test_a_run_is_measured_from_its_phase_table():
    run = measure_run(TIMER, t_ar=0.04, host=HOST)
    assert run == RunMeasure(
        host=HOST,
        samples=20,
        tokens_per_sample=133.3,
        accept=pytest.approx((2666 - 546) / 2184),  # a round emits its accepted drafts and one token of its own
        seconds_per_sample=pytest.approx(144.0 / 20),  # strict, trials and confirmations over the samples
        t_ar=0.04,
        finish_seconds=pytest.approx(0.3 + 1.2 + 1.3),  # the overlapped tracker thread not counted
    )
    assert measure_run({"phases": [], "counts": {"samples generated": 0}}, 0.04, HOST) is None  # read, not run
    no_drafts = measure_run(TIMER | {"counts": {"samples generated": 2, "tokens decoded": 10}}, None, HOST)
    assert no_drafts.accept is None and no_drafts.tokens_per_sample == 5.0


def test_runs_are_kept_per_task_and_pair_the_last_ones_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXTUNE_ESTIMATES", str(tmp_path / "est"))
    path = history_path("humaneval", 4, "d_v_llamacpp")
    assert path == tmp_path / "est" / "humaneval-v4" / "d_v_llamacpp.json"
    assert recall(path, HOST) is None  # nothing kept yet
    for i in range(KEEP + 2):
        assert remember(path, RunMeasure(HOST, 10, 100.0 + i, 0.9, 5.0, 0.04, 3.0)) == path
    kept = recall(path, HOST)
    assert [r.tokens_per_sample for r in kept.runs] == [102.0 + i for i in range(KEEP)]  # the newest KEEP
    assert remember(path, None) is None and remember(None, kept.runs[0]) is None
    monkeypatch.setenv("RELAXTUNE_ESTIMATES", "off")
    assert history_path("humaneval", 4, "d_v_llamacpp") is None and recall(None) is None
    path.write_text("{not json")
    assert recall(path, HOST) is None  # unreadable: no history
    path.write_text(json.dumps({"schema": 99, "runs": []}))
    assert recall(path, HOST) is None


def test_the_estimate_rests_on_this_hosts_runs_scaled_by_t_ar(tmp_path):
    path = tmp_path / "h.json"
    remember(path, RunMeasure(HOST, 20, 130.0, 0.95, 7.0, 0.04, 3.0))
    remember(path, RunMeasure(HOST, 10, 160.0, 0.80, 10.0, 0.04, 5.0))
    remember(path, RunMeasure("Other CPU, 8 cores", 10, 100.0, 1.0, 1.0, 0.01, 1.0))
    history = recall(path, HOST)
    assert history.tokens_per_sample == pytest.approx((20 * 130 + 10 * 160 + 10 * 100) / 40)  # every host
    assert history.accept == pytest.approx((20 * 0.95 + 10 * 0.80 + 10 * 1.0) / 40)
    assert history.finish_seconds == pytest.approx(4.0)  # this host's mean
    per = (20 * 7.0 + 10 * 10.0) / 30  # 8 s a sample here
    profile = CostProfile(t_ar=0.05, t_draft=0.02, t_verify={5: 0.15})  # t_AR now 0.05, theirs 0.04: 1.25x
    est = estimate_job(
        *groups(readme_job()), SPEC, 4, 4, profile, history=history, elapsed=60.0, device="llamacpp", load=(0.5, 2)
    )
    assert [p.seconds for p in est.phases] == pytest.approx([4 * per * 1.25, 8 * per * 1.25, 8 * per * 1.25, 320.0])
    assert est.job_seconds == pytest.approx(60.0 + 20 * per * 1.25 + 4.0)  # 60 + 200 + 4 = 4:24
    assert est.length == pytest.approx(130.0) and est.accept == pytest.approx(0.925) and est.t_ar == 0.05
    assert est.lines()[-1].endswith(
        "at 20.4 tokens/s per sequence measured now; rests on lengths, acceptance and seconds a sample of 3 "
        f"earlier runs of this task and pair (2 of them on this host; {path}), their seconds a sample scaled x1.25 "
        "by t_AR now over theirs: 130 tokens per response (earlier runs' mean), 92% of N drafts accepted, batch 8; "
        "the progress lines correct it from the measured throughput"
    )
    assert est.lines()[-1].startswith("estimate: about 4:24 for the job (1:00 so far, 0:04 for MLflow")
    # on another host: every run's seconds a sample, each scaled by t_AR now over its own (a verifier step as the unit)
    there = recall(path, "New CPU, 4 cores")
    est = estimate_job(*groups(readme_job()), SPEC, 4, 4, profile, history=there, device="llamacpp", load=(0.5, 2))
    scaled = (20 * 7.0 * 0.05 / 0.04 + 10 * 10.0 * 0.05 / 0.04 + 10 * 1.0 * 0.05 / 0.01) / 40
    assert est.phases[0].seconds == pytest.approx(4 * scaled) and est.finish == MLFLOW_SECONDS
    assert "(none on this host: other hosts' seconds a sample, in steps of the verifier; " in est.lines()[-1]
    # no t_AR now (a fixed c_rel): only the length and acceptance carry over, and no time without a profile
    est = estimate_job(*groups(readme_job()), SPEC, 4, 4, 0.2, history=there, device="llamacpp", load=(0.5, 2))
    assert est.seconds is None and est.length == pytest.approx(130.0) and est.accept == pytest.approx(0.925)
    assert (
        "rests on lengths and acceptance of 3 earlier runs of this task and pair (none on this host: the time "
        in (est.lines()[-1])
    )


def test_the_readme_job_has_a_shipped_seed_until_a_run_of_its_own_is_kept(tmp_path):
    pair = "qwen2.5-coder-0.5b-instruct-_qwen2.5-coder-1.5b-instruct_llamacpp"
    path = tmp_path / "humaneval-v4" / f"{pair}.json"
    seeded = recall(path, "AMD EPYC, 2 cores")
    assert seeded.path == SEEDS and seeded.runs == (
        RunMeasure("AMD EPYC, 2 cores", 20, 133.3, 0.9707, 7.1724, 0.039485, 2.792),
    )
    # the README job on that host, its forward step now 1.2x the seed's (a slower build, or a busier machine)
    profile = CostProfile(t_ar=0.039485 * 1.2, t_draft=0.02, t_verify={5: 0.15})
    est = estimate_job(
        *groups(readme_job()), SPEC, 4, 4, profile, history=seeded, elapsed=62.0, device="llamacpp", load=(0, 2)
    )
    assert est.job_seconds == pytest.approx(62.0 + 20 * 7.1724 * 1.2 + 2.792)  # 3:57
    assert (
        "of 1 earlier run of this task and pair, shipped with relaxtune (its developers' run; none of yours"
        in (est.lines()[-1])
    )
    assert recall(tmp_path / "humaneval-v4" / "other_pair.json") is None  # no seed for another pair
    remember(path, RunMeasure("Mine, 2 cores", 4, 100.0, 0.5, 9.0, 0.05, 1.0))
    assert recall(path).runs == (RunMeasure("Mine, 2 cores", 4, 100.0, 0.5, 9.0, 0.05, 1.0),)  # yours replace it
    assert json.loads(SEEDS.read_text())[f"humaneval-v4/{pair}"][0]["samples"] == 20


def test_without_history_the_estimate_says_it_rests_on_priors_and_a_job_keeps_its_measures(tmp_path):
    profile = CostProfile(t_ar=0.04, t_draft=0.02, t_verify={5: 0.15})
    est = estimate_job(*groups(readme_job()), SPEC, 4, 4, profile, device="llamacpp", load=(0.5, 2))
    assert est.accept == 0.6 and est.length == 192.0
    assert (
        "rests on priors (no earlier run of this task and pair in the cache): 192 tokens per response (assumed: "
        "50% of the task's 384-token budget), 60% of N drafts accepted, batch 8"
    ) in est.lines()[-1]
    assert keep_measures(None, TIMER) is None and keep_measures(est, TIMER) is None  # nowhere to keep them
    est.history_file = tmp_path / "h.json"
    assert keep_measures(est, TIMER) == est.history_file
    (run,) = recall(est.history_file).runs
    assert run.t_ar == 0.04 and run.samples == 20 and run.seconds_per_sample == pytest.approx(7.2)
    # a job on a busy machine keeps nothing (a fresh-venv trial's history held a run at t_AR 933 ms,
    # and the next first estimate, scaled x0.05 from it, said 77 s where strict and the trials took 200)
    busy = estimate_job(*groups(readme_job()), SPEC, 4, 4, profile, device="llamacpp", load=(9.5, 2))
    busy.history_file = tmp_path / "busy.json"
    assert busy.busy == ["load average 9.5 on 2 cores"] and keep_measures(busy, TIMER) is None
    assert not busy.history_file.exists()
