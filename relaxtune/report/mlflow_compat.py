"""Every use of MLflow beyond its public API, in one place (contract: tests/test_mlflow_compat.py).

Everything else in relaxtune uses MLflow's public API only (``MlflowClient``,
``mlflow.entities``, ``mlflow.data``). What needs more, and why:

- ``latest_schema_revision``: the newest alembic revision of MLflow's SQL schema
  (``mlflow.store.db.utils._get_latest_schema_revision``), to tell a store fully
  migrated from one a killed process left half-migrated (``stores.mlflow_state``).
- ``schema_revisions``: every revision, newest first (``_get_alembic_config``), for the
  tests' store left half-migrated.
- ``forget_store``: drop what this process keeps of an SQL tracking store (the engine
  in ``SqlAlchemyStore._engine_map``, the store cached by
  ``TrackingStoreRegistry._get_store_with_resolved_uri`` in
  ``mlflow.tracking._tracking_service.registry``), so a store moved aside is created
  anew at its next opening, as a new process would find it.

Checked against MLflow 3.17 (``mlflow>=3.17,<4`` in pyproject.toml); the contract test
fails on a version where any of these changes.
"""

from __future__ import annotations

__all__ = ["latest_schema_revision", "schema_revisions", "forget_store"]


def latest_schema_revision() -> str:
    """The alembic revision (e.g. ``"1b5f0d9ad7c1"``) a fully migrated MLflow SQL store holds
    in its ``alembic_version`` table, for this MLflow."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def schema_revisions(uri: str) -> list[str]:
    """Every alembic revision of MLflow's SQL schema, the newest first (MLflow's migration
    scripts, ``mlflow.store.db.utils._get_alembic_config``); the tests fake a migration cut
    short with an older one."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return [r.revision for r in ScriptDirectory.from_config(_get_alembic_config(uri)).walk_revisions()]


def forget_store(uri: str) -> bool:
    """Forget this process's engine and cached store of the SQL tracking store ``uri``
    (the engine disposed: its connections closed). True when an engine was kept."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()
    TrackingStoreRegistry._get_store_with_resolved_uri.cache_clear()  # a store this process opened before
    return engine is not None
