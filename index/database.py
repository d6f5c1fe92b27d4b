"""The database under the store: SQLite in the data dir, or PostgreSQL at ``KB_DATABASE_URL``.

``index.store.Store`` has one set of SQL for both. It is written in the subset
the two share (``ON CONFLICT`` upserts, ``RETURNING id``, ``IS DISTINCT FROM``,
window functions, reserved column names quoted) with SQLite's ``?``
placeholders; ``PostgresDatabase`` turns ``?`` into psycopg's ``%s`` and, in
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
import hashlib
import logging
import re
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import sqlite_utils
from sqlite_utils.migrations import Migrations

from index.disk import is_storage_failure, storage_error
from index.errors import DatabaseUnavailable, DiskFull, StorageError
from index.private import private_file

log = logging.getLogger(__name__)

__all__ = [
    "Connection",
    "Cursor",
    "Database",
    "PostgresConnection",
    "PostgresDatabase",
    "SQLiteDatabase",
    "masked_url",
    "open_database",
    "postgres_sql",
]

# How often a read-only connection (a full disk) tries to become writable again.
_REOPEN_SECONDS = 1.0
# Seconds a Postgres connection may take to open: a replica that cannot reach
# its database says so instead of hanging.
_CONNECT_TIMEOUT = 10
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
    return PostgresDatabase(url, data_dir)


def _lock_key(name: str) -> int:
    """A 64-bit advisory-lock key for ``name`` (namespaced: other apps may share the server)."""
    digest = hashlib.sha256(f"slack-kb:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


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


# -------------------------------------------------------------------- Postgres

# SQLite's column types as Postgres spells them, in CREATE TABLE and ADD COLUMN.
_TYPES = [
    (re.compile(r"\bINTEGER\s+PRIMARY\s+KEY(\s+AUTOINCREMENT)?\b", re.I),
     "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bREAL\b", re.I), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
]  # fmt: skip
_DDL = re.compile(r"^\s*(CREATE\s+TABLE|ALTER\s+TABLE\s+\S+\s+ADD\s+COLUMN)\b", re.I)
# Column names SQLite takes bare and Postgres only quoted (``user`` is CURRENT_USER there).
_RESERVED_COLUMN = re.compile(
    r"(?P<lead>(?:^|[(,]|ADD\s+COLUMN)\s*)(?P<name>user|order|group|limit|offset|window)"
    r"(?=\s+[A-Za-z])",
    re.I | re.M,
)
_STRING = re.compile(r"('(?:[^']|'')*')")


def postgres_sql(sql: str) -> str:
    """A statement of the store (SQLite's placeholders and column types) as Postgres takes it."""
    if _DDL.match(sql):
        for pattern, replacement in _TYPES:
            sql = pattern.sub(replacement, sql)
        sql = _RESERVED_COLUMN.sub(lambda m: f'{m["lead"]}"{m["name"]}"', sql)
    parts = _STRING.split(sql)
    # Odd parts are string literals: only their % needs escaping, never a ?.
    return "".join(
        part.replace("%", "%%") if i % 2 else part.replace("%", "%%").replace("?", "%s")
        for i, part in enumerate(parts)
    )


def _param(value: Any) -> Any:
    # SQLite stores a bool as 0/1; the columns are integers on Postgres too.
    return int(value) if isinstance(value, bool) else value


class PostgresConnection:
    """A psycopg connection that takes the store's SQL (``postgres_sql``) and speaks its errors."""

    def __init__(self, conn: Any, database: PostgresDatabase) -> None:
        self.conn = conn
        self._database = database

    def execute(self, sql: str, params: Any = None, /) -> Cursor:
        values = [_param(v) for v in params] if params is not None else []
        with self._database.translated():
            cursor = self.conn.cursor()
            cursor.execute(postgres_sql(sql), values)
        return cursor

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for each of ``rows`` (a bulk insert)."""
        with self._database.translated():
            self.conn.cursor().executemany(
                postgres_sql(sql), [[_param(v) for v in row] for row in rows]
            )

    def query(self, sql: str, params: Any = None, /) -> Iterator[dict[str, Any]]:
        cursor: Any = self.execute(sql, params)
        names = [d.name for d in cursor.description or []]
        for row in cursor.fetchall():
            yield dict(zip(names, row, strict=True))


class PostgresDatabase(Database):
    """A PostgreSQL database shared by every replica; psycopg 3, one connection per thread.

    Connections are in autocommit mode: a read is its own statement and never
    holds a transaction open; ``transaction()`` is an explicit one (nested: a
    savepoint). Locks across processes are advisory locks, held by a
    connection: released by the server when the process holding them dies.

    Args:
        url: ``postgresql://user:password@host:port/database``.
        data_dir: where this replica keeps its derived files (for messages about the disk).
    """

    dialect = "postgresql"

    def __init__(self, url: str, data_dir: Path) -> None:
        super().__init__()
        try:
            import psycopg
        except ImportError as exc:  # a SQLite-only install
            raise DatabaseUnavailable(
                "KB_DATABASE_URL names a Postgres database but psycopg is not installed: "
                "install the 'scale' extra (pip install 'slack-kb[scale]')."
            ) from exc
        self._psycopg = psycopg
        self.integrity_errors = (psycopg.IntegrityError,)
        # Every failure of the driver (what a bulk copy must turn into its own error).
        self.driver_error: type[Exception] = psycopg.Error
        self.url = url
        self.data_dir = data_dir
        self._password = urlsplit(url).password or dict(parse_qsl(urlsplit(url).query)).get(
            "password", ""
        )
        self.connection()  # fail now, with a clear message, if it cannot be reached

    @property
    def location(self) -> str:
        return masked_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` with the password of the URL replaced by ``***``."""
        return text.replace(self._password, "***") if self._password else text

    def _open(self) -> Any:
        try:
            return self._psycopg.connect(
                self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT
            )
        except self._psycopg.Error as exc:
            # `from None`: the driver's exception may carry the URL it was given.
            raise DatabaseUnavailable(
                f"Cannot connect to the database {self.location}: "
                f"{self.scrub(str(exc).strip())}. Check KB_DATABASE_URL (host, port, user, "
                "password, database name) and that the server is running."
            ) from None

    def connection(self) -> PostgresConnection:
        current: PostgresConnection | None = getattr(self._local, "db", None)
        if current is not None and not (current.conn.closed or current.conn.broken):
            return current
        current = PostgresConnection(self._open(), self)
        self._local.db = current
        return current

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Turn psycopg's failures into the store's errors (constraint violations pass through)."""
        errors = self._psycopg.errors
        try:
            yield
        except errors.DiskFull as exc:
            raise DiskFull(
                f"The database server's disk is full ({self.location}); nothing was changed. "
                "Free space there, then try again."
            ) from exc
        except (errors.InsufficientResources, errors.ReadOnlySqlTransaction) as exc:
            raise StorageError(
                f"The database {self.location} refused the write ({self.scrub(str(exc))}); "
                "nothing was changed."
            ) from exc
        except self._psycopg.OperationalError as exc:
            if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
                raise
            raise DatabaseUnavailable(
                f"The database {self.location} is unavailable: {self.scrub(str(exc).strip())}."
            ) from None

    @contextmanager
    def transaction(self) -> Iterator[PostgresConnection]:
        db = self.connection()
        with self.translated(), db.conn.transaction():
            yield db

    def migrate(self, migrations: Migrations) -> None:
        # Read first: opening an up-to-date database must not wait for anyone.
        if self._exists("_kb_migrations") and len(self.applied_migrations(migrations)) == len(
            migrations._migrations
        ):
            return
        with self._serialized() as tx:
            tx.execute(
                """CREATE TABLE IF NOT EXISTS _kb_migrations (
                       migration_set TEXT NOT NULL, name TEXT NOT NULL, applied_at REAL NOT NULL,
                       PRIMARY KEY (migration_set, name))"""
            )
            done = set(self.applied_migrations(migrations))
            for migration in migrations._migrations:
                if migration.name in done:
                    continue
                migration.fn(tx)  # type: ignore[arg-type]
                tx.execute(
                    "INSERT INTO _kb_migrations (migration_set, name, applied_at) VALUES (?, ?, ?)",
                    [migrations.name, migration.name, time.time()],
                )

    def create_table(self, name: str, definition: str) -> None:
        """``CREATE TABLE name (definition)`` unless it exists (processes starting together too)."""
        if self._exists(name):
            return
        with self._serialized() as tx:
            tx.execute(f"CREATE TABLE IF NOT EXISTS {name} ({definition})")

    def _exists(self, table: str) -> bool:
        row = self.connection().execute("SELECT to_regclass(?)", [table]).fetchone()
        return row[0] is not None

    @contextmanager
    def _serialized(self) -> Iterator[PostgresConnection]:
        # Replicas starting together: one changes the schema, the others wait
        # for it; Postgres's CREATE ... IF NOT EXISTS alone races on its catalog.
        with self.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(?)", [_lock_key("schema")])
            yield tx

    def applied_migrations(self, migrations: Migrations) -> list[str]:
        rows = self.connection().execute(
            "SELECT name FROM _kb_migrations WHERE migration_set = ? ORDER BY applied_at, name",
            [migrations.name],
        )
        return [str(r[0]) for r in rows.fetchall()]

    def table_columns(self) -> dict[str, list[str]]:
        rows = self.connection().execute(
            """SELECT table_name, column_name FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name NOT LIKE '\\_%' ESCAPE '\\'
               ORDER BY table_name, ordinal_position"""
        )
        out: dict[str, list[str]] = {}
        for table, column in rows.fetchall():
            out.setdefault(str(table), []).append(str(column))
        return out

    def hold(self, name: str) -> Callable[[], None] | None:
        """Take the lock ``name`` on a connection of its own; its release, or ``None`` if taken.

        The lock lasts as long as that connection: the server releases it when
        this process dies, however it dies.
        """
        conn = self._open()
        try:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", [_lock_key(name)]).fetchone()[0]
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return None
        return conn.close

    @contextmanager
    def exclusive(self, name: str) -> Iterator[bool]:
        release = self.hold(name)
        try:
            yield release is not None
        finally:
            if release is not None:
                release()

    def locked(self, name: str) -> bool:
        with self.exclusive(name) as acquired:
            return not acquired

    def close(self) -> None:
        current: PostgresConnection | None = getattr(self._local, "db", None)
        if current is not None:
            current.conn.close()
            self._local.db = None
