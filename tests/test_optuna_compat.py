"""Contract of ``relaxtune.tune.optuna_compat``: what relaxtune relies on beyond Optuna's
public API, checked on a real SQLite ``RDBStorage``. A failure here names the Optuna
version that broke it: adapt the compat module, nothing else."""

import inspect
import sys

import optuna
import pytest
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from relaxtune.tune.optuna_compat import RDB_MODULES, rdb_tables, requeue

VERSION = f"Optuna {optuna.__version__}"


@pytest.fixture
def storage(tmp_path):
    rdb = RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    yield rdb
    rdb.engine.dispose()


def test_the_rdb_models_are_where_we_import_them_and_name_every_table_the_storage_makes(storage):
    for module in RDB_MODULES:
        __import__(module)
        assert module in sys.modules, VERSION
    made = set(sqlalchemy.inspect(storage.engine).get_table_names())
    tables = rdb_tables()
    assert {"studies", "trials", "trial_params", "trial_values", "version_info"} <= tables, VERSION
    assert tables <= made and made - tables <= {"alembic_version"}, VERSION


def test_a_running_trial_goes_back_to_waiting_keeping_its_number_and_parameters_and_is_popped_first(storage):
    assert list(inspect.signature(RDBStorage.set_trial_state_values).parameters) == [
        "self",
        "trial_id",
        "state",
        "values",
    ], VERSION
    cached = optuna.storages.get_storage(storage)
    study = optuna.create_study(storage=cached, study_name="s")
    study.enqueue_trial({"x": 1.5})
    study.enqueue_trial({"x": 2.5})
    study_id = cached.get_study_id_from_name("s")
    first = cached.get_trial_id_from_study_id_trial_number(study_id, 0)
    assert cached.set_trial_state_values(first, TrialState.RUNNING)
    assert not cached.set_trial_state_values(first, TrialState.RUNNING), VERSION  # the pop's atomicity
    cached.set_trial_user_attr(first, "worker", "w1")
    requeue(cached, first)
    again = cached.get_trial(first)
    assert (again.state, again.number, again.system_attrs["fixed_params"], again.user_attrs) == (
        TrialState.WAITING,
        0,
        {"x": 1.5},
        {"worker": "w1"},
    ), VERSION
    # Optuna's own ask takes it first (the lowest-numbered WAITING trial), with its parameters
    trial = study.ask()
    assert (trial.number, trial.suggest_float("x", 0, 3)) == (0, 1.5), VERSION
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        requeue(cached, first)
    assert cached.get_trial(first).state == TrialState.COMPLETE
