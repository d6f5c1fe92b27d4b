"""``People`` asked of Slack: the viewer's membership check, for tool calls.

Who belongs to the workspace is ``auth.test``'s team (asked once) against the
person's team (the one Slack signed for, or ``users.info``'s, cached five
minutes); who is in a channel is ``conversations.members``, cached a minute,
the same check (and, with sign-in on, the same cache) the document viewer uses
(``bot.slack.people.signin``). A channel the bot cannot see has no known
members, so nobody gets its documents through it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bot.mcp.people import People
from bot.server.readers import READER_GATE
from bot.slack.app import web_client
from bot.slack.config import SlackConfig
from bot.slack.people import Directory, signin

__all__ = ["SlackPeople", "slack_people"]

# The SDK logs each call's arguments at DEBUG; INFO keeps the bot token's calls out of a debug log.
_api_log = logging.getLogger(f"{__name__}.api")
_api_log.setLevel(logging.INFO)


class SlackPeople(People):
    """Workspace membership and channel membership, from Slack.

    Args:
        client: a Web API client with the bot token.
        allow_external: serve people of other organisations too (``KB_ALLOW_EXTERNAL``).
        workspace: the bot's own workspace (``auth.test``).
        members: channel members, cached (``conversations.members``).
        directory: people, cached (``users.info``).
    """

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        allow_external: bool,
        workspace: signin.Workspace,
        members: signin.ChannelMembers,
        directory: Directory,
    ) -> None:
        self.client = client
        self.allow_external = allow_external
        self.workspace = workspace
        self.members = members
        self.directory = directory

    async def served(self, user_id: str, team_id: str | None) -> bool:
        """Members of this workspace, and everyone when ``KB_ALLOW_EXTERNAL`` is on.

        A token's person (``team_id`` unknown) is looked up, and one Slack has
        deactivated is served no more, whatever their organisation: leaving the
        company ends their tokens too (within ``users.info``'s cache).
        """
        user: dict[str, Any] = {}
        if team_id is None:
            user = await self.directory.user(self.client, user_id) or {}
            if user.get("deleted"):
                return False
        if self.allow_external:
            return True
        home = await self.workspace.team_id()
        team = team_id or _team_of(user)
        return bool(home and team == home)

    async def member_channels(self, user_id: str, channels: Sequence[str]) -> frozenset[str]:
        """Those of ``channels`` whose members Slack lists ``user_id`` among."""
        return frozenset([c for c in channels if user_id in await self.members.of(c)])


def _team_of(user: dict[str, Any]) -> str | None:
    """The team of a ``users.info`` user object; ``None`` when it names none."""
    team = user.get("team_id") or (user.get("profile") or {}).get("team")
    return str(team) if team else None


def slack_people(
    app: web.Application, config: SlackConfig, client: AsyncWebClient | None = None
) -> SlackPeople | None:
    """``People`` for ``config``'s workspace; ``None`` without a bot token to ask Slack with.

    With viewer sign-in on (a ``SlackReaders`` gate on ``app``), its workspace
    and its cached channel members are shared.
    """
    if not config.bot_token:
        return None
    bot = client or web_client(config, logger=_api_log)
    gate = app.get(READER_GATE)
    if isinstance(gate, signin.SlackReaders):
        workspace, members = gate.workspace, gate.members
    else:
        workspace, members = signin.Workspace(bot), signin.ChannelMembers(bot)
    return SlackPeople(
        bot,
        allow_external=config.allow_external,
        workspace=workspace,
        members=members,
        directory=Directory(),
    )
