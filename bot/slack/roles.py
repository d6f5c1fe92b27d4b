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

Slack's answers are cached for a few minutes (group members for one), so a
burst of uploads costs one API call. A failed lookup counts as "no": nobody
gains a right because Slack could not be asked.
"""

from __future__ import annotations

import logging
import time

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.config import SlackConfig
from index.models import Publish
from index.store import EVERYONE

log = logging.getLogger(__name__)

__all__ = ["Roles"]

ADMIN_CACHE_SECONDS = 300.0
GROUP_CACHE_SECONDS = 60.0


def _is_group(entry: str) -> bool:
    return entry.startswith("S")


class Roles:
    """Answers "is this person an admin / a publisher?" for one workspace.

    Args:
        config: the configured admins, publishers and whether Slack admins count.
        ttl_seconds: how long a ``users.info`` answer is remembered.
        group_ttl_seconds: how long a user group's members are remembered.
    """

    def __init__(
        self,
        config: SlackConfig,
        *,
        ttl_seconds: float = ADMIN_CACHE_SECONDS,
        group_ttl_seconds: float = GROUP_CACHE_SECONDS,
    ) -> None:
        self.config = config
        self.ttl_seconds = ttl_seconds
        self.group_ttl_seconds = group_ttl_seconds
        self._admins: dict[str, tuple[bool, float]] = {}
        self._groups: dict[str, tuple[frozenset[str], float]] = {}

    async def is_admin(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` is a knowledge-base admin."""
        if user_id in self.config.admin_user_ids:
            return True
        if not self.config.workspace_admins_are_admins or not user_id:
            return False
        cached = self._admins.get(user_id)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            resp = await client.users_info(user=user_id)
        except SlackApiError as exc:
            log.warning("users.info failed for %s; treating as not an admin: %s", user_id, exc)
            return False
        user = resp.get("user") or {}
        admin = bool(user.get("is_admin") or user.get("is_owner")) and not user.get("deleted")
        self._admins[user_id] = (admin, time.monotonic() + self.ttl_seconds)
        return admin

    async def is_publisher(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` may add and replace documents for everyone."""
        if not user_id:
            return False
        publishers = self.config.publisher_ids
        if user_id in publishers or await self.is_admin(client, user_id):
            return True
        for group in sorted(filter(_is_group, publishers)):
            if user_id in await self._members(client, group):
                return True
        return False

    async def publish_mode(self, client: AsyncWebClient, user_id: str, scope: str) -> Publish:
        """How a document ``user_id`` adds in ``scope`` may become searchable."""
        if await self.is_publisher(client, user_id):
            return Publish.DIRECT
        return Publish.APPROVAL if scope == EVERYONE else Publish.OWN

    async def _members(self, client: AsyncWebClient, group: str) -> frozenset[str]:
        cached = self._groups.get(group)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            resp = await client.usergroups_users_list(usergroup=group)
        except SlackApiError as exc:
            log.warning("usergroups.users.list failed for %s; treating as empty: %s", group, exc)
            return frozenset()
        members = frozenset(str(u) for u in resp.get("users") or [])
        self._groups[group] = (members, time.monotonic() + self.group_ttl_seconds)
        return members
