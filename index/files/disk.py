"""The disk under the data dir: free space, the floor under it, and failed writes as errors.

SQLite reports a full disk as "database or disk is full" or as a bare "disk
I/O error" (when its shared-memory file cannot grow), and the operating system
as ``ENOSPC``; ``storage_error`` turns each into ``DiskFull`` (or
``StorageError`` when the disk has room and the failure is something else),
with a sentence an operator can act on.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

from index.errors import DiskFull, DiskSpaceLow, StorageError

__all__ = [
    "check_free_space",
    "free_bytes",
    "is_storage_failure",
    "size_text",
    "storage_error",
]

# SQLite's primary result codes for a write the disk refused.
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
_SQLITE_READONLY = 8
# Under this much free space an I/O error is taken for a full disk: SQLite's
# shared-memory file grows 32 KB at a time.
_NEARLY_FULL = 1 << 20
_DISK_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_MB = 1 << 20


def free_bytes(path: Path) -> int | None:
    """Bytes free to this process on ``path``'s file system, ``None`` if it cannot be read."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def size_text(n: int) -> str:
    """``n`` bytes for a person: whole megabytes, or bytes under one."""
    return f"{n / _MB:.0f} MB" if n >= _MB else f"{n} bytes"


def check_free_space(data_dir: Path, floor: int, incoming: int = 0) -> None:
    """Refuse a new document while the data dir's disk has less than ``floor`` bytes free.

    Raises:
        DiskSpaceLow: storing ``incoming`` more bytes would leave less than ``floor`` free.
    """
    if floor <= 0:
        return
    free = free_bytes(data_dir)
    if free is None or free - incoming >= floor:
        return
    raise DiskSpaceLow(
        f"The server's disk is nearly full: {size_text(free)} free in {data_dir}, under the "
        f"{size_text(floor)} kept free (KB_MIN_FREE_BYTES). New documents are refused until "
        "space is freed there; questions are still answered."
    )


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite or the OS refusing a write to disk (not a bug, not a lock)."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        return code in (_SQLITE_IOERR, _SQLITE_FULL, _SQLITE_READONLY)
    return isinstance(exc, OSError) and exc.errno is not None


def storage_error(exc: BaseException, data_dir: Path, what: str) -> StorageError:
    """The ``StorageError`` for a failed write of ``what`` into ``data_dir``.

    ``DiskFull`` when the disk says so, or when it is (nearly) full whatever
    the error said.
    """
    free = free_bytes(data_dir)
    full = _says_full(exc) or (free is not None and free < _NEARLY_FULL)
    if full:
        return DiskFull(
            f"The server's disk is full: {what} could not be written to {data_dir} "
            f"({size_text(free or 0)} free); nothing was changed. Free space there, "
            "then try again."
        )
    return StorageError(
        f"The data dir {data_dir} could not be written ({what}: {_detail(exc)}); nothing was "
        "changed. Check the disk and the data dir's permissions, then try again."
    )


def _says_full(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def _detail(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
