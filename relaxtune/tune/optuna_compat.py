"""Every use of Optuna beyond its public API, in one place (contract: tests/test_optuna_compat.py).

Everything else in relaxtune uses Optuna's public API only (``optuna.Study``,
``optuna.Trial``, ``optuna.storages.RDBStorage``/``BaseStorage`` methods). What
needs more, and why:

- ``RDB_MODULES`` / ``rdb_tables``: the SQL models of ``RDBStorage``
  (``optuna.storages._rdb.models``): the names of its tables, to tell a storage
  already made (opened without the lock) from one still to make; and the module,
  imported before the lock is taken (``storage.load_rdb_modules``).
- ``requeue``: a RUNNING trial put back to WAITING. ``BaseStorage.set_trial_state_values``
  is public, but Optuna only documents WAITING -> RUNNING -> finished; that the RDB
  storage also accepts RUNNING -> WAITING (and that a WAITING trial is popped again,
  same number and parameters) is behaviour we rely on.

Checked against Optuna 5.1 (``optuna>=5,<6`` in pyproject.toml); the contract test
fails on a version where any of these changes.
"""

from __future__ import annotations

import importlib

__all__ = ["RDB_MODULES", "rdb_tables", "requeue"]

RDB_MODULES = ("optuna.storages._rdb.models",)  # what RDBStorage imports lazily on its first use


def rdb_tables() -> set[str]:
    """The names of the tables an Optuna ``RDBStorage`` creates (``BaseModel.metadata``
    of ``optuna.storages._rdb.models``), e.g. ``studies``, ``trials``, ``version_info``.

    Raises:
        ImportError: the module moved (a newer Optuna: the contract test says so).
    """
    models = importlib.import_module("optuna.storages._rdb.models")
    return set(models.BaseModel.metadata.tables)


def requeue(storage, trial_id: int) -> None:
    """Put the RUNNING trial ``trial_id`` back into its study's queue (WAITING), keeping
    its number, parameters and attributes, so the next worker pops it first.

    Args:
        storage: an ``RDBStorage`` or Optuna's cache around one (``optuna.storages.get_storage``).
        trial_id: the storage's id of the trial (``BaseStorage.get_trial_id_from_study_id_trial_number``).

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: the trial already finished (e.g. failed
            as stale by another worker).
        RuntimeError: the storage refused the change (a newer Optuna).
    """
    from optuna.trial import TrialState

    if not storage.set_trial_state_values(trial_id, TrialState.WAITING):
        raise RuntimeError(f"Optuna's storage refused to put trial id {trial_id} back to WAITING")
