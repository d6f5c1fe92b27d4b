"""Who is a guest of the workspace: the one cache of the process, read whole and kept fresh.

A channel's answer is read by everyone in it: when a guest is among them it
holds only what a guest may read there (:meth:`bot.access.Access.guests_at`).
Asking ``users.info`` of every member of a channel would cost one call per
person; the directory lists the workspace's guests instead (Slack:
``users.list``, page by page, Tier 2), remembered for ``ttl_seconds`` and kept
up to date between two listings by what the directory says of one person
(Slack's ``user_change`` and ``team_join`` events: :meth:`Guests.heard`).

A listing runs on its own. Once the guests have been listed, the last listing
serves while the next one runs, and no question waits for it. Before the
first, a question waits ``wait_seconds`` at most (a large workspace's pages, or
a rate limit's ``Retry-After``, take longer); then the caller is told the
guests cannot be known (:class:`AccessCheckUnavailable`) and takes the channel
as having some. A listing that fails is forgotten (the
caller told so too), and for ``retry_seconds`` it is not asked again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from bot.access.directory import AccessCheckUnavailable, Directory

__all__ = ["GUESTS_RETRY_SECONDS", "GUESTS_TTL_SECONDS", "Guests", "is_guest"]

# A guest invited since the last listing is heard of at once (team_join, user_change)
# when the app gets those events; the listing itself is the fallback.
GUESTS_TTL_SECONDS = 600.0
# After a failed listing: not asked again for this long (a rate limit's window is a minute).
GUESTS_RETRY_SECONDS = 60.0
# The longest a question waits for a listing before it is answered without it.
GUESTS_WAIT_SECONDS = 5.0
GUESTS_UNKNOWN = "Slack cannot say now who is a guest of the workspace."


def is_guest(user: Mapping[str, Any]) -> bool:
    """Whether Slack's user object is a guest of the workspace (single- or multi-channel)."""
    return bool(user.get("is_restricted") or user.get("is_ultra_restricted"))


class Guests:
    """The workspace's guests as the directory lists them, remembered for ``ttl_seconds``.

    Args:
        directory: asked for the whole list on a miss (:meth:`Directory.guest_ids`).
        ttl_seconds: how long a listing is used.
        retry_seconds: how long after a failed listing it is not asked again.
        wait_seconds: the longest a caller waits for the first listing.
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        directory: Directory,
        *,
        ttl_seconds: float = GUESTS_TTL_SECONDS,
        retry_seconds: float = GUESTS_RETRY_SECONDS,
        wait_seconds: float = GUESTS_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.ttl_seconds = ttl_seconds
        self.retry_seconds = retry_seconds
        self.wait_seconds = wait_seconds
        self.clock = clock
        self._ids: set[str] | None = None
        self._until = 0.0
        self._failed_until = 0.0
        self._listing: asyncio.Task[frozenset[str]] | None = None
        # Who was heard of while a listing runs (id: whether a guest): its pages may be
        # older than what was heard, so what was heard is laid over the listing.
        self._heard: dict[str, bool] = {}

    async def ids(self) -> frozenset[str]:
        """The user ids of the workspace's guests now.

        Raises:
            AccessCheckUnavailable: the directory cannot list them now.
        """
        now = self.clock()
        if self._ids is not None and now < self._until:
            return frozenset(self._ids)
        if now < self._failed_until:
            raise AccessCheckUnavailable(GUESTS_UNKNOWN)
        if self._listing is None or self._listing.done():
            # One listing at a time, whoever asks: a burst of questions costs one.
            self._heard = {}
            self._listing = asyncio.create_task(self._list())
            self._listing.add_done_callback(_retrieved)
        if self._ids is not None:
            # The last listing serves while the next one runs: no question waits for it.
            return frozenset(self._ids)
        try:
            return await asyncio.wait_for(asyncio.shield(self._listing), self.wait_seconds)
        except TimeoutError as exc:
            raise AccessCheckUnavailable(GUESTS_UNKNOWN) from exc

    def forget(self) -> None:
        """Serve the last listing no more: what changed since may be unknown (another
        replica's news lost). The next caller waits for a new one, as for the first."""
        self._ids, self._until = None, 0.0

    def listed(self, user_id: str) -> bool:
        """Whether ``user_id`` is a guest in what this process knows now (no listing: no)."""
        return self._ids is not None and user_id in self._ids

    async def settled(self) -> None:
        """Return once the listing under way, if any, has ended (its failure is remembered)."""
        if self._listing is not None:
            await asyncio.wait([self._listing])

    async def _list(self) -> frozenset[str]:
        try:
            listed = await self.directory.guest_ids()
        except AccessCheckUnavailable:
            self._ids, self._failed_until = None, self.clock() + self.retry_seconds
            raise
        ids = set(listed)
        ids.update(user for user, guest in self._heard.items() if guest)
        ids.difference_update(user for user, guest in self._heard.items() if not guest)
        self._ids, self._until = ids, self.clock() + self.ttl_seconds
        return frozenset(ids)

    def heard(self, user: Mapping[str, Any]) -> None:
        """What the directory said of one person since (Slack's ``user_change``, ``team_join``).

        A person made a guest, or a guest made a member, counts at once; a
        deactivated person reads nothing anywhere, so is no guest to hide from.
        A listing running meanwhile may have read the person's page before: what
        was heard is laid over it when it ends.
        """
        user_id = user.get("id")
        if not isinstance(user_id, str) or not user_id:
            return
        guest = is_guest(user) and not user.get("deleted")
        if self._listing is not None and not self._listing.done():
            self._heard[user_id] = guest
        if self._ids is None:
            return  # nothing listed yet: the listing running, or the next one, says it
        if guest:
            self._ids.add(user_id)
        else:
            self._ids.discard(user_id)


def _retrieved(listing: asyncio.Task[frozenset[str]]) -> None:
    """Mark a listing's failure seen: a caller that stopped waiting does not see it."""
    if not listing.cancelled():
        listing.exception()
