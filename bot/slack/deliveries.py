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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

from index.store import Store

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
    """

    def __init__(self, store: Store, executor: Executor) -> None:
        self.store = store
        self.executor = executor
        self._seen: OrderedDict[str, float] = OrderedDict()

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
        """Record ``keys`` in the shared database; whether this process is the first to."""
        if not keys:
            return True
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, _first_delivery, self.store, keys)
        except Exception as exc:  # any failure to record it: answer rather than drop
            log.warning(
                "could not record Slack delivery %s in the database (%s: %s); answering it anyway",
                ", ".join(keys),
                type(exc).__name__,
                exc,
            )
            return True


def _first_delivery(store: Store, keys: list[str]) -> bool:
    return store.first_delivery(*keys)
