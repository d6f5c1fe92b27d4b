"""The audit log: every change to the knowledge base, who made it and when.

``store.audit_log`` holds it: an entry is written with ``store.audit_log.add(...)``
inside the transaction that makes the change, so the log and the documents
never disagree. The ``audit`` table (``index.storage.schema``) refuses updates and
deletes.
"""

from __future__ import annotations

from index.records import AUDIT_COLUMNS, AuditEntry
from index.storage.part import StorePart

__all__ = ["AuditLog"]

_WRITTEN = [c for c in AUDIT_COLUMNS if c != "id"]


class AuditLog(StorePart):
    """Writing and reading the audit log (``store.audit_log``)."""

    def add(self, entry: AuditEntry) -> int:
        """Record ``entry`` (its time is now) and return its id.

        Call it inside the transaction that makes the change it records.
        """
        row = entry.to_dict() | {"at": self.clock()}
        marks = ", ".join("?" * len(_WRITTEN))
        with self.transaction() as db:
            cur = db.execute(
                f"INSERT INTO audit ({', '.join(_WRITTEN)}) VALUES ({marks}) RETURNING id",
                [row[c] for c in _WRITTEN],
            )
            return int(cur.fetchone()[0])

    def entries(self, limit: int | None = None) -> list[AuditEntry]:
        """The newest ``limit`` entries (all when ``None``), newest first."""
        newest = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit ORDER BY id DESC"
        rows = (
            self.db.query(newest) if limit is None else self.db.query(f"{newest} LIMIT ?", [limit])
        )
        return [AuditEntry.from_row(r) for r in rows]
