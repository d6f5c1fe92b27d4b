"""What Slack says about people and groups, asked once and remembered briefly.

``users.info`` (is this person an admin, which organisation are they from)
and ``usergroups.users.list`` (who is in a publishers group) are asked by
several parts of the bot; a burst of questions or uploads costs one call.
A failed call is remembered by nobody and answered as "unknown", so callers
decide what unknown means (it never grants a right).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

__all__ = ["Directory"]

USER_CACHE_SECONDS = 300.0
GROUP_CACHE_SECONDS = 60.0


class Directory:
    """A short-lived cache in front of ``users.info`` and ``usergroups.users.list``.

    Args:
        user_ttl_seconds: how long a person's ``users.info`` answer is remembered.
        group_ttl_seconds: how long a user group's members are remembered.
    """

    def __init__(
        self,
        *,
        user_ttl_seconds: float = USER_CACHE_SECONDS,
        group_ttl_seconds: float = GROUP_CACHE_SECONDS,
    ) -> None:
        self.user_ttl_seconds = user_ttl_seconds
        self.group_ttl_seconds = group_ttl_seconds
        self._users: dict[str, tuple[dict[str, Any], float]] = {}
        self._groups: dict[str, tuple[frozenset[str], float]] = {}

    async def user(self, client: AsyncWebClient, user_id: str) -> dict[str, Any] | None:
        """The ``users.info`` user object, or ``None`` when Slack could not say."""
        cached = _fresh(self._users.get(user_id))
        if cached is not None:
            return cached
        try:
            resp = await client.users_info(user=user_id)
        except SlackApiError as exc:
            log.warning("users.info failed for %s: %s", user_id, exc)
            return None
        user = dict(resp.get("user") or {})
        self._users[user_id] = (user, time.monotonic() + self.user_ttl_seconds)
        return user

    async def group_members(self, client: AsyncWebClient, group: str) -> frozenset[str] | None:
        """The user ids in a user group, or ``None`` when Slack could not say."""
        cached = _fresh(self._groups.get(group))
        if cached is not None:
            return cached
        try:
            resp = await client.usergroups_users_list(usergroup=group)
        except SlackApiError as exc:
            log.warning("usergroups.users.list failed for %s: %s", group, exc)
            return None
        members = frozenset(str(u) for u in resp.get("users") or [])
        self._groups[group] = (members, time.monotonic() + self.group_ttl_seconds)
        return members


def _fresh(entry: tuple[Any, float] | None) -> Any:
    return entry[0] if entry is not None and entry[1] > time.monotonic() else None
