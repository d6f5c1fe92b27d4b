"""Uploads in progress: the files of a claimed delivery until each is done, shared by every process.

An upload's delivery (a Slack event sharing files, a ``/kb-upload``
submission) is claimed in ``store.deliveries`` and stays claimed until every
file it brought is done: indexed, or failed with the person told. Its files
are recorded here when the claim is won, each with what the surface needs to
resume it (``request``, opaque to the store: who, where, how), then where its
status message is and which document it became as those exist. A process
that takes over a lapsed claim (its holder died) reads these rows and
carries on from the last step recorded: the same status message, the stored
original instead of a second download, no second document. ``lapsed`` lists
the deliveries whose claims nobody renews, for the periodic sweep that takes
them over when Slack does not redeliver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from index.storage.part import StorePart

__all__ = ["Upload", "Uploads"]

_COLUMNS = (
    "delivery, file_id, claim_keys, request, status_channel, status_ts, document_id, "
    "attempts, done_at"
)


@dataclass(frozen=True)
class Upload:
    """One file of an upload, as recorded.

    Attributes:
        delivery: the delivery it came with (the first of ``keys``).
        file_id: the file's id (Slack's).
        keys: every key of the delivery's claim.
        request: what the surface needs to resume it.
        status_channel, status_ts: its status message, once posted.
        document_id: the document it became, once stored.
        attempts: how many processes started on it (a takeover is one more).
        done: indexed or failed, with the person told.
    """

    delivery: str
    file_id: str
    keys: tuple[str, ...]
    request: Mapping[str, Any]
    status_channel: str | None = None
    status_ts: str | None = None
    document_id: int | None = None
    attempts: int = 0
    done: bool = False


def delivery_of(keys: Sequence[str]) -> str:
    """The name a delivery's uploads are recorded under: the first of its keys."""
    return min(keys)


class Uploads(StorePart):
    """Recording and reading uploads in progress (table ``uploads``; ``store.uploads``)."""

    def record(
        self,
        keys: Sequence[str],
        files: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        ttl_seconds: float = 3600.0,
    ) -> list[Upload]:
        """Record the files of the delivery ``keys`` (``(file id, request)`` each), unless
        recorded already; every file of the delivery as recorded, in order.

        A process taking over the delivery gets the rows its first holder
        recorded, not new ones. Uploads done more than ``ttl_seconds`` ago are forgotten.
        """
        now = self.clock()
        delivery, claim_keys = delivery_of(keys), json.dumps(sorted(set(keys)))
        with self.transaction() as db:
            db.execute("DELETE FROM uploads WHERE done_at < ?", [now - ttl_seconds])
            for position, (file_id, request) in enumerate(files):
                db.execute(
                    """INSERT INTO uploads (delivery, file_id, claim_keys, request, position,
                                            created_at)
                       VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (delivery, file_id) DO NOTHING""",
                    [delivery, file_id, claim_keys, json.dumps(request, sort_keys=True),
                     position, now],
                )  # fmt: skip
        return self.of(keys)

    def of(self, keys: Sequence[str]) -> list[Upload]:
        """The files recorded for the delivery ``keys``, in the order they came."""
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM uploads WHERE delivery = ? ORDER BY position, file_id",
            [delivery_of(keys)],
        ).fetchall()
        return [_upload(row) for row in rows]

    def started(self, upload: Upload) -> int:
        """Count one more process starting on ``upload``; how many have, this one included."""
        with self.transaction() as db:
            row = db.execute(
                """UPDATE uploads SET attempts = attempts + 1
                   WHERE delivery = ? AND file_id = ? RETURNING attempts""",
                [upload.delivery, upload.file_id],
            ).fetchone()
        return int(row[0]) if row else upload.attempts + 1

    def set_status(self, upload: Upload, channel: str, ts: str) -> None:
        """Record where ``upload``'s status message is: a takeover edits that one."""
        self._set(upload, status_channel=channel, status_ts=ts)

    def set_document(self, upload: Upload, document_id: int) -> None:
        """Record the document ``upload`` became: a takeover indexes it from its stored original."""
        self._set(upload, document_id=document_id)

    def settle(self, upload: Upload) -> None:
        """Mark ``upload`` done: indexed or failed, and the person told."""
        self._set(upload, done_at=self.clock())

    def _set(self, upload: Upload, **changes: object) -> None:
        # Column names come from the code above, never from input.
        sets = ", ".join(f"{column} = ?" for column in changes)
        with self.transaction() as db:
            db.execute(
                f"UPDATE uploads SET {sets} WHERE delivery = ? AND file_id = ?",
                [*changes.values(), upload.delivery, upload.file_id],
            )

    def lapsed(self, *, lease_seconds: float) -> list[tuple[str, ...]]:
        """The claim keys of each delivery with files not done whose claim nobody renews.

        Lapsed: not renewed for ``lease_seconds``, released, or forgotten
        (``store.deliveries``); a live holder renews its claim every third of a lease.
        """
        rows = self.db.execute(
            """SELECT DISTINCT u.claim_keys, u.delivery FROM uploads u
               LEFT JOIN deliveries d ON d.key = u.delivery
               WHERE u.done_at IS NULL AND (d.key IS NULL OR d.seen_at < ?)
               ORDER BY u.delivery""",
            [self.clock() - lease_seconds],
        ).fetchall()
        return [tuple(json.loads(row[0])) for row in rows]


def _upload(row: Sequence[Any]) -> Upload:
    delivery, file_id, keys, request, channel, ts, document_id, attempts, done_at = row
    return Upload(
        delivery=str(delivery),
        file_id=str(file_id),
        keys=tuple(json.loads(keys)),
        request=json.loads(request),
        status_channel=channel,
        status_ts=ts,
        document_id=int(document_id) if document_id is not None else None,
        attempts=int(attempts),
        done=done_at is not None,
    )
