"""Who a tool call runs as, and which documents that person may search.

A call runs as a person (``Person``): the token's, or the one Slack signed for.
What they may search is the documents for everyone plus the channels of the
knowledge base's documents that the person is a member of now, asked of Slack
(``People``, ``bot.mcp.slack_people``: the viewer's cached
``conversations.members`` check). A token issued with ``--scope`` channels only
narrows that to those of its channels: a scope never grants a channel its
person is not in. Without Slack to ask, nobody can say who is in a channel, so
every call searches the documents for everyone only, scoped tokens included.

People of another organisation get nothing unless ``KB_ALLOW_EXTERNAL`` is on,
and a person Slack cannot place counts as another organisation: unknown grants
nothing.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from bot.mcp.auth import Caller
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE, DocState

__all__ = ["NotServed", "People", "Person", "person_of", "scopes_of"]


class NotServed(KBError):
    """The person a tool call runs as may not use this knowledge base (another organisation)."""


@dataclass(frozen=True)
class Person:
    """Who a tool call runs as.

    Attributes:
        user_id: their Slack user id.
        team_id: the workspace Slack said they asked from; ``None``: not said (a token).
        client: the token's name, or ``slack`` (for the query log).
        channels: the channels a token was narrowed to (``--scope``); ``None``: not narrowed.
    """

    user_id: str
    team_id: str | None
    client: str
    channels: frozenset[str] | None


class People(ABC):
    """What the workspace says about people: who belongs to it, who is in which channel."""

    @abstractmethod
    async def served(self, user_id: str, team_id: str | None) -> bool:
        """Whether ``user_id`` (who asked from ``team_id``, when known) is served at all."""

    @abstractmethod
    async def member_channels(self, user_id: str, channels: Sequence[str]) -> frozenset[str]:
        """Those of ``channels`` that ``user_id`` is a member of."""


def person_of(caller: Caller) -> Person | None:
    """The person ``caller``'s tool call runs as; ``None`` when it names nobody.

    A token's call runs as the token's person, whatever the call says of itself.
    """
    if caller.token is not None:
        token = caller.token
        channels = frozenset(token.scopes) if token.scopes else None
        return Person(token.user_id, None, token.name, channels)
    if caller.slack is not None:
        return Person(caller.slack.user_id, caller.slack.team_id, caller.client, None)
    return None


async def scopes_of(person: Person, people: People | None, kb: KnowledgeBase) -> frozenset[str]:
    """The channel scopes ``person`` may search (documents for everyone come with any):
    the channels they are a member of, narrowed to a token's own, if it has any.

    Raises:
        NotServed: the person belongs to another organisation (or Slack cannot say).
        AccessCheckUnavailable: Slack cannot be asked right now.
    """
    if people is None and person.team_id is not None:
        # Slack signed for a person of some workspace, and without Slack to ask
        # nothing says it is this one: unknown grants nothing.
        raise NotServed(
            "This knowledge base cannot tell which workspace a Slack person belongs to "
            "without SLACK_BOT_TOKEN, so it answers no Slack-signed call: an admin sets it."
        )
    if people is not None and not await people.served(person.user_id, person.team_id):
        raise NotServed(
            "This knowledge base answers only members of its own Slack workspace; "
            "an admin can allow people of other organisations with KB_ALLOW_EXTERNAL."
        )
    if people is None:
        # Nobody to ask who is in a channel: a token's scopes alone grant nothing.
        return frozenset()
    channels = await asyncio.to_thread(_channel_scopes, kb)
    if person.channels is not None:
        channels = [c for c in channels if c in person.channels]
    return await people.member_channels(person.user_id, channels)


def _channel_scopes(kb: KnowledgeBase) -> list[str]:
    """The channels some searchable document belongs to, sorted."""
    return sorted({d.scope for d in kb.store.documents(DocState.INDEXED)} - {EVERYONE})
