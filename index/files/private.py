"""Folders and files that only the bot's own user can read, whatever the umask.

The data dir holds every document's text, every question asked and who asked
it: folders are created ``0700`` and files ``0600``. A data dir made before
this rule (or by hand) is tightened when it is opened.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` if needed (its parent must exist), and make it ``0700``."""
    path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    # mkdir's mode is filtered by the umask and ignored for a folder that exists.
    os.chmod(path, PRIVATE_DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty if missing, and make it ``0600`` (its content is left alone)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    return path


def tighten(path: Path) -> None:
    """Make an existing file ``0600``; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, PRIVATE_FILE_MODE)
