"""Prefect flows for real, in Prefect's test harness (a local ephemeral server)."""

import json
import threading
from pathlib import Path

import pytest
import yaml

from relaxtune.tasks.spec import list_tasks
from relaxtune.tune.settings import TuneSettings

from .tiny_task import write_tiny_task

ROOT = Path(__file__).parents[1]
SHIPPED = {"humaneval", "gsm8k_mini", "gsm8k", "math500", "aime24", "aime25", "gpqa_diamond", "lcb_lite_v6"}


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _settings(tmp_path, tiny_pair_dirs, **over) -> dict:
    drafter, verifier = tiny_pair_dirs
    return {
        "drafter": drafter,
        "verifier": verifier,
        "dtype": "float32",
        "c_rel": 0.3,
        "stage_size": 4,
        "output_dir": str(tmp_path / "runs"),
        "mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "range_size": 2,
        "heartbeat": 5,
        "confirm": "seeds",
    } | over


@pytest.mark.slow
def test_two_workers_task_runs_share_a_study(harness, tmp_path, tiny_pair_dirs, monkeypatch):
    import optuna

    import relaxtune.flows.tune
    from relaxtune.flows.tune import tune_task

    task = write_tiny_task(tmp_path)
    settings = _settings(tmp_path, tiny_pair_dirs, epsilon=0.5)
    results: dict = {}
    # Neither worker takes a trial before both are ready: a worker that starts late on a
    # busy machine would otherwise find the study finished and the test would prove nothing.
    both_ready, arrived, lock = threading.Event(), set(), threading.Lock()
    register = relaxtune.flows.tune.register

    def gated_register(key: str, next_trial):
        label = key.rsplit("/", 2)[-2]

        def gated_next_trial():  # every lane of either worker waits until both workers have asked
            with lock:
                arrived.add(label)
                if arrived == {"first", "second"}:
                    both_ready.set()
            assert both_ready.wait(timeout=300), f"only {arrived} asked for a trial"
            return next_trial()

        return register(key, gated_next_trial)

    monkeypatch.setattr(relaxtune.flows.tune, "register", gated_register)

    def worker(label: str, lanes: int) -> None:  # what a Prefect worker on another host runs
        results[label] = tune_task.with_options(flow_run_name=label)(
            task=task,
            methods=["cactus"],
            limit=4,
            trials=6,
            n_drafts=[2],
            settings=settings | {"parallel_trials": lanes},
        )

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


@pytest.mark.slow
def test_ranges_merge_and_a_bumped_task_version_is_not_served_from_cache(harness, tmp_path, tiny_pair_dirs):
    from relaxtune.flows.tune import evaluate_point

    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    point = dict(
        task=task,
        method="cactus",
        alpha=0.1,
        n_draft=2,
        limit=4,
        drafter=drafter,
        verifier=verifier,
        dtype="float32",
        output_dir=str(tmp_path / "runs"),
    )
    split = evaluate_point(**point, range_size=1)  # four task runs, merged
    whole = evaluate_point(**point)  # one task run: the records the ranges wrote
    assert split["n"] == whole["n"] == 4 and split == whole
    assert evaluate_point(**point) == whole  # the same inputs again: Prefect's cache
    assert "tiny_math-v1" in whole["path"]
    Path(task).write_text(
        Path(task).read_text().replace("version: 1", "version: 2").replace("max_new_tokens: 10", "max_new_tokens: 6")
    )  # a new version of the task, under the same name
    bumped = evaluate_point(**point)
    assert "tiny_math-v2" in bumped["path"] and bumped["mean_length"] <= 6  # evaluated anew, not v1's cached result


@pytest.mark.slow
def test_tune_new_tunes_what_has_no_current_config(harness, tmp_path, tiny_pair_dirs, monkeypatch, user_tasks_only):
    import relaxtune.flows.tune
    from relaxtune.flows.tune import tune_new

    evals, extra = tmp_path / "evals", tmp_path / "extra"
    evals.mkdir()
    extra.mkdir()
    task = write_tiny_task(extra)  # a new task in an extra folder; evals/ has none
    missing = extra / "no_data.yaml"  # a spec whose data file is not there: skipped before any model loads
    missing.write_text(
        Path(task).read_text().replace("name: tiny_math", "name: no_data").replace("tiny_math.jsonl", "absent.jsonl")
    )
    write_tiny_task(extra, max_new_tokens=8, name="short")  # shorter than a draft length (10): skipped, told why
    monkeypatch.setenv("RELAXTUNE_EVALS", str(evals))
    loaded, load = [], relaxtune.flows.tune.load_backend
    monkeypatch.setattr(relaxtune.flows.tune, "load_backend", lambda pair: loaded.append(pair.verifier) or load(pair))
    settings = _settings(tmp_path, tiny_pair_dirs)
    kwargs = dict(
        folders=[str(extra)], methods=["cactus"], limit=2, trials=1, settings=settings | {"n_drafts": [3, 10]}
    )
    assert tune_new(**kwargs) == {"tiny_math": "strict"}  # 2 problems certify nothing: strict
    # the pair loaded once, for tiny_math alone (no_data and short are skipped before any model loads)
    assert loaded == [settings["verifier"]] and (tmp_path / "runs" / "tiny_math.tuned.yaml").exists()
    assert tune_new(**kwargs) == {} and loaded == [settings["verifier"]]  # tuned: nothing left to do


def test_prefect_yaml_deploys_every_task_and_tune_new_daily():
    from relaxtune.flows.tune import tune_new, tune_task

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    per_task = {d["parameters"]["task"]: d for d in spec["deployments"] if d["entrypoint"].endswith(":tune_task")}
    assert set(per_task) == SHIPPED and SHIPPED <= set(list_tasks())  # a spec added to evals/ changes nothing here
    for name, d in per_task.items():
        assert d["entrypoint"] == "relaxtune/flows/tune.py:tune_task" and d["work_pool"]["name"] == "relaxtune"
        assert d["schedules"][0]["cron"].count(" ") == 4
        tune_task.validate_parameters(d["parameters"])  # the parameters fit the flow's signature
    (new,) = [d for d in spec["deployments"] if d["entrypoint"] == "relaxtune/flows/tune.py:tune_new"]
    minute, hour, day, month, weekday = new["schedules"][0]["cron"].split()
    assert (day, month, weekday) == ("*", "*", "*") and minute.isdigit() and hour.isdigit()  # daily
    tune_new.validate_parameters(new["parameters"])
    bounds = new["parameters"]
    assert (bounds["limit"], bounds["trials"], bounds["n_drafts"]) == (8, 4, [4])  # a bounded run per task
    assert "PREFECT_DEPLOYMENTS_CLEAR_SCHEDULES_ON_EMPTY=true" in (ROOT / "prefect.yaml").read_text()
    from relaxtune.flows.transfer import transfer_matrix

    (transfer,) = [d for d in spec["deployments"] if d["entrypoint"] == "relaxtune/flows/transfer.py:transfer_matrix"]
    transfer_matrix.validate_parameters(transfer["parameters"])
    assert set(transfer["parameters"]["tasks"]) <= set(per_task)


@pytest.mark.slow
def test_transfer_flow_and_command_read_the_tuning_records_back(harness, tmp_path, tiny_pair_dirs):
    """Two tiny tasks tuned at the same point (cactus delta = 0.1, N = 2): the diagonal is
    read from the confirmations' records, each other cell from the other task's search
    (its strict and its trial of that point), so neither the flow nor the command
    generates a sample; both judge the same cells."""
    from typer.testing import CliRunner

    from relaxtune.certify.stats import drop_bound
    from relaxtune.cli import app
    from relaxtune.flows.transfer import transfer_matrix
    from relaxtune.job.run import run_tune_job
    from relaxtune.report.export import load_config

    settings = _settings(tmp_path, tiny_pair_dirs, epsilon=0.9, methods=["cactus"], limit=4, trials=1, n_drafts=[2])
    tasks = [write_tiny_task(tmp_path, name=name) for name in ("tiny_math", "tiny_sums")]
    for task in tasks:
        config, _ = run_tune_job(
            TuneSettings(**settings | {"task": task}), progress=False, track=False, log=lambda message: None
        )
        assert (config.methods["cactus"].feasible, config.methods["cactus"].knob) == (
            True,
            10.0,
        )  # the grid strongest first
    runs = tmp_path / "runs"
    records = {p: p.read_text() for p in runs.rglob("*.jsonl")}
    result = transfer_matrix(tasks=tasks, output_dir=str(runs), mlflow_uri=settings["mlflow_uri"])
    assert {p: p.read_text() for p in runs.rglob("*.jsonl")} == records  # nothing generated
    cells = [(r["source"], r["target"], r["samples"], r["within_epsilon"]) for r in result["cells"]]
    assert cells == [
        ("tiny_math", "tiny_math", "confirmation", True),
        ("tiny_math", "tiny_sums", "search", True),
        ("tiny_sums", "tiny_math", "search", True),
        ("tiny_sums", "tiny_sums", "confirmation", True),
    ]
    assert sorted(Path(p).name for p in result["written"]) == ["tiny_math.tuned.yaml", "tiny_sums.tuned.yaml"]
    assert load_config(runs / "tiny_sums.tuned.yaml").transfer.targets["tiny_math"]["cactus"].within_epsilon
    out = CliRunner().invoke(
        app,
        ["transfer", "--tasks", ",".join(tasks), "--output-dir", str(runs), "--mlflow-uri", settings["mlflow_uri"]],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert {p: p.read_text() for p in runs.rglob("*.jsonl")} == records
    bounds = {round(r["drop_upper_bound"], 3) for r in result["cells"]}
    assert bounds == {round(drop_bound([(1, 0, 0)] * 4, 0.975).upper, 3)}  # no discordance, 0.9 over four cells
    text = " ".join(out.output.split())
    assert text.count(f"\u2713 <= {bounds.pop():.3f} (eps 0.9)") == 4 and "tiny_sums (delta=10 N=2)" in text
    assert "each cell judged at 97.50% one-sided" in text and text.count("transfer section written to") == 2
    out = CliRunner().invoke(
        app,
        [
            "transfer",
            "--tasks",
            ",".join(tasks),
            "--output-dir",
            str(runs),
            "--mlflow-uri",
            settings["mlflow_uri"],
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)  # every field of every cell, messages on stderr
    assert [(c["source"], c["target"], c["within_epsilon"]) for c in data["cells"]] == [c[:2] + c[3:] for c in cells]
    assert data["confidence_each"] == 0.975 and len(data["written"]) == 2


def test_the_evaluation_cache_key_sees_what_inputs_only_name(tmp_path, tiny_pair_dirs):
    import os
    import shutil

    from relaxtune.flows.steps import backend_tag, evaluation_cache_key

    drafter, verifier = tiny_pair_dirs
    verifier_copy = shutil.copytree(verifier, tmp_path / "verifier")
    task = write_tiny_task(tmp_path)
    settings = {"task": task, "drafter": drafter, "verifier": str(verifier_copy), "dtype": "float32"}
    params = {
        "settings": settings,
        "method": "cactus",
        "knob": 0.1,
        "n_draft": 2,
        "seed": 0,
        "problem_ids": ("0", "1", "2", "3"),
    }
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
    assert backend_tag(TuneSettings(**served).pair) == "relaxtune-backend:127.0.0.1:9"


def test_a_flow_range_runs_the_whole_point_every_named_knob_included(tmp_path, tiny_pair_dirs):
    """A task run of a point off alpha's view (FLy's window W = 1 where alpha's view at N = 3
    says min(6, N - 1) = 2) evaluates that point, under its own records, not alpha's view."""
    from relaxtune.flows.steps import evaluation_cache_key, generate_and_grade

    drafter, verifier = tiny_pair_dirs
    settings = {
        "task": write_tiny_task(tmp_path),
        "drafter": drafter,
        "verifier": verifier,
        "dtype": "float32",
        "output_dir": str(tmp_path / "runs"),
    }
    args = dict(settings=settings, method="fly", knob=0.5, n_draft=3, seed=0, problem_ids=("0", "1"))
    off = generate_and_grade.fn(**args, extra=(("fly_window_size", 1),))
    view = generate_and_grade.fn(**args)
    assert "fly-0.5+fly_window_size=1__N3__seed0" in off.path.name and "fly-0.5__N3__seed0" in view.path.name
    assert evaluation_cache_key(None, args | {"extra": (("fly_window_size", 1),)}) != evaluation_cache_key(None, args)
