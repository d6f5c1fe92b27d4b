"""Time that moves only when a test moves it: a clock, and an asyncio sleep on that clock.

A test of a lease, an expiry or a retry interval passes ``FakeTime.clock`` (and,
where the code waits, ``FakeTime.sleep``) to the code under test and calls
``advance``: what happens before and after a deadline is then decided by the
test's steps, never by how busy the machine is. Synchronous code that waits
(a source's retries) is given ``Waits.sleep``, which records each wait and moves
``Waits.clock`` by it at once.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase

__all__ = ["FakeTime", "Waits", "send_answer", "trickle"]

# How long ``advance`` waits for a woken task to get back to sleep (its real work
# happens in threads and databases): a bound on a stuck test, not a timing.
WAKE_TIMEOUT_S = 30.0


@dataclass
class _Sleeper:
    wake_at: float
    future: asyncio.Future[None]
    task: asyncio.Task[object] | None


class FakeTime:
    """A clock (``clock``, seconds) and an asyncio ``sleep`` that only ``advance`` moves."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self._sleepers: list[_Sleeper] = []
        self._moved: asyncio.Event | None = None
        self._watched: set[asyncio.Task[object]] = set()

    def clock(self) -> float:
        """The time now."""
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has advanced by ``seconds`` (``asyncio.sleep``'s signature)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        sleeper = _Sleeper(self.now + seconds, loop.create_future(), task)
        self._sleepers.append(sleeper)
        if task is not None and task not in self._watched:
            self._watched.add(task)
            task.add_done_callback(lambda _: self._changed())
        self._changed()
        try:
            await sleeper.future
        finally:
            if sleeper in self._sleepers:  # cancelled while asleep
                self._sleepers.remove(sleeper)

    async def sleeping(self, count: int, timeout: float = WAKE_TIMEOUT_S) -> None:
        """Wait until ``count`` tasks are asleep on this clock."""
        await self._until(lambda: len(self._sleepers) >= count, timeout)

    async def advance(self, seconds: float, timeout: float = WAKE_TIMEOUT_S) -> None:
        """Move the clock ``seconds`` on, waking each sleeper at its time, in order.

        Each woken task runs until it sleeps again or ends before the clock moves
        further, as it would if time passed while it worked.
        """
        target = self.now + seconds
        while due := [s for s in self._sleepers if s.wake_at <= target]:
            sleeper = min(due, key=lambda s: s.wake_at)
            self._sleepers.remove(sleeper)
            self.now = max(self.now, sleeper.wake_at)
            sleeper.future.set_result(None)
            await self._until(functools.partial(self._settled, sleeper.task), timeout)
        self.now = target

    def _settled(self, task: asyncio.Task[object] | None) -> bool:
        """Whether ``task``, woken, is asleep again or ended."""
        return task is None or task.done() or any(s.task is task for s in self._sleepers)

    def _changed(self) -> None:
        if self._moved is not None:
            self._moved.set()

    async def _until(self, check: Callable[[], bool], timeout: float) -> None:
        self._moved = self._moved or asyncio.Event()
        async with asyncio.timeout(timeout):
            while not check():
                self._moved.clear()
                await self._moved.wait()


class Waits:
    """A blocking ``sleep`` that records each wait and moves its clock by it, never sleeping."""

    def __init__(self, now: float = 2_000_000.0) -> None:
        self.waits: list[float] = []
        self.now = now
        self.reads = 0  # how often the clock was read (a trickling server paces itself by it)

    def sleep(self, seconds: float) -> None:
        """Record ``seconds`` and move the clock by them (``time.sleep``'s signature)."""
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        """The time now."""
        self.reads += 1
        return self.now


# How long a trickling server waits for its client to look at the clock again before it
# sends the next byte all the same (a client that stopped reading: the write then fails).
_PACE_TIMEOUT_S = 2.0


def trickle(stream: BufferedIOBase, body: bytes, clock: Waits | None, step: float) -> None:
    """Send ``body`` to ``stream`` a byte at a time, each arriving ``step`` seconds on
    ``clock`` after the last: a server that trickles, on the test's time.

    Each byte waits until the client has read ``clock`` since the last one (as a client does
    each time it checks its deadline), so the server never runs ahead of the client's
    checks: a client that gives up at its deadline has been sent what reached it by then.

    Raises:
        OSError: the client stopped reading (closed the connection).
    """
    for byte in range(len(body)):
        seen = clock.reads if clock is not None else 0
        if clock is not None:
            clock.now += step
        stream.write(body[byte : byte + 1])
        stream.flush()
        if clock is None:
            continue
        deadline = time.monotonic() + _PACE_TIMEOUT_S
        while clock.reads == seen and time.monotonic() < deadline:
            time.sleep(0.001)  # polling the client's progress, not standing in for a clock


def send_answer(
    request: BaseHTTPRequestHandler,
    status: int,
    headers: dict[str, str],
    body: bytes,
    *,
    trickled: bool,
    clock: Waits | None,
    step: float,
) -> None:
    """A mock server's answer (JSON unless ``headers`` say otherwise), its body sent whole
    or, ``trickled``, a byte at a time on ``clock`` (:func:`trickle`)."""
    request.send_response(status)
    request.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
    for name, value in headers.items():
        request.send_header(name, value)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    if not trickled:
        request.wfile.write(body)
        return
    try:
        trickle(request.wfile, body, clock, step)
    except OSError:
        request.close_connection = True  # the client stopped reading: what it should do
