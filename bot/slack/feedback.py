"""Thumbs on answers: a click counts only on the answer it names, by someone who could see it.

The feedback buttons under an answer carry ``positive:<id>`` or ``negative:<id>``,
the logged question's id (``bot.slack.blocks.answers``). Like every part of a
block action, the value and the message it says it came from are the clicker's
to forge, so a click is written only when it is bound to that answer:

* it came from where the answer was posted: the action's channel
  (``container.channel_id``) is the channel the query log recorded for the
  question, and the clicked message is in the thread the log recorded
  (``message.thread_ts``), where the bot posts every answer and nothing of
  anyone else's carries the buttons. A value naming a question of another
  conversation, or a question asked on another surface (MCP, ``kb ask``: no
  channel), never matches;
* the clicker could see that answer: in a DM only its asker (nobody else is in
  it); in a channel its asker or a member of the channel now (the access
  rule's ``conversations.members``, ``bot.access``; a channel Slack cannot
  answer for admits only the asker).

Anything else is ignored: a log line, nothing written, and nothing said to the
clicker, so a forged click learns nothing about the question it named.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from bot.access import Access, Person
from bot.slack.blocks import parse_feedback_value
from index.knowledge_base import KnowledgeBase
from index.records import QueryRecord

log = logging.getLogger(__name__)

__all__ = ["Click", "Thumb", "record_thumb"]


@dataclass(frozen=True)
class Click:
    """Where a feedback click says it came from, and who made it (a block action's fields)."""

    user: str
    channel: str
    thread: str
    value: str

    @classmethod
    def of(cls, body: dict[str, Any], action: dict[str, Any]) -> Click:
        """The click in a ``block_actions`` payload ``body`` for its ``action``."""
        container = body.get("container") or {}
        message = body.get("message") or {}
        return cls(
            user=str((body.get("user") or {}).get("id") or ""),
            channel=str(container.get("channel_id") or ""),
            thread=str(message.get("thread_ts") or container.get("thread_ts") or ""),
            value=str(action.get("value") or ""),
        )


@dataclass(frozen=True)
class Thumb:
    """A thumb written: on which question, up (+1) or down (-1)."""

    query_id: int
    value: int


async def record_thumb(kb: KnowledgeBase, access: Access, click: Click) -> Thumb | None:
    """Write ``click``'s thumb if it is bound to the answer it names; ``None`` when ignored.

    Raises:
        QueryNotFound: the value names no logged question (it is no longer on record).
    """
    parsed = parse_feedback_value(click.value)
    if parsed is None:
        log.warning("ignoring feedback with a malformed value %r", click.value[:40])
        return None
    query_id, value = parsed
    record = await asyncio.to_thread(kb.queries.get, query_id)
    if not _where_it_was_posted(record, click):
        log.warning(
            "ignoring feedback by %s on question %s: clicked in %s thread %s, "
            "the answer is in %s thread %s",
            click.user,
            query_id,
            click.channel,
            click.thread,
            record.channel,
            record.thread_id,
        )
        return None
    if not await _could_see(record, click.user, access):
        log.warning(
            "ignoring feedback by %s on question %s: they cannot see its answer in %s",
            click.user,
            query_id,
            record.channel,
        )
        return None
    await asyncio.to_thread(kb.feedback.add, query_id, value, click.user)
    return Thumb(query_id, value)


def _where_it_was_posted(record: QueryRecord, click: Click) -> bool:
    """The click came from the channel and thread the answer was posted in."""
    if not (record.channel and record.thread_id and click.channel and click.thread):
        return False
    return (click.channel, click.thread) == (record.channel, record.thread_id)


async def _could_see(record: QueryRecord, user: str, access: Access) -> bool:
    """``user`` could see the answer: its asker, or (in a channel) one of the channel's members."""
    if not user:
        return False
    if user == record.user:
        return True
    if not record.channel or record.channel.startswith("D"):
        return False  # a DM holds only its asker and the bot
    return (await access.in_channel(Person(user), record.channel)).allowed
