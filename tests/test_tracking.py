"""MLflow run identity: job ids, runs found by (study, trial number, job), quotes in
names, tables and figures replaced on re-logging, an MLflow run already active."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from relaxtune.report.tracking import Tracker, filter_literal
from relaxtune.tune.job_identity import job_id
from relaxtune.tune.settings import TuneSettings

from .synthetic import PROBLEMS, SPEC


class Study:
    def __init__(self, name: str):
        self.study_name = name


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    """One MLflow store for the module (creating one takes seconds); each test tracks its own task."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def tracker(uri: str, job: str, task: str, pair: str = "pair") -> Tracker:
    return Tracker(uri, SPEC.model_copy(update={"name": task}), pair, {"x": 1}, PROBLEMS[:3], job)


def runs_of(t: Tracker, kind: str):
    return [r for r in t.client.search_runs([t.experiment_id]) if r.data.tags.get("relaxtune.kind") == kind]


def test_job_ids_follow_the_settings_that_shape_trials():
    def ident(s: TuneSettings, spec, pair: str) -> str:  # the groups a job id is made of
        return job_id(s.stores, s.stats, s.search, spec, pair)

    base = TuneSettings(task="x", storage="postgresql+psycopg://rt:secret@db.example/rt", n_drafts=[4])
    same = base.model_copy(
        update={
            "storage": "postgresql+psycopg://rt:other@db.example/rt",
            "trials": 30,
            "output_dir": "elsewhere",
            "verifier_url": None,
            "parallel_trials": 4,
        }
    )
    assert ident(base, SPEC, "pair") == ident(same, SPEC, "pair")  # password, trials, folder, workers: same job
    assert ident(base, SPEC, "pair").startswith("synthetic-")
    others = [
        base.model_copy(update={"n_drafts": [2]}),
        base.model_copy(update={"epsilon": 0.1}),
        base.model_copy(update={"limit": 10}),
        base.model_copy(update={"storage": "sqlite:///other.db"}),
    ]
    assert len({ident(s, SPEC, "pair") for s in others} | {ident(base, SPEC, "pair")}) == 5
    assert ident(base, SPEC, "other-pair") != ident(base, SPEC, "pair")
    assert ident(base, SPEC.model_copy(update={"max_new_tokens": 32}), "pair") != ident(base, SPEC, "pair")
    assert ident(base.model_copy(update={"job_id": "mine"}), SPEC, "pair") == "mine"


def test_trial_runs_are_never_shared_between_jobs(uri):
    first = tracker(uri, "job-a", "jobs")
    first.start_study("cactus", Study("s__cactus__pair"))
    first.log_trial("cactus", 0, {"knob": 1.0, "n_draft": 4}, {"l_accept": 3.0}, "COMPLETE", None)
    second = tracker(uri, "job-b", "jobs")  # another job (other settings), same study name and trial number
    second.start_study("cactus", Study("s__cactus__pair"))
    second.log_trial("cactus", 0, {"knob": 1.0, "n_draft": 2}, {"l_accept": 1.5}, "COMPLETE", None)
    trials = runs_of(first, "trial")
    assert len(trials) == 2 and len(runs_of(first, "study")) == 2 and len(runs_of(first, "task")) == 2
    by_job = {r.data.tags["relaxtune.job"]: r for r in trials}
    assert by_job["job-a"].data.params["n_draft"] == "4" and by_job["job-a"].data.metrics["l_accept"] == 3.0
    assert by_job["job-b"].data.params["n_draft"] == "2" and by_job["job-b"].data.metrics["l_accept"] == 1.5
    again = tracker(uri, "job-a", "jobs")  # a restart of the first job finds its runs
    again.start_study("cactus", Study("s__cactus__pair"))
    again.log_trial("cactus", 0, {"knob": 1.0, "n_draft": 4}, {"l_accept": 3.0}, "COMPLETE", None)
    assert again.task_run_id == first.task_run_id and len(runs_of(again, "trial")) == 2


@pytest.mark.parametrize("pair", ["O'Brien's pair", 'the "best" pair', "both ' and \" quotes"])
def test_names_with_quotes_are_found_again(uri, pair):
    task = f"task {pair}"
    first = tracker(uri, f"job {pair}", task, pair)
    first.start_study("cactus", Study(f"{task}__cactus__x"))
    first.log_trial("cactus", 3, {"knob": 0.5, "n_draft": 4}, {"accuracy": 0.5}, "COMPLETE", None)
    again = tracker(uri, f"job {pair}", task, pair)
    again.start_study("cactus", Study(f"{task}__cactus__x"))
    again.log_trial("cactus", 3, {"knob": 0.5, "n_draft": 4}, {"accuracy": 0.5}, "COMPLETE", None)
    assert again.task_run_id == first.task_run_id and again.study_runs == first.study_runs
    assert len(runs_of(again, "trial")) == 1 and runs_of(again, "task")[0].info.run_name == f"{task} tuning"
    assert runs_of(again, "task")[0].data.tags["relaxtune.pair"] == pair


def test_filter_literals_never_break_the_filter(uri):
    assert filter_literal("plain") == "'plain'" and filter_literal("O'Brien") == '"O\'Brien"'
    assert filter_literal('say "hi"') == "'say \"hi\"'" and filter_literal("'\"") is None
    client = MlflowClient(uri)
    exp = client.create_experiment("filters")
    run = client.create_run(exp, tags={"k": "O'Brien"}).info.run_id
    found = client.search_runs([exp], filter_string=f"tags.k = {filter_literal('O' + chr(39) + 'Brien')}")
    assert [r.info.run_id for r in found] == [run]


def test_relogging_a_table_or_figure_replaces_it(uri, tmp_path):
    t = tracker(uri, "job", "tables")
    rows = [{"label": "a", "speedup": 1.0}, {"label": "b", "speedup": 2.0}]
    for _ in range(3):  # e.g. a resumed job drawing its study's front again
        t._log_table(t.task_run_id, rows, "pareto_front.json")
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, len(rows)])
        t.client.log_figure(t.task_run_id, fig, "pareto_front.png")
        plt.close(fig)
        rows = rows + [{"label": "c", "speedup": 3.0}]
    path = t.client.download_artifacts(t.task_run_id, "pareto_front.json", str(tmp_path))
    table = json.loads(Path(path).read_text())
    assert table["columns"] == ["label", "speedup"] and [r[0] for r in table["data"]] == ["a", "b", "c", "c"]
    assert sorted(a.path for a in t.client.list_artifacts(t.task_run_id)) == [
        "pareto_front.json",
        "pareto_front.png",
        "settings.json",
    ]
    logged = json.loads(t.client.get_run(t.task_run_id).data.tags["mlflow.loggedArtifacts"])
    assert logged == [{"path": "pareto_front.json", "type": "table"}]  # the UI shows it as a table, once
    other = t.client.create_run(t.experiment_id).info.run_id  # MLflow's own log_table, once: the same file and tag
    t.client.log_table(other, data=pd.DataFrame(rows[:-1]), artifact_file="pareto_front.json")
    theirs = t.client.download_artifacts(other, "pareto_front.json", str(tmp_path / "theirs"))
    assert json.loads(Path(theirs).read_text()) == table
    assert t.client.get_run(other).data.tags["mlflow.loggedArtifacts"] == json.dumps(logged)


def test_tracker_works_inside_an_active_mlflow_run(uri):
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as outer:
            t = tracker(uri, "job", "inside")
            t.start_study("cactus", Study("s__cactus__pair"))
            t.log_trial("cactus", 0, {"knob": 1.0, "n_draft": 4}, {"accuracy": 1.0}, "COMPLETE", None)
            assert mlflow.active_run().info.run_id == outer.info.run_id  # untouched, still the caller's
        assert t.client.get_run(t.task_run_id).inputs.dataset_inputs[0].dataset.name == "inside-v2"
        assert mlflow.get_run(outer.info.run_id).data.params == {}
    finally:
        mlflow.set_tracking_uri(None)


def test_every_write_of_params_or_tags_to_a_run_holds_the_jobs_lock(uri, monkeypatch):
    """Workers of one job log the same study run's params, and the same trial (its owner, and
    another worker's backfill), at the same moment: MLflow checks a run's params, then inserts
    them, so two writers can clash (UNIQUE params.key, params.run_uuid: it ended a 4-worker
    job once). Every write of params or tags holds the job's lock (two threads here)."""
    import threading
    from contextlib import contextmanager

    guard, held = threading.RLock(), threading.local()

    @contextmanager
    def lock():
        with guard:
            held.depth = getattr(held, "depth", 0) + 1
            try:
                yield
            finally:
                held.depth -= 1

    writes, real = [], MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if params or tags:
            writes.append((sorted(p.key for p in params), getattr(held, "depth", 0) > 0))
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    workers = [
        Tracker(uri, SPEC.model_copy(update={"name": "clash"}), "pair", {"x": 1}, PROBLEMS[:3], "job-c", lock)
        for _ in range(2)
    ]
    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    errors = []

    def work(t: Tracker) -> None:
        try:
            t.start_study("cactus", Study("c__cactus__pair"))
            t.log_trial("cactus", 0, {"knob": 1.0, "n_draft": 4}, {"l_accept": 3.0}, "COMPLETE", None)
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and writes and all(locked for _, locked in writes), writes
    (study,), (trial,) = runs_of(workers[0], "study"), runs_of(workers[0], "trial")
    assert study.data.params["method"] == "cactus" and trial.data.params["n_draft"] == "4"
    assert trial.data.tags["relaxtune.state"] == "COMPLETE" and trial.data.metrics["l_accept"] == 3.0


def test_workers_finishing_together_split_the_figures_and_draw_each_once(uri, tmp_path):
    """Each figure is drawn by one worker: they claim figures one by one (the second
    takes what the first has not), the task run's tag records each drawn figure, a later
    finish of the same config draws none, another config draws all again, and a figure
    whose claim a dead worker held is drawn by the worker that waits for it."""
    import hashlib
    import threading

    from matplotlib.figure import Figure

    from relaxtune.tune.claims import claim

    keys = ["pareto_fronts_by_method.png"] + [
        f"{m}_{f}" for m in ("cactus", "mentored") for f in ("pareto_front.png", "speed_vs_knob.png")
    ]
    shared = threading.RLock()  # the job's MLflow lock (storage_lock(storage, "mlflow")), shared by the workers
    workers = [
        Tracker(
            uri,
            SPEC.model_copy(update={"name": "split"}),
            "pair",
            {"output_dir": str(tmp_path)},
            PROBLEMS[:3],
            "job-s",
            lambda: shared,
        )
        for _ in range(2)
    ]
    drawn, first, meet = [], threading.local(), threading.Barrier(2, timeout=30)

    def draw(key: str):
        def f():
            drawn.append((threading.current_thread().name, key))
            if not getattr(first, "done", False):  # each worker's first figure: both are drawing at once
                first.done = True
                meet.wait()
            return Figure()

        return f

    def jobs(t: Tracker):
        return [(k, draw(k), [(t.task_run_id, f"figures/{k}")]) for k in keys]

    threads = [
        threading.Thread(target=t._share_figures, args=(jobs(t), "d1", False), name=f"w{i}")
        for i, t in enumerate(workers)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(k for _, k in drawn) == sorted(keys)  # each once
    assert {w for w, _ in drawn} == {"w0", "w1"}  # split between the two
    client, run = workers[0].client, workers[0].task_run_id
    assert sorted(a.path for a in client.list_artifacts(run, "figures")) == sorted(f"figures/{k}" for k in keys)
    assert json.loads(client.get_run(run).data.tags["relaxtune.figures"]) == dict.fromkeys(keys, "d1")

    drawn.clear()
    first.done = True
    workers[1]._share_figures(jobs(workers[1]), "d1", wait=True)
    assert drawn == []  # the same config: drawn already
    workers[1]._share_figures(jobs(workers[1]), "d2", wait=True)
    assert [k for _, k in drawn] == keys  # another config: all again

    drawn.clear()
    path = workers[0]._claims / (hashlib.sha256(f"job-s\n{keys[0]}".encode()).hexdigest()[:24] + ".lock")
    holding, release = threading.Event(), threading.Event()

    def dead_worker():
        with claim(path):  # claimed, then gone without drawing
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=dead_worker)
    holder.start()
    holding.wait(30)
    workers[0]._share_figures(jobs(workers[0]), "d3", wait=False)  # leaves the claimed figure to its holder
    assert sorted(k for _, k in drawn) == sorted(keys[1:])
    threading.Timer(0.3, release.set).start()
    workers[0]._share_figures(jobs(workers[0]), "d3", wait=True)  # waits for the claim, then draws what is missing
    holder.join()
    assert sorted(k for _, k in drawn) == sorted(keys)
    assert json.loads(client.get_run(run).data.tags["relaxtune.figures"]) == dict.fromkeys(keys, "d3")
