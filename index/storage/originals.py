"""Where the originals are kept: content-addressed by sha256, for as long as a document names them.

Beside SQLite they are files in the data dir (``OriginalFiles``). On Postgres
they are rows of the table ``originals`` (``OriginalRows``), so that every
replica reads every original; the table is the originals' storage, not part
of the schema the migrations build, and ``OriginalRows`` creates it.

Either way an original is written before the row that names it and deleted
only once no row does (``Store.drop_originals_if_unused``).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from index.errors import OriginalMissing
from index.files import AtomicWriteError, private_dir, storage_error, write_atomic
from index.storage.database import Database
from index.storage.postgres import PostgresDatabase

__all__ = ["OriginalFiles", "OriginalRows", "Originals", "open_originals"]


class Originals(ABC):
    """The stored originals of one knowledge base."""

    @abstractmethod
    def save(self, data: bytes) -> str:
        """Store ``data`` (once) and return its sha256."""

    @abstractmethod
    def has(self, sha256: str) -> bool:
        """Whether the original with this sha256 is stored."""

    @abstractmethod
    def read(self, sha256: str) -> bytes:
        """The bytes of an original; ``OriginalMissing`` if they are gone."""

    @abstractmethod
    def delete(self, sha256: str) -> None:
        """Delete an original (no document names it any more)."""

    @abstractmethod
    def digests(self) -> Iterator[str]:
        """The sha256 of every stored original, sorted."""

    def _missing(self, sha256: str, where: str) -> OriginalMissing:
        return OriginalMissing(
            f"The stored original {sha256[:12]} is missing from {where}; upload the document again."
        )


class OriginalFiles(Originals):
    """Files ``originals/<first two hex digits>/<sha256>`` in the data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.dir = data_dir / "originals"

    def path(self, sha256: str) -> Path:
        """Where the original with this sha256 is kept."""
        return self.dir / sha256[:2] / sha256

    def save(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.path(digest)
        if path.exists():
            return digest
        try:
            private_dir(self.dir)
            private_dir(path.parent)
            write_atomic(path, lambda tmp: tmp.write_bytes(data))
        except OSError as exc:
            raise storage_error(exc, self.data_dir, "the document's original") from exc
        except AtomicWriteError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
            raise storage_error(cause, self.data_dir, "the document's original") from exc
        return digest

    def has(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def read(self, sha256: str) -> bytes:
        try:
            return self.path(sha256).read_bytes()
        except FileNotFoundError as exc:
            raise self._missing(sha256, str(self.dir)) from exc

    def delete(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def digests(self) -> Iterator[str]:
        if self.dir.is_dir():
            yield from sorted(p.name for p in self.dir.glob("*/*") if len(p.name) == 64)


class OriginalRows(Originals):
    """Rows ``(sha256, data)`` of the table ``originals`` in the shared database."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        database.create_table("originals", "sha256 TEXT PRIMARY KEY, data BLOB NOT NULL")

    def save(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            with self.database.transaction() as db:
                db.execute(
                    "INSERT INTO originals (sha256, data) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    [digest, data],
                )
        return digest

    def has(self, sha256: str) -> bool:
        row = (
            self.database.connection()
            .execute("SELECT 1 FROM originals WHERE sha256 = ?", [sha256])
            .fetchone()
        )
        return row is not None

    def read(self, sha256: str) -> bytes:
        row = (
            self.database.connection()
            .execute("SELECT data FROM originals WHERE sha256 = ?", [sha256])
            .fetchone()
        )
        if row is None:
            raise self._missing(sha256, f"the database {self.database.location}")
        return bytes(row[0])

    def delete(self, sha256: str) -> None:
        with self.database.transaction() as db:
            # Only if still unused: another replica may have named it meanwhile.
            db.execute(
                """DELETE FROM originals WHERE sha256 = ?
                   AND NOT EXISTS (SELECT 1 FROM documents WHERE sha256 = ?)""",
                [sha256, sha256],
            )

    def digests(self) -> Iterator[str]:
        rows = self.database.connection().execute("SELECT sha256 FROM originals ORDER BY sha256")
        yield from (str(r[0]) for r in rows.fetchall())


def open_originals(database: Database, data_dir: Path) -> Originals:
    """The originals beside ``database``: files beside SQLite, rows in Postgres."""
    if isinstance(database, PostgresDatabase):
        return OriginalRows(database)
    return OriginalFiles(data_dir)
