"""Stores created once however many workers start together on them (``relaxtune.report.stores``):
the race of MLflow's migrations, and a store a killed process left half-created."""

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relaxtune.report.stores import StoreError, mlflow_state, prepare_mlflow, prepare_stores

ROOT = Path(__file__).parents[1]
ENV = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
WORKER = """
import sys, time
from pathlib import Path
from relaxtune.report.stores import prepare_stores
from mlflow.tracking import MlflowClient
import optuna
folder, mlflow_uri, storage = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(folder / f"ready{sys.argv[4]}").touch()
while not (folder / "go").exists():
    time.sleep(0.002)
prepare_stores(storage, mlflow_uri, log=lambda m: None)
client = MlflowClient(mlflow_uri)
client.create_run(client.get_experiment_by_name("Default").experiment_id)
optuna.create_study(storage=storage, study_name="s", load_if_exists=True).enqueue_trial({})
print("ok")
"""


def _start_together(tmp_path: Path, mlflow_uri: str, storage: str, n: int = 3) -> list[subprocess.CompletedProcess]:
    """``n`` processes that, once all are imported, prepare and use the stores at the same instant."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), mlflow_uri, storage, str(i)],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n)
    ]
    try:
        deadline = time.time() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(n)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), [p.poll() for p in procs]
            time.sleep(0.05)
        (tmp_path / "go").touch()
        return [(p.wait(timeout=180), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _check(results, mlflow_uri: str, storage: str, n: int = 3) -> None:
    import optuna
    from mlflow.tracking import MlflowClient

    assert [rc for rc, _ in results] == [0] * n, "\n".join(out[-2000:] for _, out in results)
    assert mlflow_state(mlflow_uri)["complete"]
    assert len(MlflowClient(mlflow_uri).search_runs(["0"])) == n
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == n


@pytest.mark.slow
def test_three_workers_starting_at_once_on_fresh_sqlite_stores(tmp_path):
    mlflow_uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", f"sqlite:///{tmp_path / 'optuna.db'}"
    _check(_start_together(tmp_path, mlflow_uri, storage), mlflow_uri, storage)


def test_three_workers_starting_at_once_on_fresh_postgresql_stores(pg_database, tmp_path):
    mlflow_uri, storage = pg_database("mlflow"), pg_database("optuna")
    _check(_start_together(tmp_path, mlflow_uri, storage), mlflow_uri, storage)


def _half_migrated(path: Path, runs: int) -> str:
    """An SQLite MLflow store as a process killed in the middle of its migration leaves it:
    a leftover ``_alembic_tmp_experiments``, a table missing, alembic's revision behind."""
    from mlflow.tracking import MlflowClient

    from relaxtune.report.mlflow_compat import schema_revisions

    uri = f"sqlite:///{path}"
    client = MlflowClient(uri)
    for _ in range(runs):
        client.create_run("0")
    revisions = schema_revisions(uri)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
        db.execute("DROP TABLE job_locks")
        db.execute("UPDATE alembic_version SET version_num = ?", (revisions[5],))
    from relaxtune.report.mlflow_compat import forget_store

    assert forget_store(uri)  # as a new process finds it
    return uri


@pytest.mark.slow  # about 6-11 s: the default run stays under 8 minutes on 2 cores
def test_a_half_created_store_with_no_runs_is_moved_aside_and_created_anew(tmp_path):
    uri = _half_migrated(tmp_path / "mlflow.db", runs=0)
    plain = subprocess.run(
        [sys.executable, "-c", f"from mlflow.tracking import MlflowClient; MlflowClient({uri!r}).search_experiments()"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    # MLflow alone cannot open it: its upgrade stops at the first migration the half state breaks ("table
    # _alembic_tmp_experiments already exists", or, in newer releases, an earlier migration's missing column)
    assert plain.returncode != 0 and "Traceback" in plain.stderr and "mlflow/store/db" in plain.stderr
    said = []
    prepare_mlflow(uri, said.append)
    assert mlflow_state(uri)["complete"]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("mlflow.db.broken-")]
    assert len(aside) == 1 and "_alembic_tmp_experiments" in said[0] and aside[0].name in said[0]
    with sqlite3.connect(aside[0]) as db:  # kept, not deleted
        assert db.execute("SELECT COUNT(*) FROM _alembic_tmp_experiments").fetchone() == (0,)


def test_a_half_migrated_store_with_runs_is_refused_saying_what_to_do(tmp_path):
    uri = _half_migrated(tmp_path / "mlflow.db", runs=2)
    before = (tmp_path / "mlflow.db").read_bytes()
    with pytest.raises(StoreError, match=r"_alembic_tmp_experiments.*holds 2 run\(s\).*mlflow db upgrade"):
        prepare_stores(f"sqlite:///{tmp_path / 'optuna.db'}", uri, log=lambda m: None)
    assert (tmp_path / "mlflow.db").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if "broken" in p.name] == []


def test_mlflow_and_optuna_in_one_database_is_refused_with_the_fix(pg_database):
    url = pg_database("shared")
    prepare_stores(url, None, track=False, log=lambda m: None)  # Optuna's tables (and its alembic_version) first
    with pytest.raises(StoreError, match="database of its own"):
        prepare_mlflow(url, lambda m: None)


def test_an_optuna_storage_is_made_once_in_write_ahead_log_mode_and_its_schema_checked_once(tmp_path, monkeypatch):
    from relaxtune.tune import storage, studies

    checks = []
    opening = storage.RDBStorage

    def counted(url, *args, **kwargs):  # an opening that checks the schema (Optuna's public switch)
        checks.extend([1] * (not kwargs.get("skip_compatibility_check", False)))
        return opening(url, *args, **kwargs)

    monkeypatch.setattr(storage, "RDBStorage", counted)
    monkeypatch.setattr(storage, "_CHECKED", set())
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    prepare_stores(url, None, track=False, log=lambda m: None)
    with sqlite3.connect(
        tmp_path / "optuna.db"
    ) as db:  # kept in the file: every later connection reads beside a writer
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert checks == [1]
    storage.open_rdb(url).engine.dispose()  # the job's later openings (its checks, its trial queue) skip it
    studies.TrialQueue(url, heartbeat=2, stale_after=10, worker="w").storage.get_all_studies()
    assert checks == [1]


def test_an_optuna_storage_of_another_schema_is_refused_at_its_first_opening_naming_the_upgrade(tmp_path, monkeypatch):
    from relaxtune.tune import storage

    monkeypatch.setattr(storage, "_CHECKED", set())
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage.open_rdb(url).engine.dispose()
    with sqlite3.connect(tmp_path / "optuna.db") as db:  # as an older Optuna would have left it
        db.execute("UPDATE alembic_version SET version_num = 'v1.2.0.a'")
    monkeypatch.setattr(storage, "_CHECKED", set())  # a new process
    with pytest.raises(StoreError, match="optuna storage upgrade"):
        prepare_stores(url, None, track=False, log=lambda m: None)


def test_a_storage_deleted_after_its_first_opening_is_made_again_by_the_same_process(tmp_path, monkeypatch):
    """A long-lived process (a Prefect worker running flows in-process) opens a storage
    that someone deleted since: its tables are made again, not assumed."""
    import optuna

    from relaxtune.tune import storage, studies

    monkeypatch.setattr(storage, "_CHECKED", set())
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    prepare_stores(url, None, track=False, log=lambda m: None)
    (tmp_path / "optuna.db").unlink()
    for leftover in tmp_path.glob("optuna.db-*"):  # the write-ahead log's files
        leftover.unlink()
    queue = studies.TrialQueue(url, heartbeat=2, stale_after=10, worker="w")
    optuna.create_study(storage=queue.storage, study_name="s").enqueue_trial({})
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1


def test_a_fresh_store_says_so_in_one_line_of_ours_not_mlflows(tmp_path, capfd):
    """MLflow's INFO lines ("Creating initial MLflow database tables...", "Updating database tables") were
    printed among the job's progress lines; a fresh store now gets one line of the job's own log."""
    said = []
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_mlflow(uri, said.append)
    prepare_mlflow(uri, said.append)  # ready: nothing to say
    out = capfd.readouterr()
    assert "database tables" not in out.out + out.err
    assert said == [f"creating the MLflow store at {uri} (its first use: MLflow's migrations take a few seconds)"]
