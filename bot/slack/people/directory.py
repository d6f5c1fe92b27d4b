"""What Slack says about people and groups, asked once and remembered briefly.

``users.info`` (is this person an admin, which organisation are they from,
which locale they use Slack in) and
``usergroups.users.list`` (who is in a publishers group) are asked
by several parts of the bot; a burst of questions or uploads costs one call.
A person's ``users.info`` is the access rule's cache when there is one
(:meth:`bot.access.SlackDirectory.user`): who they are to the access rule and
how the surface speaks to them cost one call.
A failed call is remembered by nobody and answered as "unknown", so callers
decide what unknown means (it never grants a right). Who is in a channel is
the access rule's to ask (``bot.access``: one cache for every surface).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import SlackDirectory

log = logging.getLogger(__name__)

__all__ = ["Directory"]

T = TypeVar("T")

USER_CACHE_SECONDS = 300.0
GROUP_CACHE_SECONDS = 60.0
# Answers remembered of each kind; a workspace has more people, the oldest are asked again.
MAX_REMEMBERED = 10_000


class Directory:
    """A short-lived cache in front of ``users.info`` and ``usergroups.users.list``.

    Args:
        user_ttl_seconds: how long a person's ``users.info`` answer is remembered.
        group_ttl_seconds: how long a user group's members are remembered.
        capacity: the most answers remembered of each kind (people, groups);
            past it the oldest are forgotten, so a long-running
            process in a large workspace holds a bounded amount.
        people: the access rule's directory, whose cache of ``users.info`` is read
            instead of one of this directory's own; ``None``: this one asks.
    """

    def __init__(
        self,
        *,
        user_ttl_seconds: float = USER_CACHE_SECONDS,
        group_ttl_seconds: float = GROUP_CACHE_SECONDS,
        capacity: int = MAX_REMEMBERED,
        people: SlackDirectory | None = None,
    ) -> None:
        self.capacity = capacity
        self.people = people
        self.user_ttl_seconds = user_ttl_seconds
        self.group_ttl_seconds = group_ttl_seconds
        self._users: dict[str, tuple[dict[str, Any], float]] = {}
        self._groups: dict[str, tuple[frozenset[str], float]] = {}

    async def user(self, client: AsyncWebClient, user_id: str) -> dict[str, Any] | None:
        """The ``users.info`` user object, or ``None`` when Slack could not say."""
        if self.people is not None:
            return await self.people.user(user_id)

        async def ask() -> dict[str, Any]:
            # The locale too (``user.locale``, "fr-FR"): the language the person is spoken to in.
            resp = await client.users_info(user=user_id, include_locale=True)
            return dict(resp.get("user") or {})

        return await _remembered(self._users, user_id, self.user_ttl_seconds, ask, self.capacity)

    async def group_members(self, client: AsyncWebClient, group: str) -> frozenset[str] | None:
        """The user ids in a user group, or ``None`` when Slack could not say."""

        async def ask() -> frozenset[str]:
            resp = await client.usergroups_users_list(usergroup=group)
            return frozenset(str(u) for u in resp.get("users") or [])

        return await _remembered(self._groups, group, self.group_ttl_seconds, ask, self.capacity)


async def _remembered(
    cache: dict[str, tuple[T, float]],
    key: str,
    ttl: float,
    ask: Callable[[], Awaitable[T]],
    capacity: int = MAX_REMEMBERED,
) -> T | None:
    """``cache[key]`` while fresh, else ``ask()`` remembered for ``ttl`` s; ``None`` if Slack failed."""
    entry = cache.get(key)
    if entry is not None and entry[1] > time.monotonic():
        return entry[0]
    try:
        value = await ask()
    except SlackApiError as exc:
        log.warning("Slack could not tell about %s: %s", key, exc)
        return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Unreachable counts as refused: nobody gains a right because Slack could not be asked.
        log.warning("Slack could not be reached about %s: %s", key, type(exc).__name__)
        return None
    cache.pop(key, None)
    cache[key] = (value, time.monotonic() + ttl)
    _bound(cache, capacity)
    return value


def _bound(cache: dict[str, tuple[T, float]], capacity: int) -> None:
    """Forget what expired, then the oldest answers, until ``cache`` holds ``capacity``."""
    if len(cache) <= capacity:
        return
    now = time.monotonic()
    for key in [k for k, (_, until) in cache.items() if until <= now]:
        del cache[key]
    while len(cache) > capacity:
        del cache[next(iter(cache))]
