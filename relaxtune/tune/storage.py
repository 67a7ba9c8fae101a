"""The Optuna RDB storage (SQLite, PostgreSQL, MySQL) that every worker process and
host of a tuning job shares: opening it (``open_rdb``: its tables made once, under the
lock, its schema checked once per process; an SQLite file in write-ahead-log mode,
``write_ahead_log``) and its locks (``StorageLock``, one per storage and purpose in
a process: ``storage_lock``): a PostgreSQL advisory lock, MySQL ``GET_LOCK``, a file
lock next to an SQLite file. The trial queues that change under it: ``studies``.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optuna.storages import RDBStorage

from .optuna_compat import RDB_MODULES, rdb_tables

__all__ = ["StorageLock", "storage_lock", "load_rdb_modules", "open_rdb", "write_ahead_log"]

_LOCK_NAME = "relaxtune-trial-queue"
_CHECKED: set[str] = set()  # storage URLs whose tables this process has made or checked (open_rdb)


def load_rdb_modules() -> None:
    """Import what Optuna's ``RDBStorage`` imports lazily on its first use in a process
    (its SQL models, alembic: about 0.5-0.9 s of CPU), so that it happens before the
    storage's lock is taken: workers starting together would otherwise import them
    one after another, each holding the lock that the others wait for."""
    import importlib

    for module in (*RDB_MODULES, "alembic.command", "alembic.config", "alembic.migration", "alembic.script"):
        importlib.import_module(module)


def _rdb_made(url: str) -> bool:
    """Whether Optuna's tables all exist at ``url`` with their version rows written, so
    that opening the storage only reads (False when it cannot tell: opening it says why)."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        try:
            if not rdb_tables() <= set(sqlalchemy.inspect(engine).get_table_names()):
                return False
            with engine.connect() as conn:
                return all(
                    conn.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {table}")).scalar()
                    for table in ("version_info", "alembic_version")
                )
        finally:
            engine.dispose()
    except Exception:
        return False


def open_rdb(url: str, lock: StorageLock | None = None, **kwargs) -> RDBStorage:
    """``RDBStorage(url, **kwargs)``, under ``lock`` (default ``storage_lock(url)``) only
    while its tables are not all made (checked again once the lock is held): the first
    worker creates them (an SQLite file in write-ahead-log mode), and the workers that
    waited for it open the storage together, not one after another. Its schema is
    checked against this Optuna once per process: opening it again, while its tables
    are there, skips the check (each reads Optuna's migration scripts: about 0.1 s of CPU).

    Raises:
        as ``RDBStorage``: ImportError for a missing driver, RuntimeError for a schema
        of another Optuna version, SQLAlchemy's errors for a store it cannot open.
    """
    if url in _CHECKED and _rdb_made(url):  # (not a store deleted since: made again below, under the lock)
        return RDBStorage(url, skip_compatibility_check=True, skip_table_creation=True, **kwargs)
    lock = lock or storage_lock(url)
    load_rdb_modules()
    rdb = None
    if not _rdb_made(url):
        with lock():  # concurrent creation of the tables would collide
            if not _rdb_made(url):
                rdb = RDBStorage(url, **kwargs)
                if lock.kind == "sqlite":  # from its creation on (the mode is kept in the file): the
                    with rdb.engine.connect() as conn:  # workers opening it next read while one writes
                        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    rdb = rdb or RDBStorage(url, **kwargs)
    if not (lock.kind == "sqlite" and lock._file is None):  # an in-memory SQLite is a new one at each opening
        _CHECKED.add(url)
    return rdb


class StorageLock:
    """A lock shared by every process and host that uses one storage URL.

    Threads of this process first take a lock among themselves, then the one
    between processes: PostgreSQL, a transaction-scoped advisory lock; MySQL or
    MariaDB, ``GET_LOCK``; SQLite, a ``filelock.FileLock`` on ``<database>.lock`` (SQLite
    is one host anyway); an in-memory SQLite or another database, none (with a
    warning for the latter). Re-entrant within a thread. Released when its holder
    dies (the connection or the file closes). ``purpose`` names one of several
    independent locks of the storage: ``"queue"`` (the trial queues and stores;
    ``<database>.lock``) or another (``<database>.<purpose>.lock``, e.g.
    ``"mlflow"``: the job's MLflow runs, written without holding up the queues;
    ``"finish"``: the job's figures, drawn without holding up the log calls).
    """

    def __init__(self, url: str, purpose: str = "queue") -> None:
        import sqlalchemy
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        self.kind = parsed.get_backend_name()
        self._name = _LOCK_NAME if purpose == "queue" else f"{_LOCK_NAME}-{purpose}"
        self._held = threading.local()
        self._thread_lock = threading.Lock()
        self._engine = self._file = self._file_lock = None
        if self.kind == "sqlite" and parsed.database not in (None, "", ":memory:"):
            import filelock

            suffix = ".lock" if purpose == "queue" else f".{purpose}.lock"
            self._file = Path(parsed.database).resolve().with_name(Path(parsed.database).name + suffix)
            # flock(2) on Unix, released when its holder dies; the file stays (deleting it would let two
            # holders lock two files of one name)
            self._file_lock = filelock.FileLock(self._file, thread_local=False, preserve_lock_file=True)
        elif self.kind in ("postgresql", "mysql", "mariadb"):
            self._engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=0)
        elif self.kind != "sqlite":
            warnings.warn(
                f"no cross-process lock for {self.kind} storages: run one worker per study, or use "
                "PostgreSQL, MySQL or SQLite",
                stacklevel=2,
            )

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        with self._thread_lock, self._acquire():  # one connection per process waits for the lock
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0

    @contextmanager
    def _acquire(self) -> Iterator[None]:
        from sqlalchemy import text

        if self._file_lock is not None:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            with self._file_lock:  # waits as long as it takes
                yield
        elif self._engine is not None and self.kind == "postgresql":
            key = int.from_bytes(hashlib.blake2b(self._name.encode(), digest_size=8).digest(), "big", signed=True)
            with self._engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
                yield
        elif self._engine is not None:
            with self._engine.connect() as conn:
                conn.execute(text("SELECT GET_LOCK(:name, -1)"), {"name": self._name})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": self._name})
        else:
            yield


@functools.cache
def storage_lock(url: str, purpose: str = "queue") -> StorageLock:
    """The one ``StorageLock`` of this process for ``url`` and ``purpose`` (so holding it and
    taking it again in the same thread, e.g. the tracker inside a queue operation, never deadlocks)."""
    return StorageLock(url, purpose)


def write_ahead_log(engine) -> None:
    """SQLite in write-ahead-log mode with normal sync: readers never wait for the
    writer and a commit costs no sync of the whole file (workers write often)."""
    from sqlalchemy import event

    def pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections opened before the listener reopen with it
