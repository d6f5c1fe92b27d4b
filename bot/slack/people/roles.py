"""Who may do what to the knowledge base from Slack: admins and publishers.

* **Admins**: the user ids in ``KB_ADMIN_USERS`` and, when
  ``KB_SLACK_ADMINS_ARE_ADMINS``, Slack workspace admins and owners (as
  ``users.info`` reports them) of this workspace, never a partner
  organisation's admin met in a channel shared through Slack Connect. They run
  ``/kb-reindex`` and approve or reject documents for everyone, and are always
  publishers.
* **Publishers**: admins, and the user ids and members of the user groups
  (``S...``, read with ``usergroups.users.list``) in ``KB_PUBLISHERS``. They add
  and replace documents for everyone.
* Everyone else adds documents to a channel they are in (replacing only their
  own earlier versions), and asks for an approval to add one for everyone.

Slack's answers come through ``bot.slack.people.directory`` (cached briefly). A
failed lookup counts as "no": nobody gains a right because Slack could not be
asked.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.config import SlackConfig
from bot.slack.people.directory import Directory
from index.models import EVERYONE, Publish

log = logging.getLogger(__name__)

__all__ = ["Roles"]


def _is_group(entry: str) -> bool:
    return entry.startswith("S")


def _team_of(user: dict[str, Any]) -> str | None:
    team = user.get("team_id") or (user.get("profile") or {}).get("team")
    return str(team) if team else None


class Roles:
    """Answers "is this person an admin / a publisher?" for one workspace.

    Args:
        config: the configured admins, publishers and whether Slack admins count.
        directory: Slack's answers about people and groups, cached.
    """

    def __init__(self, config: SlackConfig, directory: Directory) -> None:
        self.config = config
        self.directory = directory
        self._team: str | None = None

    async def is_admin(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` is a knowledge-base admin."""
        if user_id in self.config.admin_user_ids:
            return True
        if not self.config.workspace_admins_are_admins or not user_id:
            return False
        user = await self.directory.user(client, user_id) or {}
        if not (user.get("is_admin") or user.get("is_owner")) or user.get("deleted"):
            return False
        # Slack Connect: a partner's admin is an admin of their own organisation, not this one.
        home = await self._workspace_team(client)
        return bool(home) and _team_of(user) == home

    async def _workspace_team(self, client: AsyncWebClient) -> str | None:
        """The team the bot's token belongs to (``auth.test``); asked until Slack answers."""
        if self._team is None:
            try:
                resp = await client.auth_test()
            except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
                log.warning("auth.test failed, no workspace admin counts: %s", type(exc).__name__)
                return None
            team = resp.get("team_id")
            self._team = str(team) if team else None
        return self._team

    async def is_publisher(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` may add and replace documents for everyone."""
        if not user_id:
            return False
        publishers = self.config.publisher_ids
        if user_id in publishers or await self.is_admin(client, user_id):
            return True
        for group in sorted(filter(_is_group, publishers)):
            if user_id in (await self.directory.group_members(client, group) or frozenset()):
                return True
        return False

    async def publish_mode(self, client: AsyncWebClient, user_id: str, scope: str) -> Publish:
        """How a document ``user_id`` adds in ``scope`` may become searchable."""
        if await self.is_publisher(client, user_id):
            return Publish.DIRECT
        return Publish.APPROVAL if scope == EVERYONE else Publish.OWN
