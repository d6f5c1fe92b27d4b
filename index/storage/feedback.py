"""Feedback on answers: thumbs up and down, and the answers people marked not helpful.

Its table (``feedback``) is created with the rest of the schema in
``index.storage.schema``.
"""

from __future__ import annotations

from typing import Any

from index.records import DislikedAnswer
from index.storage.database import Database
from index.storage.part import Clock, StorePart
from index.storage.query_log import QueryLog

__all__ = ["Feedback"]


class Feedback(StorePart):
    """Thumbs on logged answers (``store.feedback``); a thumb names a logged question.

    Args:
        database: the store's database.
        queries: the query log the thumbs refer to.
        clock: the time thumbs are stamped with.
    """

    def __init__(self, database: Database, queries: QueryLog, clock: Clock) -> None:
        super().__init__(database, clock)
        self.queries = queries

    def add(self, query_id: int, value: int, user: str | None = None) -> int:
        """Store a thumbs-up (+1) or thumbs-down (-1) for a logged answer."""
        self.queries.get(query_id)
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO feedback (query_id, "user", value, created_at)
                   VALUES (?, ?, ?, ?) RETURNING id""",
                [query_id, user, value, self.clock()],
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


# A feedback row ``f`` that is a thumbs-down at or after ``?`` and its giver's latest thumb
# on that answer (a row without a user stands alone).
_STANDING_DISLIKE = """f.value < 0 AND f.created_at >= ? AND (f."user" IS NULL OR f.id = (
    SELECT MAX(g.id) FROM feedback g WHERE g.query_id = f.query_id AND g."user" = f."user"))"""
