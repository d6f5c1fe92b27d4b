"""One turn of a conversation, the same on every chat surface.

A surface (Slack today) turns its payload into a :class:`Turn` and hands a
:class:`Reply` that knows how to show things there; :class:`Conversation`
does the rest in the same order everywhere: help for an empty question, a
refusal of one longer than ``core.answer.MAX_QUESTION_CHARS`` (read by nothing), a
progress indicator, a word that the question waits when its asker has as many
being answered as one person may (``KB_MAX_QUESTIONS_PER_USER``), the thread's earlier messages as history (as the surface
has the thread, else as the query log has it), the steps of the work as the
engine reaches them (a surface may show them or not), the engine's
answer streamed at a bounded rate (by the conversation, or by a surface that
paces its own native stream), and the final answer in place of the
progress. A turn cancelled before its answer is complete (the asker pressed
Stop) is logged as stopped (by the engine once it has the question) and tells
the reply, which marks what it showed as stopped, and the cancellation goes
on; once the engine has its answer the turn finishes as it would have. A
second surface (Microsoft Teams, a web chat) is one new package that
implements ``Reply`` and builds ``Turn``; nothing here changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from core.answer import MAX_QUESTION_CHARS, Answer, Asker, Engine, Step
from core.outside import OutsideSearch
from core.prompt import ThreadMessage

log = logging.getLogger(__name__)

__all__ = ["STREAM_UPDATE_SECONDS", "Conversation", "Reply", "Thread", "Turn"]

# Chat platforms rate-limit message edits (Slack: about one per second per message).
STREAM_UPDATE_SECONDS = 1.0


class Reply(Protocol):
    """How one surface shows a turn's progress and result to the person who asked."""

    async def help(self) -> None:
        """The question was empty: say what the bot is for and how to ask."""

    async def too_long(self, length: int, limit: int) -> None:
        """The question is ``length`` characters long, over ``limit``: say so; nothing read it."""

    async def progress(self) -> None:
        """Show that the question is being worked on (kept until the first text or ``final``)."""

    async def waiting(self, per_asker: int) -> None:
        """The asker has ``per_asker`` questions being answered already: say this one waits
        for them (it starts as one of them ends)."""

    def paces_itself(self) -> bool:
        """Whether :meth:`partial` takes every piece and decides itself how often to show one.

        ``False``: the conversation hands it the answer at most once per interval.
        A surface that streams natively shows the first words at once and
        coalesces the rest by its own platform's limits.
        """

    async def partial(self, text: str) -> None:
        """Show the answer as written so far (citations not yet resolved)."""

    async def step(self, step: Step) -> None:
        """Show a step of the work (searching, what was found, writing); a surface may ignore it."""

    async def final(self, answer: Answer) -> None:
        """Replace the progress indicator with the engine's answer."""

    async def stopped(self) -> None:
        """The turn was stopped before its answer was complete: say so where the work was shown.

        What was shown stays; nothing else is shown for this turn afterwards.
        """


class Thread(Protocol):
    """The thread a question was asked in, as the chat platform has it."""

    async def earlier(self) -> list[ThreadMessage] | None:
        """Its messages before the question, oldest first; ``None`` when it cannot be read."""


@dataclass(frozen=True)
class Turn:
    """A question as every surface sees it.

    Attributes:
        question: the text, with any mention of the bot already removed.
        scopes: document scopes the place it was asked may see (``None``: all).
        asker: who asked, where, and in which thread.
        follow_up: asked inside an earlier thread; its earlier messages become history.
        thread: reads that thread on the platform, so that people's messages the
            bot did not answer count too; without it (or when it fails) the query
            log's questions and answers of the thread are the history.
        outside: a search of the platform itself as the asker, beside the
            knowledge base (``core.outside``); ``None``: none.
        read_alone: only the asker reads the answer (a direct message): what
            ``outside`` finds may be given to the model; else it never is.
    """

    question: str
    scopes: frozenset[str] | None
    asker: Asker
    follow_up: bool = False
    thread: Thread | None = None
    outside: OutsideSearch | None = None
    read_alone: bool = False


class Conversation:
    """Answers turns with one engine.

    Args:
        engine: the answer engine.
        stream_update_seconds: least time between two partial answers shown.
    """

    def __init__(
        self, engine: Engine, *, stream_update_seconds: float = STREAM_UPDATE_SECONDS
    ) -> None:
        self.engine = engine
        self.stream_update_seconds = stream_update_seconds

    async def answer(self, turn: Turn, reply: Reply) -> Answer | None:
        """Answer ``turn`` through ``reply``; ``None`` when there was no question to answer."""
        if not turn.question:
            await reply.help()
            return None
        if len(turn.question) > MAX_QUESTION_CHARS:
            log.info(
                "a question of %d characters refused (at most %d)",
                len(turn.question),
                MAX_QUESTION_CHARS,
            )
            await reply.too_long(len(turn.question), MAX_QUESTION_CHARS)
            return None
        asked = False  # the engine logs a turn stopped once it has it
        try:
            await reply.progress()
            history = await self._history(turn)
            show = (
                reply.partial
                if reply.paces_itself()
                else _throttled(reply.partial, self.stream_update_seconds)
            )
            asked = True
            answer = await self.engine.ask(
                turn.question,
                scopes=turn.scopes,
                history=history,
                asker=turn.asker,
                on_delta=show,
                on_step=reply.step,
                outside=turn.outside,
                quote_outside=turn.read_alone,
                on_wait=reply.waiting,
            )
        except asyncio.CancelledError:
            if not asked:
                await self.engine.stopped(turn.question, scopes=turn.scopes, asker=turn.asker)
            await reply.stopped()
            raise
        await reply.final(answer)
        return answer

    async def _history(self, turn: Turn) -> list[ThreadMessage]:
        asker = turn.asker
        if not turn.follow_up:
            return []
        if turn.thread is not None:
            earlier = await turn.thread.earlier()
            if earlier is not None:
                return earlier
        if not (asker.channel and asker.thread_id):
            return []
        return await asyncio.to_thread(self.engine.thread_history, asker.channel, asker.thread_id)


def _throttled(
    show: Callable[[str], Awaitable[None]], interval: float
) -> Callable[[str], Awaitable[None]]:
    """``show``, called at most once per ``interval`` seconds; calls in between are dropped.

    Each call carries the whole text so far, so a dropped one loses nothing
    the next one (or the final answer) does not show.
    """
    last = time.monotonic()

    async def maybe_show(text: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < interval:
            return
        last = now
        await show(text)

    return maybe_show
