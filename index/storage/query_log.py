"""The query log: every question asked, its outcome, its answer and what it was written from.

Its table (``query_log``) is created with the rest of the schema in
``index.storage.schema``; feedback on the answers is ``index.storage.feedback``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from index.errors import QueryNotFound
from index.records import QUERY_COLUMNS, AskedQuestion, LoggedQuestion, QueryRecord
from index.storage.part import BESIDE_AN_ANSWER_SECONDS, StorePart

__all__ = ["QueryLog", "quoted"]


class QueryLog(StorePart):
    """What is recorded about questions: outcomes and answers (``store.queries``)."""

    def log(self, record: QueryRecord) -> int:
        """Record one question's outcome and return its id.

        Raises:
            StorageError: not recorded (``DatabaseBusy``: another process held the
                write lock for ``BESIDE_AN_ANSWER_SECONDS``, the answer waits no longer).
        """
        row = {"created_at": self.clock(), **record.to_row()}
        marks = ", ".join("?" * len(row))
        with self.transaction(wait=BESIDE_AN_ANSWER_SECONDS) as db:
            cur = db.execute(
                f"INSERT INTO query_log ({quoted(row)}) VALUES ({marks}) RETURNING id",
                list(row.values()),
            )
            return int(cur.fetchone()[0])

    def get(self, query_id: int) -> QueryRecord:
        """The question logged under ``query_id``; ``QueryNotFound`` if there is none."""
        columns = quoted(QUERY_COLUMNS)
        rows = list(self.db.query(f"SELECT {columns} FROM query_log WHERE id = ?", [query_id]))
        if not rows:
            raise QueryNotFound(query_id)
        return QueryRecord.from_row(rows[0])

    def latest(self, limit: int, *, surface: str | None = None) -> list[AskedQuestion]:
        """The ``limit`` questions asked last (only those asked on ``surface``, if given), newest first."""
        columns = quoted(QUERY_COLUMNS)
        where, params = ("WHERE surface = ?", [surface]) if surface else ("", [])
        rows = self.db.query(
            f"""SELECT id, created_at, {columns} FROM query_log {where}
                ORDER BY created_at DESC, id DESC LIMIT ?""",
            [*params, limit],
        )
        return [
            AskedQuestion(int(r["id"]), float(r["created_at"]), QueryRecord.from_row(r))
            for r in rows
        ]

    def by_outcome(
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


def quoted(columns: Iterable[str]) -> str:
    """Column names for a statement, quoted: ``user`` is a reserved word in Postgres."""
    return ", ".join(f'"{c}"' for c in columns)
