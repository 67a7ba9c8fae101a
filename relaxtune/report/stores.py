"""A tuning job's stores, created and migrated once before any worker uses them.

Any number of workers may start at the same instant on stores that do not exist
yet. MLflow creates and migrates its database in whichever client opens it
first, and Optuna creates its tables in whichever storage opens them first:
left to themselves, workers starting together run the same migration at once
and crash ("table _alembic_tmp_experiments already exists", "duplicate column"),
sometimes leaving the store half-migrated. ``prepare_stores`` creates both stores
under the job's storage lock (``relaxtune.tune.storage.storage_lock``: a file lock
next to an SQLite file, a PostgreSQL advisory lock), before any MLflow client or
Optuna storage of the job opens them; the workers that wait find them ready.

A store left half-created by a process that died while creating it is repaired
when it holds nothing yet (an SQLite file is moved aside to
``<file>.broken-<time>``, never deleted, and created anew), else refused with a
``StoreError`` that says what to do. An MLflow tracking server (``http(s)://``)
migrates its own store when it starts: nothing to prepare.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..tune.stopping import first_line

__all__ = [
    "StoreError",
    "prepare_stores",
    "prepare_optuna",
    "prepare_mlflow",
    "mlflow_state",
    "is_database",
    "reach_tracking",
    "reach_storage",
]

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3's default store (it refuses ./mlruns)
REACH_TIMEOUT = 10  # seconds to connect to a database server or a tracking server (reach_tracking, reach_storage)
_DRIVERS = {
    "postgresql": "install relaxtune[postgres] (psycopg 3) and write postgresql+psycopg://...",
    "mysql": "install a MySQL driver (e.g. pip install pymysql) and write mysql+pymysql://...",
    "mssql": "install a SQL Server driver (e.g. pip install pyodbc) and write mssql+pyodbc://...",
}
QUIET_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")  # MLflow's migration chatter
LEFTOVER = "_alembic_tmp_"  # the tables alembic's batch migrations build on SQLite, then rename


class StoreError(RuntimeError):
    """A store could not be created or migrated; the message says what to do."""


def prepare_stores(
    storage_url: str,
    mlflow_uri: str | None,
    *,
    track: bool = True,
    optuna: bool = True,
    log: Callable[[str], None] = print,
) -> None:
    """Create and migrate (``optuna``) the Optuna storage ``storage_url`` and (``track``) the
    MLflow store ``mlflow_uri`` (default ``sqlite:///mlflow.db``) once, each under its lock
    (an export reads an existing storage: ``optuna=False``).

    Raises:
        StoreError: a store that cannot be created or migrated (the message says why
            and what to do), or a missing database driver.
    """
    if optuna:
        prepare_optuna(storage_url, log)
    if track:
        prepare_mlflow(mlflow_uri or DEFAULT_URI, log)


def reach_tracking(uri: str | None) -> None:
    """Reach the MLflow store ``uri`` (default ``sqlite:///mlflow.db``) before any model
    loads, so that a wrong address fails in seconds and names ``--mlflow-uri``: an
    SQLite file's folder must exist and be writable, a database server must accept a
    connection and a tracking server answer MLflow's API, each within
    ``REACH_TIMEOUT`` seconds. Nothing is created or migrated (``prepare_stores`` does it).

    Raises:
        StoreError: a store that cannot be reached, saying why and what to do.
    """
    uri = uri or DEFAULT_URI
    if is_database(uri):
        _reach_database(uri, "--mlflow-uri", None)
    elif uri.lower().startswith(("http://", "https://")):
        _reach_server(uri)


def reach_storage(url: str, output_dir: str | Path | None = None) -> None:
    """Reach the Optuna storage ``url`` as ``reach_tracking`` reaches MLflow's, naming
    ``--storage``; an SQLite file may lie in a folder to be made inside ``output_dir``
    (the job creates it), never elsewhere: a typo never creates folders.

    Raises:
        StoreError: a storage that cannot be reached, saying why and what to do.
    """
    _reach_database(url, "--storage", output_dir)


def _reach_database(url: str, flag: str, output_dir: str | Path | None) -> None:
    import sqlalchemy
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database).resolve()
        inside = output_dir is not None and path.parent.is_relative_to(Path(output_dir).resolve())
        if path.is_dir():
            raise StoreError(f"{flag} {url}: {path} is a folder; give a file in it, e.g. {path / 'store.db'}")
        if path.is_file() and path.stat().st_size and not _sqlite_file(path):  # (an empty file is a new database)
            raise StoreError(
                f"{flag} {url}: {path} is not an SQLite database (its first bytes are not SQLite's); "
                "give a new file, or the database file itself"
            )
        if not path.parent.is_dir() and not inside:
            raise StoreError(
                f"{flag} {url}: the folder {path.parent} does not exist (a typo?); create it, or give a "
                "file in a folder that exists"
            )
        if path.parent.is_dir() and not os.access(path.parent, os.W_OK | os.X_OK):
            raise StoreError(
                f"{flag} {url}: the folder {path.parent} is not writable (SQLite writes its journal "
                "there); give a file in a folder you may write to"
            )
        return
    connect = {"connect_timeout": REACH_TIMEOUT} if parsed.get_backend_name() in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(parsed, connect_args=connect)
    except ImportError as err:
        raise StoreError(
            f"{flag} {_shown(url)}: its database driver is missing ({err}); "
            f"{_DRIVERS.get(parsed.get_backend_name(), 'install the driver SQLAlchemy names')}"
        ) from None
    except Exception as err:
        raise StoreError(f"{flag} {_shown(url)}: {type(err).__name__}: {first_line(str(err), 200)}") from None
    try:
        with engine.connect():
            pass
    except Exception as err:
        raise StoreError(
            f"{flag} {_shown(url)}: the database does not accept a connection within {REACH_TIMEOUT} s "
            f"({type(err).__name__}: {first_line(str(err), 200)}); start its server, create the "
            "database, or fix the address"
        ) from None
    finally:
        engine.dispose()


def _sqlite_file(path: Path) -> bool:
    """Whether ``path`` starts with SQLite's header (read, never opened as a database)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _reach_server(uri: str) -> None:
    """A tracking server answering MLflow's REST API, with the credentials MLflow itself would send."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    endpoint = "/api/2.0/mlflow/experiments/search"
    try:
        response = http_request(
            get_default_host_creds(uri),
            endpoint,
            "GET",
            max_retries=0,
            timeout=REACH_TIMEOUT,
            raise_on_status=False,
            params={"max_results": 1},
        )
    except Exception as err:
        raise StoreError(
            f"--mlflow-uri {_shown(uri)}: no MLflow tracking server answers there within {REACH_TIMEOUT} s "
            f"({_why(err)}); start it (`mlflow server --host ... --port ...`), "
            f"fix the address, or leave --mlflow-uri out for the default {DEFAULT_URI}"
        ) from None
    if response.status_code in (401, 403):
        raise StoreError(
            f"--mlflow-uri {_shown(uri)}: the tracking server refused this client (HTTP {response.status_code}); "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"
        )
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code != 200 or not isinstance(answer, dict):
        raise StoreError(
            f"--mlflow-uri {_shown(uri)}: a server answers there, but not as an MLflow tracking server (GET "
            f"{endpoint}: HTTP {response.status_code}); give the tracking server's address"
        )


def _why(err: BaseException) -> str:
    """Why a request failed, in a few words (MLflow folds the cause into its message)."""
    text = str(err).lower()
    for needle, said in (
        ("connection refused", "connection refused"),
        ("timed out", "timed out"),
        ("name or service not known", "no such host"),
        ("nodename nor servname", "no such host"),
        ("temporary failure in name resolution", "no such host"),
        ("certificate", "TLS certificate"),
    ):
        if needle in text:
            return said
    return f"{type(err).__name__}: {first_line(str(err), 200)}"


def prepare_optuna(url: str, log: Callable[[str], None] = print) -> None:
    """Create the Optuna storage's tables once, under its lock (Optuna's ``create_all`` only
    adds missing tables, so one left half-created by a killed process is completed);
    a storage already made is opened without the lock (``open_rdb``).

    Raises:
        StoreError: the storage cannot be opened (e.g. an older Optuna schema: the
            message names ``optuna storage upgrade``).
    """
    from ..tune.storage import open_rdb

    try:
        storage = open_rdb(url)
    except ImportError as err:
        raise StoreError(f"Optuna storage {_shown(url)}: {err} (install relaxtune[postgres] for PostgreSQL)") from err
    except Exception as err:
        raise StoreError(
            f"Optuna storage {_shown(url)} could not be opened: {type(err).__name__}: "
            f"{str(err).rstrip('.')}. If it was made by an older Optuna, run `optuna storage upgrade "
            "--storage URL`; else point --storage at a new database"
        ) from err
    storage.engine.dispose()


def mlflow_state(uri: str) -> dict:
    """What an MLflow database holds, read without MLflow: ``tables`` (set of names),
    ``leftovers`` (``_alembic_tmp_*`` tables of a migration cut short), ``runs`` (how
    many; 0 without a runs table), ``version`` (alembic's revision or None) and
    ``complete`` (every table MLflow defines exists, at its newest revision, no leftovers)."""
    import sqlalchemy
    from mlflow.store.db.base_sql_model import Base

    from .mlflow_compat import latest_schema_revision

    engine = sqlalchemy.create_engine(uri)
    try:
        tables = set(sqlalchemy.inspect(engine).get_table_names())
        with engine.connect() as conn:
            runs = conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM runs")).scalar() if "runs" in tables else 0
            version = (
                conn.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()
                if "alembic_version" in tables
                else None
            )
    finally:
        engine.dispose()
    leftovers = sorted(t for t in tables if t.startswith(LEFTOVER))
    complete = set(Base.metadata.tables) <= tables and not leftovers and version == latest_schema_revision()
    return {"tables": tables, "leftovers": leftovers, "runs": runs, "version": version, "complete": complete}


def prepare_mlflow(uri: str, log: Callable[[str], None] = print) -> None:
    """Create and migrate the MLflow store at ``uri`` once, under its lock; repair one
    left half-created (it holds no runs) or refuse it.

    Raises:
        StoreError: a half-migrated store that holds runs, or one that cannot be created.
    """
    from sqlalchemy.engine import make_url

    from ..tune.storage import storage_lock

    if not is_database(uri):
        return  # a tracking server migrates its own store; other schemes are not databases
    url = make_url(uri)
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite and url.database:
        Path(url.database).resolve().parent.mkdir(parents=True, exist_ok=True)
    import mlflow.store.db.utils
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401   before the lock that other workers wait for

    for name in QUIET_LOGGERS:  # their INFO lines ("Creating initial MLflow database tables...") broke the progress
        logging.getLogger(name).setLevel(logging.WARNING)
    with storage_lock(uri)():
        state = mlflow_state(uri)
        if state["complete"]:
            return
        if not state["tables"]:
            log(f"creating the MLflow store at {uri} (its first use: MLflow's migrations take a few seconds)")
        broken = bool(state["leftovers"]) or (state["tables"] and not state["complete"] and state["runs"] == 0)
        if broken and state["runs"] == 0 and sqlite:
            _move_aside(uri, url.database, state, log)
        elif state["leftovers"]:
            raise StoreError(
                _refusal(uri, state, f"leftover tables {', '.join(state['leftovers'])} of a migration cut short")
            )
        try:
            _open(uri)
        except Exception as err:
            state = mlflow_state(uri)
            if not (sqlite and state["runs"] == 0):
                raise StoreError(
                    _refusal(uri, state, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
                ) from err
            _move_aside(uri, url.database, state, log)
            _open(uri)


def is_database(uri: str) -> bool:
    """Whether MLflow's ``uri`` names a database it opens itself (SQLite, PostgreSQL,
    MySQL, SQL Server), not a tracking server (``http(s)://``, ``databricks``)."""
    from ..tune.store_uris import MLFLOW_DATABASES, scheme_of

    return scheme_of(uri).lower() in MLFLOW_DATABASES


def _open(uri: str) -> None:
    """Open the store through MLflow (which creates and migrates it) and read from it."""
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).search_experiments(max_results=1)


def _move_aside(uri: str, database: str, state: dict, log: Callable[[str], None]) -> None:
    """Move a half-created SQLite store (no runs) to ``<file>.broken-<time>`` and forget
    MLflow's engine of it, so the next open creates it anew."""
    from .mlflow_compat import forget_store

    forget_store(uri)
    path = Path(database).resolve()
    aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm", "-journal"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            os.replace(part, aside.with_name(aside.name + suffix))
    what = f"leftover tables {', '.join(state['leftovers'])}" if state["leftovers"] else "tables missing or unversioned"
    log(
        f"MLflow store {path} was left half-created by a process that died while creating it ({what}; no runs): "
        f"moved aside to {aside.name} and created anew"
    )


def _refusal(uri: str, state: dict, why: str) -> str:
    if "Can't locate revision" in why:  # e.g. Optuna's alembic_version in the same database
        return (
            f"MLflow store {_shown(uri)}: its database holds another application's tables (alembic revision "
            f"{state['version']} is not MLflow's; Optuna keeps one too): give MLflow a database of its own"
        )
    return (
        f"MLflow store {_shown(uri)} is half-migrated ({why}) and holds {state['runs']} run(s), so it is left as "
        f"it is: back it up, drop the leftover tables ({', '.join(state['leftovers']) or 'none'}), then run "
        f"`mlflow db upgrade {_shown(uri)}`; or point --mlflow-uri at a new store"
    )


def _shown(url: str) -> str:
    """``url`` with its password hidden (a database URL's, or a server URL's ``user:password@``)."""
    from urllib.parse import urlsplit, urlunsplit

    from sqlalchemy.engine import make_url

    if url.lower().startswith(("http://", "https://")):
        parts = urlsplit(url)
        if parts.password is None:
            return url
        return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url
