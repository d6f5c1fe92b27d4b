"""Agent messaging: the Messages tab, the channel each person is viewing, the older assistant pane.

Slack's agent view (``features.agent_view`` in the manifest; the only one new
apps may use) is the app's Messages tab, where each message can start its own
thread. There:

* ``app_home_opened`` on the ``messages`` tab sets suggested prompts drawn from
  the documents the person may read (those for everyone, and those of the
  channel they are viewing when they are a member of it), and the first time a
  person opens the tab (their DM with the bot is still empty) the bot greets
  them; with an empty knowledge base the greeting says how to add documents.
  ``assistant.threads.setSuggestedPrompts`` is called without a thread: with
  one, Slack silently ignores an agent app's call.
* ``app_context_changed`` says which channel the person is looking at; it is
  remembered for a few minutes (:class:`Viewing`). A question asked in the DM
  meanwhile may also use that channel's documents, but only when the asker is
  a member of the channel (the access rule, ``bot.access``: ``conversations.members``,
  remembered for a minute): anyone else gets the documents for everyone
  alone. A DM message that carries its own ``app_context`` uses that instead.
  What is remembered lives in this process: with several replicas a question
  may reach one that never saw the change, and then only the message's own
  context counts.

Apps still on the assistant view (``features.assistant_view``) keep working
until Slack removes it in February 2027: ``assistant_thread_started`` greets
the new thread with the same prompts, and it and
``assistant_thread_context_changed`` tell which channel the person views.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Access, Person, visible
from bot.slack.blocks import render_notice
from bot.slack.reply import SLACK_FAILURES, Refusals, slack_failure
from bot.slack.words import Languages, Words
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE, DocState, OnlyScopes
from index.names import display_name

log = logging.getLogger(__name__)

__all__ = ["MAX_PROMPTS", "Agent", "Viewing", "suggested_prompts", "viewed_channel"]

# Slack shows at most four suggested prompts.
MAX_PROMPTS = 4
# Long enough for a question typed after glancing at a channel; short enough
# that a channel left long ago stops widening the answers.
VIEWING_TTL_SECONDS = 600.0
MAX_VIEWERS = 20_000
PROMPT_TITLE_CHARS = 60
PROMPT_MESSAGE_CHARS = 200
_HEADER_SEPARATOR = " > "
# Public and private channels: a DM (D...) has no documents of its own.
_CHANNEL_ID = re.compile(r"[CG][A-Z0-9]{2,30}")
_CHANNEL_ENTITY = "slack#/types/channel_id"
_MESSAGE_ENTITY = "slack#/types/message_context"


# ---------------------------------------------------------------- what the person is viewing


def viewed_channel(context: Any) -> str | None:
    """The channel a context's entities name first (Slack orders them by relevance).

    ``None`` when the most relevant conversation is not a channel (a DM) or none is named.
    """
    if not isinstance(context, dict):
        return None
    for entity in context.get("entities") or []:
        channel = _entity_channel(entity)
        if channel is not None:
            return channel if _CHANNEL_ID.fullmatch(channel) else None
    return None


def _entity_channel(entity: Any) -> str | None:
    if not isinstance(entity, dict):
        return None
    value = entity.get("value")
    if entity.get("type") == _MESSAGE_ENTITY and isinstance(value, dict):
        value = value.get("channel_id")
    elif entity.get("type") != _CHANNEL_ENTITY:
        return None
    return value if isinstance(value, str) else None


class Viewing:
    """The channel each person was last seen viewing, remembered for ``ttl_seconds``.

    Args:
        ttl_seconds: how long a sighting counts.
        capacity: people remembered at most; the least recently seen are forgotten first.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        *,
        ttl_seconds: float = VIEWING_TTL_SECONDS,
        capacity: int = MAX_VIEWERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.capacity = capacity
        self.clock = clock
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def see(self, user: str, channel: str | None) -> None:
        """``user`` now views ``channel`` (``None``: nothing with documents of its own)."""
        self._seen.pop(user, None)
        if channel is None:
            return
        self._seen[user] = (channel, self.clock() + self.ttl_seconds)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def channel(self, user: str) -> str | None:
        """The channel ``user`` was viewing lately, if the sighting is still fresh."""
        seen = self._seen.get(user)
        if seen is None or seen[1] <= self.clock():
            return None
        return seen[0]


# ---------------------------------------------------------------- suggested prompts


def suggested_prompts(
    kb: KnowledgeBase,
    scopes: frozenset[str] = frozenset(),
    limit: int = MAX_PROMPTS,
    *,
    words: Words,
) -> list[dict[str, str]]:
    """Questions about the newest documents the asker may read, one per document.

    Documents for everyone (unless ``scopes`` are :class:`index.models.OnlyScopes`: a
    guest's), and those of ``scopes`` (the channel the asker views and is a member
    of) first. Each names the document's title and its first
    section, words the document itself holds, so that the knowledge base has an
    answer to it. They are worded in ``words``, the asker's language.
    """
    # Stale documents (indexed with another model) are not searched until a reindex.
    stale = {d.id for d in kb.stale_documents()}
    documents = [
        d for d in kb.documents(DocState.INDEXED) if visible(scopes, d.scope) and d.id not in stale
    ]
    documents.sort(key=lambda d: (d.scope != EVERYONE, d.indexed_at or 0.0, d.id), reverse=True)
    prompts = []
    for doc in documents[:limit]:
        title = display_name(doc.title or doc.name, PROMPT_TITLE_CHARS)
        message = words.suggested_question(title, _first_section(kb, doc.id))
        prompts.append({"title": title, "message": message[:PROMPT_MESSAGE_CHARS]})
    return prompts


def _first_section(kb: KnowledgeBase, doc_id: int) -> str:
    for chunk in kb.chunks(doc_id):
        section = str(chunk.get("section") or "").split(_HEADER_SEPARATOR)[-1].strip()
        if section:
            return display_name(section, PROMPT_TITLE_CHARS)
    return ""


# ---------------------------------------------------------------- the agent


class Agent:
    """The Messages tab's greeting and prompts, and which channel's documents a DM may use.

    Args:
        kb: the knowledge base the prompts are drawn from.
        access: who may read which channel's documents.
        languages: the words each person is greeted in.
        viewing: what each person is viewing (a fresh one when omitted).
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        access: Access,
        languages: Languages,
        viewing: Viewing | None = None,
    ) -> None:
        self.kb = kb
        self.access = access
        self.languages = languages
        self.viewing = viewing or Viewing()
        self.prompts = Refusals("suggested prompts")
        """Whether Slack takes suggested prompts (``assistant.threads.setSuggestedPrompts``)."""

    async def messages_tab_opened(self, client: AsyncWebClient, event: dict[str, Any]) -> None:
        """Greet a first visit, and offer prompts (``app_home_opened`` on the Messages tab)."""
        user, channel = str(event.get("user", "")), str(event.get("channel", ""))
        if "app_context" in event:
            self.viewing.see(user, viewed_channel(event["app_context"]))
        if not channel:
            return
        words = await self.languages.of(client, user)
        scopes = await self._scopes_of(user, self.viewing.channel(user))
        prompts = await asyncio.to_thread(suggested_prompts, self.kb, scopes, words=words)
        if await self._first_visit(client, channel):
            await self._greet(client, channel, None, words, has_documents=bool(prompts))
        if prompts:
            await self._offer(client, channel, None, prompts, words)

    async def assistant_thread_started(
        self, client: AsyncWebClient, thread: dict[str, Any]
    ) -> None:
        """Greet a new thread of the assistant pane and offer prompts in it."""
        self.assistant_context_changed(thread)
        channel, thread_ts = str(thread.get("channel_id", "")), str(thread.get("thread_ts", ""))
        if not (channel and thread_ts):
            return
        user = str(thread.get("user_id", ""))
        words = await self.languages.of(client, user)
        scopes = await self._scopes_of(user, self.viewing.channel(user))
        prompts = await asyncio.to_thread(suggested_prompts, self.kb, scopes, words=words)
        await self._greet(client, channel, thread_ts, words, has_documents=bool(prompts))
        if prompts:
            await self._offer(client, channel, thread_ts, prompts, words)

    def assistant_context_changed(self, thread: dict[str, Any]) -> None:
        """Remember the channel an assistant thread's person views (``context.channel_id``)."""
        user = thread.get("user_id")
        if isinstance(user, str) and user:
            channel = (thread.get("context") or {}).get("channel_id")
            ok = isinstance(channel, str) and _CHANNEL_ID.fullmatch(channel)
            self.viewing.see(user, channel if ok else None)

    def context_changed(self, event: dict[str, Any]) -> None:
        """Remember what ``app_context_changed`` says the person views now."""
        user = event.get("user")
        if isinstance(user, str) and user:
            self.viewing.see(user, viewed_channel(event.get("context")))

    def viewed(self, event: dict[str, Any]) -> list[str]:
        """The channel a DM question's asker is viewing, whose documents it may use too.

        The message's own ``app_context`` when it carries one, else the last
        one seen for the asker; its documents are used only for a member of it
        (:meth:`bot.access.Access.search_scopes` checks).
        """
        if "app_context" in event:
            channel = viewed_channel(event["app_context"])
        else:
            channel = self.viewing.channel(str(event.get("user", "")))
        return [channel] if channel else []

    async def _scopes_of(self, user: str, channel: str | None) -> frozenset[str]:
        """``{channel}`` when ``user`` is one of its members, else none; only those for a
        guest (:meth:`bot.access.Access.guest`), without the documents for everyone."""
        if not user:
            return frozenset()
        person = Person(user)
        channels = await self.access.readable_channels(person, [channel] if channel else [])
        return OnlyScopes(channels) if await self.access.guest(person) else channels

    async def _first_visit(self, client: AsyncWebClient, channel: str) -> bool:
        try:
            history = await client.conversations_history(channel=channel, limit=1)
        except SlackApiError as exc:
            log.warning("conversations.history failed for %s: %s", channel, exc)
            return False
        return not history.get("messages")

    async def _greet(
        self,
        client: AsyncWebClient,
        channel: str,
        thread_ts: str | None,
        words: Words,
        *,
        has_documents: bool,
    ) -> None:
        text = words.AGENT_GREETING if has_documents else words.AGENT_GREETING_EMPTY
        notice = render_notice(text)
        await client.chat_postMessage(channel=channel, thread_ts=thread_ts, **notice.as_kwargs())

    async def _offer(
        self,
        client: AsyncWebClient,
        channel: str,
        thread_ts: str | None,
        prompts: list[dict[str, str]],
        words: Words,
    ) -> None:
        # Slack has no agents.* successor for this method (slack-sdk 3.48 has none, agent
        # view keeps using it) and does not list it among those it removes in February
        # 2027. Refused or removed (unknown_method), that is remembered for an hour and
        # the greeting stands alone.
        if not self.prompts.available(channel):
            return
        try:
            await client.assistant_threads_setSuggestedPrompts(
                channel_id=channel,
                thread_ts=thread_ts,
                prompts=prompts,
                title=words.PROMPTS_TITLE,
            )
        except SLACK_FAILURES as exc:
            # Without assistant:write, or on a surface that has no prompts: the greeting stands.
            log.warning("assistant.threads.setSuggestedPrompts failed: %s", slack_failure(exc))
            self.prompts.refused(channel, exc)
