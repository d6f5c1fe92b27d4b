"""A conversation turn shown in a Slack thread: a placeholder edited into the answer.

Implements ``bot.conversation.Reply``. In a DM thread the assistant status
("is searching the knowledge base…") is set first; the placeholder message is
then edited as the model writes and finally replaced by the rendered answer.
"""

from __future__ import annotations

import contextlib
import logging

from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.render import render_answer, render_notice, render_partial
from core.answer import Answer

log = logging.getLogger(__name__)

__all__ = ["REPLY_KEY", "SlackReply"]

REPLY_KEY = "kb_reply"  # bolt context key: where a failing listener should report


class SlackReply:
    """Shows one turn in ``thread_ts`` of ``channel``.

    Args:
        client: the Web API client.
        context: the listener's bolt context; told where the placeholder is, so
            the error handler can replace it if anything fails afterwards.
        channel: where the question was asked.
        thread_ts: the thread the reply goes in.
        show_status: set the assistant status first (only assistant threads accept one).
        note: server-written mrkdwn shown above the answer.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        context: AsyncBoltContext,
        *,
        channel: str,
        thread_ts: str,
        show_status: bool = False,
        note: str | None = None,
    ) -> None:
        self.client = client
        self.context = context
        self.channel = channel
        self.thread_ts = thread_ts
        self.show_status = show_status
        self.note = note
        self.ts: str | None = None

    async def help(self) -> None:
        """Post how to ask, in the thread."""
        notice = render_notice(messages.EMPTY_QUESTION)
        await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **notice.as_kwargs()
        )

    async def progress(self) -> None:
        """Set the status (DM threads) and post the placeholder the answer will replace."""
        if self.show_status:
            # In a plain DM thread Slack refuses a status, which is fine.
            with contextlib.suppress(SlackApiError):
                await self.client.assistant_threads_setStatus(
                    channel_id=self.channel,
                    thread_ts=self.thread_ts,
                    status=messages.STATUS_SEARCHING,
                )
        placeholder = render_notice(messages.PLACEHOLDER)
        posted = await self.client.chat_postMessage(
            channel=self.channel, thread_ts=self.thread_ts, **placeholder.as_kwargs()
        )
        self.ts = str(posted["ts"])
        self.context[REPLY_KEY] = {"channel": self.channel, "ts": self.ts}

    async def partial(self, text: str) -> None:
        """Edit the placeholder to show the answer so far."""
        try:
            await self.client.chat_update(
                channel=self.channel, ts=self._placeholder(), **render_partial(text).as_kwargs()
            )
        except SlackApiError as exc:
            # A lost progress update must not lose the answer that follows it.
            log.warning("progress update failed: %s", exc)

    async def final(self, answer: Answer) -> None:
        """Replace the placeholder with the rendered answer."""
        await self.client.chat_update(
            channel=self.channel,
            ts=self._placeholder(),
            **render_answer(answer, note=self.note).as_kwargs(),
        )

    def _placeholder(self) -> str:
        if self.ts is None:
            raise RuntimeError("SlackReply.progress() must run before the answer is shown")
        return self.ts
