"""Who may do what to the knowledge base from Slack: admins and publishers.

* **Admins**: the user ids in ``KB_ADMIN_USERS`` and, when
  ``KB_SLACK_ADMINS_ARE_ADMINS``, Slack workspace admins and owners (as
  ``users.info`` reports them). They run ``/kb-reindex`` and approve or reject
  documents for everyone, and are always publishers.
* **Publishers**: admins, and the user ids and members of the user groups
  (``S...``, read with ``usergroups.users.list``) in ``KB_PUBLISHERS``. They add
  and replace documents for everyone.
* Everyone else adds documents to a channel they are in (replacing only their
  own earlier versions), and asks for an approval to add one for everyone.

Slack's answers come through ``bot.slack.directory`` (cached briefly). A
failed lookup counts as "no": nobody gains a right because Slack could not be
asked.
"""

from __future__ import annotations

import logging

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.config import SlackConfig
from bot.slack.directory import Directory
from index.models import Publish
from index.store import EVERYONE

log = logging.getLogger(__name__)

__all__ = ["Roles"]


def _is_group(entry: str) -> bool:
    return entry.startswith("S")


class Roles:
    """Answers "is this person an admin / a publisher?" for one workspace.

    Args:
        config: the configured admins, publishers and whether Slack admins count.
        directory: Slack's answers about people and groups, cached.
    """

    def __init__(self, config: SlackConfig, directory: Directory) -> None:
        self.config = config
        self.directory = directory

    async def is_admin(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` is a knowledge-base admin."""
        if user_id in self.config.admin_user_ids:
            return True
        if not self.config.workspace_admins_are_admins or not user_id:
            return False
        user = await self.directory.user(client, user_id) or {}
        return bool(user.get("is_admin") or user.get("is_owner")) and not user.get("deleted")

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
