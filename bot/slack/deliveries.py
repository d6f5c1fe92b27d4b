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

A claim is a lease (``KB_SLACK_CLAIM_LEASE``) in the shared store, held by
one ``Claim`` (its holder's name is unique to it): the process answering renews
it every third of the lease for as long as the task that claimed it runs, and
marks the delivery answered when that task ends, however it ends. A replica
killed mid-answer stops renewing; once its lease lapses, Slack's next
redelivery of that event is claimed and answered by another replica instead
of being dropped as a duplicate for the hour deliveries are remembered.

Work that outlives the task that claimed it (an upload: its files are
downloaded and indexed in the background) takes the claim with it
(``Claim.detach``, or ``Deliveries.take``): the claim is renewed until that
work calls ``Claim.finish`` (done: never claimed again) or ``Claim.let_go``
(not done: the next claim, a redelivery's or a sweep's, takes it over at
once). A renewal that finds the claim taken over (its holder stalled past the
lease) says so (``Claim.held``), so the stalled holder leaves the rest to the
one that took it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from typing import Any, TypeVar

from bot.slack.config import DEFAULT_CLAIM_LEASE
from index.storage import Store

log = logging.getLogger(__name__)

__all__ = ["CLAIM", "Claim", "DELIVERY_KEYS", "Deliveries", "delivery_keys"]

DELIVERY_KEYS = "kb_delivery_keys"  # bolt context key: the keys ``claim`` records
CLAIM = "kb_claim"  # bolt context key: the ``Claim`` a listener won
TTL_SECONDS = 3600.0  # Slack stops redelivering long before this
MEMORY_CAPACITY = 20_000  # deliveries remembered in memory; the oldest are forgotten first
_T = TypeVar("_T")


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


class Claim:
    """This process's hold on one delivery, renewed every third of the lease until it ends.

    Ended by ``finish`` (the delivery is answered), by ``let_go`` (it is not:
    another process takes it over), or, unless ``detach``ed, when the task that
    claimed it ends (``Deliveries.claim``). ``recorded`` is false when the store
    could not record it: the work goes on unguarded, and nothing is renewed.
    """

    def __init__(self, deliveries: Deliveries, keys: list[str], *, recorded: bool = True) -> None:
        self.deliveries = deliveries
        self.keys = tuple(keys)
        self.holder = secrets.token_hex(8)
        self.recorded = recorded
        self.detached = False
        self._lost = False
        self._ended = False
        self._renewal: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        """Whether no other process took the claim over (its renewals found it still ours)."""
        return not self._lost

    def detach(self) -> None:
        """Keep the claim past the task that won it: whoever does the work now ends it."""
        self.detached = True

    async def finish(self) -> bool:
        """Mark the delivery answered (only while this claim holds it); whether it was."""
        written = self.finish_soon()
        return bool(await written) if written is not None else False

    def finish_soon(self) -> asyncio.Future[bool | None] | None:
        """Stop renewing and start marking the delivery answered; the write, if one was started."""
        return self.deliveries.submit(self._finish) if self._end() else None

    async def let_go(self) -> None:
        """End the claim unanswered: the next claim of the delivery (a redelivery, a sweep) wins."""
        if self._end():
            released = self.deliveries.submit(self._release)
            if released is not None:
                await released

    def _end(self) -> bool:
        """Stop renewing; whether this is the first end (and the claim is recorded)."""
        if self._renewal is not None:
            self._renewal.cancel()
            self.deliveries.renewals.discard(self._renewal)
        first, self._ended = not self._ended, True
        return first and self.recorded

    def _finish(self) -> bool:
        return self.deliveries.store.deliveries.finish(self.keys, self.holder)

    def _release(self) -> None:
        self.deliveries.store.deliveries.release(self.keys, self.holder)

    def _renew(self) -> bool:
        return self.deliveries.store.deliveries.renew(self.keys, self.holder)

    def renew_in_background(self) -> None:
        """Start renewing every third of the lease until the claim ends or is lost."""
        if not self.recorded or self._ended:
            return
        self._renewal = asyncio.get_running_loop().create_task(
            self._renewing(), name="renew Slack delivery claim"
        )
        self.deliveries.renewals.add(self._renewal)

    async def _renewing(self) -> None:
        while True:
            await self.deliveries.sleep(self.deliveries.lease_seconds / 3)
            renewed = self.deliveries.submit(self._renew)
            if renewed is None:  # shutting down: the claim lapses
                return
            if await renewed is False:
                self._lost = True
                log.warning(
                    "the claim on Slack delivery %s was taken over by another process",
                    ", ".join(self.keys),
                )
                return


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
        self.sleep = sleep
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.renewals: set[asyncio.Task[None]] = set()

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

    async def claim(self, keys: list[str]) -> Claim | None:
        """Claim ``keys`` in the shared database; the claim when this process answers the delivery.

        Won, the claim is held until the calling task ends, then marked answered
        (see the module docstring), unless it was ``detach``ed meanwhile.
        """
        claim = await self.take(keys)
        if claim is None:
            return None
        owner = asyncio.current_task()

        def finished(_: object) -> None:
            if not claim.detached:
                claim.finish_soon()

        if owner is None:  # not in a task: nothing to wait for
            await claim.finish()
        else:
            owner.add_done_callback(finished)
        return claim

    async def take(self, keys: list[str]) -> Claim | None:
        """Claim ``keys``; the claim, renewed until it is finished or let go, or ``None``
        when another process holds it or the delivery was answered."""
        if not keys:
            return Claim(self, [], recorded=False)
        claim = Claim(self, keys)
        loop = asyncio.get_running_loop()
        try:
            won = await loop.run_in_executor(self.executor, self._claim, claim)
        except Exception as exc:  # any failure to record it: answer rather than drop
            log.warning(
                "could not record Slack delivery %s in the database (%s: %s); answering it anyway",
                ", ".join(keys),
                type(exc).__name__,
                exc,
            )
            return Claim(self, keys, recorded=False)
        if not won:
            # Another process holds it: a later redelivery here asks the database again,
            # so that it is answered if that process dies.
            for key in keys:
                self._seen.pop(key, None)
            return None
        claim.renew_in_background()
        return claim

    def _claim(self, claim: Claim) -> bool:
        return self.store.deliveries.claim(
            claim.keys,
            lease_seconds=self.lease_seconds,
            ttl_seconds=TTL_SECONDS,
            holder=claim.holder,
        )

    def submit(self, write: Callable[[], _T]) -> asyncio.Future[_T | None] | None:
        """Start one write to a claim in the delivery threads: its result, ``None`` when it
        failed (logged); no future when the process is shutting down (the claim lapses)."""
        try:
            return asyncio.get_running_loop().run_in_executor(self.executor, _logged, write)
        except RuntimeError:  # no threads (or no loop) left
            return None


def _logged(write: Callable[[], _T]) -> _T | None:
    try:
        return write()
    except Exception as exc:  # the lease may lapse: a rare second answer, never none
        log.warning(
            "could not update a claim on a Slack delivery (%s: %s)", type(exc).__name__, exc
        )
        return None
