"""Who a tool call runs as, and which documents that person may search.

A call runs as a person (``Person``): the token's, or the one Slack signed for.
What they may search is the access rule's (``bot.access``, the one every
surface asks): the documents for everyone plus the channels of the knowledge
base's documents that the person is a member of now, asked of Slack
(``conversations.members``, the cache the viewer and the Slack surface share).
A token issued with ``--scope`` channels only narrows that to those of its
channels: a scope never grants a channel its person is not in. Without Slack
to ask, nobody can say who is in a channel, so every call searches the
documents for everyone only, scoped tokens included.

People of another organisation get nothing unless ``KB_ALLOW_EXTERNAL`` is on,
and a person Slack cannot place counts as another organisation: unknown grants
nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bot.access import Access, NotServed
from bot.access import Person as Reader
from bot.mcp.auth import Caller
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE, DocState

__all__ = ["NotServed", "People", "Person", "person_of", "scopes_of"]

# What a tool call asks who may read what: the access rule (``None``: nobody to ask).
People = Access


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
    access = people if people is not None else Access(None, allow_external=False)
    # Slack signed the workspace, and names a user id: that person must exist there too.
    signed = person.team_id is not None
    served = await access.served(Reader(person.user_id, person.team_id), known=signed)
    if not served.allowed:
        raise NotServed(_NO_SLACK if access.directory is None else _OTHER_ORGANISATION)
    if access.members is None:
        # Nobody to ask who is in a channel: a token's scopes alone grant nothing, and
        # nobody to ask a person's email: of the synced documents, the public ones.
        return await access.source_scopes(Reader(person.user_id))
    channels = await asyncio.to_thread(_channel_scopes, kb)
    if person.channels is None:
        return await access.search_scopes(Reader(person.user_id), None, channels, strict=True)
    channels = [c for c in channels if c in person.channels]
    scopes = await access.search_scopes(Reader(person.user_id), None, channels, strict=True)
    return await access.narrowed(scopes)


def _channel_scopes(kb: KnowledgeBase) -> list[str]:
    """The channels some searchable document belongs to, sorted."""
    return sorted({d.scope for d in kb.store.documents(DocState.INDEXED)} - {EVERYONE})


# Slack signed for a person of some workspace, and without Slack to ask
# nothing says it is this one: unknown grants nothing.
_NO_SLACK = (
    "This knowledge base cannot tell which workspace a Slack person belongs to "
    "without SLACK_BOT_TOKEN, so it answers no Slack-signed call: an admin sets it."
)
_OTHER_ORGANISATION = (
    "This knowledge base answers only members of its own Slack workspace; "
    "an admin can allow people of other organisations with KB_ALLOW_EXTERNAL."
)
