"""Slack event deliveries seen and claimed, shared by every process on the database.

A replica answers an event only after claiming it here, so N replicas never
answer twice; a claim whose holder stops renewing it lapses, so an event whose
replica died mid-answer is answered by another. A claim names its holder: only
the holder renews it or marks it answered, so a holder whose claim was taken
over while it stalled finds out (``renew`` and ``finish`` say so) and leaves
the answer to the one that took it. Its table (``deliveries``) is created with
the rest of the schema in ``index.storage.schema``.
"""

from __future__ import annotations

from collections.abc import Sequence

from index.storage.part import BESIDE_AN_ANSWER_SECONDS, StorePart

__all__ = ["DeliveryLog"]


class DeliveryLog(StorePart):
    """Event deliveries (``store.deliveries``); the lease and TTL are measured by the clock."""

    def claim(
        self,
        keys: Sequence[str],
        *,
        lease_seconds: float,
        ttl_seconds: float = 3600.0,
        holder: str | None = None,
    ) -> bool:
        """Whether the caller answers the delivery ``keys``: it claimed them first, or after
        their holder stopped renewing its claim (a replica that died mid-answer).

        A claim lasts ``lease_seconds`` from its last ``renew``; a delivery
        marked answered (``finish``) is never claimed again. Each step is a
        conditional write in one transaction, so of several processes claiming the
        same delivery at once exactly one wins, on SQLite and Postgres alike.

        Args:
            holder: who claims it (unique to this claim): only it may then
                ``renew`` or ``finish`` the claim under its name.
        """
        now = self.clock()
        # In one order: two claims of the same keys never wait on each other in a cycle.
        keys = sorted(set(keys))
        # Not waited for long: a delivery that cannot be claimed is answered all the same.
        with self.transaction(wait=BESIDE_AN_ANSWER_SECONDS) as db:
            db.execute("DELETE FROM deliveries WHERE seen_at < ?", [now - ttl_seconds])
            new = sum(
                db.execute(
                    """INSERT INTO deliveries (key, seen_at, holder) VALUES (?, ?, ?)
                       ON CONFLICT (key) DO NOTHING""",
                    [key, now, holder],
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
                    "UPDATE deliveries SET seen_at = ?, holder = ? WHERE key = ? AND seen_at < ?",
                    [now, holder, key, now - lease_seconds],
                ).rowcount
                for key in keys
            )
            return new + lapsed == len(keys)

    def renew(self, keys: Sequence[str], holder: str | None = None) -> bool:
        """Keep the claim on ``keys`` from lapsing (``claim``): its holder is alive.

        With ``holder``, only a claim it still holds; whether every key was renewed
        (``False``: another process took the claim over meanwhile).
        """
        keys = sorted(set(keys))
        marks = ", ".join("?" * len(keys))
        mine, params = ("", []) if holder is None else (" AND holder = ?", [holder])
        with self.transaction() as db:
            renewed = db.execute(
                f"UPDATE deliveries SET seen_at = ? WHERE key IN ({marks}){mine}",
                [self.clock(), *keys, *params],
            ).rowcount
        return renewed == len(keys)

    def finish(self, keys: Sequence[str], holder: str | None = None) -> bool:
        """Mark the delivery ``keys`` answered: no redelivery is claimed after this.

        With ``holder``, only while it still holds the claim (checked and marked in
        one transaction); whether it was marked.
        """
        now = self.clock()
        keys = sorted(set(keys))
        with self.transaction() as db:
            # The renewal locks the rows it finds held (Postgres): no claim slips in between.
            if holder is not None and not self.renew(keys, holder):
                return False
            for key in keys:
                db.execute(
                    "INSERT INTO deliveries (key, seen_at) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                    [_ANSWERED + key, now],
                )
        return True

    def release(self, keys: Sequence[str], holder: str) -> None:
        """End ``holder``'s claim on ``keys`` unanswered: the next claim takes it at once."""
        keys = sorted(set(keys))
        marks = ", ".join("?" * len(keys))
        with self.transaction() as db:
            # Lapsed for any lease (and soon forgotten: unanswered, it is claimed again).
            db.execute(
                f"""UPDATE deliveries SET seen_at = seen_at - ?, holder = NULL
                    WHERE key IN ({marks}) AND holder = ?""",
                [_RELEASED, *keys, holder],
            )


# A delivery's keys with this prefix: its answer is done (``finish``).
_ANSWERED = "answered:"
# How far back ``release`` moves a claim: past any lease.
_RELEASED = 86400.0
