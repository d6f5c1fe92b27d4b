"""The database under the store: SQLite in the data dir, or PostgreSQL at ``KB_DATABASE_URL``.

``index.storage.store.Store`` has one set of SQL for both. It is written in the subset
the two share (``ON CONFLICT`` upserts, ``RETURNING id``, ``IS DISTINCT FROM``,
window functions, reserved column names quoted) with SQLite's ``?``
placeholders; ``PostgresDatabase`` (``index.storage.postgres``) turns ``?`` into psycopg's ``%s`` and, in
``CREATE TABLE`` and ``ALTER TABLE ... ADD COLUMN``, SQLite's column types into
Postgres's (``INTEGER PRIMARY KEY`` -> an identity column, ``INTEGER`` ->
``BIGINT``, ``REAL`` -> ``DOUBLE PRECISION``, ``BLOB`` -> ``BYTEA``). So the
Postgres schema comes from the same migrations (``index.storage.schema``) as SQLite's.

What differs beyond the SQL is here, behind one interface (``Database``): a
connection per thread, write transactions, locks several processes contend
for (file locks beside SQLite, advisory locks on Postgres), and the
translation of each driver's failures into ``DatabaseUnavailable`` and the
storage errors. psycopg is imported only when a Postgres URL is configured.

``open_database`` (``index.storage.connect``) picks one; SQLite is
``index.storage.sqlite``.

A database URL with a password is a secret: it appears only masked
(``masked_url``), in messages and in ``kb status``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sqlite_utils.migrations import Migrations

log = logging.getLogger(__name__)

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
    def transaction(
        self, *, wait: float | None = None
    ) -> contextlib.AbstractContextManager[Connection]:
        """One atomic write (nested: a savepoint).

        ``wait``: the longest it waits for another process's write lock before
        ``DatabaseBusy`` (``None``: the database's own bound). SQLite's alone:
        on Postgres writers of other rows never wait for each other.
        """

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
