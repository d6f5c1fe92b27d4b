"""Who is in each channel: the one membership cache of the process.

Every surface that asks whether a person is in a channel (answers in the DM,
suggested prompts, the Home tab, Work Objects, the viewer, MCP tools, feedback
clicks) asks :class:`Memberships`, so a channel's members cost one directory
call per ``ttl_seconds`` whichever surface asks first. What is remembered is
bounded by member ids, not by channels: a channel counts its members plus one,
and past ``capacity`` the least recently used channels are forgotten. A
failed lookup is never remembered.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from cachetools import TLRUCache

from bot.access.directory import Directory

__all__ = ["MAX_MEMBER_IDS", "MEMBERS_TTL_SECONDS", "Memberships"]

# Short: someone removed from a channel soon stops reading its documents; long
# enough that a page and its PDF, or a burst of questions, cost one lookup.
MEMBERS_TTL_SECONDS = 60.0
# Member ids remembered in all (each channel counts one more): tens of megabytes at most.
MAX_MEMBER_IDS = 1_000_000


class Memberships:
    """Channel members as the directory says them, remembered for ``ttl_seconds``.

    Args:
        directory: asked on a miss.
        ttl_seconds: how long an answer is remembered (read at each insertion).
        capacity: the most member ids remembered, all channels together.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        directory: Directory,
        *,
        ttl_seconds: float = MEMBERS_TTL_SECONDS,
        capacity: int = MAX_MEMBER_IDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.ttl_seconds = ttl_seconds
        self.capacity = capacity
        self.clock = clock
        self._cache: TLRUCache[str, frozenset[str]] = TLRUCache(
            maxsize=capacity,
            ttu=lambda _key, _value, now: now + self.ttl_seconds,
            timer=lambda: self.clock(),
            getsizeof=lambda members: len(members) + 1,
        )
        # Channels forgotten while their members were being asked (their askers): that
        # answer may be from before the change, so it is not remembered.
        self._asking: dict[str, int] = {}
        self._forgotten: set[str] = set()

    async def of(self, channel: str) -> frozenset[str]:
        """The user ids in ``channel``.

        Raises:
            AccessCheckUnavailable: the directory cannot say now (nothing is remembered).
        """
        cached = self._cache.get(channel)
        if cached is not None:
            return cached
        self._asking[channel] = self._asking.get(channel, 0) + 1
        try:
            members = await self.directory.channel_members(channel)
        finally:
            self._asking[channel] -= 1
            stale = channel in self._forgotten
            if not self._asking[channel]:
                del self._asking[channel]
                self._forgotten.discard(channel)
        if stale:
            return members  # forgotten meanwhile: it serves this caller only
        # More members than the whole cache holds: not remembered, asked again next time.
        with contextlib.suppress(ValueError):
            self._cache[channel] = members
        return members

    def forget(self, channel: str) -> None:
        """Ask the directory again next time (someone joined or left ``channel``), and
        remember no answer already on its way."""
        self._cache.pop(channel, None)
        if channel in self._asking:
            self._forgotten.add(channel)

    @property
    def remembered(self) -> int:
        """Member ids remembered now (each channel counts one more)."""
        self._cache.expire()
        return int(self._cache.currsize)
