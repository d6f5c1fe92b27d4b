"""The messages the bot posted about a document: upload statuses and approval requests.

``store.messages`` holds them. A button's value is the clicker's to forge, and
so is the message a payload says it came from: a listener edits a message only
when this record says the bot posted it for that document. Every copy of an
approval request (one per admin's DM) is recorded, so any replica can update
them all once one admin decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.storage.part import StorePart

__all__ = ["APPROVAL", "STATUS", "PostedMessage", "PostedMessages"]

STATUS = "status"  # the uploader's status message (its Retry button)
APPROVAL = "approval"  # one copy of the request the admins decide on


@dataclass(frozen=True)
class PostedMessage:
    """Where one message about a document is: its channel and timestamp."""

    channel: str
    ts: str


class PostedMessages(StorePart):
    """Recording and reading them (table ``posted_messages``; ``store.messages``)."""

    def record(self, document_id: int, kind: str, channel: str, ts: str) -> None:
        """Record that the message ``channel``/``ts`` is the bot's ``kind`` message for the document."""
        with self.transaction() as db:
            db.execute(
                """INSERT INTO posted_messages (channel, ts, document_id, kind, at)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (channel, ts) DO UPDATE SET document_id = excluded.document_id,
                       kind = excluded.kind, at = excluded.at""",
                [channel, ts, document_id, kind, self.clock()],
            )

    def of(self, document_id: int, kind: str) -> list[PostedMessage]:
        """The document's ``kind`` messages, oldest first."""
        rows = self.db.execute(
            """SELECT channel, ts FROM posted_messages WHERE document_id = ? AND kind = ?
               ORDER BY at, channel, ts""",
            [document_id, kind],
        ).fetchall()
        return [PostedMessage(str(r[0]), str(r[1])) for r in rows]

    def is_of(self, document_id: int, kind: str, channel: str, ts: str) -> bool:
        """Whether ``channel``/``ts`` is a ``kind`` message the bot posted for the document."""
        row = self.db.execute(
            """SELECT 1 FROM posted_messages
               WHERE channel = ? AND ts = ? AND document_id = ? AND kind = ?""",
            [channel, ts, document_id, kind],
        ).fetchone()
        return row is not None
