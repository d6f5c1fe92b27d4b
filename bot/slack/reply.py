"""A conversation turn shown in a Slack thread: a status, then the answer as it is written.

Implements ``bot.conversation.Reply``. The thread's status ("is searching the
knowledge base…", ``assistant.threads.setStatus``, which ``chat:write`` allows
in channel threads and DMs alike) is set first and nothing is posted until the
answer has text: Slack clears the status as soon as the bot posts in the
thread. The first text the model writes is posted, edited as it grows, and
finally replaced by the rendered answer (or the answer is posted at once when
it came in one piece). Where Slack refuses the status, a placeholder message
shows the progress instead.

Slack failing to show progress never costs the answer: a placeholder that
could not be posted or edited (deleted, rate-limited past the retries, Slack
down for a moment) is skipped, and the answer is posted as a new message in
the thread instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.render import Rendered, render_answer, render_notice, render_partial
from core.answer import Answer

log = logging.getLogger(__name__)

__all__ = ["REPLY_KEY", "SLACK_FAILURES", "SlackReply", "slack_failure"]

STATUS_TIMEOUT_SECONDS = 3.0
REPLY_KEY = "kb_reply"  # bolt context key: where a failing listener should report
# What a Web API call raises once its retries are spent: Slack's refusal, or no answer at all.
SLACK_FAILURES = (SlackApiError, aiohttp.ClientError, TimeoutError)


def slack_failure(exc: BaseException) -> str:
    """A short description of a failed Web API call for the log (Slack's error code when it gave one)."""
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or exc.response.status_code)
    return type(exc).__name__


class SlackReply:
    """Shows one turn in ``thread_ts`` of ``channel``.

    Args:
        client: the Web API client.
        context: the listener's bolt context; told where the placeholder is, so
            the error handler can replace it if anything fails afterwards.
        channel: where the question was asked.
        thread_ts: the thread the reply goes in.
        note: server-written mrkdwn shown above the answer.
        ask_a_person: the answer gets the "Ask a person" button (``KB_ESCALATION_CHANNEL``).
    """

    def __init__(
        self,
        client: AsyncWebClient,
        context: AsyncBoltContext,
        *,
        channel: str,
        thread_ts: str,
        note: str | None = None,
        ask_a_person: bool = False,
    ) -> None:
        self.client = client
        self.context = context
        self.channel = channel
        self.thread_ts = thread_ts
        self.note = note
        self.ask_a_person = ask_a_person
        self.ts: str | None = None

    async def help(self) -> None:
        """Post how to ask, in the thread."""
        notice = render_notice(messages.EMPTY_QUESTION)
        await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **notice.as_kwargs()
        )

    async def progress(self) -> None:
        """Set the thread's status; post a placeholder only where Slack refuses the status."""
        try:
            # A slow status must not hold the answer back: the placeholder then does its job.
            async with asyncio.timeout(STATUS_TIMEOUT_SECONDS):
                await self.client.assistant_threads_setStatus(
                    channel_id=self.channel,
                    thread_ts=self.thread_ts,
                    status=messages.STATUS_SEARCHING,
                )
            return
        except SLACK_FAILURES as exc:
            log.info(
                "no thread status in %s (%s): posting a placeholder",
                self.channel,
                slack_failure(exc),
            )
        try:
            await self._post(render_notice(messages.PLACEHOLDER))
        except SLACK_FAILURES as exc:
            # The answer is worth computing all the same: final() posts it.
            log.warning(
                "could not post the placeholder in %s: %s", self.channel, slack_failure(exc)
            )

    async def partial(self, text: str) -> None:
        """Show the answer so far: posted the first time (ending the status), then edited."""
        rendered = render_partial(text)
        try:
            if self.ts is None:
                await self._post(rendered)
            else:
                await self.client.chat_update(
                    channel=self.channel, ts=self.ts, **rendered.as_kwargs()
                )
        except SLACK_FAILURES as exc:
            # A lost progress update must not lose the answer that follows it.
            log.warning("progress update failed: %s", slack_failure(exc))

    async def final(self, answer: Answer) -> None:
        """Replace the answer so far (or the placeholder) with the rendered answer, or post it."""
        rendered = render_answer(answer, note=self.note, ask_a_person=self.ask_a_person)
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
            # Best effort: a "Searching…" left above the answer would look unfinished.
            with contextlib.suppress(*SLACK_FAILURES):
                await self.client.chat_delete(channel=self.channel, ts=placeholder)

    async def _post(self, rendered: Rendered) -> None:
        """Post in the thread; the error handler then reports failures on this message."""
        posted = await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **rendered.as_kwargs()
        )
        self.ts = str(posted["ts"])
        self.context[REPLY_KEY] = {"channel": self.channel, "ts": self.ts}
