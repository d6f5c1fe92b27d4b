"""SQLite in the data dir (``kb.sqlite``, WAL mode): the embedded default database."""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils
from sqlite_utils.migrations import Migrations

from index.errors import DatabaseBusy, DatabaseUnavailable
from index.files import is_storage_failure, private_file, storage_error
from index.storage.database import Database

log = logging.getLogger(__name__)

# How often a read-only connection (a full disk) tries to become writable again.
_REOPEN_SECONDS = 1.0
# How long a write waits for another connection's write lock (SQLite's busy timeout).
BUSY_SECONDS = 30.0
# SQLite's primary result codes for a lock another connection holds.
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


class SQLiteDatabase(Database):
    """``kb.sqlite`` in the data dir, in WAL mode: readers proceed while one writes.

    On a full disk SQLite cannot create the shared-memory file a WAL database
    needs, even to read: the connection is then read-only (``_open_read_only``)
    and a writable one is tried again every ``_REOPEN_SECONDS``.

    Args:
        data_dir: the data directory holding ``kb.sqlite``.
        clock: the seconds that interval is measured in (``time.monotonic``); an
            attribute, so that a test can set its own on a knowledge base's store.
    """

    dialect = "sqlite"
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(self, data_dir: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.path = data_dir / "kb.sqlite"
        self.clock = clock

    @property
    def location(self) -> str:
        return str(self.path)

    def connection(self) -> sqlite_utils.Database:
        db: sqlite_utils.Database | None = getattr(self._local, "db", None)
        fallback_at: float | None = getattr(self._local, "fallback_at", None)
        if db is not None and (fallback_at is None or self.clock() - fallback_at < _REOPEN_SECONDS):
            return db
        return self._connect(db)

    def _connect(self, current: sqlite_utils.Database | None) -> sqlite_utils.Database:
        try:
            db = self._open_writable()
        except sqlite3.Error as exc:
            if not is_storage_failure(exc):
                raise DatabaseUnavailable(f"Cannot open the database {self.path}: {exc}.") from exc
            if current is not None:
                self._local.fallback_at = self.clock()
                return current
            db = self._open_read_only(exc)
            self._local.fallback_at = self.clock()
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
        conn = sqlite3.connect(self.path, timeout=BUSY_SECONDS, check_same_thread=False)
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
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS, check_same_thread=False)
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
    def transaction(self, *, wait: float | None = None) -> Iterator[sqlite_utils.Database]:
        """One atomic write: everything inside commits together or not at all.

        ``wait``: the longest it waits for another connection's write lock
        (``None``: ``BUSY_SECONDS``).

        Raises:
            StorageError: the disk refused the write (``DiskFull`` when it is
                full), or another connection held the write lock past ``wait``
                (``DatabaseBusy``); nothing was committed.
        """
        db = self.connection()
        if db.conn.in_transaction:
            with db.atomic():  # nested: a savepoint
                yield db
            return
        if getattr(self._local, "fallback_at", None) is not None:
            db = self._connect(db)  # the disk may have room again
        waits = BUSY_SECONDS if wait is None else wait
        try:
            if wait is not None:
                db.conn.execute(f"PRAGMA busy_timeout = {int(waits * 1000)}")
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
            if db.conn.in_transaction:
                db.conn.rollback()
            if _busy(exc):
                raise DatabaseBusy(
                    f"The database {self.path} stayed locked by another process (a long `kb` "
                    f"command?) for over {waits:g} s; nothing was changed. Try again once it "
                    "is done."
                ) from exc
            if not is_storage_failure(exc):
                raise
            raise storage_error(exc, self.data_dir, "a change to the database") from exc
        finally:
            if wait is not None:
                db.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")

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


def _busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is another connection's lock outlasting the busy timeout."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
