"""The audit log: every change to the knowledge base, who made it and when.

``Store`` mixes in ``AuditMixin``: an entry is written with ``store.audit(...)``
inside the transaction that makes the change, so the log and the documents
never disagree. The ``audit`` table (``index.storage.schema``) refuses updates and
deletes.
"""

from __future__ import annotations

import time

from index.records import AUDIT_COLUMNS, AuditEntry
from index.storage.store_mixin import StoreMixin

__all__ = ["AuditMixin"]

_WRITTEN = [c for c in AUDIT_COLUMNS if c != "id"]


class AuditMixin(StoreMixin):
    """Writing and reading the audit log.

    Mixed into ``Store``, which provides ``db`` (this thread's connection) and
    ``transaction()``.
    """

    def audit(self, entry: AuditEntry) -> int:
        """Record ``entry`` (its time is now) and return its id.

        Call it inside the transaction that makes the change it records.
        """
        row = entry.to_dict() | {"at": time.time()}
        marks = ", ".join("?" * len(_WRITTEN))
        with self.transaction() as db:
            cur = db.execute(
                f"INSERT INTO audit ({', '.join(_WRITTEN)}) VALUES ({marks}) RETURNING id",
                [row[c] for c in _WRITTEN],
            )
            return int(cur.fetchone()[0])

    def audit_entries(self, limit: int | None = None) -> list[AuditEntry]:
        """The newest ``limit`` entries (all when ``None``), newest first."""
        newest = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit ORDER BY id DESC"
        rows = (
            self.db.query(newest) if limit is None else self.db.query(f"{newest} LIMIT ?", [limit])
        )
        return [AuditEntry.from_row(r) for r in rows]
