"""Values accepted once: a replayed sign-in callback or Slack-signed request is refused by every replica.

``store.used_states`` holds them: the viewer's sign-in ``state`` values
(``bot.slack.people.signin``) and the Slack signatures of MCP requests
(``bot.mcp.server``, prefixed so the two never meet), each until it expires
(a value older than that is refused for its age anyway, so forgetting it then
loses nothing).
"""

from __future__ import annotations

from index.storage.part import StorePart

__all__ = ["UsedStates"]


class UsedStates(StorePart):
    """Claiming values once (table ``used_states``; ``store.used_states``)."""

    def claim(self, state: str, *, ttl_seconds: float) -> bool:
        """``True`` the first time ``state`` (any value) is claimed; ``False`` for a replay, on any replica.

        The claim is kept ``ttl_seconds``; expired claims are dropped here too.
        """
        now = self.clock()
        with self.transaction() as db:
            db.execute("DELETE FROM used_states WHERE expires_at <= ?", [now])
            cur = db.execute(
                """INSERT INTO used_states (state, expires_at) VALUES (?, ?)
                   ON CONFLICT (state) DO NOTHING""",
                [state, now + ttl_seconds],
            )
            return cur.rowcount == 1

    def count(self) -> int:
        """How many claims are kept (expired ones included until the next claim)."""
        row = self.db.execute("SELECT COUNT(*) FROM used_states").fetchone()
        return int(row[0]) if row else 0
