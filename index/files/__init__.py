"""The data dir's files: folders ``0700`` and files ``0600``, atomic replacement, the disk's free space."""

from __future__ import annotations

from index.files.atomic import AtomicWriteError, write_atomic
from index.files.disk import check_free_space, is_storage_failure, size_text, storage_error
from index.files.private import PRIVATE_FILE_MODE, private_dir, private_file, tighten

__all__ = [
    "AtomicWriteError",
    "PRIVATE_FILE_MODE",
    "check_free_space",
    "is_storage_failure",
    "private_dir",
    "private_file",
    "size_text",
    "storage_error",
    "tighten",
    "write_atomic",
]
