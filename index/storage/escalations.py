"""Questions handed to a person: at most one hand-off per logged question.

``store.escalations`` holds them. A hand-off is claimed before anything
is posted and marked sent once it was: two clicks, two replicas or a
redelivered click find the claim and post nothing. A claim whose post failed
is released, so a later click can try again. A claim is a lease: its holder
renews it while it posts (``renew``), and one left by a process that died while
posting is taken over once it was not renewed for ``stale_after`` seconds. The
first post marked sent wins (``mark_sent`` is conditional), so a holder that
finds another post marked first knows its own is a duplicate to withdraw.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.storage.part import StorePart

__all__ = ["Claim", "Escalation", "Escalations"]


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


@dataclass(frozen=True)
class Claim:
    """A caller's hold on the hand-off of ``query_id``: ``at`` is when it was last taken or
    renewed, which tells it from a later claim that took over."""

    query_id: int
    user: str
    at: float


class Escalations(StorePart):
    """Claiming, recording and reading hand-offs (table ``escalations``; ``store.escalations``)."""

    def claim(self, query_id: int, user: str, *, stale_after: float = 60.0) -> Claim | None:
        """The caller's claim when it may post the hand-off of ``query_id`` (for ``user``).

        ``None`` when it was sent, or is being sent by a claim renewed less than
        ``stale_after`` seconds ago. The check of the sent mark and the takeover are one
        conditional write: of several callers at once, at most one gets a claim.
        """
        now = self.clock()
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO escalations (query_id, "user", at) VALUES (?, ?, ?)
                   ON CONFLICT(query_id) DO UPDATE SET "user" = excluded."user", at = excluded.at
                   WHERE escalations.ts IS NULL AND escalations.at < ?""",
                [query_id, user, now, now - stale_after],
            )
            return Claim(query_id, user, now) if cur.rowcount == 1 else None

    def renew(self, claim: Claim) -> Claim | None:
        """Keep ``claim`` from being taken over: its holder is still posting.

        The renewed claim; ``None`` when it was taken over, released or sent meanwhile.
        """
        now = self.clock()
        with self.transaction() as db:
            cur = db.execute(
                """UPDATE escalations SET at = ?
                   WHERE query_id = ? AND "user" = ? AND at = ? AND ts IS NULL""",
                [now, claim.query_id, claim.user, claim.at],
            )
            return Claim(claim.query_id, claim.user, now) if cur.rowcount == 1 else None

    def mark_sent(self, query_id: int, channel: str, ts: str, *, user: str = "") -> bool:
        """Record where the hand-off of ``query_id`` was posted (by ``user``, when given).

        ``False`` when another post of it was marked first: this one is a duplicate.
        """
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO escalations (query_id, "user", at, channel, ts)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT(query_id) DO UPDATE SET
                       channel = excluded.channel,
                       ts = excluded.ts,
                       "user" = COALESCE(NULLIF(excluded."user", ''), escalations."user")
                   WHERE escalations.ts IS NULL""",
                [query_id, user, self.clock(), channel, ts],
            )
            return cur.rowcount == 1

    def release(self, query_id: int, claim: Claim | None = None) -> None:
        """Forget an unsent claim (its post failed), so a later click can try again.

        With ``claim``, only that one: a claim that took it over is left alone.
        """
        with self.transaction() as db:
            if claim is None:
                db.execute("DELETE FROM escalations WHERE query_id = ? AND ts IS NULL", [query_id])
                return
            db.execute(
                """DELETE FROM escalations
                   WHERE query_id = ? AND "user" = ? AND at = ? AND ts IS NULL""",
                [query_id, claim.user, claim.at],
            )

    def get(self, query_id: int) -> Escalation | None:
        """The hand-off of ``query_id``, sent or being sent; ``None`` when there is none."""
        row = self.db.execute(
            'SELECT query_id, "user", at, channel, ts FROM escalations WHERE query_id = ?',
            [query_id],
        ).fetchone()
        if row is None:
            return None
        return Escalation(int(row[0]), str(row[1]), float(row[2]), row[3] or "", row[4] or "")
