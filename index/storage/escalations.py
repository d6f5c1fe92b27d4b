"""Questions handed to a person: at most one hand-off per logged question.

``store.escalations`` holds them. A hand-off is claimed before anything
is posted and marked sent once it was: two clicks, two replicas or a
redelivered click find the claim and post nothing. A claim whose post failed
is released, so a later click can try again; one left by a process that died
while posting is taken over once it is older than ``stale_after`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.storage.part import StorePart

__all__ = ["Escalation", "Escalations"]


@dataclass(frozen=True)
class Escalation:
    """One question's hand-off.

    Attributes:
        query_id: the logged question.
        user: who handed it off (a Slack user id).
        at: when it was claimed (Unix time).
        channel, ts: the message that handed it off; empty while it is being posted.
    """

    query_id: int
    user: str
    at: float
    channel: str = ""
    ts: str = ""

    @property
    def sent(self) -> bool:
        """Whether the hand-off was posted."""
        return bool(self.ts)


class Escalations(StorePart):
    """Claiming, recording and reading hand-offs (table ``escalations``; ``store.escalations``)."""

    def claim(self, query_id: int, user: str, *, stale_after: float = 60.0) -> bool:
        """``True`` when this caller may post the hand-off of ``query_id`` (claimed for ``user``).

        ``False`` when it was sent, or is being sent by a claim younger than ``stale_after``.
        """
        now = self.clock()
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO escalations (query_id, "user", at) VALUES (?, ?, ?)
                   ON CONFLICT(query_id) DO UPDATE SET "user" = excluded."user", at = excluded.at
                   WHERE escalations.ts IS NULL AND escalations.at < ?""",
                [query_id, user, now, now - stale_after],
            )
            return cur.rowcount == 1

    def mark_sent(self, query_id: int, channel: str, ts: str) -> None:
        """Record where the hand-off of ``query_id`` was posted."""
        with self.transaction() as db:
            db.execute(
                "UPDATE escalations SET channel = ?, ts = ? WHERE query_id = ?",
                [channel, ts, query_id],
            )

    def release(self, query_id: int) -> None:
        """Forget an unsent claim (its post failed), so a later click can try again."""
        with self.transaction() as db:
            db.execute("DELETE FROM escalations WHERE query_id = ? AND ts IS NULL", [query_id])

    def get(self, query_id: int) -> Escalation | None:
        """The hand-off of ``query_id``, sent or being sent; ``None`` when there is none."""
        row = self.db.execute(
            'SELECT query_id, "user", at, channel, ts FROM escalations WHERE query_id = ?',
            [query_id],
        ).fetchone()
        if row is None:
            return None
        return Escalation(int(row[0]), str(row[1]), float(row[2]), row[3] or "", row[4] or "")
