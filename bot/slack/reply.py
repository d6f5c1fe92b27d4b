"""A conversation turn shown in a Slack thread: a sign of work, then the answer as it is written.

Implements ``bot.conversation.Reply``. The first sign of work is the turn's
**agent session** set ``processing`` (``agents.sessions.setStatus``: Slack
shows that the app is working, with a Stop button); Slack takes sessions from
apps declared as agents, in DMs and channel threads alike. Where Slack refuses
them (not an agent app, no such method, a missing scope or token type), the
thread's status stands in ("is searching the knowledge base…",
``assistant.threads.setStatus``, cleared by Slack when the bot posts; Slack
removes it in February 2027, with ``features.assistant_view``); where Slack
refuses that too, a placeholder message. Each refusal is remembered by the
process (:class:`Refusals`), so a removed method is not asked on every turn.
Nothing is posted before the answer has text. The bot calls no
``assistant.threads.setTitle``: a session's title is its question
(``agents.sessions.setStatus``'s ``title``, ``agents.sessions.rename``).

The answer then appears as the model writes it, in one of two ways:

* native streaming (``KB_SLACK_STREAMING=auto``, the default): the first text
  starts a stream (``chat.startStream``), later text is appended
  (``chat.appendStream``), each time only what is new. The streamed text is
  Markdown made inert (``render.stream_markdown``: no mention, no link, citation
  numbers plain) and is cut before the word being written, so what was sent
  never changes; text the model rewrote (no longer extending what was sent) is
  not appended, the final answer corrects it. The stream paces itself: it
  gets every piece the model writes, starts once the model has been writing
  for 0.2 s (``FIRST_TEXT_SECONDS``: an answer written in one go is posted
  whole), appends at most every half second (``APPEND_SECONDS``), and all of this
  process's streams share a budget below Slack's ``appendStream`` limit (Tier
  4, about 100 a minute per workspace); an append not yet due or over budget
  is skipped, the next one carries its text. Streams themselves share a budget
  of 20 a minute (each ends with a ``chat.stopStream``, Tier 2): past it an
  answer takes the fallback.
* the fallback: the first text is posted, edited as it grows (``chat.update``,
  about once a second), and replaced by the rendered answer.

The final answer is always the message ``render_answer`` renders (links that
resolve the citations, the sources, the feedback buttons and whatever else the
render adds). ``chat.stopStream`` can only add blocks *below* the streamed
text, which would leave the unresolved copy above the rendered one; so a
stream is stopped bare and its message replaced with ``chat.update``, as the
fallback's message is. An answer that came in one piece (refusals, related
passages, the evidence when the model is down) is posted at once.

Streaming falls back to the edits for the rest of the turn when Slack refuses
it: a failed ``startStream`` means nothing was shown yet; a stream failing
midway (an append refused, or not accepted within ``APPEND_TIMEOUT_SECONDS``)
is stopped and its message carries on as the fallback's. What Slack
said is remembered for this process (:class:`Streaming`): a workspace or app
without streaming is not asked again for an hour, a rate limit or a timeout
for half a minute.

Slack failing to show progress never costs the answer: a placeholder, stream or
edit that failed (deleted, rate-limited past the retries, Slack down for a
moment) is skipped, and the answer is posted as a new message in the thread,
the half-written one deleted.

In an agent session the question titles the session (at most
``SESSION_TITLE_CHARS``; ``agents.sessions.rename`` corrects the title of a
session Slack already had for a new question), and the session **always ends
``active``**, whatever happens to the turn: ``session_status`` of the
answer's ``chat.stopStream``, or ``agents.sessions.setStatus`` (an answer not
streamed, a stream Slack would not stop, a Stop, a failure anywhere in the
turn: :meth:`SlackReply.end_session`). Slack leaves a session ``processing``
until told; a stream given up midway keeps it ``processing`` (and its Stop)
until the answer is shown. In a session the answer's stream starts at once,
with the steps of the work as task cards (``bot.slack.blocks.steps``):
searching, what was found (the documents, linked), writing; the text follows
in the same message. A Stop (``bot.slack.sessions``) cancels the turn;
:meth:`SlackReply.stopped` then ends the stream and leaves what was shown,
marked as stopped, and posts nothing more. Where Slack refuses the steps'
chunks, that is remembered like a refused stream and the turn goes on without
them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import RATE_LIMITED
from bot.conversation import STREAM_UPDATE_SECONDS
from bot.slack.blocks import (
    STEP_DISPLAY_MODE,
    Rendered,
    render_answer,
    render_from_slack,
    render_notice,
    render_partial,
    render_stopped,
    step_chunks,
    stream_markdown,
)
from bot.slack.words import Words
from core.answer import Answer, Step, StepKind
from index.names import display_name

log = logging.getLogger(__name__)

__all__ = [
    "REPLY_KEY",
    "SESSION_TITLE_CHARS",
    "SLACK_FAILURES",
    "STREAM_TEXT_LIMIT",
    "Refusals",
    "SlackReply",
    "Streaming",
    "set_session_active",
    "settled_text",
    "slack_failure",
    "stop_stream",
]

# A sign of work (a session's status, the thread's) Slack has not taken by then is given up:
# the answer must not wait for it.
STATUS_TIMEOUT_SECONDS = 3.0
# agents.sessions.setStatus and .rename take a title of 1 to 200 characters.
SESSION_TITLE_CHARS = 200
REPLY_KEY = "kb_reply"  # bolt context key: where a failing listener should report
# What a Web API call raises once its retries are spent: Slack's refusal, or no answer at all.
SLACK_FAILURES = (SlackApiError, aiohttp.ClientError, TimeoutError)

# Slack takes at most 12,000 characters of markdown_text per call; the streamed copy
# stops growing there (the final answer shows everything).
STREAM_TEXT_LIMIT = 12_000
# A stream takes every piece the model writes and shows new words at most this often;
# the edits of the fallback keep the conversation's pace (about one a second).
APPEND_SECONDS = 0.5
# A stream starts once the model has been writing this long: an answer it wrote in one
# go (a cache, a stub, a very short reply) is posted whole, a stream would only add calls.
FIRST_TEXT_SECONDS = 0.2
# An append Slack has not accepted by then is given up: the stream is stopped and edited.
# (A start is left to the client's own timeout: given up, it could leave a stream behind.)
APPEND_TIMEOUT_SECONDS = 5.0
EDIT_SECONDS = STREAM_UPDATE_SECONDS
# appendStream is Tier 4 (100+ a minute per workspace): a bucket a little below that,
# shared by every stream of the process, with room for a burst of answers starting.
APPENDS_PER_MINUTE = 90
APPEND_BURST = 20
# Every stream costs one chat.stopStream, which is Tier 2 (20+ a minute per workspace):
# past this budget an answer is posted and edited instead of streamed.
STREAMS_PER_MINUTE = 20
STREAM_BURST = 20
# A stop held up by a rate limit must not hold the answer back: it is replaced or posted.
STOP_TIMEOUT_SECONDS = 3.0
# A stream Slack would not stop can be neither edited nor deleted: the answer is posted
# anew, and the stream stopped and deleted this much later (Slack is reported to end a
# stream idle for about 30 s by itself).
CLEANUP_SECONDS = 35.0
# How long streaming stays off after Slack refused it: for good (no such method, scope
# or surface: until someone changes the app), or for a moment (rate limits, timeouts).
UNSUPPORTED_SECONDS = 3600.0
TRANSIENT_SECONDS = 30.0
_UNSUPPORTED = frozenset(
    {
        "unknown_method",
        "method_deprecated",
        "deprecated_endpoint",
        "not_allowed",
        "not_allowed_token_type",
        "missing_scope",
        "access_denied",
        "channel_type_not_supported",
        "messages_tab_disabled",
        "enterprise_is_restricted",
        "missing_recipient_user_id",
        "missing_recipient_team_id",
    }
)
_TRANSIENT = RATE_LIMITED | frozenset(
    {
        "fatal_error",
        "internal_error",
        "service_unavailable",
        "request_timeout",
        "team_added_to_org",
    }
)
# Refusals about one conversation or message only (archived, bot not a member...): they
# say nothing about whether Slack has the feature, even when any other refusal would.
_ABOUT_ONE_CONVERSATION = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_thread_ts",
        "thread_not_found",
        "message_not_found",
        "user_not_in_channel",
    }
)
_LAST_WORD_RE = re.compile(r"\S+\s*$")


def slack_failure(exc: BaseException) -> str:
    """A short description of a failed Web API call for the log (Slack's error code when it gave one)."""
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or exc.response.status_code)
    return type(exc).__name__


async def stop_stream(
    client: AsyncWebClient,
    channel: str,
    ts: str,
    *,
    session_status: str | None = None,
    chunks: list[Any] | None = None,
) -> bool:
    """Stop the stream of message ``ts`` so that it can be edited; failures are only logged.

    Already stopped (Slack ends streams after a few minutes, and at a Stop),
    unreachable, or rate-limited past ``STOP_TIMEOUT_SECONDS``: the edit that
    follows, or a new message, still shows what it must. ``session_status``:
    the agent session's status from then on (``None``: no session, or leave it);
    ``chunks``: the last ones to show (a step held back for a call of the stream).
    """
    try:
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            await client.chat_stopStream(
                channel=channel, ts=ts, session_status=session_status, chunks=chunks
            )
        return True
    except SLACK_FAILURES as exc:
        log.info("could not stop the stream in %s: %s", channel, slack_failure(exc))
        return False


async def _stop_and_delete(client: AsyncWebClient, channel: str, ts: str, delay: float) -> None:
    """Later: stop the stream of message ``ts`` and delete it (its answer was posted anew)."""
    await asyncio.sleep(delay)
    await stop_stream(client, channel, ts)
    try:
        await client.chat_delete(channel=channel, ts=ts)
    except SLACK_FAILURES as exc:
        log.warning("a half-written answer stays in %s: %s", channel, slack_failure(exc))


def session_title(question: str) -> str:
    """An agent session's title for ``question``: one line, at most ``SESSION_TITLE_CHARS``."""
    return display_name(question, SESSION_TITLE_CHARS)


# Agent session statuses (agents.sessions.setStatus): working, with Slack's Stop
# button; and done for now, waiting for the person.
SESSION_PROCESSING = "processing"
SESSION_ACTIVE = "active"


async def set_session_active(
    client: AsyncWebClient,
    channel: str,
    thread_ts: str,
    *,
    timeout: float = STATUS_TIMEOUT_SECONDS,
) -> bool:
    """Set the agent session of ``thread_ts`` ``active`` (``agents.sessions.setStatus``).

    Slack leaves a session ``processing`` (its Stop button shown) until the app
    says otherwise. A failure is only logged: ``False``.
    """
    try:
        async with asyncio.timeout(timeout):
            await client.agents_sessions_setStatus(
                channel_id=channel, thread_ts=thread_ts, status=SESSION_ACTIVE
            )
        return True
    except SLACK_FAILURES as exc:
        log.warning("the agent session in %s stays processing: %s", channel, slack_failure(exc))
        return False


# Clean-ups running in the background, referenced until they end.
_CLEANUPS: set[asyncio.Task[None]] = set()


def settled_text(text: str) -> str:
    """``text`` up to the word being written: what the model will not change by adding to it."""
    last = _LAST_WORD_RE.search(text)
    return text[: last.start()] if last else ""


class Refusals:
    """What Slack refused of one feature, remembered per kind of conversation (DMs, channels).

    Off for an hour when the feature is missing (no such method, scope or
    surface: until someone changes the app), for half a minute after a rate
    limit, a timeout or a failure of Slack's own; an error about one channel
    or message only changes nothing.

    Args:
        feature: what is remembered, for the log ("streaming", "agent sessions").
        clock: seconds, monotonic.
    """

    def __init__(self, feature: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.feature = feature
        self._clock = clock
        self._off_until: dict[str, float] = {}

    def available(self, channel: str) -> bool:
        """Whether to try the feature in ``channel``."""
        return self._clock() >= self._off_until.get(_kind(channel), 0.0)

    def refused(self, channel: str, exc: BaseException, *, for_good: bool = False) -> None:
        """Remember a failed call; ``for_good``: any refusal Slack gave means the feature is missing."""
        error = slack_failure(exc)
        if error in _UNSUPPORTED:
            pause = UNSUPPORTED_SECONDS
        elif error in _TRANSIENT or not isinstance(exc, SlackApiError) or _server_error(exc):
            pause = TRANSIENT_SECONDS
        elif for_good and error not in _ABOUT_ONE_CONVERSATION:
            pause = UNSUPPORTED_SECONDS
        else:
            return  # about this channel or message only (archived, not in channel...)
        self._off_until[_kind(channel)] = self._clock() + pause
        log.info("%s off for %.0f s in %s channels: %s", self.feature, pause, _kind(channel), error)


class Streaming:
    """Whether this process streams answers natively: the setting and what Slack said.

    Also what Slack said about agent sessions (:attr:`sessions`), the thread's
    status (:attr:`statuses`) and the steps' chunks (:attr:`steps`), which the
    same replies use.

    Args:
        enabled: ``KB_SLACK_STREAMING`` is ``auto``.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, enabled: bool = True, *, clock: Callable[[], float] = time.monotonic):
        self.enabled = enabled
        self.append_seconds = APPEND_SECONDS
        """Least time between two appends of one stream."""
        self.first_text_seconds = FIRST_TEXT_SECONDS
        """How long the model must have been writing before a stream starts."""
        self.append_timeout = APPEND_TIMEOUT_SECONDS
        """Seconds an append may take before the stream is given up."""
        self.cleanup_seconds = CLEANUP_SECONDS
        """When a stream that would not stop is stopped and deleted again."""
        self.status_timeout = STATUS_TIMEOUT_SECONDS
        """Seconds a session's or the thread's status may take before the turn goes on."""
        self.sessions = Refusals("agent sessions", clock)
        """Whether Slack takes agent sessions (an agent app's; sessions need no streaming)."""
        self.statuses = Refusals("the thread status (assistant.threads.setStatus)", clock)
        """Whether Slack takes the thread's status, the fallback where it refuses sessions."""
        self.steps = Refusals("steps", clock)
        """Whether Slack takes the steps' task chunks in a stream."""
        self._streams = Refusals("streaming", clock)
        self._appends = _Budget(APPEND_BURST, APPENDS_PER_MINUTE, clock)
        self._starts = _Budget(STREAM_BURST, STREAMS_PER_MINUTE, clock)

    def available(self, channel: str) -> bool:
        """Whether to try a stream in ``channel`` (DMs and channels are remembered apart)."""
        return self.enabled and self._streams.available(channel)

    def refused(self, channel: str, exc: BaseException) -> None:
        """Remember a failed streaming call: off for an hour, half a minute, or not at all."""
        self._streams.refused(channel, exc)

    def take_append(self) -> bool:
        """Spend one append of the shared budget; ``False`` when it is spent for now."""
        return self._appends.take()

    def take_start(self) -> bool:
        """Spend one stream of the shared budget; ``False``: post and edit this answer instead."""
        return self._starts.take()


class _Budget:
    """A token bucket: ``burst`` calls at once, then ``per_minute`` calls a minute."""

    def __init__(self, burst: int, per_minute: float, clock: Callable[[], float]) -> None:
        self._burst = float(burst)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._tokens = float(burst)
        self._refilled = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def _kind(channel: str) -> str:
    return "DM" if channel.startswith("D") else "channel"


def _server_error(exc: SlackApiError) -> bool:
    status = getattr(exc.response, "status_code", 200)
    return isinstance(status, int) and status >= 500


class SlackReply:
    """Shows one turn in ``thread_ts`` of ``channel``.

    Args:
        client: the Web API client.
        context: the listener's bolt context; told where the answer is being
            shown, so the error handler can replace it if anything fails afterwards.
        words: the asker's language (``bot.slack.words``).
        channel: where the question was asked.
        thread_ts: the thread the reply goes in.
        note: server-written mrkdwn shown above the answer.
        streaming: this process's streaming state; ``None``: never stream.
        recipient_user_id, recipient_team_id: who asked, and their team; Slack
            needs both to stream in a channel.
        ask_a_person: the answer gets the "Ask a person" button (``KB_ESCALATION_CHANNEL``).
        title: the question, to title the agent session with; ``None``: no session.
        follow_up: asked in a thread that may have a session already (its title stays).
        read_alone: the asker alone reads the thread (a DM): the "From Slack" group
            goes in the answer; elsewhere it goes to the asker alone, in a message
            only they see (``chat.postEphemeral``), or nowhere.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        context: AsyncBoltContext,
        *,
        words: Words,
        channel: str,
        thread_ts: str,
        note: str | None = None,
        streaming: Streaming | None = None,
        recipient_user_id: str | None = None,
        recipient_team_id: str | None = None,
        ask_a_person: bool = False,
        title: str | None = None,
        follow_up: bool = False,
        read_alone: bool = False,
    ) -> None:
        self.client = client
        self.read_alone = read_alone
        self.context = context
        self.words = words
        self.channel = channel
        self.thread_ts = thread_ts
        self.note = note
        self.ask_a_person = ask_a_person
        self.ts: str | None = None
        self.streaming = streaming
        self.recipient_user_id = recipient_user_id
        self.recipient_team_id = recipient_team_id
        self.stream_ts: str | None = None  # the message being streamed, until it is stopped
        self._streamed = ""  # the Markdown sent so far
        self._stream_failed = False
        self._rewritten = False
        self._paced = False  # partial() gets every piece: it keeps the pace itself
        self._writing_since: float | None = None  # the model's first piece
        self._unstopped = False  # a stream Slack would not stop
        self._last_shown = -float("inf")
        self.title = session_title(title) if title else ""
        self.follow_up = follow_up
        self._session = False  # an agent session of this turn is processing
        self._steps = True  # the steps may still be shown (no refusal in this turn)
        self._finishing = False  # the answer is complete: a Stop no longer stops it
        self._shown_text = ""  # the answer's text as shown so far (before escaping)
        self._held: list[Any] = []  # a step's chunks waiting for the next call of the stream
        # A call creating this turn's message (a stream, a post) that a Stop interrupted, the
        # text it shows, and whether it is a stream: Slack may create it all the same, and
        # that message is the one to mark stopped.
        self._interrupted: tuple[asyncio.Future[Any], str, bool] | None = None

    async def help(self) -> None:
        """Post how to ask, in the thread."""
        notice = render_notice(self.words.EMPTY_QUESTION)
        await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **notice.as_kwargs()
        )

    async def too_long(self, length: int, limit: int) -> None:
        """Post, in the thread, that the question is over the length read and what to do."""
        notice = render_notice(self.words.too_long(length, limit))
        await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **notice.as_kwargs()
        )

    async def progress(self) -> None:
        """Show at once that the question is being worked on: the agent session set
        ``processing`` where Slack takes sessions, else the thread's status, else a placeholder."""
        if await self._open_session():
            return
        if await self._set_status():
            return
        try:
            await self._post(render_notice(self.words.PLACEHOLDER))
        except SLACK_FAILURES as exc:
            # The answer is worth computing all the same: final() posts it.
            log.warning(
                "could not post the placeholder in %s: %s", self.channel, slack_failure(exc)
            )

    async def waiting(self, per_asker: int) -> None:
        """Post, in the thread, that the question waits for the asker's own earlier ones.

        Slack refusing it is logged: the question is answered in its turn all the same.
        """
        notice = render_notice(self.words.question_waiting_for_yours(per_asker))
        try:
            await self.client.chat_postMessage(
                channel=self.channel, thread_ts=self.thread_ts, **notice.as_kwargs()
            )
        except SLACK_FAILURES as exc:
            log.info(
                "could not say in %s that a question waits: %s", self.channel, slack_failure(exc)
            )

    async def _set_status(self) -> bool:
        """The thread's status (``assistant.threads.setStatus``); ``False`` where Slack refuses it.

        Only where Slack refuses agent sessions: this method is their
        predecessor, which Slack removes in February 2027. A refusal (a removed
        method answers ``unknown_method``) is remembered like a refused session.
        """
        statuses = self.streaming.statuses if self.streaming else None
        if statuses is not None and not statuses.available(self.channel):
            return False
        try:
            # A slow status must not hold the answer back: the placeholder then does its job.
            async with asyncio.timeout(self._status_timeout()):
                await self.client.assistant_threads_setStatus(
                    channel_id=self.channel,
                    thread_ts=self.thread_ts,
                    status=self.words.STATUS_SEARCHING,
                )
            return True
        except SLACK_FAILURES as exc:
            log.info(
                "no thread status in %s (%s): posting a placeholder",
                self.channel,
                slack_failure(exc),
            )
            if statuses is not None:
                statuses.refused(self.channel, exc, for_good=True)
            return False

    def paces_itself(self) -> bool:
        """Whether this turn streams natively: :meth:`partial` then gets every piece.

        Its first words are shown as soon as there are any, later ones at most
        every ``append_seconds``; if the stream fails, edits keep the usual pace.
        """
        self._paced = self._streams()
        return self._paced

    async def partial(self, text: str) -> None:
        """Show the answer so far: streamed, or posted the first time (ending the status), then edited."""
        if self._streams() and await self._stream(text):
            return
        if self._paced and not self._due(EDIT_SECONDS):
            return
        self._last_shown = time.monotonic()
        rendered = render_partial(text, words=self.words)
        try:
            await self._show(rendered, text)
            self._shown_text = text
        except SLACK_FAILURES as exc:
            # A lost progress update must not lose the answer that follows it.
            log.warning("progress update failed: %s", slack_failure(exc))

    async def final(self, answer: Answer) -> None:
        """Replace the answer so far (or the placeholder) with the rendered answer, or post it."""
        rendered = render_answer(
            answer,
            words=self.words,
            note=self.note,
            ask_a_person=self.ask_a_person,
            from_slack=self.read_alone,
        )
        self._finishing = True
        await self._end_stream()
        try:
            await self._show_final(rendered)
            if not self.read_alone:
                await self._from_slack_to_asker(answer)
        finally:
            await self.end_session()

    async def _from_slack_to_asker(self, answer: Answer) -> None:
        """The "From Slack" group, in a message only the asker sees; not shown when that fails.

        Slack's messages were searched as the asker and may be theirs alone (their
        DMs): where others read the thread, they go nowhere but to the asker.
        """
        group = render_from_slack(answer.outside, self.words)
        if group is None or not self.recipient_user_id:
            return
        try:
            await self.client.chat_postEphemeral(
                channel=self.channel,
                user=self.recipient_user_id,
                thread_ts=self.thread_ts,
                **group.as_kwargs(),
            )
        except SLACK_FAILURES as exc:
            log.warning(
                "the From Slack group was not shown in %s: %s", self.channel, slack_failure(exc)
            )

    async def _show_final(self, rendered: Rendered) -> None:
        placeholder = self.ts
        if placeholder is not None:
            try:
                await self.client.chat_update(
                    channel=self.channel, ts=placeholder, **rendered.as_kwargs()
                )
                return
            except SLACK_FAILURES as exc:
                log.warning(
                    "could not replace the placeholder with the answer (%s); posting it instead",
                    slack_failure(exc),
                )
        await self._post(rendered)
        if placeholder is not None:
            # Best effort: a "Searching…" or a half-written answer left above it would look unfinished.
            try:
                await self.client.chat_delete(channel=self.channel, ts=placeholder)
            except SLACK_FAILURES:
                if self._unstopped:
                    self._clean_up_later(placeholder)

    def stoppable(self) -> bool:
        """Whether a Stop still stops this turn: not once its answer is complete."""
        return not self._finishing

    async def step(self, step: Step) -> None:
        """Show a step of the work as a task card in the answer's stream (agent sessions only).

        The first step starts the stream. What the search found is held and
        goes with the next step, writing, in one append (the appends are a budget
        the answer's words share), or with the stream's stop when no model writes
        (a refusal). Where Slack refuses the chunks the steps stop for this turn
        (and are not tried again for a while); the status, then the text, show
        the progress as without them.
        """
        if step.kind is StepKind.DONE:
            self._finishing = True
            return
        if not self._shows_steps():
            return
        assert self.streaming is not None
        ts = self.stream_ts
        chunks = step_chunks(step, words=self.words, first=ts is None)
        if not chunks:
            return
        if ts is None:
            await self._start_steps(chunks)
            return
        if step.kind is not StepKind.WRITING:
            self._held = chunks
            return
        chunks, self._held = [*self._held, *chunks], []
        if not self.streaming.take_append():
            return  # over the shared budget: a step is not worth an answer's appends
        try:
            async with asyncio.timeout(self.streaming.append_timeout):
                await self.client.chat_appendStream(channel=self.channel, ts=ts, chunks=chunks)
        except SLACK_FAILURES as exc:
            log.warning("showing a step failed (%s): editing the answer", slack_failure(exc))
            self.streaming.steps.refused(self.channel, exc, for_good=True)
            self._steps = False
            await self._abandon_stream()

    def _shows_steps(self) -> bool:
        """Whether this turn shows its steps: in an agent session that streams, until refused."""
        return (
            self._session
            and self._steps
            and self.streaming is not None
            and self.streaming.steps.available(self.channel)
            and self._streams()
        )

    async def _start_steps(self, chunks: list[Any]) -> None:
        """Start the answer's stream with its first step; refused, the status stays."""
        assert self.streaming is not None
        if not self.streaming.take_start():
            self._steps = False
            return  # over the streams' budget: the text will post and edit
        try:
            started = await self._creating(
                "",
                channel=self.channel,
                thread_ts=self.thread_ts,
                chunks=chunks,
                task_display_mode=STEP_DISPLAY_MODE,
                recipient_user_id=self.recipient_user_id or None,
                recipient_team_id=self.recipient_team_id or None,
            )
        except SLACK_FAILURES as exc:
            log.info(
                "no steps in %s (%s): the status shows the progress",
                self.channel,
                slack_failure(exc),
            )
            self.streaming.steps.refused(self.channel, exc, for_good=True)
            self._steps = False
            return
        self._started(str(started["ts"]))

    async def stopped(self) -> None:
        """The asker pressed Stop: what was shown stays, marked as stopped; nothing more is posted.

        The stream (if any) is stopped first (Slack may have stopped it at the
        click already), its message or the one being edited then shows the text
        it had with "Stopped."; with nothing shown yet, "Stopped." is posted in
        the thread, as Slack asks an agent to confirm a stop. The session goes
        back to ``active``.
        """
        self._finishing = True
        await self._created_meanwhile()
        await self._end_stream()
        try:
            await self._show(render_stopped(self._shown_text, words=self.words))
        except SLACK_FAILURES as exc:
            log.warning(
                "could not mark the stopped answer in %s: %s", self.channel, slack_failure(exc)
            )
        finally:
            await self.end_session()

    async def _open_session(self) -> bool:
        """Set this turn's agent session ``processing`` (Slack shows Stop), titled with the
        question; ``False`` when Slack did not take it (the thread's status then stands in)."""
        if not (self.title and self.streaming and self.streaming.sessions.available(self.channel)):
            return False
        # From the request on: Slack may show Stop before it answers, and a Stop
        # then must still set the session active again.
        self._session = True
        try:
            async with asyncio.timeout(self.streaming.status_timeout):
                opened = await self.client.agents_sessions_setStatus(
                    channel_id=self.channel,
                    thread_ts=self.thread_ts,
                    status=SESSION_PROCESSING,
                    title=self.title,
                    initiator_user_id=self.recipient_user_id or None,
                )
        except SLACK_FAILURES as exc:
            log.info("no agent session in %s (%s)", self.channel, slack_failure(exc))
            # Any refusal but one about this thread means no sessions here (an app not
            # declared an agent, a method Slack does not have): the status stands in.
            self.streaming.sessions.refused(self.channel, exc, for_good=True)
            # Refused, there is no session; not answered in time, Slack may have set it
            # processing all the same, and the turn's end sets it active.
            self._session = not isinstance(exc, SlackApiError)
            return False
        if "missing_agent_session_stopped_event_subscription" in str(opened.get("warning", "")):
            log.warning(
                "Slack shows no Stop button: subscribe the app to the agent_session_stopped "
                "event (docs/stop-and-steps.md)"
            )
        titled = opened.get("title")
        if not self.follow_up and isinstance(titled, str) and titled and titled != self.title:
            await self._rename_session()
        return True

    async def _rename_session(self) -> None:
        """Retitle a session Slack had for this thread already with this new question."""
        try:
            async with asyncio.timeout(self._status_timeout()):
                await self.client.agents_sessions_rename(
                    channel_id=self.channel, thread_ts=self.thread_ts, title=self.title
                )
        except SLACK_FAILURES as exc:
            log.info(
                "the agent session in %s keeps its title: %s", self.channel, slack_failure(exc)
            )

    async def end_session(self) -> None:
        """Set the session ``active`` again, unless that was done (the answer shown, the stream's stop).

        Called at the end of every turn, however it ended (the answer shown, a
        Stop, an exception anywhere in it).
        """
        if not self._session:
            return
        self._session = False
        await set_session_active(
            self.client, self.channel, self.thread_ts, timeout=self._status_timeout()
        )

    def _status_timeout(self) -> float:
        return self.streaming.status_timeout if self.streaming else STATUS_TIMEOUT_SECONDS

    def _clean_up_later(self, ts: str) -> None:
        delay = self.streaming.cleanup_seconds if self.streaming else CLEANUP_SECONDS
        task = asyncio.create_task(_stop_and_delete(self.client, self.channel, ts, delay))
        _CLEANUPS.add(task)
        task.add_done_callback(_CLEANUPS.discard)

    # ------------------------------------------------------------ streaming

    def _streams(self) -> bool:
        """Whether this turn shows its text as a native stream."""
        if self.stream_ts is not None:
            return True
        # A placeholder already shows the progress: it is edited, not joined by a stream.
        return (
            self.streaming is not None
            and self.ts is None
            and not self._stream_failed
            and self.streaming.available(self.channel)
        )

    def _due(self, interval: float) -> bool:
        return time.monotonic() - self._last_shown >= interval

    async def _stream(self, text: str) -> bool:
        """Stream what is new in ``text``; ``False`` when streaming failed and the edits take over."""
        assert self.streaming is not None
        if self.stream_ts is None:
            now = time.monotonic()
            self._writing_since = self._writing_since or now
            if now - self._writing_since < self.streaming.first_text_seconds:
                return True  # the status stays; an answer written at once is posted whole
        elif not self._due(self.streaming.append_seconds):
            return True  # coalesced: the next append carries this text too
        markdown = stream_markdown(settled_text(text))
        if self.stream_ts is None:
            started = await self._start_stream(markdown, settled_text(text))
            if self.stream_ts is not None:
                self._shown_text = settled_text(text)
            return started
        if not markdown.startswith(self._streamed):
            if not self._rewritten:
                log.debug("the model rewrote streamed text; the final answer replaces it")
            self._rewritten = True
        new = markdown[len(self._streamed) :]
        if self._rewritten or not new or len(markdown) > STREAM_TEXT_LIMIT:
            return True
        if not self.streaming.take_append():
            return True  # over the shared budget: the next append carries this text too
        self._last_shown = time.monotonic()
        try:
            async with asyncio.timeout(self.streaming.append_timeout):
                await self.client.chat_appendStream(
                    channel=self.channel, ts=self.stream_ts, markdown_text=new
                )
        except SLACK_FAILURES as exc:
            log.warning("streaming the answer failed midway (%s): editing it", slack_failure(exc))
            self.streaming.refused(self.channel, exc)
            await self._abandon_stream()
            return False
        self._streamed = markdown
        self._shown_text = settled_text(text)
        return True

    async def _start_stream(self, markdown: str, shown: str) -> bool:
        if not markdown.strip():
            return True  # no whole word yet: the status stays
        assert self.streaming is not None
        if not self.streaming.take_start():
            log.info("streams over budget: posting and editing the answer in %s", self.channel)
            self._stream_failed = True
            return False
        try:
            started = await self._creating(
                shown,
                channel=self.channel,
                thread_ts=self.thread_ts,
                markdown_text=markdown[:STREAM_TEXT_LIMIT],
                # Required in channels; the SDK leaves out what is None.
                recipient_user_id=self.recipient_user_id or None,
                recipient_team_id=self.recipient_team_id or None,
            )
        except SLACK_FAILURES as exc:
            log.info(
                "no native streaming in %s (%s): editing instead", self.channel, slack_failure(exc)
            )
            self.streaming.refused(self.channel, exc)
            self._stream_failed = True
            return False
        self._started(str(started["ts"]))
        self._last_shown = time.monotonic()
        self._streamed = markdown[:STREAM_TEXT_LIMIT]
        return True

    async def _creating(self, shown: str, *, stream: bool = True, **kwargs: Any) -> Any:
        """``chat.startStream`` (or ``chat.postMessage``); a Stop meanwhile leaves the call to
        :meth:`stopped` to finish.

        Only this turn's wait is cancelled, not the request: a message Slack
        creates after the click is then marked stopped like any other, not left
        behind (a stream still writing) above a second one. ``shown``: the text
        the message starts with.
        """
        method = self.client.chat_startStream if stream else self.client.chat_postMessage
        call = asyncio.ensure_future(method(**kwargs))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            self._interrupted = (call, shown, stream)
            raise

    async def _created_meanwhile(self) -> None:
        """Take on the message whose creation a Stop interrupted, once Slack has answered."""
        if self._interrupted is None:
            return
        (call, shown, stream), self._interrupted = self._interrupted, None
        try:
            async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
                created = await call
        except SLACK_FAILURES:
            return  # no message: "Stopped." is posted
        if stream:
            self._started(str(created["ts"]))
        else:
            self._posted(str(created["ts"]))
        self._shown_text = shown

    def _started(self, ts: str) -> None:
        self.stream_ts = ts
        self.context[REPLY_KEY] = {"channel": self.channel, "ts": ts, "stream": True}

    async def _abandon_stream(self) -> None:
        """Stop a stream that failed; its message goes on as the fallback's."""
        self._stream_failed = True
        await self._end_stream()

    async def _end_stream(self) -> None:
        """Stop the stream, if any: its message is then edited like any other."""
        if self.stream_ts is None:
            return
        ts, self.stream_ts = self.stream_ts, None
        self.ts = ts
        self.context[REPLY_KEY] = {"channel": self.channel, "ts": ts}
        # The stop says what the session is from then on: active once the answer is
        # complete; a stream given up midway leaves it processing, with its Stop button.
        status = None
        if self._session:
            status = SESSION_ACTIVE if self._finishing else SESSION_PROCESSING
        chunks, self._held = self._held, []
        self._unstopped = not await stop_stream(
            self.client, self.channel, ts, session_status=status, chunks=chunks or None
        )
        if status == SESSION_ACTIVE and not self._unstopped:
            self._session = False  # the stop ended the session's processing

    async def _show(self, rendered: Rendered, shown: str = "") -> None:
        """Post ``rendered`` in the thread, or edit the message shown so far into it."""
        if self.ts is None:
            await self._post(rendered, shown)
        else:
            await self.client.chat_update(channel=self.channel, ts=self.ts, **rendered.as_kwargs())

    async def _post(self, rendered: Rendered, shown: str = "") -> None:
        """Post in the thread (``shown``: the answer's text it shows); the error handler then
        reports failures on this message."""
        posted = await self._creating(
            shown,
            stream=False,
            channel=self.channel,
            thread_ts=self.thread_ts,
            **rendered.as_kwargs(),
        )
        self._posted(str(posted["ts"]))

    def _posted(self, ts: str) -> None:
        self.ts = ts
        self.context[REPLY_KEY] = {"channel": self.channel, "ts": ts}
