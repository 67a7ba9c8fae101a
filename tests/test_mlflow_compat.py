"""Contract of ``relaxtune.report.mlflow_compat`` (and of the public replica of what
``mlflow.log_input`` sends), checked on real SQLite tracking stores. A failure here names
the MLflow version that broke it: adapt the compat module, nothing else."""

import sqlite3

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from relaxtune.report.mlflow_compat import forget_store, latest_schema_revision, schema_revisions
from relaxtune.report.mlflow_runs import dataset_entity
from relaxtune.report.stores import mlflow_state

VERSION = f"MLflow {mlflow.__version__}"


def test_the_latest_schema_revision_is_what_a_new_store_holds(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments(max_results=1)  # MLflow creates and migrates it
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        ((version,),) = db.execute("SELECT version_num FROM alembic_version").fetchall()
    revision = latest_schema_revision()
    assert isinstance(revision, str) and revision == version, VERSION
    assert mlflow_state(uri)["complete"]
    forget_store(uri)


def test_a_forgotten_store_is_opened_anew_as_a_new_process_would(tmp_path):
    path = tmp_path / "mlflow.db"
    uri = f"sqlite:///{path}"
    client = MlflowClient(uri)
    client.create_experiment("kept")
    assert forget_store(uri) is True, VERSION  # this process kept an engine for it
    assert forget_store(uri) is False, VERSION  # and no longer does
    path.rename(tmp_path / "aside.db")  # what stores._move_aside does
    fresh = MlflowClient(uri)
    assert [e.name for e in fresh.search_experiments()] == ["Default"], VERSION  # created anew, not the old engine
    assert path.exists()
    forget_store(uri)


def test_the_dataset_entity_is_what_log_input_logs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    df = pd.DataFrame([{"id": "p1", "prompt": "2+2?", "gold": "4"}, {"id": "p2", "prompt": "3+3?", "gold": "6"}])
    dataset = mlflow.data.from_pandas(df, name="tiny-v1")
    client = MlflowClient(uri)
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as run:
            mlflow.log_input(dataset, context="tuning")
        logged = client.get_run(run.info.run_id).inputs.dataset_inputs[0].dataset
    finally:
        mlflow.set_tracking_uri(None)
    ours = dataset_entity(dataset)
    fields = ("name", "digest", "source_type", "source", "schema", "profile")
    assert [getattr(ours, f) for f in fields] == [getattr(logged, f) for f in fields], VERSION
    forget_store(uri)


def test_the_schema_revisions_run_newest_first_from_the_latest():
    revisions = schema_revisions("sqlite:///unused.db")  # read from MLflow's migration scripts, no store opened
    assert revisions[0] == latest_schema_revision() and len(revisions) == len(set(revisions)) > 5, VERSION
