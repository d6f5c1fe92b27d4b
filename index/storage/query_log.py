"""The query log, answer feedback and event delivery de-duplication.

``Store`` mixes in ``QueryLogMixin``, so these are called on the store
(``store.log_query(...)``, ``store.add_feedback(...)``) and use its per-thread
connection (``db``) and its ``transaction()``. Their tables (``query_log``,
``feedback``, ``deliveries``) are created with the rest of the schema in
``index.storage.schema``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from index.errors import QueryNotFound
from index.records import QUERY_COLUMNS, DislikedAnswer, LoggedQuestion, QueryRecord
from index.storage.store_mixin import StoreMixin

__all__ = ["QueryLogMixin"]


class QueryLogMixin(StoreMixin):
    """What is recorded about questions: outcomes and answers, thumbs, event deliveries seen.

    Mixed into ``Store``, which provides ``db`` (this thread's connection) and
    ``transaction()``.
    """

    # ----------------------------------------------------------------- query log

    def log_query(self, record: QueryRecord) -> int:
        """Record one question's outcome and return its id."""
        row = {"created_at": time.time(), **record.to_row()}
        marks = ", ".join("?" * len(row))
        with self.transaction() as db:
            cur = db.execute(
                f"INSERT INTO query_log ({_quoted(row)}) VALUES ({marks}) RETURNING id",
                list(row.values()),
            )
            return int(cur.fetchone()[0])

    def query(self, query_id: int) -> QueryRecord:
        """The question logged under ``query_id``; ``QueryNotFound`` if there is none."""
        columns = _quoted(QUERY_COLUMNS)
        rows = list(self.db.query(f"SELECT {columns} FROM query_log WHERE id = ?", [query_id]))
        if not rows:
            raise QueryNotFound(query_id)
        return QueryRecord.from_row(rows[0])

    def questions_by_outcome(
        self,
        outcomes: Sequence[str],
        *,
        since: float,
        limit: int,
        per_user: int | None = None,
    ) -> list[LoggedQuestion]:
        """Questions that ended in one of ``outcomes`` asked at or after ``since``, newest first.

        At most ``limit`` of them: the newest; with ``per_user``, at most that many
        of each person's (their newest), so that one person asking over and over
        cannot crowd everyone else out.
        """
        if not outcomes or limit <= 0:
            return []
        marks = ",".join("?" * len(outcomes))
        rows = self.db.query(
            f"""SELECT id, question, outcome, kept, scopes, created_at, channel, nearest, "user"
                FROM (SELECT *, ROW_NUMBER() OVER (
                          PARTITION BY COALESCE("user", 'id:' || id)
                          ORDER BY created_at DESC, id DESC) AS nth
                      FROM query_log WHERE outcome IN ({marks}) AND created_at >= ?) AS q
                WHERE nth <= ?
                ORDER BY created_at DESC, id DESC LIMIT ?""",
            [*outcomes, since, per_user if per_user is not None else limit, limit],
        )
        return [LoggedQuestion.from_row(r) for r in rows]

    def thread_turns(self, channel: str, thread_id: str, limit: int) -> list[tuple[str, str]]:
        """The last ``limit`` logged ``(question, answer)`` pairs of a thread, oldest first."""
        rows = self.db.query(
            "SELECT question, answer FROM query_log WHERE channel = ? AND thread_id = ? "
            "ORDER BY id DESC LIMIT ?",
            [channel, thread_id, limit],
        )
        return [(r["question"], r["answer"] or "") for r in reversed(list(rows))]

    def answered_in_thread(self, channel: str, thread_id: str) -> bool:
        """Whether a question of this thread was logged (the bot is answering in it)."""
        row = self.db.execute(
            "SELECT 1 FROM query_log WHERE channel = ? AND thread_id = ? LIMIT 1",
            [channel, thread_id],
        ).fetchone()
        return row is not None

    def add_feedback(self, query_id: int, value: int, user: str | None = None) -> int:
        """Store a thumbs-up (+1) or thumbs-down (-1) for a logged answer."""
        self.query(query_id)
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO feedback (query_id, "user", value, created_at)
                   VALUES (?, ?, ?, ?) RETURNING id""",
                [query_id, user, value, time.time()],
            )
            return int(cur.fetchone()[0])

    def disliked_questions(self) -> list[dict[str, Any]]:
        """Logged questions that got a thumbs-down, newest first."""
        return list(
            self.db.query(
                """SELECT q.id, q.question, q.outcome, q.created_at FROM query_log q
                   WHERE EXISTS (SELECT 1 FROM feedback f WHERE f.query_id = q.id AND f.value < 0)
                   ORDER BY q.id DESC"""
            )
        )

    def disliked_answers(
        self, *, since: float = 0.0, limit: int = 50, offset: int = 0
    ) -> list[DislikedAnswer]:
        """Answers given a thumbs-down at or after ``since``, the latest thumbs-down first.

        A person's latest thumb is their opinion: a thumbs-down taken back with
        a thumbs-up no longer counts, and a second thumbs-down counts once.
        ``offset`` and ``limit`` page through them; ``disliked_count`` says how
        many there are.
        """
        rows = self.db.query(
            f"""SELECT q.id, q.question, q.answer, q.outcome, q."user", q.channel, q.thread_id,
                       q.created_at, COUNT(*) AS dislikes, MAX(f.created_at) AS disliked_at
                FROM query_log q JOIN feedback f ON f.query_id = q.id
                WHERE {_STANDING_DISLIKE}
                GROUP BY q.id ORDER BY disliked_at DESC, q.id DESC LIMIT ? OFFSET ?""",
            [since, limit, offset],
        )
        return [DislikedAnswer(**r) for r in rows]

    def disliked_count(self, *, since: float = 0.0) -> int:
        """How many answers ``disliked_answers`` has for ``since``."""
        row = self.db.execute(
            f"SELECT COUNT(DISTINCT f.query_id) FROM feedback f WHERE {_STANDING_DISLIKE}",
            [since],
        ).fetchone()
        return int(row[0])

    # ----------------------------------------------------------------- events

    def first_delivery(self, *keys: str, ttl_seconds: float = 3600.0) -> bool:
        """True the first time any of ``keys`` is seen within the TTL; False for a redelivery.

        A delivery has several keys (Slack's event id, the message it is about);
        all are recorded in one transaction, every one even after a duplicate, so
        either catches the next redelivery. One transaction matters: recorded one
        by one, two replicas could each take one key first and both drop the event.
        Kept in the database rather than in memory so that replicas sharing it
        never answer the same event twice: the key is unique, and on Postgres a
        second claim of a key waits for the first one's transaction, then finds it.
        """
        now = time.time()
        with self.transaction() as db:
            db.execute("DELETE FROM deliveries WHERE seen_at < ?", [now - ttl_seconds])
            new = 0
            # In one order: two claims of the same keys never wait on each other in a cycle.
            for key in sorted(set(keys)):
                cur = db.execute(
                    "INSERT INTO deliveries (key, seen_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    [key, now],
                )
                new += cur.rowcount
            return new == len(set(keys))

    def claim_delivery(
        self, keys: Sequence[str], *, lease_seconds: float, ttl_seconds: float = 3600.0
    ) -> bool:
        """Whether the caller answers the delivery ``keys``: it claimed them first, or after
        their holder stopped renewing its claim (a replica that died mid-answer).

        A claim lasts ``lease_seconds`` from its last ``renew_delivery``; a delivery
        marked answered (``finish_delivery``) is never claimed again. Each step is a
        conditional write in one transaction, so of several processes claiming the
        same delivery at once exactly one wins, on SQLite and Postgres alike.
        """
        now = time.time()
        # In one order: two claims of the same keys never wait on each other in a cycle.
        keys = sorted(set(keys))
        with self.transaction() as db:
            db.execute("DELETE FROM deliveries WHERE seen_at < ?", [now - ttl_seconds])
            new = sum(
                db.execute(
                    "INSERT INTO deliveries (key, seen_at) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                    [key, now],
                ).rowcount
                for key in keys
            )
            if new == len(keys):
                return True
            marks = ", ".join("?" * len(keys))
            answered = db.execute(
                f"SELECT 1 FROM deliveries WHERE key IN ({marks})", [_ANSWERED + k for k in keys]
            ).fetchone()
            if answered is not None:
                return False
            lapsed = sum(
                db.execute(
                    "UPDATE deliveries SET seen_at = ? WHERE key = ? AND seen_at < ?",
                    [now, key, now - lease_seconds],
                ).rowcount
                for key in keys
            )
            return new + lapsed == len(keys)

    def renew_delivery(self, keys: Sequence[str]) -> None:
        """Keep the claim on ``keys`` from lapsing (``claim_delivery``): its holder is alive."""
        marks = ", ".join("?" * len(keys))
        with self.transaction() as db:
            db.execute(
                f"UPDATE deliveries SET seen_at = ? WHERE key IN ({marks})", [time.time(), *keys]
            )

    def finish_delivery(self, keys: Sequence[str]) -> None:
        """Mark the delivery ``keys`` answered: no redelivery is claimed after this."""
        now = time.time()
        with self.transaction() as db:
            for key in keys:
                db.execute(
                    "INSERT INTO deliveries (key, seen_at) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                    [_ANSWERED + key, now],
                )


# A delivery's keys with this prefix: its answer is done (``finish_delivery``).
_ANSWERED = "answered:"


# A feedback row ``f`` that is a thumbs-down at or after ``?`` and its giver's latest thumb
# on that answer (a row without a user stands alone).
_STANDING_DISLIKE = """f.value < 0 AND f.created_at >= ? AND (f."user" IS NULL OR f.id = (
    SELECT MAX(g.id) FROM feedback g WHERE g.query_id = f.query_id AND g."user" = f."user"))"""


def _quoted(columns: Iterable[str]) -> str:
    """Column names for a statement, quoted: ``user`` is a reserved word in Postgres."""
    return ", ".join(f'"{c}"' for c in columns)
