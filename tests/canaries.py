"""Canary secrets: every secret the tests configure is a distinctive value that must never leak.

``tests/conftest.py`` records every log record of the session (root handler,
DEBUG) and at the end looks for these values in those records and in every file
under the session's temporary directories, which hold every data dir the
product wrote. A canary found anywhere fails the run.

Records are formatted by the product's own formatters (``bot.logs``), console
and JSON, as an operator would see them, but configured with no secrets to
redact: redacting by value is the last line of defence, and the check proves
the secrets do not reach the log in the first place.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bot.logs import build_formatter
from core.links import SECRET_FILENAME
from tests import servers
from tests.conftest_bot import LINK_SECRET


def _canaries() -> dict[str, str]:
    """The mock servers' secret defaults (each ``DEFAULT_...`` holding "canary"), and the
    link secret the bot's settings use: a secret added there is checked without more ado."""
    found = {
        name: value
        for name, value in vars(servers).items()
        if name.startswith("DEFAULT_") and isinstance(value, str) and "canary" in value
    }
    return {**found, "LINK_SECRET": LINK_SECRET}


CANARIES = _canaries()
# Files are scanned without their holes (written_bytes), which read as zero bytes.
assert not any("\0" in value for value in CANARIES.values()), "a canary holds a zero byte"
# Files that hold a secret by design and are not scanned: the link secret the
# product generates into a data dir, and ``.env`` files, an operator's own
# configuration, which tests write on purpose (``kb calibrate --write-env``
# rewrites one, keeping its other lines).
SECRET_FILES = frozenset({SECRET_FILENAME, ".env"})


@dataclass(frozen=True)
class Leak:
    """One canary found somewhere."""

    canary: str
    where: str

    def __str__(self) -> str:
        return f"{self.canary} ({masked(CANARIES[self.canary])}) in {self.where}"


def masked(value: str) -> str:
    """Enough of a canary to recognise it, not the whole value."""
    return value[: len(value) // 3] + "..."


def canaries_in(text: str | bytes) -> list[str]:
    """Names of the canaries ``text`` contains."""
    if isinstance(text, bytes):
        return [name for name, value in CANARIES.items() if value.encode() in text]
    return [name for name, value in CANARIES.items() if value in text]


class LeakRecorder(logging.Handler):
    """Formats every record as the product would and remembers those that show a canary.

    ``during`` names what was running (the test), for the report.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.formatters = [build_formatter("console"), build_formatter("json")]
        self.leaks: list[Leak] = []
        self.during = "the session set-up"

    def emit(self, record: logging.LogRecord) -> None:
        """Look for canaries in ``record`` as each format renders it (traceback included)."""
        try:
            text = "\n".join(formatter.format(record) for formatter in self.formatters)
        except Exception:
            self.handleError(record)
            return
        where = f"a {record.levelname} record of {record.name} during {self.during}"
        self.leaks += [Leak(name, where) for name in canaries_in(text)]


def scan_files(root: Path) -> list[Leak]:
    """Canaries in the files under ``root``, except :data:`SECRET_FILES`."""
    leaks = []
    for path in sorted(root.rglob("*")):
        if path.name in SECRET_FILES or path.is_symlink() or not path.is_file():
            continue
        try:
            data = written_bytes(path)
        except OSError:
            continue  # gone or unreadable since the listing: nothing to leak from
        leaks += [Leak(name, f"file {path}") for name in canaries_in(data)]
    return leaks


def written_bytes(path: Path) -> bytes:
    """The stretches of ``path`` that hold data, joined by a zero byte; its holes left out.

    A sparse file (Qdrant's preallocated pages: 32 MB each, a few KB written) reads
    as zeros in its holes, and no canary holds a zero byte: a canary is whole
    inside one stretch, and the zero byte between two stretches joins none.
    Where the system cannot tell holes, the whole file is one stretch.
    """
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return path.read_bytes()
    stretches = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size, offset = os.fstat(fd).st_size, 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, seek_data)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break  # nothing but a hole up to the end
                return path.read_bytes()  # holes unknown here: every byte
            offset = os.lseek(fd, start, seek_hole)
            stretches.append(os.pread(fd, offset - start, start))
    finally:
        os.close(fd)
    return b"\0".join(stretches)


def report(leaks: Iterable[Leak]) -> str:
    """The failure message: which canary was found where (never the whole secret)."""
    lines = sorted({str(leak) for leak in leaks})
    return "secrets leaked during the test session:\n" + "\n".join(f"  {x}" for x in lines)
