"""Slack event deliveries seen and claimed, shared by every process on the database.

A replica answers an event only after claiming it here, so N replicas never
answer twice; a claim whose holder stops renewing it lapses, so an event whose
replica died mid-answer is answered by another. Its table (``deliveries``) is
created with the rest of the schema in ``index.storage.schema``.
"""

from __future__ import annotations

from collections.abc import Sequence

from index.storage.part import StorePart

__all__ = ["DeliveryLog"]


class DeliveryLog(StorePart):
    """Event deliveries (``store.deliveries``); the lease and TTL are measured by the clock."""

    def claim(
        self, keys: Sequence[str], *, lease_seconds: float, ttl_seconds: float = 3600.0
    ) -> bool:
        """Whether the caller answers the delivery ``keys``: it claimed them first, or after
        their holder stopped renewing its claim (a replica that died mid-answer).

        A claim lasts ``lease_seconds`` from its last ``renew``; a delivery
        marked answered (``finish``) is never claimed again. Each step is a
        conditional write in one transaction, so of several processes claiming the
        same delivery at once exactly one wins, on SQLite and Postgres alike.
        """
        now = self.clock()
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

    def renew(self, keys: Sequence[str]) -> None:
        """Keep the claim on ``keys`` from lapsing (``claim``): its holder is alive."""
        marks = ", ".join("?" * len(keys))
        with self.transaction() as db:
            db.execute(
                f"UPDATE deliveries SET seen_at = ? WHERE key IN ({marks})", [self.clock(), *keys]
            )

    def finish(self, keys: Sequence[str]) -> None:
        """Mark the delivery ``keys`` answered: no redelivery is claimed after this."""
        now = self.clock()
        with self.transaction() as db:
            for key in keys:
                db.execute(
                    "INSERT INTO deliveries (key, seen_at) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                    [_ANSWERED + key, now],
                )


# A delivery's keys with this prefix: its answer is done (``finish``).
_ANSWERED = "answered:"
