"""What Slack told another replica of people and channels, laid over this process's lists.

Slack delivers each event to one replica: a member made a guest
(``user_change``), a guest invited (``team_join``), someone who joined or left a
channel (``member_joined_channel``, ``member_left_channel``). The replica that
hears it applies it to its own lists (:class:`bot.access.Guests`,
:class:`bot.access.Memberships`) and writes it to the shared store
(``index.storage.people_heard``); every replica reads what was written since it
last looked before it decides who reads along in a channel or who is in one,
or serves a person (whose profile, made a guest or deactivated, it then asks the
directory for again).
So a guest who joined a channel through replica A does not read an answer
replica B posts there a moment later from the members it listed before.

A store that cannot be read now is an access check that cannot be made
(:class:`AccessCheckUnavailable`): the caller takes a guest as present, or the
person as outside the channel. One that cannot be written loses only the other
replicas' news: they learn it when their own lists run out (ten minutes for the
guests, one for a channel's members).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from bot.access.directory import AccessCheckUnavailable, Directory
from bot.access.guests import Guests, is_guest
from bot.access.members import Memberships
from index.storage import HEARD_KEEP_SECONDS, Heard, HeardKind, PeopleHeard

__all__ = ["NEWS_UNKNOWN", "PeopleNews"]

log = logging.getLogger(__name__)

NEWS_UNKNOWN = "The store cannot say now what the other replicas heard of people and channels."


class PeopleNews:
    """This process's lists of guests and members, kept level with what any replica heard.

    Args:
        heard: the store's record of what was heard.
        directory: whose remembered profile of a person heard of is asked again.
        guests: this process's guests.
        members: this process's channel members.
    """

    def __init__(
        self, heard: PeopleHeard, directory: Directory, guests: Guests, members: Memberships
    ) -> None:
        self.heard = heard
        self.directory = directory
        self.guests = guests
        self.members = members
        self._last = 0
        # When this process last read what was heard (the store's clock); None: never.
        self._looked_at: float | None = None
        # The rows of the late window already applied, and those this process wrote.
        self._seen: set[int] = set()
        self._own: set[int] = set()
        self._one = asyncio.Lock()

    async def person(self, user: Mapping[str, Any]) -> None:
        """Slack said this of a person (``user_change``, ``team_join``): here at once, and for
        the other replicas when it makes or unmakes a guest."""
        user_id = user.get("id")
        if not isinstance(user_id, str) or not user_id:
            return
        was_guest = self.guests.listed(user_id)
        self.guests.heard(user)
        if is_guest(user) and not user.get("deleted"):
            await self._record("guest", user_id)
        elif was_guest or user.get("deleted"):
            # A deactivated person too: every replica asks again, and serves them nothing.
            await self._record("member", user_id)

    async def channel(self, channel: str) -> None:
        """Someone joined or left ``channel``: asked again here, and on the other replicas."""
        self.members.forget(channel)
        await self._record("channel", channel)

    async def catch_up(self) -> None:
        """Apply what the other replicas heard since the last look.

        Raises:
            AccessCheckUnavailable: the store cannot be read now.
        """
        async with self._one:
            now = self.heard.clock()
            try:
                rows = await asyncio.to_thread(self.heard.since, self._last)
            except Exception as exc:  # a store down is one check that cannot be made
                log.warning("cannot read what the other replicas heard: %s", exc)
                raise AccessCheckUnavailable(NEWS_UNKNOWN) from exc
            if self._looked_at is not None and now - self._looked_at >= HEARD_KEEP_SECONDS:
                # Rows written since the last look may be gone: the guests listed before
                # (served past their time while the next listing runs) may miss one.
                self.guests.forget()
            self._looked_at = now
            for row in rows:
                if row.id not in self._seen and row.id not in self._own:
                    self._apply(row)
            returned = {row.id for row in rows}
            self._last = max([self._last, *returned])
            self._seen = returned
            self._own = {i for i in self._own if i in returned or i > self._last}

    def _apply(self, row: Heard) -> None:
        if row.kind == "channel":
            self.members.forget(row.subject)
        else:
            self.directory.forget(row.subject)
            self.guests.heard({"id": row.subject, "is_restricted": row.kind == "guest"})

    async def _record(self, kind: HeardKind, subject: str) -> None:
        try:
            self._own.add(await asyncio.to_thread(self.heard.record, kind, subject))
        except Exception as exc:  # the others learn it when their own lists run out
            log.warning("cannot tell the other replicas what Slack said of %s: %s", subject, exc)
