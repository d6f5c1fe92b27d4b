"""Which Slack messages are questions, and answering one.

A question is an ``app_mention`` (answered in its thread), a direct message, or
a follow-up in a thread the bot already answered in; each becomes a
``bot.conversation.Turn``, answered through a ``SlackReply``. People of other
organisations (Slack Connect) are told they are not served. Each answer runs
as a turn of its thread (``bot.slack.sessions``), which Slack's Stop button
can cancel, and ends with its agent session ``active``, however it ended.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Person, Where
from bot.conversation import Turn
from bot.slack.blocks import render_notice
from bot.slack.people import Place
from bot.slack.reply import SlackReply
from bot.slack.search import PUBLIC_ONLY
from bot.slack.services import Services
from bot.slack.thread import SlackThread, as_typed
from bot.slack.words import WORDS_KEY
from core.answer import Asker
from core.outside import OutsideSearch

log = logging.getLogger(__name__)

_MENTION_RE = re.compile(r"<@[UW][A-Z0-9]+(?:\|[^>]*)?>")


def strip_mention(text: str, bot_user_id: str | None) -> str:
    """The question without the bot's mention (any mention when the bot's id is unknown), as
    the person typed it (``bot.slack.thread.as_typed``): searched, logged and asked so."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    else:
        text = _MENTION_RE.sub(" ", text, count=1)
    return as_typed(text)


# A person writing: a plain message, files with one, or a thread reply also sent to the
# channel. Every other subtype (edits, deletions, joins, other apps) is not a question.
_PERSON_SUBTYPES = (None, "file_share", "thread_broadcast")


def from_a_person(event: dict[str, Any], context: AsyncBoltContext) -> bool:
    """Whether a message event is a person's own new message (never this bot's or another app's)."""
    if event.get("subtype") not in _PERSON_SUBTYPES or event.get("bot_id"):
        return False
    user = event.get("user")
    return bool(user) and user != context.bot_user_id


async def is_follow_up(
    services: Services, context: AsyncBoltContext, event: dict[str, Any]
) -> bool:
    """A channel message is a question only as a reply in a thread the bot answers in."""
    thread_ts = event.get("thread_ts")
    if not thread_ts:
        return False
    if mentions_the_bot(event, context):
        # Slack sends this message as app_mention too, and that event answers it:
        # it arrives whether or not the bot answered in the thread, and even for
        # an app installed without the channel message events.
        return False
    if _MENTION_RE.search(str(event.get("text", ""))):
        return False  # addressed to someone else: people talking, the bot stays out
    return await asyncio.to_thread(
        services.kb.queries.answered_in_thread, str(event["channel"]), str(thread_ts)
    )


def mentions_the_bot(event: dict[str, Any], context: AsyncBoltContext) -> bool:
    text = str(event.get("text", ""))
    if context.bot_user_id:
        return f"<@{context.bot_user_id}>" in text or f"<@{context.bot_user_id}|" in text
    # Without the bot's id, any mention may be it: a missed follow-up beats a double answer.
    return _MENTION_RE.search(text) is not None


async def served_place(
    services: Services, client: AsyncWebClient, body: dict[str, Any], event: dict[str, Any]
) -> Place | None:
    """Where ``event`` happened, or ``None`` (after telling the person) when it is not served."""
    place = await services.audience.place(client, body, event)
    if services.audience.serves(place):
        return place
    log.info("not serving %s: a person of another organisation", event.get("user"))
    words = await services.languages.of(client, event.get("user"), str(event.get("text") or ""))
    notice = render_notice(words.EXTERNAL_ASKER)
    thread_ts = str(event.get("thread_ts") or event["ts"])
    await client.chat_postMessage(
        channel=str(event["channel"]), thread_ts=thread_ts, **notice.as_kwargs()
    )
    return None


async def answer(
    services: Services,
    client: AsyncWebClient,
    context: AsyncBoltContext,
    body: dict[str, Any],
    event: dict[str, Any],
    *,
    offered: Sequence[str] = (),
) -> None:
    """Answer the question of ``event`` where it was asked.

    ``offered``: channels whose documents it may use too, for an asker who is
    a member of them (a DM's viewed channel); a channel's own are always used.
    """
    place = await served_place(services, client, body, event)
    if place is None:
        return
    question = strip_mention(str(event.get("text", "")), context.bot_user_id)
    words = await services.languages.of(client, event.get("user"), question)
    context[WORDS_KEY] = words  # the error handler speaks the asker's language too
    channel = str(event["channel"])
    # Who reads the answer: everyone in the channel, or in a DM the asker alone (no
    # Where: the synced documents their own source permissions grant are theirs to read),
    # unless the DM is shared with another organisation.
    read_alone = event.get("channel_type") == "im"
    where = (
        None
        if read_alone and not place.shared_channel
        else Where(channel=None if read_alone else channel, shared=place.shared_channel)
    )
    person = Person(str(event.get("user") or ""))
    scopes = await services.access.search_scopes(person, where, offered)
    # People of other organisations read it too: only the channel's own documents.
    note = words.SHARED_CHANNEL_NOTE if services.access.only_its_own(where) else None
    thread_ts = str(event.get("thread_ts") or event["ts"])
    in_thread = bool(event.get("thread_ts"))
    thread = SlackThread(
        client,
        channel=channel,
        thread_ts=thread_ts,
        before=str(event["ts"]),
        bot_user_id=context.bot_user_id,
        bot_id=context.bot_id,
    )
    # Slack's messages found as the asker may be theirs alone (their DMs): the model
    # reads them only for an answer nobody else reads; elsewhere they go to the
    # asker alone, beside an answer written without them (SlackReply.final).
    turn = Turn(
        question=question,
        scopes=scopes,
        asker=Asker(user=event.get("user"), channel=channel, thread_id=thread_ts),
        follow_up=in_thread,
        thread=thread if in_thread else None,
        outside=await _slack_search(services, event, person, place, context.bot_user_id),
        read_alone=read_alone,
    )
    reply = SlackReply(
        client,
        context,
        words=words,
        channel=channel,
        thread_ts=thread_ts,
        note=note,
        streaming=services.streaming,
        recipient_user_id=event.get("user"),
        recipient_team_id=event.get("user_team") or event.get("team") or body.get("team_id"),
        ask_a_person=bool(services.config.escalation_channel),
        # Every answer is an agent session where Slack takes them (an agent app's), with Stop.
        title=question,
        follow_up=in_thread,
        read_alone=read_alone,
    )
    try:
        await services.turns.run(
            channel,
            thread_ts,
            event.get("user"),
            services.conversation.answer(turn, reply),
            stoppable=reply.stoppable,
            asked=str(event["ts"]),
        )
    finally:
        await reply.end_session()  # a turn that failed leaves no session processing


async def _slack_search(
    services: Services,
    event: dict[str, Any],
    person: Person,
    place: Place,
    bot_user_id: str | None,
) -> OutsideSearch | None:
    """Slack's own messages searched for the question (``KB_SLACK_SEARCH``); ``None``: not searched.

    Without the event's ``action_token`` Slack is searched with the bot's token, in
    every public channel of this workspace, which neither a guest of the workspace
    nor a person of another organisation (``KB_ALLOW_EXTERNAL``) reads: they (and
    one Slack cannot say is neither) ask the knowledge base alone.
    """
    if services.search is None:
        return None
    search = services.search.for_event(event, bot_user_id=bot_user_id)
    if search.reach == PUBLIC_ONLY and (
        place.external_asker or await services.access.guest(person)
    ):
        log.info("not searching public channels for %s, who does not read them", person.user_id)
        return None
    return search
