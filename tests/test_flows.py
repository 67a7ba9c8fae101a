"""Prefect flows for real, in Prefect's test harness (a local ephemeral server)."""

import threading
from pathlib import Path

import pytest
import yaml

from relaxtune.settings import TuneSettings
from relaxtune.tasks import list_tasks

from .tiny_task import write_tiny_task

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _settings(tmp_path, tiny_pair_dirs, **over) -> dict:
    drafter, verifier = tiny_pair_dirs
    return {"drafter": drafter, "verifier": verifier, "dtype": "float32", "c_rel": 0.3, "stage_size": 4,
            "output_dir": str(tmp_path / "runs"), "mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "range_size": 2, "heartbeat": 5} | over


def test_two_workers_task_runs_share_a_study(harness, tmp_path, tiny_pair_dirs):
    import optuna
    from flows.tune import tune_task

    task = write_tiny_task(tmp_path)
    settings = _settings(tmp_path, tiny_pair_dirs, epsilon=0.5)
    results: dict = {}

    def worker(label: str, lanes: int) -> None:  # what a Prefect worker on another host runs
        results[label] = tune_task.with_options(flow_run_name=label)(
            task=task, methods=["cactus"], limit=4, trials=6, n_drafts=[2],
            settings=settings | {"parallel_trials": lanes})

    threads = [threading.Thread(target=worker, args=(label, lanes)) for label, lanes in (("first", 2), ("second", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert set(results) == {"first", "second"}
    (name,) = optuna.get_all_study_names(settings["storage"])
    trials = optuna.load_study(study_name=name, storage=settings["storage"]).trials
    assert [t.state.name for t in trials].count("FAIL") == 0
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == len(trials) == 6  # exactly --trials
    assert {t.user_attrs["worker"].rsplit("/", 1)[1] for t in trials} == {"first", "second"}
    first, second = ({k: v for k, v in r.items() if k != "created"} for r in (results["first"], results["second"]))
    assert first == second and first["methods"]["cactus"]["trials"] == 6  # every worker exports the same config
    assert (tmp_path / "runs" / "tiny_math.tuned.yaml").exists()


def test_ranges_merge_and_a_bumped_task_version_is_not_served_from_cache(harness, tmp_path, tiny_pair_dirs):
    from flows.tune import evaluate_point

    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    point = dict(task=task, method="cactus", alpha=0.1, n_draft=2, limit=4, drafter=drafter, verifier=verifier,
                 dtype="float32", output_dir=str(tmp_path / "runs"))
    split = evaluate_point(**point, range_size=1)  # four task runs, merged
    whole = evaluate_point(**point)  # one task run: the records the ranges wrote
    assert split["n"] == whole["n"] == 4 and split == whole
    assert evaluate_point(**point) == whole  # the same inputs again: Prefect's cache
    assert "tiny_math-v1" in whole["path"]
    Path(task).write_text(Path(task).read_text().replace("version: 1", "version: 2").replace(
        "max_new_tokens: 10", "max_new_tokens: 6"))  # a new version of the task, under the same name
    bumped = evaluate_point(**point)
    assert "tiny_math-v2" in bumped["path"] and bumped["mean_length"] <= 6  # evaluated anew, not v1's cached result


def test_tune_new_tunes_what_has_no_current_config(harness, tmp_path, tiny_pair_dirs, monkeypatch):
    from flows.tune import tune_new

    evals, extra = tmp_path / "evals", tmp_path / "extra"
    evals.mkdir()
    extra.mkdir()
    write_tiny_task(extra)  # a new task in an extra folder; evals/ has none
    monkeypatch.setenv("RELAXTUNE_EVALS", str(evals))
    settings = _settings(tmp_path, tiny_pair_dirs)
    kwargs = dict(folders=[str(extra)], methods=["cactus"], limit=2, trials=1, settings=settings)
    assert tune_new(**kwargs) == {"tiny_math": "strict"}  # 2 problems certify nothing: strict
    assert (tmp_path / "runs" / "tiny_math.tuned.yaml").exists()
    assert tune_new(**kwargs) == {}  # tuned for this version: nothing left to do


def test_prefect_yaml_deploys_every_task_and_tune_new_daily():
    from flows.tune import tune_new, tune_task

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    per_task = {d["parameters"]["task"]: d for d in spec["deployments"] if d["entrypoint"].endswith(":tune_task")}
    assert set(per_task) == set(list_tasks())
    for name, d in per_task.items():
        assert d["entrypoint"] == "flows/tune.py:tune_task" and d["work_pool"]["name"] == "relaxtune"
        assert d["schedules"][0]["cron"].count(" ") == 4
        tune_task.validate_parameters(d["parameters"])  # the parameters fit the flow's signature
    (new,) = [d for d in spec["deployments"] if d["entrypoint"] == "flows/tune.py:tune_new"]
    minute, hour, day, month, weekday = new["schedules"][0]["cron"].split()
    assert (day, month, weekday) == ("*", "*", "*") and minute.isdigit() and hour.isdigit()  # daily
    tune_new.validate_parameters(new["parameters"])
    assert "PREFECT_DEPLOYMENTS_CLEAR_SCHEDULES_ON_EMPTY=true" in (ROOT / "prefect.yaml").read_text()


def test_the_evaluation_cache_key_sees_what_inputs_only_name(tmp_path, tiny_pair_dirs):
    import os
    import shutil

    from flows.steps import backend_tag, evaluation_cache_key

    drafter, verifier = tiny_pair_dirs
    verifier_copy = shutil.copytree(verifier, tmp_path / "verifier")
    task = write_tiny_task(tmp_path)
    settings = {"task": task, "drafter": drafter, "verifier": str(verifier_copy), "dtype": "float32"}
    params = {"settings": settings, "method": "cactus", "knob": 0.1, "n_draft": 2, "seed": 0,
              "problem_ids": ("0", "1", "2", "3")}
    key = evaluation_cache_key(None, params)
    assert evaluation_cache_key(None, params) == key
    assert evaluation_cache_key(None, params | {"problem_ids": ("0", "1")}) != key
    text = Path(task).read_text()
    Path(task).write_text(text.replace("max_new_tokens: 10", "max_new_tokens: 9"))  # same version, other spec
    edited = evaluation_cache_key(None, params)
    Path(task).write_text(text.replace("version: 1", "version: 2"))
    bumped = evaluation_cache_key(None, params)
    Path(task).write_text(text)
    assert len({key, edited, bumped}) == 3 and evaluation_cache_key(None, params) == key
    weights = next(f for f in verifier_copy.iterdir() if f.suffix == ".safetensors")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # replaced weights
    assert evaluation_cache_key(None, params) != key
    assert evaluation_cache_key(None, params | {"settings": settings | {"dtype": "bfloat16"}}) != key
    served = settings | {"verifier_url": "http://127.0.0.1:9/", "drafter_url": "http://127.0.0.1:9/"}
    assert evaluation_cache_key(None, params | {"settings": served}) != key  # an (unreachable) server
    assert backend_tag(TuneSettings(**served)) == "relaxtune-backend:127.0.0.1:9"
