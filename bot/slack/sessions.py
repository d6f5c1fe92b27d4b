"""The turns this process is answering, by thread, so that Slack's Stop button can cancel one at once.

In an agent session Slack shows a Stop button while the bot works; a click
arrives as ``agent_session_stopped`` naming the channel and the thread
(``thread_ts``) of the session, and who clicked. :class:`Turns` runs each
answer as its own task under that key (:meth:`Turns.run`), and
:meth:`Turns.stop` cancels it there and then: the model's stream and its HTTP
request are closed by the cancellation, the engine logs the question as
``stopped``, and the reply marks what it had shown as stopped
(``bot.conversation.Conversation``).

A stop is acted on only when it is the asker's, for a turn still working:

* someone else's click (a channel thread is everyone's to see) is ignored and logged;
* a turn whose answer is complete (its reply said so: ``stoppable`` is false)
  finishes as it would have; a stop after it ended finds nothing to stop;
* a repeated stop for a turn already stopping changes nothing;
* a click made before a turn's question was asked (``event_ts`` before the
  question's ``ts``: a late or repeated click for an earlier answer in the same
  thread) does not stop it.

What is remembered lives in this process: with several replicas a stop may
reach one that is not answering the question, and is then only logged. Turns
that ended are remembered for ``FINISHED_TTL_SECONDS`` (at most
``MAX_FINISHED``), so the log can tell a late stop from one for a thread never
answered here.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

log = logging.getLogger(__name__)

__all__ = ["FINISHED_TTL_SECONDS", "Stop", "StopRequest", "Turns", "stop_request"]

T = TypeVar("T")

# Long enough to recognise a click that raced the end of the answer.
FINISHED_TTL_SECONDS = 600.0
MAX_FINISHED = 10_000
# Slack's timestamps ("1782234671.392669"), channel and user ids ("D0123ABC", "U0123ABC").
_TS_RE = re.compile(r"(\d{1,12})(?:\.(\d{1,9}))?")
_ID_RE = re.compile(r"[A-Z0-9]{1,32}")


class Stop(StrEnum):
    """What a stop request came to."""

    STOPPED = "stopped"  # a running turn was cancelled
    NOT_THE_ASKER = "not_the_asker"  # someone else clicked: ignored
    FINISHING = "finishing"  # the answer was complete: it is shown as it is
    ALREADY_STOPPING = "already_stopping"  # a repeated stop
    FINISHED = "finished"  # the turn had ended
    NOT_RUNNING = "not_running"  # no turn of this process in that thread


@dataclass(frozen=True)
class StopRequest:
    """An ``agent_session_stopped`` event, checked: the session's thread and who clicked."""

    channel: str
    thread_ts: str
    user: str
    clicked: tuple[int, int] | None = None  # the click's ``event_ts``, when Slack gave one


def _ts_order(ts: object) -> tuple[int, int] | None:
    """A Slack timestamp (``"1782234671.392669"``) as something to compare; ``None`` if it is not one."""
    match = _TS_RE.fullmatch(ts) if isinstance(ts, str) else None
    if match is None:
        return None
    return int(match[1]), int((match[2] or "").ljust(9, "0"))


def _is(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def stop_request(event: Any) -> StopRequest | None:
    """The stop an ``agent_session_stopped`` event asks for; ``None`` when it names no thread and person.

    Slack documents ``channel``, ``thread_ts`` and ``user`` as strings; anything
    else (missing, empty, another type, not an id or a timestamp) is not a stop
    to act on, nor written to the log.
    """
    if not isinstance(event, dict):
        return None
    channel, thread_ts, user = event.get("channel"), event.get("thread_ts"), event.get("user")
    if not (_is(_ID_RE, channel) and _is(_TS_RE, thread_ts) and _is(_ID_RE, user)):
        return None
    assert isinstance(channel, str) and isinstance(thread_ts, str) and isinstance(user, str)
    return StopRequest(channel, thread_ts, user, _ts_order(event.get("event_ts")))


@dataclass(eq=False)
class _Turn:
    task: asyncio.Future[Any]
    asker: str | None
    stoppable: Callable[[], bool]
    asked: tuple[int, int] | None = None  # the question's message ``ts``
    stopping: bool = False

    def asked_after(self, request: StopRequest) -> bool:
        """Whether the question was asked after the click: the click was for an earlier turn."""
        if self.asked is None or request.clicked is None:
            return False
        return self.asked > request.clicked


@dataclass
class Turns:
    """The turns running in this process, by ``(channel, thread_ts)``.

    Args:
        clock: monotonic seconds (tests pass their own).
        finished_ttl: how long an ended turn's thread is remembered.
    """

    clock: Callable[[], float] = time.monotonic
    finished_ttl: float = FINISHED_TTL_SECONDS
    _running: dict[tuple[str, str], list[_Turn]] = field(default_factory=dict)
    _finished: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)

    def running(self, channel: str, thread_ts: str) -> int:
        """How many turns are being answered in that thread."""
        return len(self._running.get((channel, thread_ts), []))

    async def run(
        self,
        channel: str,
        thread_ts: str,
        asker: str | None,
        work: Awaitable[T],
        *,
        stoppable: Callable[[], bool] = lambda: True,
        asked: str | None = None,
    ) -> T | None:
        """Run ``work`` as a turn of that thread; ``None`` when its asker stopped it.

        ``stoppable`` says whether a stop should still cancel it (false once its
        answer is complete); ``asked``: the question's message ``ts`` (a click
        made before it is not for this turn). A cancellation from outside (a
        shutdown) goes on as usual.
        """
        key = (channel, thread_ts)
        turn = _Turn(asyncio.ensure_future(work), asker, stoppable, _ts_order(asked))
        self._running.setdefault(key, []).append(turn)
        try:
            return await turn.task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if turn.stopping and not (current and current.cancelling()):
                return None
            raise
        finally:
            self._forget(key, turn)

    def stop(self, request: StopRequest) -> Stop:
        """Cancel the asker's turns in the request's thread at once; what it came to."""
        key = (request.channel, request.thread_ts)
        turns = self._running.get(key, [])
        if not turns:
            return self._not_running(key)
        mine = [t for t in turns if t.asker == request.user]
        if not mine:
            log.warning(
                "%s pressed Stop on a question someone else asked in %s: ignored",
                request.user,
                request.channel,
            )
            return Stop.NOT_THE_ASKER
        current = [t for t in mine if not t.asked_after(request)]
        if not current:
            log.info("stop in %s clicked before its question was asked: ignored", request.channel)
            return Stop.FINISHED
        outcome = Stop.ALREADY_STOPPING
        for turn in current:
            if turn.stopping or turn.task.done():
                continue
            if not turn.stoppable():
                outcome = Stop.FINISHING if outcome is Stop.ALREADY_STOPPING else outcome
                continue
            turn.stopping = True
            turn.task.cancel()
            outcome = Stop.STOPPED
        log.info("stop in %s by its asker: %s", request.channel, outcome.value)
        return outcome

    def _not_running(self, key: tuple[str, str]) -> Stop:
        self._expire()
        if key in self._finished:
            log.info("stop in %s after its answer was shown: nothing to stop", key[0])
            return Stop.FINISHED
        log.info("stop in %s for no question this process is answering", key[0])
        return Stop.NOT_RUNNING

    def _forget(self, key: tuple[str, str], turn: _Turn) -> None:
        turns = self._running.get(key, [])
        if turn in turns:
            turns.remove(turn)
        if not turns:
            self._running.pop(key, None)
        self._finished.pop(key, None)
        self._finished[key] = self.clock() + self.finished_ttl
        self._expire()

    def _expire(self) -> None:
        now = self.clock()
        while self._finished and (
            len(self._finished) > MAX_FINISHED or next(iter(self._finished.values())) <= now
        ):
            self._finished.popitem(last=False)
