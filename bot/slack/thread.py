"""A Slack thread as conversation history: what people and the bot said before the question.

Implements ``bot.conversation.Thread`` with ``conversations.replies``, so that a
colleague's clarification in the thread counts, not only the questions the bot
answered. The bot's own messages are its turns; people's messages are theirs
(untrusted text, like any question: the prompt neutralises it); other apps'
messages, edits and joins are left out. Reading is bounded: a few pages of
replies, the newest messages kept, each one cut short (``core.prompt`` bounds
what reaches the model again).

The thread's text is never logged: a failed read logs Slack's error code only,
and the history then comes from the query log.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.reply import SLACK_FAILURES, slack_failure
from bot.slack.words import translated_everywhere
from core.prompt import HISTORY_MESSAGES, Role, ThreadMessage

log = logging.getLogger(__name__)

__all__ = ["MAX_PAGES", "PAGE_SIZE", "READ_SECONDS", "SlackThread", "as_typed"]

PAGE_SIZE = 100  # replies per conversations.replies call
MAX_PAGES = 3  # a longer thread keeps its newest messages of the first pages only
MESSAGE_CHARS = 2000  # a message longer than this is cut before it is kept
# Reading the thread may wait out Slack's Retry-After (a rate-limited app waits a minute):
# the answer does not, it falls back to the logged questions.
READ_SECONDS = 5.0
# Messages that are someone speaking in the thread; every other subtype is an event about it.
_SPOKEN = {None, "thread_broadcast", "file_share"}
# A link or an e-mail address Slack linked, with the text shown for it.
_LINK_RE = re.compile(r"<((?:https?://|mailto:)[^|>]*)\|([^>]*)>")
# A channel named in a message: Slack sends its id and, usually, its name.
_CHANNEL_RE = re.compile(r"<#[CG][A-Z0-9]+\|([^>]*)>")


class SlackThread:
    """The thread ``thread_ts`` of ``channel`` before the message ``before``.

    Args:
        client: the Web API client.
        channel: where the thread is.
        thread_ts: the thread's parent message.
        before: the question's own message; it and anything after it are left out.
        bot_user_id: this bot's user id (its messages are its turns).
        bot_id: this bot's bot id (its messages may carry only that).
        read_seconds: how long reading the thread may take before the logged questions are used.
    """

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        before: str,
        bot_user_id: str | None,
        bot_id: str | None,
        read_seconds: float = READ_SECONDS,
    ) -> None:
        self.client = client
        self.read_seconds = read_seconds
        self.channel = channel
        self.thread_ts = thread_ts
        self.before = before
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id

    async def earlier(self) -> list[ThreadMessage] | None:
        """The thread's messages before the question, oldest first; ``None`` if Slack refuses."""
        try:
            async with asyncio.timeout(self.read_seconds):
                raw = await self._replies()
        except SLACK_FAILURES as exc:
            # Typically an app installed before it had the history scopes.
            log.warning(
                "could not read thread %s in %s (%s); using the logged questions",
                self.thread_ts,
                self.channel,
                slack_failure(exc),
            )
            return None
        said = [m for m in map(self._message, raw) if m is not None]
        return said[-4 * HISTORY_MESSAGES :]

    async def _replies(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await self.client.conversations_replies(
                channel=self.channel,
                ts=self.thread_ts,
                latest=self.before,
                inclusive=False,
                limit=PAGE_SIZE,
                cursor=cursor,
            )
            found += [m for m in page.get("messages") or [] if isinstance(m, dict)]
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not (page.get("has_more") and cursor):
                break
        # Slack is asked for earlier messages only; a message at or after the question is not.
        return [m for m in found if _ts(m) < _ts({"ts": self.before})]

    def _message(self, message: dict[str, Any]) -> ThreadMessage | None:
        if message.get("subtype") not in _SPOKEN:
            return None
        text = str(message.get("text") or "")
        if self._is_mine(message):
            if text in translated_everywhere("PLACEHOLDER"):  # whoever it was for
                return None
            return ThreadMessage(Role.ASSISTANT, _cut(as_typed(text)))
        if message.get("bot_id") or message.get("subtype") == "bot_message":
            return None  # another app: not a person of this conversation
        if self.bot_user_id:
            text = re.sub(rf"<@{re.escape(self.bot_user_id)}(?:\|[^>]*)?>", " ", text)
        text = _cut(as_typed(text))
        return ThreadMessage(Role.USER, text) if text else None

    def _is_mine(self, message: dict[str, Any]) -> bool:
        user, bot = message.get("user"), message.get("bot_id")
        return bool(
            (self.bot_user_id and user == self.bot_user_id) or (self.bot_id and bot == self.bot_id)
        )


def as_typed(text: str) -> str:
    """Slack's mrkdwn as plain text, as the person typed it: links as their label (a host name
    or an address Slack linked is its text again), a channel as ``#name``, ``&amp;`` ``&lt;``
    ``&gt;`` decoded, spaces squeezed."""
    text = _LINK_RE.sub(lambda m: m.group(2), text)
    text = _CHANNEL_RE.sub(lambda m: f"#{m.group(1)}", text)
    return " ".join(html.unescape(text).split())


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _ts(message: dict[str, Any]) -> tuple[int, int]:
    """A message's ``ts`` as numbers: comparing them as text would misorder some."""
    seconds, _, micros = str(message.get("ts") or "0").partition(".")
    try:
        return int(seconds), int(micros or 0)
    except ValueError:
        return 0, 0
