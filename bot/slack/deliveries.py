"""Slack's redeliveries, recognised without making Slack wait for the database.

Slack redelivers an event it did not see acknowledged within 3 seconds, and
with several replicas behind one URL any of them may get any delivery. Two
checks, so that the acknowledgement never waits on a database lock:

* ``first_here``, on the acknowledgement path: this process's own memory of
  the deliveries it saw, synchronous and instant. A redelivery to the same
  process is dropped before bolt acknowledges it.
* ``claim``, after the acknowledgement and before any work: the shared
  database's record decides which process answers, so replicas sharing it
  never answer twice. A database that cannot record the delivery (locked past
  its busy timeout, a full disk) is logged and the event is answered anyway: a
  rare duplicate answer is better than a question nobody answers.

A claim is a lease (``KB_SLACK_CLAIM_LEASE``): the process answering renews it
every third of the lease for as long as the task that claimed it runs, and
marks the delivery answered when that task ends, however it ends. A replica
killed mid-answer stops renewing; once its lease lapses, Slack's next
redelivery of that event is claimed and answered by another replica instead
of being dropped as a duplicate for the hour deliveries are remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from bot.slack.config import DEFAULT_CLAIM_LEASE
from index.storage import Store

log = logging.getLogger(__name__)

__all__ = ["DELIVERY_KEYS", "Deliveries", "delivery_keys"]

DELIVERY_KEYS = "kb_delivery_keys"  # bolt context key: the keys ``claim`` records
TTL_SECONDS = 3600.0  # Slack stops redelivering long before this
MEMORY_CAPACITY = 20_000  # deliveries remembered in memory; the oldest are forgotten first


def delivery_keys(body: dict[str, Any]) -> list[str]:
    """Keys identifying one delivery of an event (``event_id``; ``client_msg_id`` for messages)."""
    if body.get("type") != "event_callback":
        return []
    keys = [f"event:{body['event_id']}"] if body.get("event_id") else []
    event = body.get("event") or {}
    if event.get("client_msg_id"):
        # Per event type: app_mention and message.channels carry the same client_msg_id.
        keys.append(f"msg:{event.get('type')}:{event['client_msg_id']}")
    return keys


class Deliveries:
    """Which deliveries this process saw, and which ones it answers.

    Args:
        store: the shared database holding every process's record.
        executor: threads for the database write, apart from the answering work.
        lease_seconds: how long a claim lasts without being renewed.
        sleep: how the renewal waits a third of the lease (``asyncio.sleep``; tests
            pass one on their own clock, which the store's claims read too).
    """

    def __init__(
        self,
        store: Store,
        executor: Executor,
        lease_seconds: float = DEFAULT_CLAIM_LEASE,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.executor = executor
        self.lease_seconds = lease_seconds
        self._sleep = sleep
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._renewals: set[asyncio.Task[None]] = set()

    def first_here(self, keys: Iterable[str]) -> bool:
        """Remember ``keys``; whether none of them was seen by this process before."""
        now = time.monotonic()
        while self._seen and next(iter(self._seen.values())) < now - TTL_SECONDS:
            self._seen.popitem(last=False)
        first = True
        for key in keys:
            first = first and key not in self._seen
            self._seen[key] = now
            self._seen.move_to_end(key)
        while len(self._seen) > MEMORY_CAPACITY:
            self._seen.popitem(last=False)
        return first

    async def claim(self, keys: list[str]) -> bool:
        """Claim ``keys`` in the shared database; whether this process answers the delivery.

        Won, the claim is held until the calling task ends (see the module docstring).
        """
        if not keys:
            return True
        loop = asyncio.get_running_loop()
        try:
            won = await loop.run_in_executor(self.executor, self._claim, keys)
        except Exception as exc:  # any failure to record it: answer rather than drop
            log.warning(
                "could not record Slack delivery %s in the database (%s: %s); answering it anyway",
                ", ".join(keys),
                type(exc).__name__,
                exc,
            )
            return True
        if won:
            self._hold(keys)
        else:
            # Another process holds it: a later redelivery here asks the database again,
            # so that it is answered if that process dies.
            for key in keys:
                self._seen.pop(key, None)
        return won

    def _claim(self, keys: list[str]) -> bool:
        return self.store.deliveries.claim(
            keys, lease_seconds=self.lease_seconds, ttl_seconds=TTL_SECONDS
        )

    def _hold(self, keys: list[str]) -> None:
        """Renew the claim while the current task runs; mark it answered when it ends."""
        loop, owner = asyncio.get_running_loop(), asyncio.current_task()
        renewal = loop.create_task(self._renew(keys), name="renew Slack delivery claim")
        self._renewals.add(renewal)

        def finished(_: object) -> None:
            renewal.cancel()
            self._renewals.discard(renewal)
            # A process shutting down has no executor left: its claim simply lapses.
            with contextlib.suppress(RuntimeError):
                loop.run_in_executor(self.executor, self._write, self.store.deliveries.finish, keys)

        if owner is None:  # not in a task: nothing to wait for
            finished(None)
        else:
            owner.add_done_callback(finished)

    async def _renew(self, keys: list[str]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._sleep(self.lease_seconds / 3)
            await loop.run_in_executor(
                self.executor, self._write, self.store.deliveries.renew, keys
            )

    @staticmethod
    def _write(write: Callable[[list[str]], None], keys: list[str]) -> None:
        try:
            write(keys)
        except Exception as exc:  # the lease may lapse: a rare second answer, never none
            log.warning(
                "could not update the claim on Slack delivery %s (%s: %s)",
                ", ".join(keys),
                type(exc).__name__,
                exc,
            )
