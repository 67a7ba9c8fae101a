"""An export is its own MLflow run and file: the tuning run's files, artifacts, tables,
params, metrics, tags and status are byte-identical after it; re-logged tables are
replaced; an export with nothing to read refuses before any model loads, naming
what is missing (the synthetic evaluation, real MLflow and Optuna on sqlite)."""

import hashlib
import json
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from relaxtune.job.run import run_tune_job
from relaxtune.report.reexport import JobError, check_exportable, export_path
from relaxtune.tasks.spec import load_problems, load_task
from relaxtune.tune.job_identity import job_id
from relaxtune.tune.settings import TuneSettings

from .synthetic import Synthetic, SyntheticPair, write_task


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    """One MLflow store for the module (creating one takes seconds); each test tunes its own task."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def settings(tmp_path: Path, uri: str, name: str, **over) -> TuneSettings:
    task = write_task(tmp_path / "task", 24, name)
    return TuneSettings(
        **(
            dict(
                task=task,
                methods=["cactus", "mentored"],
                n_drafts=[4],
                trials=4,
                stage_size=24,
                c_rel=0.2,
                output_dir=str(tmp_path / "relaxtune-runs"),
                mlflow_uri=uri,
                confirm="seeds",
            )
            | over
        )
    )


def run(s: TuneSettings, new_trials: bool = True, track: bool = True):
    # every point is lossless (cliff 20) and cactus at delta 10 is the fastest; with 24 problems a lossless
    # point's drop bound is 1 - 0.1^(1/24) = 0.091 in the search and 0.145 in each of its four confirmations
    # (the 0.1 split four ways), so epsilon 0.2 takes cactus and 0.1 keeps strict
    return run_tune_job(
        s,
        SyntheticPair(),
        progress=False,
        new_trials=new_trials,
        log=lambda m: None,
        track=track,
        evaluate_fn=Synthetic(cliff=20.0, delay=1e-4),
    )


def snapshot(client: MlflowClient, experiment: str, job: str, where: Path) -> dict:
    """Every run of tuning job ``job``: status, times, name, params, metric histories, tags,
    and the sha256 of every artifact file."""
    out = {}
    for r in client.search_runs([experiment], filter_string=f"tags.`relaxtune.job` = '{job}'"):
        rid = r.info.run_id
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=r.info.artifact_uri, dst_path=str(where / rid)))
        files = {
            str(p.relative_to(local)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(local.rglob("*"))
            if p.is_file()
        }
        history = {
            k: [(m.value, m.step, m.timestamp) for m in client.get_metric_history(rid, k)] for k in r.data.metrics
        }
        out[rid] = dict(
            status=r.info.status,
            end=r.info.end_time,
            name=r.info.run_name,
            params=r.data.params,
            metrics=history,
            tags=r.data.tags,
            files=files,
        )
    return out


def files_of(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "optuna.db" not in p.name
    }


@pytest.mark.slow
def test_an_export_is_its_own_run_and_file_and_leaves_the_tuning_run_untouched(tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    tuning = settings(tmp_path, uri, "iso", epsilon=0.2)
    config, tuned_path = run(tuning)
    assert tuned_path == tmp_path / "relaxtune-runs" / "iso.tuned.yaml"
    assert config.recommendation.method == "cactus" and config.recommendation.knob == 10.0
    client = MlflowClient(tuning.mlflow_uri)
    spec = load_task(tuning.task)
    job = job_id(tuning.stores, tuning.stats, tuning.search, spec, SyntheticPair.name)
    exp = client.get_experiment_by_name("relaxtune-iso")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's model-training view
    before = snapshot(client, exp.experiment_id, job, tmp_path / "before")
    before_files = files_of(tmp_path / "relaxtune-runs")

    tight = tuning.model_copy(update={"epsilon": 0.1})
    exported, path = run(tight, new_trials=False)
    assert path == tmp_path / "relaxtune-runs" / "iso.tuned.eps0.1.yaml" and path.exists()
    assert exported.recommendation.method == "strict" and exported.epsilon == 0.1  # the confirmations miss 0.1
    assert snapshot(client, exp.experiment_id, job, tmp_path / "after") == before  # runs, tables, figures, status
    after_files = files_of(tmp_path / "relaxtune-runs")
    assert {k: v for k, v in after_files.items() if k != path.name} == before_files  # records, job file, config

    task_run = next(
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("relaxtune.job") == job and r.data.tags["relaxtune.kind"] == "task"
    )
    exports = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("relaxtune.kind") == "export"]
    assert len(exports) == 1
    e = exports[0]
    assert e.info.status == "FINISHED" and e.data.tags["mlflow.parentRunId"] == task_run.info.run_id
    assert e.data.tags["relaxtune.tuning_run"] == task_run.info.run_id and e.data.tags["relaxtune.tuning_job"] == job
    assert exported.mlflow["run_id"] == e.info.run_id and exported.mlflow["tuning_run_id"] == task_run.info.run_id
    rec = exported.recommendation
    assert e.data.params["epsilon"] == "0.1" and e.data.params["recommended_method"] == "strict"
    assert e.data.params["recommended_n_draft"] == str(rec.n_draft) and e.data.params["recommended_knob"] == "-"
    assert e.data.metrics["recommended_speedup"] == pytest.approx(rec.modeled_speedup)
    assert e.data.metrics["recommended_drop_ucb"] == 0.0 and e.data.metrics["cactus.feasible"] == 0.0
    assert e.data.metrics["cactus.drop_ucb"] == pytest.approx(1 - 0.1 ** (1 / 24))  # the closest point's bound
    assert task_run.data.params["epsilon"] == "0.2" and task_run.data.params["recommended_method"] == "cactus"
    chosen = config.methods["cactus"]  # both bounds: the confirmation's (exported) and the search's
    assert task_run.data.params["recommended_drop_ucb"] == f"{chosen.drop_upper_bound:.4g}"
    assert task_run.data.params["recommended_search_drop_ucb"] == f"{chosen.search_drop_upper_bound:.4g}" == "0.09148"
    assert chosen.search_drop_upper_bound < chosen.drop_upper_bound <= 0.2
    assert e.info.run_name == "iso export eps 0.1: use strict N=4"
    listed = {a.path for a in client.list_artifacts(e.info.run_id)} | {
        a.path for a in client.list_artifacts(e.info.run_id, "figures")
    }
    assert {
        "pareto_fronts_by_method.png",
        "points.json",
        path.name,
        "settings.json",
        "figures/cactus_pareto_front.png",
        "figures/cactus_speed_vs_delta.png",
        "figures/mentored_speed_vs_alpha.png",
    } <= listed
    # the study runs an export names are the tuning job's (read, not written)
    study_runs = {
        r.data.tags["relaxtune.method"]: r.info.run_id
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("relaxtune.kind") == "study" and r.data.tags.get("relaxtune.job") == job
    }
    assert {m: r.mlflow_run_id for m, r in exported.methods.items()} == study_runs

    again, same_path = run(tight, new_trials=False)  # a second export: another run, its own file replaced
    assert same_path == path and again.recommendation == exported.recommendation
    assert (
        len([r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("relaxtune.kind") == "export"]) == 2
    )
    assert snapshot(client, exp.experiment_id, job, tmp_path / "again") == before


def test_relogged_tables_replace_the_old_rows(tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)
    s = settings(tmp_path, uri, "tables")
    run(s)
    run(s)  # a resumed job draws its figures and tables again
    # the figures' claims are in the job's output folder, which its workers share (given to the Tracker)
    figures = 1 + 2 * len(s.methods)  # the combined one, and a Pareto front and a knob figure per method
    assert len(list((Path(s.output_dir) / "mlflow-figures.claims").glob("*.lock"))) == figures
    client = MlflowClient(s.mlflow_uri)
    exp = client.get_experiment_by_name("relaxtune-tables").experiment_id
    for r in client.search_runs([exp]):
        kind = r.data.tags["relaxtune.kind"]
        if kind not in ("study", "task"):
            continue
        name = "pareto_front.json" if kind == "study" else "points.json"
        table = json.loads(
            Path(client.download_artifacts(r.info.run_id, name, str(tmp_path / r.info.run_id))).read_text()
        )
        cols = table["columns"]
        keys = [
            (row[cols.index("kind")], row[cols.index("method")], row[cols.index("trial")], row[cols.index("n_draft")])
            for row in table["data"]
        ]
        assert len(keys) == len(set(keys))  # each point once, never both feasible and infeasible
        trials = [k for k in keys if k[0] == "trial"]
        assert len(trials) == (4 if kind == "study" else 8) and ("ar", "ar", None, None) in keys


def test_the_figures_are_drawn_holding_neither_the_queue_nor_the_mlflow_lock(tmp_path, monkeypatch, uri):
    # other workers' trial queues and log calls must not wait for one worker drawing the job's figures
    import filelock
    from sqlalchemy.engine import make_url

    from relaxtune.report.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    s = settings(tmp_path, uri, "locks")
    db = Path(make_url(s.storage_url).database).resolve()
    held = []
    draw = Tracker._log_figure

    def probing(self, *args, **kwargs):
        held.append({})
        for purpose, suffix in (("queue", ".lock"), ("mlflow", ".mlflow.lock")):
            other = filelock.FileLock(db.with_name(db.name + suffix), preserve_lock_file=True)
            try:  # another holder, as another worker's would be
                other.acquire(blocking=False)
                other.release()
                held[-1][purpose] = False
            except filelock.Timeout:
                held[-1][purpose] = True
        return draw(self, *args, **kwargs)

    monkeypatch.setattr(Tracker, "_log_figure", probing)
    run(s)
    figures = 1 + 2 * len(s.methods)  # the combined one, and a Pareto front and a knob figure per method
    assert held == [{"queue": False, "mlflow": False}] * figures


def test_an_export_with_nothing_to_read_names_what_is_missing(tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)
    s = settings(tmp_path / "empty", uri, "synthetic")
    spec = load_task(s.task)
    problems = load_problems(spec, None)
    with pytest.raises(JobError, match="no Optuna storage at .*optuna.db .*run `relaxtune tune --task synthetic`"):
        check_exportable(s, spec, problems, "synthetic-pair")

    s = settings(tmp_path / "tuned", uri, "synthetic", methods=["cactus"])
    run(s.model_copy(update={"mlflow_uri": None}), track=False)
    cases = [  # (settings, pair, what the refusal names)
        (
            s.model_copy(update={"methods": ["cactus", "mentored"]}),
            "synthetic-pair",
            r"mentored \(study synthetic__mentored__synthetic-pair does not exist\).*studies of synthetic there: "
            "synthetic__cactus__synthetic-pair",
        ),
        (s, "other-pair", "cactus \\(study synthetic__cactus__other-pair does not exist\\)"),
        (s.model_copy(update={"c_rel": "measured"}), "synthetic-pair", "no saved cost profile at .*cost_profile.json"),
        (s.model_copy(update={"seed": 7}), "synthetic-pair", "no complete strict records at N=4 .*seed 7"),
        (
            s.model_copy(update={"export": str(Path(s.output_dir) / "synthetic.tuned.yaml")}),
            "synthetic-pair",
            "is the tuning run's own config: an export never overwrites it",
        ),
    ]
    for settings_, pair, message in cases:
        with pytest.raises(JobError, match=message):
            check_exportable(settings_, spec, problems, pair)
    check_exportable(s, spec, problems, "synthetic-pair")  # everything there: no refusal


def test_export_files_are_named_by_their_budget(tmp_path):
    s = settings(tmp_path, "sqlite:///unused.db", "synthetic")
    spec = load_task(s.task)
    out = Path(s.output_dir)
    name = lambda **kw: export_path(s.model_copy(update=kw), spec, s).name  # noqa: E731
    assert name(epsilon=0.2) == "synthetic.tuned.eps0.2.yaml"
    assert name() == "synthetic.tuned.eps0.05.yaml"  # the tuning run's own budget still gets its own file
    assert name(epsilon=0.1, confidence=0.95) == "synthetic.tuned.eps0.1.conf0.95.yaml"
    assert name(epsilon=0.1, max_length_ratio=1.5) == "synthetic.tuned.eps0.1.lr1.5.yaml"
    assert name(epsilon=0.1, methods=["cactus"]) == "synthetic.tuned.eps0.1.cactus.yaml"
    assert export_path(s.model_copy(update={"export": str(tmp_path / "mine.yaml")}), spec, s) == tmp_path / "mine.yaml"
    tuned_elsewhere = s.model_copy(update={"export": str(tmp_path / "deploy.yaml")})
    with pytest.raises(JobError, match="tuning run's own config"):
        export_path(s.model_copy(update={"export": str(tmp_path / "deploy.yaml")}), spec, tuned_elsewhere)
    assert export_path(s, spec, tuned_elsewhere).parent == out
