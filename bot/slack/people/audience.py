"""Who is asking, and who else will read the answer: this workspace, or other organisations.

Slack Connect puts people of other organisations in the same channels (and
DMs) as the workspace's own members. By default (``KB_ALLOW_EXTERNAL=false``)
they get no answers from the knowledge base, and in a channel shared with
another organisation the bot uses only the documents added to that channel,
because everyone in it reads the answer. The checks use what Slack says in the
event itself (the envelope's ``team_id`` and ``is_ext_shared_channel``, the
event's ``user_team``/``team``) and, when the event does not say which team
the person belongs to, ``users.info`` (through ``bot.slack.people.directory``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Where, admitted, slack_error
from bot.slack.config import SlackConfig, is_channel_id
from bot.slack.people.directory import Directory

log = logging.getLogger(__name__)

__all__ = ["Audience", "Place", "channel_readers"]


@dataclass(frozen=True)
class Place:
    """What the bot knows about where a question was asked.

    Attributes:
        external_asker: the person belongs to another organisation.
        shared_channel: people of other organisations are in the channel.
    """

    external_asker: bool
    shared_channel: bool


class Audience:
    """Tells members of this workspace from people of other organisations.

    Args:
        config: whether external people may be answered at all.
        directory: Slack's answers about people, cached.
    """

    def __init__(self, config: SlackConfig, directory: Directory) -> None:
        self.allow_external = config.allow_external
        self.directory = directory

    async def place(
        self, client: AsyncWebClient, body: dict[str, Any], event: dict[str, Any]
    ) -> Place:
        """Where ``event`` (delivered in ``body``) was asked."""
        home = _home_team(body)
        team = event.get("user_team") or event.get("team")
        if not team and event.get("user"):
            team = await self._team_of(client, str(event["user"]))
        return Place(
            # A team nobody could tell counts as another organisation: unknown grants nothing.
            external_asker=not admitted(team, home, allow_external=False),
            shared_channel=bool(body.get("is_ext_shared_channel")),
        )

    def serves_submitter(self, body: dict[str, Any]) -> bool:
        """Whether the person who submitted an interactive payload (a modal) is served.

        In a shared channel Slack puts the submitter's own team in ``team``; the
        workspace the app is installed in is the view's ``app_installed_team_id``.
        """
        view = body.get("view") or {}
        home = view.get("app_installed_team_id") or _home_team(body)
        user_team = (body.get("user") or {}).get("team_id")
        return admitted(user_team, home, allow_external=self.allow_external)

    def serves_clicker(self, body: dict[str, Any], context: Any) -> bool:
        """Whether the person who clicked a button in a message is served.

        A click's payload names the clicker's team; the workspace the app is
        installed in is the one its token belongs to (bolt's ``auth.test``
        result), which a shared channel's payload does not otherwise say.
        """
        result = getattr(context, "authorize_result", None)
        home = getattr(result, "team_id", None) or _home_team(body)
        user_team = (body.get("user") or {}).get("team_id")
        return admitted(user_team, home, allow_external=self.allow_external)

    def serves(self, place: Place) -> bool:
        """Whether a question asked at ``place`` gets an answer from the knowledge base."""
        return self.allow_external or not place.external_asker

    async def _team_of(self, client: AsyncWebClient, user_id: str) -> str | None:
        user = await self.directory.user(client, user_id) or {}
        team = user.get("team_id") or (user.get("profile") or {}).get("team")
        return str(team) if team else None


def _home_team(body: dict[str, Any]) -> str | None:
    """The workspace the app is installed in: the one every event is delivered for."""
    if body.get("team_id"):
        return str(body["team_id"])
    for auth in body.get("authorizations") or []:
        if auth.get("team_id"):
            return str(auth["team_id"])
    return None


async def channel_readers(client: AsyncWebClient, channel: str) -> Where | None:
    """Who reads what the bot posts in ``channel``: its people (``None`` for a DM: one person).

    A channel people of other organisations are in (Slack Connect, ``conversations.info``'s
    ``is_ext_shared``, or pending) reads as such; one Slack cannot tell about reads so too
    (unknown is hidden).
    """
    if not is_channel_id(channel):
        return None
    try:
        resp = await client.conversations_info(channel=channel)
        info = resp.get("channel") or {}
        shared = bool(info.get("is_ext_shared") or info.get("is_pending_ext_shared"))
    except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
        why = slack_error(exc) if isinstance(exc, SlackApiError) else type(exc).__name__
        log.info("conversations.info on %s failed: %s", channel, why)
        shared = True
    return Where(channel=channel, shared=shared)
