"""The form of a job's store addresses, checked when the settings are made (a CLI
flag, a ``--config`` key): an Optuna storage is a database URL, an MLflow store a
database URL or a tracking server, and neither may be an in-memory database (its
runs and trials would end with the process, and no other worker could see them).
Whether the store answers is checked before any model loads
(``relaxtune.report.stores.reach_stores``)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["check_storage_uri", "check_tracking_uri"]

_STORAGE = "a database URL such as sqlite:///relaxtune-runs/optuna.db or postgresql://user@host/db"
_TRACKING = ("sqlite:///mlflow.db, a database URL such as postgresql://user@host/db, or a tracking server "
             "such as http://127.0.0.1:5000")
_MLFLOW_OWN = ("databricks", "databricks-uc", "uc", "file")  # schemes MLflow resolves itself


def check_storage_uri(url: str) -> str:
    """``url`` when it is a database URL that outlives the process (Optuna's storage).

    Raises:
        ValueError: not a URL (no scheme), not a database URL, or an in-memory SQLite database.
    """
    _database(url, _STORAGE, "sqlite:///relaxtune-runs/optuna.db")
    return url


def check_tracking_uri(uri: str) -> str:
    """``uri`` when it is an MLflow store: a database URL that outlives the process, an
    ``http(s)`` tracking server with a host, or a scheme MLflow resolves itself
    (``databricks``, ``file``).

    Raises:
        ValueError: not a URI (no scheme), a server URL without a host, an unknown
            scheme, or an in-memory SQLite database.
    """
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        if not urlsplit(uri).hostname:
            raise ValueError(f"{uri!r} names no host; give e.g. http://127.0.0.1:5000")
        return uri
    if scheme in _MLFLOW_OWN and (":" in uri or uri == "databricks"):
        return uri
    _database(uri, _TRACKING, "sqlite:///mlflow.db")
    return uri


def _database(url: str, wanted: str, example: str) -> None:
    """Raise ``ValueError`` unless ``url`` parses as a SQLAlchemy URL of a database kept on disk or a server."""
    from sqlalchemy.engine import make_url

    if "://" not in url:
        raise ValueError(f"{url!r} is not a URL (no scheme://); give {wanted}")
    try:
        parsed = make_url(url)
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's ArgumentError, said plainly
        raise ValueError(f"{url!r} is not a database URL ({err}); give {wanted}") from None
    database = parsed.database or ""
    memory = database in ("", ":memory:") or database.startswith("file::memory:") or parsed.query.get("mode") == "memory"
    if parsed.get_backend_name() == "sqlite" and memory:
        raise ValueError(f"{url!r} is an in-memory SQLite database: it ends with this process and no other worker "
                         f"sees it; give a file, e.g. {example}")
