"""What Slack said of people and channels, passed from the replica that heard it to the others.

Slack delivers each event to one replica. When it says that a member was
made a guest (``user_change``), or that someone joined or left a channel
(``member_joined_channel``), the replica that heard it writes a row here, and
every replica reads the rows written since it last looked before it decides
who reads along in a channel (``bot.access``): none goes on deciding from the
lists it made before the change.

A row is kept :data:`HEARD_KEEP_SECONDS`; a reader that looked longer ago than that
has lists older than their own lifetimes, and lists the guests again before it
serves that listing (``bot.access.news``). Rows are read by id from the
last one seen, and again for :data:`LATE_SECONDS` by time: on Postgres a row
can become visible after one with a higher id (two writes committing in the
other order), and is not missed for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from index.storage.part import StorePart

__all__ = ["HEARD_KEEP_SECONDS", "LATE_SECONDS", "Heard", "HeardKind", "PeopleHeard"]

# Longer than any list a replica keeps (its guests for ten minutes, a channel's
# members for one).
HEARD_KEEP_SECONDS = 3600.0
# Far longer than a write transaction holds an id before it commits.
LATE_SECONDS = 30.0

# guest: a person who is a guest of the workspace now; member: a person who is no
# guest now; channel: someone joined or left the channel.
HeardKind = Literal["guest", "member", "channel"]
_KINDS = frozenset({"guest", "member", "channel"})


@dataclass(frozen=True)
class Heard:
    """One thing Slack said: ``subject`` is a user id (guest, member) or a channel id."""

    id: int
    kind: HeardKind
    subject: str


class PeopleHeard(StorePart):
    """Table ``people_heard`` (``store.people_heard``)."""

    def record(self, kind: HeardKind, subject: str) -> int:
        """Write what was heard of ``subject``; its row's id. Rows past their time go."""
        if kind not in _KINDS:
            raise ValueError(f"unknown kind of news: {kind!r}")
        now = self.clock()
        with self.transaction() as db:
            db.execute("DELETE FROM people_heard WHERE heard_at < ?", [now - HEARD_KEEP_SECONDS])
            row = db.execute(
                "INSERT INTO people_heard (kind, subject, heard_at) VALUES (?, ?, ?) RETURNING id",
                [kind, subject, now],
            ).fetchone()
        return int(row[0])

    def since(self, last_id: int) -> list[Heard]:
        """The rows after ``last_id``, and those of the last :data:`LATE_SECONDS`, by id."""
        rows = self.db.execute(
            """SELECT id, kind, subject FROM people_heard
               WHERE id > ? OR heard_at > ? ORDER BY id""",
            [last_id, self.clock() - LATE_SECONDS],
        ).fetchall()
        return [Heard(int(i), kind, str(subject)) for i, kind, subject in rows if kind in _KINDS]

    def last_id(self) -> int:
        """The highest id written so far (0: none)."""
        row = self.db.execute("SELECT MAX(id) FROM people_heard").fetchone()
        return int(row[0]) if row and row[0] is not None else 0
