"""The directory contract: what the access rule asks of whoever knows people and places.

Slack is the directory today (``bot.access.slack``): the workspace the bot
serves (``auth.test``), a person's workspace and whether they are still active
(``users.info``), a channel's members (``conversations.members``), the
workspace's guests (``users.list``). A source's
identities and groups are asked the same way when documents carry a source's
permissions: a person is matched to a source's identities by the email the
directory verified. Whatever cannot be answered raises :class:`AccessCheckUnavailable`,
and the rule treats it as unknown: unknown grants nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from index.errors import KBError

__all__ = ["AccessCheckUnavailable", "Directory", "Profile"]


class AccessCheckUnavailable(KBError):
    """Who may read a document could not be checked now (the directory is unreachable)."""

    status = 503


@dataclass(frozen=True)
class Profile:
    """What the directory says of a person.

    Attributes:
        team_id: the workspace they belong to; ``None`` when it names none.
        deleted: deactivated (they left the organisation).
        email: their email as the directory verified it (lower-cased); ``None``: none
            verified, or not shown: they are matched to no source identity.
        guest: a guest of the workspace (Slack's single- and multi-channel guests), who
            sees only the places they were let into.
    """

    team_id: str | None
    deleted: bool = False
    email: str | None = None
    guest: bool = False


class Directory(Protocol):
    """Who is who, and who is in which place."""

    async def home_team(self) -> str:
        """The workspace (organisation) the knowledge base serves.

        Raises:
            AccessCheckUnavailable: the directory cannot say now.
        """

    async def profile(self, user_id: str) -> Profile | None:
        """What the directory says of ``user_id``; ``None`` when it could not say."""

    def forget(self, user_id: str) -> None:
        """Ask again next time what :meth:`profile` says of ``user_id``: Slack said the person
        changed (made a guest, deactivated), which what was remembered does not say."""

    async def channel_members(self, channel: str) -> frozenset[str]:
        """The user ids in ``channel`` now (none for a channel the directory cannot see).

        Raises:
            AccessCheckUnavailable: the directory cannot say now.
        """

    async def guest_ids(self) -> frozenset[str]:
        """The user ids of every guest of the workspace now (see :class:`Profile`).

        Raises:
            AccessCheckUnavailable: the directory cannot say now.
        """
