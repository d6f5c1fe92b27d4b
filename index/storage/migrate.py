"""Moving a SQLite knowledge base into an empty Postgres database (``kb migrate-store``).

Every table of the schema and every stored original is copied in ONE
transaction of the target: a failure at any point (a lost connection, a
corrupt original, a count or checksum that disagrees) leaves the target as
empty as it was, and the command can simply be run again. The source is only
read. Ids are copied as they are (links and citations keep working) and each
identity sequence is set past the highest id SQLite ever handed out.

The check, before the commit: per table, the number of rows and a checksum
(the sum of the rows' sha256, so it does not depend on the order a database
returns them in) read back from the target equal the source's; per original,
its bytes hash to its name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from index.errors import KBError
from index.storage.database import Connection
from index.storage.originals import OriginalFiles
from index.storage.postgres import PostgresConnection, PostgresDatabase
from index.storage.store import Store

__all__ = ["MigrationReport", "StoreMigrationError", "TableCheck", "migrate_store"]

# Parents before the rows that name them; a table added later comes after these.
_ORDER = ["documents", "texts", "chunks", "query_log", "feedback", "deliveries", "meta"]
_BATCH = 500
_MODULUS = 2**256

Progress = Callable[[str, int, int], None]


class StoreMigrationError(KBError):
    """A knowledge base could not be moved into Postgres; the target was left unchanged."""


@dataclass(frozen=True)
class TableCheck:
    """One table (or the originals) as copied: rows and checksum on each side."""

    table: str
    rows: int
    checksum: str
    target_rows: int
    target_checksum: str

    @property
    def matches(self) -> bool:
        """Whether the target holds exactly what the source holds."""
        return (self.rows, self.checksum) == (self.target_rows, self.target_checksum)


@dataclass
class MigrationReport:
    """What ``migrate_store`` copied and checked."""

    source: str
    target: str
    tables: list[TableCheck] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (``--json``)."""
        return {
            "source": self.source,
            "target": self.target,
            "tables": [asdict(t) | {"matches": t.matches} for t in self.tables],
        }


def migrate_store(data_dir: Path, url: str, *, progress: Progress | None = None) -> MigrationReport:
    """Copy the SQLite knowledge base of ``data_dir`` into the empty Postgres database at ``url``.

    Raises:
        StoreMigrationError: no knowledge base in ``data_dir``, a target that
            is not empty, a corrupt original, or a check that failed; nothing
            was committed.
        DatabaseUnavailable: either database cannot be opened or reached.
    """
    if not (data_dir / "kb.sqlite").is_file():
        raise StoreMigrationError(
            f"There is no knowledge base in {data_dir} (no kb.sqlite) to move."
        )
    source = Store(data_dir)
    target = Store(data_dir, database_url=url)
    database = target.database
    if not isinstance(database, PostgresDatabase):
        raise StoreMigrationError("kb migrate-store --to needs a postgresql:// URL.")
    report = MigrationReport(source=source.database.location, target=database.location)
    columns = source.database.table_columns()
    tables = [t for t in _ORDER if t in columns] + sorted(set(columns) - set(_ORDER))
    _refuse_unless_empty(target, tables)
    originals = OriginalFiles(data_dir)
    try:
        with database.transaction() as tx:
            for table in tables:
                report.tables.append(_copy_table(source.db, tx, table, columns[table], progress))
            _advance_sequences(source.db, tx, tables, columns)
            report.tables.append(_copy_originals(originals, tx, progress))
            failed = [t.table for t in report.tables if not t.matches]
            if failed:
                raise StoreMigrationError(
                    f"The copy of {', '.join(failed)} does not match the source; nothing was "
                    f"committed to {database.location}. Run kb migrate-store again."
                )
    except database.driver_error as exc:
        raise StoreMigrationError(
            f"Postgres refused a row ({database.scrub(str(exc).strip())}); nothing was committed "
            f"to {database.location}. Fix the source and run kb migrate-store again."
        ) from None
    source.close()
    target.close()
    return report


def _refuse_unless_empty(target: Store, tables: Sequence[str]) -> None:
    held = [
        t
        for t in [*tables, "originals"]
        if target.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
    ]
    if held:
        raise StoreMigrationError(
            f"The database {target.database.location} is not empty ({', '.join(held)} hold "
            "rows); kb migrate-store only fills an empty database. Point --to at a new database."
        )


def _row_hash(row: Iterable[Any]) -> int:
    canonical = repr(tuple(bytes(v) if isinstance(v, memoryview) else v for v in row))
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest(), "big")


def _checksum(rows: Iterable[Iterable[Any]]) -> tuple[int, str]:
    count, total = 0, 0
    for row in rows:
        count += 1
        total = (total + _row_hash(row)) % _MODULUS
    return count, f"{total:064x}"


def _select(table: str, columns: Sequence[str]) -> str:
    return f"SELECT {', '.join(_quoted(columns))} FROM {table}"


def _quoted(columns: Iterable[str]) -> list[str]:
    return [f'"{c}"' for c in columns]


def _copy_table(
    source: Connection,
    target: PostgresConnection,
    table: str,
    columns: Sequence[str],
    progress: Progress | None,
) -> TableCheck:
    total = int(source.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    insert = (
        f"INSERT INTO {table} ({', '.join(_quoted(columns))}) "
        f"VALUES ({', '.join('?' * len(columns))})"
    )
    cursor: Any = source.execute(_select(table, columns))
    done = 0
    while batch := cursor.fetchmany(_BATCH):
        target.executemany(insert, batch)
        done += len(batch)
        if progress:
            progress(table, done, total)
    rows, checksum = _checksum(source.execute(_select(table, columns)).fetchall())
    target_rows, target_checksum = _checksum(target.execute(_select(table, columns)).fetchall())
    return TableCheck(table, rows, checksum, target_rows, target_checksum)


def _advance_sequences(
    source: Connection, target: PostgresConnection, tables: Sequence[str], columns: Any
) -> None:
    """Set each identity sequence past every id SQLite handed out (``AUTOINCREMENT`` never reuses one)."""
    handed_out = dict(source.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
    for table in tables:
        key = columns[table][0]
        sequence = target.execute("SELECT pg_get_serial_sequence(?, ?)", [table, key]).fetchone()[0]
        if sequence is None:
            continue
        highest = target.execute(f'SELECT MAX("{key}") FROM {table}').fetchone()[0] or 0
        last = max(int(highest), int(handed_out.get(table) or 0))
        if last:
            target.execute("SELECT setval(?, ?)", [sequence, last])


def _copy_originals(
    originals: OriginalFiles, target: PostgresConnection, progress: Progress | None
) -> TableCheck:
    digests = list(originals.digests())
    for i, digest in enumerate(digests, 1):
        data = originals.read(digest)
        if hashlib.sha256(data).hexdigest() != digest:
            raise StoreMigrationError(
                f"The stored original {originals.path(digest)} does not hash to its name: it is "
                "damaged. Nothing was committed; restore it from a backup or delete the "
                "documents naming it (kb rm), then run kb migrate-store again."
            )
        target.execute("INSERT INTO originals (sha256, data) VALUES (?, ?)", [digest, data])
        if progress:
            progress("originals", i, len(digests))
    rows, checksum = _checksum((d,) for d in digests)
    stored = target.execute("SELECT sha256, data FROM originals").fetchall()
    # Checked by content: a row's bytes must hash to its key.
    sound = [(str(k),) for k, v in stored if hashlib.sha256(bytes(v)).hexdigest() == k]
    target_rows, target_checksum = _checksum(sound)
    return TableCheck("originals", rows, checksum, target_rows, target_checksum)
