"""The form of a job's store addresses, checked when the settings are made (a CLI
flag, a ``--config`` key): an Optuna storage is a database URL, an MLflow store a
database URL of a kind MLflow keeps runs in, or a tracking server; neither may be
an in-memory database (its runs and trials would end with the process, and no
other worker could see them). Whether the store answers is checked before any
model loads (``relaxtune.report.stores.reach_tracking``, ``reach_storage``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["check_storage_uri", "check_tracking_uri", "scheme_of", "MLFLOW_DATABASES"]

MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # the SQLAlchemy stores MLflow keeps runs in
_STORAGE = "a database URL such as sqlite:///relaxtune-runs/optuna.db or postgresql://user@host/db"
_TRACKING = (
    "sqlite:///mlflow.db, a database URL such as postgresql://user@host/db, or a tracking server "
    "such as http://127.0.0.1:5000"
)
_SERVERS = ("http", "https")
_MISSPELT = {"postgres": "postgresql", "psql": "postgresql", "pg": "postgresql", "sqlite3": "sqlite"}


def scheme_of(uri: str) -> str:
    """The scheme of ``uri`` without a driver (``postgresql+psycopg://...`` -> ``postgresql``),
    as written (case kept); ``""`` when it has none."""
    return uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""


def check_storage_uri(url: str) -> str:
    """``url`` when it is a database URL that outlives the process (Optuna's storage).

    Raises:
        ValueError: spaces around it, no scheme, a server or other non-database scheme,
            a scheme not in lower case or misspelt (``postgres://``), or an in-memory
            SQLite database.
    """
    _plain(url, _STORAGE)
    scheme = scheme_of(url)
    if scheme.lower() in _SERVERS + ("file",):
        raise ValueError(f"{url!r} is not a database: Optuna keeps its studies in one; give {_STORAGE}")
    _database(url, _STORAGE, "sqlite:///relaxtune-runs/optuna.db")
    return url


def check_tracking_uri(uri: str) -> str:
    """``uri`` when it is an MLflow store: a database URL (``MLFLOW_DATABASES``) that
    outlives the process, an ``http(s)`` tracking server with a host (and a numeric
    port, if any), or ``databricks``.

    Raises:
        ValueError: spaces around it, no scheme, a server URL without a host or with a
            port that is not a number, a ``file:`` store (MLflow 3 keeps file stores
            read-only), another scheme, or an in-memory SQLite database.
    """
    _plain(uri, _TRACKING)
    scheme = scheme_of(uri).lower() or uri.split(":", 1)[0].lower()
    if scheme in _SERVERS:
        parts = urlsplit(uri)
        if not parts.hostname:
            raise ValueError(f"{uri!r} names no host; give e.g. http://127.0.0.1:5000")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"{uri!r}: the port is not a number; give e.g. http://127.0.0.1:5000") from None
        return uri
    if uri == "databricks" or scheme == "databricks":
        return uri
    if scheme == "file":
        raise ValueError(f"{uri!r}: MLflow 3 keeps file stores read-only (maintenance mode); give {_TRACKING}")
    if scheme_of(uri) and _known(uri, MLFLOW_DATABASES) not in MLFLOW_DATABASES:
        raise ValueError(
            f"{uri!r}: MLflow keeps runs in {', '.join(MLFLOW_DATABASES)} databases or on a tracking "
            f"server, not {scheme_of(uri)!r}; give {_TRACKING}"
        )
    _database(uri, _TRACKING, "sqlite:///mlflow.db")
    return uri


def _plain(uri: str, wanted: str) -> None:
    if uri != uri.strip():
        raise ValueError(f"{uri!r} has spaces around it; give {wanted}")
    if "://" not in uri and uri != "databricks":
        raise ValueError(f"{uri!r} is not a URL (no scheme://); give {wanted}")


def _known(uri: str, names: tuple[str, ...]) -> str:
    """The scheme of ``uri``, refused when written in another case or misspelt."""
    scheme = scheme_of(uri)
    if scheme != scheme.lower() and scheme.lower() in names + tuple(_MISSPELT):
        raise ValueError(f"{uri!r}: write the scheme in lower case ({scheme.lower()}://...)")
    if scheme in _MISSPELT:
        raise ValueError(f"{uri!r}: SQLAlchemy names this database {_MISSPELT[scheme]}:// (not {scheme}://)")
    return scheme


def _database(url: str, wanted: str, example: str) -> None:
    """Raise ``ValueError`` unless ``url`` parses as a SQLAlchemy URL of a database kept on disk or a server."""
    from sqlalchemy.engine import make_url

    _known(url, MLFLOW_DATABASES)
    try:
        parsed = make_url(url)
    except Exception as err:
        raise ValueError(f"{url!r} is not a database URL ({err}); give {wanted}") from None
    database = parsed.database or ""
    memory = (
        database in ("", ":memory:") or database.startswith("file::memory:") or parsed.query.get("mode") == "memory"
    )
    if parsed.get_backend_name() == "sqlite" and memory:
        raise ValueError(
            f"{url!r} is an in-memory SQLite database: it ends with this process and no other worker "
            f"sees it; give a file, e.g. {example}"
        )
