"""Atomic file replacement: readers see the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from index.errors import KBError


class AtomicWriteError(KBError):
    """A file could not be written (disk full, permissions); the previous version is intact."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"Could not write {path} ({reason}). The previous version of the file is intact; "
            "check free disk space and permissions of the data directory."
        )
        self.path = path


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Create or replace ``path`` so that a crash never leaves a partial file.

    ``write`` fills a temporary file in the same directory (same file system, so
    the final ``os.replace`` is an atomic rename); the data is flushed to disk
    before the rename, and the temporary file is removed if anything fails.

    Args:
        path: the file to create or replace.
        write: called with the temporary path; writes the complete new content
            there (its return value is ignored).

    Raises:
        AtomicWriteError: the operating system refused a write, flush or rename.
        Exception: whatever ``write`` raises, other than ``OSError``, unchanged.
    """
    path = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise AtomicWriteError(path, exc.strerror or str(exc)) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise AtomicWriteError(path, exc.strerror or str(exc)) from exc
        raise
    _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable. Not possible on Windows, where opening a
    # directory fails; the rename is still atomic there, only not yet flushed.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
