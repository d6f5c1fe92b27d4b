"""The database under the store: SQLite in the data dir, or PostgreSQL at ``KB_DATABASE_URL``.

``index.store.Store`` has one set of SQL for both. It is written in the subset
the two share (``ON CONFLICT`` upserts, ``RETURNING id``, ``IS DISTINCT FROM``,
window functions, reserved column names quoted) with SQLite's ``?``
placeholders; ``PostgresDatabase`` (``index.pg_database``) turns ``?`` into psycopg's ``%s`` and, in
``CREATE TABLE`` and ``ALTER TABLE ... ADD COLUMN``, SQLite's column types into
Postgres's (``INTEGER PRIMARY KEY`` -> an identity column, ``INTEGER`` ->
``BIGINT``, ``REAL`` -> ``DOUBLE PRECISION``, ``BLOB`` -> ``BYTEA``). So the
Postgres schema comes from the same migrations (``index.schema``) as SQLite's.

What differs beyond the SQL is here, behind one interface (``Database``): a
connection per thread, write transactions, locks several processes contend
for (file locks beside SQLite, advisory locks on Postgres), and the
translation of each driver's failures into ``DatabaseUnavailable`` and the
storage errors. psycopg is imported only when a Postgres URL is configured.

A database URL with a password is a secret: it appears only masked
(``masked_url``), in messages and in ``kb status``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import sqlite_utils
from sqlite_utils.migrations import Migrations

from index.disk import is_storage_failure, storage_error
from index.errors import DatabaseUnavailable
from index.private import private_file

log = logging.getLogger(__name__)

__all__ = [
    "Connection",
    "Cursor",
    "Database",
    "SQLiteDatabase",
    "masked_url",
    "open_database",
]

# How often a read-only connection (a full disk) tries to become writable again.
_REOPEN_SECONDS = 1.0
POSTGRES_SCHEMES = ("postgresql", "postgres")


class Cursor(Protocol):
    """What a statement returns: rows and the number of rows it changed."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """One thread's connection, as the store uses it (a ``sqlite_utils.Database`` is one)."""

    def execute(self, sql: str, params: Any = None, /) -> Cursor: ...

    def query(self, sql: str, params: Any = None, /) -> Iterator[dict[str, Any]]: ...


def masked_url(url: str) -> str:
    """``url`` with its password (in the address or as ``?password=``) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*/")))


def open_database(data_dir: Path, url: str = "") -> Database:
    """The database of a knowledge base: Postgres at ``url``, else SQLite in ``data_dir``.

    Raises:
        DatabaseUnavailable: ``url`` is not a ``postgresql://`` URL, or the
            database cannot be reached.
    """
    if not url:
        return SQLiteDatabase(data_dir)
    scheme = urlsplit(url).scheme
    if scheme not in POSTGRES_SCHEMES:
        raise DatabaseUnavailable(
            f"KB_DATABASE_URL must be a postgresql:// URL (or empty for SQLite in the data "
            f"dir), not a {scheme or 'schemeless'} URL: {masked_url(url)}."
        )
    from index.pg_database import PostgresDatabase  # psycopg only where it is used

    return PostgresDatabase(url, data_dir)


class Database(ABC):
    """One knowledge base's database: per-thread connections, transactions, locks.

    Attributes:
        dialect: ``sqlite`` or ``postgresql``.
        integrity_errors: the driver's exceptions for a broken constraint (a unique key).
        read_only: why this process can read the database but not write it, or ``None``.
    """

    dialect: str
    integrity_errors: tuple[type[Exception], ...]
    read_only: str | None = None

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the database is, as it may be shown (a path, or a URL without its password)."""

    @abstractmethod
    def connection(self) -> Connection:
        """This thread's connection."""

    @abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Connection]:
        """One atomic write (nested: a savepoint)."""

    @abstractmethod
    def migrate(self, migrations: Migrations) -> None:
        """Apply the migrations this database has not had yet."""

    @abstractmethod
    def applied_migrations(self, migrations: Migrations) -> list[str]:
        """Names of the migrations applied, in order."""

    @abstractmethod
    def table_columns(self) -> dict[str, list[str]]:
        """Each table of the schema and its columns, in order (bookkeeping tables left out)."""

    @abstractmethod
    def exclusive(self, name: str) -> contextlib.AbstractContextManager[bool]:
        """Hold the lock ``name`` across processes while inside; yields ``False`` if it is taken."""

    @abstractmethod
    def locked(self, name: str) -> bool:
        """Whether some process holds the lock ``name`` right now."""

    @abstractmethod
    def close(self) -> None:
        """Close this thread's connection."""


# ---------------------------------------------------------------------- SQLite


class SQLiteDatabase(Database):
    """``kb.sqlite`` in the data dir, in WAL mode: readers proceed while one writes.

    On a full disk SQLite cannot create the shared-memory file a WAL database
    needs, even to read: the connection is then read-only (``_open_read_only``)
    and a writable one is tried again every ``_REOPEN_SECONDS``.
    """

    dialect = "sqlite"
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.path = data_dir / "kb.sqlite"

    @property
    def location(self) -> str:
        return str(self.path)

    def connection(self) -> sqlite_utils.Database:
        db: sqlite_utils.Database | None = getattr(self._local, "db", None)
        fallback_at: float | None = getattr(self._local, "fallback_at", None)
        if db is not None and (
            fallback_at is None or time.monotonic() - fallback_at < _REOPEN_SECONDS
        ):
            return db
        return self._connect(db)

    def _connect(self, current: sqlite_utils.Database | None) -> sqlite_utils.Database:
        try:
            db = self._open_writable()
        except sqlite3.Error as exc:
            if not is_storage_failure(exc):
                raise DatabaseUnavailable(f"Cannot open the database {self.path}: {exc}.") from exc
            if current is not None:
                self._local.fallback_at = time.monotonic()
                return current
            db = self._open_read_only(exc)
            self._local.fallback_at = time.monotonic()
        else:
            if current is not None:
                current.conn.close()
            if self.read_only is not None:
                log.info("the database %s is writable again", self.path)
            self.read_only = None
            self._local.fallback_at = None
        self._local.db = db
        return db

    def _open_writable(self) -> sqlite_utils.Database:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        try:
            conn.execute("PRAGMA foreign_keys=ON")
            # The first statement that reads the file: SQLite opens (and sizes)
            # its shared-memory file here, which fails on a full disk.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.Error:
            conn.close()
            raise
        return sqlite_utils.Database(conn)

    def _open_read_only(self, cause: sqlite3.Error) -> sqlite_utils.Database:
        """A read-only connection that needs no shared memory, for a disk too full to open one.

        Only when the write-ahead log is empty (every commit is in the database
        file): ``immutable`` reads the file alone and would not see commits
        still in the log.
        """
        error = storage_error(cause, self.data_dir, "the database's shared-memory file")
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise error from cause
        uri = f"{self.path.resolve().as_uri()}?mode=ro&immutable=1"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise error from exc
        if self.read_only is None:
            log.warning(
                "opened the database %s read-only: %s Answers keep working; "
                "nothing can be added or changed until space is freed",
                self.path,
                error,
            )
        self.read_only = str(error)
        return sqlite_utils.Database(conn)

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """One atomic write: everything inside commits together or not at all.

        Raises:
            StorageError: the disk refused the write (``DiskFull`` when it is
                full); nothing was committed.
        """
        db = self.connection()
        if db.conn.in_transaction:
            with db.atomic():  # nested: a savepoint
                yield db
            return
        if getattr(self._local, "fallback_at", None) is not None:
            db = self._connect(db)  # the disk may have room again
        try:
            # BEGIN IMMEDIATE takes the write lock up front, waiting up to the busy
            # timeout. A deferred BEGIN that reads first (sqlite-utils' insert reads
            # the table's columns) and writes later fails at once with "database is
            # locked" when another connection committed in between: in WAL mode
            # SQLite does not wait on that upgrade.
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.conn.rollback()
                raise
            else:
                db.conn.commit()
        except sqlite3.Error as exc:
            if not is_storage_failure(exc):
                raise
            if db.conn.in_transaction:
                db.conn.rollback()
            raise storage_error(exc, self.data_dir, "a change to the database") from exc

    def migrate(self, migrations: Migrations) -> None:
        db = self.connection()
        # Read first: opening an up-to-date data dir must not wait for a writer.
        if not migrations.pending(db):
            return
        # One write transaction: a second process opening the same data dir
        # waits for it, then finds every migration applied.
        with self.transaction() as tx:
            migrations.apply(tx)

    def applied_migrations(self, migrations: Migrations) -> list[str]:
        return [m.name for m in migrations.applied(self.connection())]

    def table_columns(self) -> dict[str, list[str]]:
        db = self.connection()
        return {
            name: [c.name for c in db[name].columns]
            for name in db.table_names()
            if not name.startswith(("sqlite_", "_sqlite"))
        }

    def _lock_path(self, name: str) -> Path:
        return private_file(self.data_dir / f"{name}.lock")

    @contextmanager
    def exclusive(self, name: str) -> Iterator[bool]:
        # A lock file rather than a threading lock: `kb reindex` in a shell and
        # /kb-reindex in the running bot are different processes.
        with open(self._lock_path(name), "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def locked(self, name: str) -> bool:
        with open(self._lock_path(name), "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    def close(self) -> None:
        db: sqlite_utils.Database | None = getattr(self._local, "db", None)
        if db is not None:
            db.conn.close()
            self._local.db = None
