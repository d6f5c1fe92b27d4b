"""Who is indexing what: a lock each indexing process holds for as long as it lives.

A process marks a document ``indexing`` with the id of its lock. Beside SQLite
the lock is a file (``locks/<id>.lock`` in the data dir, held with ``flock``:
``FileWorkerLock``); on Postgres, shared by replicas on other machines, it is
an advisory lock held by a connection of its own (``AdvisoryWorkerLock``). The
kernel, or the database server, releases the lock when the process ends,
however it ends, so indexing was interrupted exactly when its holder's lock
can be taken. A pid cannot say that: in a container the bot is pid 1 again
after every restart, so the pid recorded by the dead process is always "alive".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path

from index.files import PRIVATE_FILE_MODE, private_dir
from index.storage.postgres import PostgresDatabase

__all__ = ["AdvisoryWorkerLock", "FileWorkerLock", "WorkerLock"]

_SUFFIX = ".lock"
# Longer than taking a lock can take: a hidden file older than this was abandoned.
_TAKING_SECONDS = 60.0


class WorkerLock(ABC):
    """This process's indexing lock in one knowledge base, taken on first use and held until exit."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._guard = threading.Lock()
        self._working: set[int] = set()

    @abstractmethod
    def _take(self) -> str:
        """Take a new lock for this process and return its id."""

    @abstractmethod
    def _free(self, holder: str) -> bool:
        """Whether nobody holds the lock ``holder`` (a process that is gone)."""

    @abstractmethod
    def sweep(self, holders_in_use: Iterable[str] = ()) -> int:
        """Forget the locks of processes that are gone; returns how many."""

    @property
    def id(self) -> str:
        """This process's lock id, taking the lock the first time (a read-only opening never does)."""
        with self._guard:
            if self._id is None:
                self._id = self._take()
            return self._id

    @contextlib.contextmanager
    def working(self, doc_id: int) -> Iterator[str]:
        """Mark ``doc_id`` as being indexed by this process while inside; yields the lock id."""
        lock_id = self.id
        with self._guard:
            self._working.add(doc_id)
        try:
            yield lock_id
        finally:
            with self._guard:
                self._working.discard(doc_id)

    def interrupted(self, doc_id: int, holder: str | None) -> bool:
        """Whether work on ``doc_id`` marked with ``holder`` stopped without finishing."""
        if holder is None:
            # Marked before holders were recorded: by a process that has since
            # been replaced by this release, so it is not running any more.
            return True
        if holder == self._id:
            with self._guard:
                return doc_id not in self._working
        return self._free(holder)


class FileWorkerLock(WorkerLock):
    """The lock as a file held with ``flock``, in the data dir beside SQLite.

    Args:
        data_dir: the data dir; its ``locks/`` folder holds one file per live holder.
    """

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.dir = data_dir / "locks"

    def _take(self) -> str:
        private_dir(self.dir)
        lock_id = secrets.token_hex(8)
        # Locked under a hidden name, then renamed: a sweep only ever sees
        # ``.lock`` files whose holder already holds them.
        hidden = self.dir / f".{lock_id}.tmp"
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            path = self.dir / f"{lock_id}{_SUFFIX}"
            os.rename(hidden, path)
        except BaseException:
            os.close(fd)
            raise
        weakref.finalize(self, _release, fd, path)
        return lock_id

    def _free(self, holder: str) -> bool:
        return _free(self.dir / f"{holder}{_SUFFIX}")

    def sweep(self, holders_in_use: Iterable[str] = ()) -> int:
        """Delete the lock files of processes that are gone; returns how many."""
        if not self.dir.is_dir():
            return 0
        keep = set(holders_in_use) | {self._id}
        removed = 0
        # A hidden file is a lock being taken; only an old one is left over.
        old = time.time() - _TAKING_SECONDS
        hidden = [p for p in self.dir.glob(".*.tmp") if _mtime(p) < old]
        for path in [*self.dir.glob(f"*{_SUFFIX}"), *hidden]:
            lock_id = path.name.strip(".").removesuffix(_SUFFIX).removesuffix(".tmp")
            if lock_id not in keep and _take_and_delete(path):
                removed += 1
        return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def _free(path: Path) -> bool:
    """Whether nobody holds the lock on ``path`` (a missing file is free)."""
    return _lockable(path) is not False


def _take_and_delete(path: Path) -> bool:
    """Delete ``path`` if nobody holds its lock; whether it was deleted."""
    return _lockable(path, delete=True) is True


def _lockable(path: Path, *, delete: bool = False) -> bool | None:
    """Whether the lock on ``path`` could be taken (``None``: no such file); ``delete`` it then."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        if delete:
            path.unlink(missing_ok=True)  # still held: nobody can take it in between
        return True
    finally:
        os.close(fd)


def _release(fd: int, path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        os.close(fd)


class AdvisoryWorkerLock(WorkerLock):
    """The lock as a Postgres advisory lock, held by a connection this process keeps open.

    Args:
        database: the shared database.
    """

    def __init__(self, database: PostgresDatabase) -> None:
        super().__init__()
        self.database = database

    def _take(self) -> str:
        while True:
            lock_id = secrets.token_hex(8)
            release = self.database.hold(f"worker:{lock_id}")
            if release is not None:
                weakref.finalize(self, release)
                return lock_id

    def _free(self, holder: str) -> bool:
        return not self.database.locked(f"worker:{holder}")

    def sweep(self, holders_in_use: Iterable[str] = ()) -> int:
        """Nothing to delete: the server forgets a lock when its connection ends."""
        return 0
