"""Prefect flows for real, in Prefect's test harness (a local ephemeral server)."""

from pathlib import Path

import pytest
import yaml

from relaxtune.tasks import list_tasks

from .tiny_task import write_tiny_task

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_tune_task_flow_end_to_end(harness, tmp_path, tiny_pair_dirs):
    from flows.tune import evaluate_point, tune_task

    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    settings = {"drafter": drafter, "verifier": verifier, "dtype": "float32", "c_rel": 0.3, "stage_size": 4,
                "output_dir": str(tmp_path / "runs"), "mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = tune_task(task=task, methods=["cactus"], limit=4, trials=2, n_drafts=[2], settings=settings)
    assert result["task"] == "tiny_math" and result["methods"]["cactus"]["trials"] == 2
    assert (tmp_path / "runs" / "tiny_math.tuned.yaml").exists()
    summary = evaluate_point(task=task, method="cactus", alpha=0.1, n_draft=2, limit=4, drafter=drafter,
                             verifier=verifier, dtype="float32", output_dir=str(tmp_path / "runs"))
    assert summary["n"] == 4 and 0 <= summary["accuracy"] <= 1
    # the same point again comes from Prefect's cache / the records: identical numbers
    again = evaluate_point(task=task, method="cactus", alpha=0.1, n_draft=2, limit=4, drafter=drafter,
                           verifier=verifier, dtype="float32", output_dir=str(tmp_path / "runs"))
    assert again["accuracy"] == summary["accuracy"] and again["l_accept"] == summary["l_accept"]


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
