"""Who may read what: one rule, asked by every surface.

A person (:class:`Person`) reads a document when

1. they are served at all: of the organisation the knowledge base serves (the
   directory's home workspace), or anyone when ``KB_ALLOW_EXTERNAL`` is on; a
   person whose workspace nobody can tell, or whom the directory says is
   deactivated, is not. A guest of the workspace (Slack's single- and
   multi-channel guests: ``users.info`` ``is_restricted``) is served only what
   Slack would show them: their own channels' documents and the synced ones a
   source names them for (by email, domain or group), neither those for
   everyone nor those public in the organisation;
2. every restriction the document carries admits them: a document for everyone
   (scope ``*``) admits everyone served; a channel's document admits the
   channel's members now (:class:`bot.access.members.Memberships`). A
   source's permissions (users, groups, domain, public in the organisation)
   are one more restriction of the same kind: a document may carry a channel
   scope, a source's permissions, or both, and each must admit the person;
3. when the words are shown where others read them too (:class:`Where`: an
   answer or a Work Object in a channel), that place may read the document:
   a channel reads its own documents and those for everyone, and a
   conversation shared with another organisation (Slack Connect) only its own,
   unless ``KB_ALLOW_EXTERNAL`` is on. A channel a guest of the workspace is in
   (:class:`bot.access.guests.Guests` against its members), or one nobody can
   say has none, reads only its own: neither the documents for everyone nor the
   synced ones public in the organisation, which a guest may not read.

Unknown is hidden: a membership the directory cannot give now, a workspace
nobody can tell, a document whose permissions are not known, admit nobody.

A synced document (Confluence...) carries its source's permissions
(:class:`index.sources.Acl`) and no channel: it admits a person whose email,
as the directory verified it, is a user entry, whose email's domain is a
domain entry, or who is a member of a group entry (the source's API expanded
it; a group of another source with the same name is another group); or
everyone served, when it is public in the organisation. A person
without a verified email reads only the public ones; permissions not read
(``unknown``) admit nobody. Shown where others read too (an answer in a
channel), only a public one: everyone there reads it.

A search is filtered before the gate by the scopes :meth:`Access.search_scopes`
returns (a refusal never reveals what a hidden document holds): the place's
own channel, and those of the channels offered (the channel a DM's asker is
viewing; every channel of the knowledge base for a tool call or ``kb ask --as``)
that the person is a member of now, and the synced documents they may read
there (:meth:`Access.source_scopes`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol

from bot.access.directory import AccessCheckUnavailable, Directory, Profile
from bot.access.grants import SourceGrants
from bot.access.guests import Guests
from bot.access.members import Memberships
from bot.access.news import PeopleNews
from index.errors import KBError
from index.models import EVERYONE, OnlyScopes
from index.sources import Acl, is_source_scope
from index.storage import PeopleHeard

log = logging.getLogger(__name__)

__all__ = [
    "Access",
    "NotServed",
    "Decision",
    "Person",
    "Readable",
    "Rule",
    "Where",
    "admitted",
    "only_its_own",
    "shown_at",
    "visible",
]

NO_DIRECTORY = (
    "Nobody can say who is in a channel without SLACK_BOT_TOKEN: an admin sets it, "
    "and until then only the documents for everyone are read."
)


class NotServed(KBError):
    """The person is not served by this knowledge base (another organisation, or deactivated)."""


@dataclass(frozen=True)
class Person:
    """Who reads.

    Today a Slack user; a source's identities (matched by verified email) join
    them here when documents carry a source's permissions.

    Attributes:
        user_id: their Slack user id.
        team_id: the workspace Slack said they act from; ``None``: not said,
            the directory is asked.
    """

    user_id: str
    team_id: str | None = None


@dataclass(frozen=True)
class Where:
    """Where the words are shown, and so who else reads them.

    Where the person reads alone (a DM, the viewer, a tool call, the command
    line) there is no ``Where``: ``None``.

    Attributes:
        channel: the channel whose people all read them (an answer, an unfurl
            posted there); ``None``: a conversation not known yet (a message
            being written).
        shared: people of other organisations are there too (Slack Connect).
    """

    channel: str | None = None
    shared: bool = False


class Readable(Protocol):
    """A document as the rule sees it: the restrictions it carries."""

    @property
    def scope(self) -> str:
        """``*`` (everyone) or the channel it belongs to."""


class Rule(StrEnum):
    """Which part of the rule decided."""

    EVERYONE = "everyone"
    CHANNEL = "channel"
    PLACE = "place"
    ORGANISATION = "organisation"
    SOURCE = "source"


@dataclass(frozen=True)
class Decision:
    """Whether a person may read something, and why.

    Attributes:
        allowed: they may.
        rule: the part of the rule that decided.
        reason: the why, as a sentence (for the log and ``kb access explain``).
        channel: the channel the decision is about, if any.
        member: the person is in it as the directory says now; ``None``: not asked or unknown.
        unknown: the directory could not say, so it is hidden.
    """

    allowed: bool
    rule: Rule
    reason: str
    channel: str | None = None
    member: bool | None = None
    unknown: bool = False

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {**asdict(self), "rule": str(self.rule)}


def admitted(team: str | None, home: str | None, *, allow_external: bool) -> bool:
    """The organisation part of the rule: ``team`` is the served one, or everyone is served.

    A team nobody could tell counts as another organisation: unknown grants nothing.
    """
    return allow_external or bool(home and team and team == home)


def visible(scopes: frozenset[str] | None, scope: str) -> bool:
    """Whether a search filtered by ``scopes`` sees documents of ``scope``.

    Documents for everyone come with any scopes, unless they are :class:`OnlyScopes`;
    ``None`` sees everything.
    """
    if scopes is None:
        return True
    if isinstance(scopes, OnlyScopes):
        return scope in scopes
    return scope == EVERYONE or scope in scopes


def only_its_own(where: Where | None, *, allow_external: bool) -> bool:
    """Whether only the place's own documents may be shown at ``where`` (Slack Connect)."""
    return where is not None and where.shared and not allow_external


def shown_at(where: Where | None, *, allow_external: bool, guests: bool = False) -> frozenset[str]:
    """The scopes everyone at ``where`` may read, before anyone's own channels.

    A channel's own documents (everyone reading there is in it: Slack lets only
    its members post there), with those for everyone; in a place shared with
    another organisation, or where ``guests`` of the workspace read too, only
    its own (an :class:`OnlyScopes`).
    """
    own = frozenset({where.channel}) if where is not None and where.channel else frozenset()
    if guests or only_its_own(where, allow_external=allow_external):
        return OnlyScopes(own)
    return own


class Access:
    """The rule, over a directory of people and places (none: nobody can say who is where).

    Args:
        directory: who is who and in which channel; ``None`` without one (no bot token).
        allow_external: serve people of other organisations too (``KB_ALLOW_EXTERNAL``).
        members: the channel members cache; one over ``directory`` by default.
        grants: the synced documents' permissions; ``None``: no synced document is read.
        guests: the workspace's guests cache; one over ``directory`` by default.
        heard: the store's record of what Slack said of people and channels, shared
            by the replicas (``bot.access.news``); ``None``: this process's lists only.
    """

    def __init__(
        self,
        directory: Directory | None,
        *,
        allow_external: bool,
        members: Memberships | None = None,
        grants: SourceGrants | None = None,
        guests: Guests | None = None,
        heard: PeopleHeard | None = None,
    ) -> None:
        self.directory = directory
        self.allow_external = allow_external
        self.members = members or (Memberships(directory) if directory is not None else None)
        self.guests = guests or (Guests(directory) if directory is not None else None)
        self.grants = grants
        self.news = (
            PeopleNews(heard, directory, self.guests, self.members)
            if heard is not None
            and directory is not None
            and self.guests is not None
            and self.members is not None
            else None
        )

    # ------------------------------------------------------------ people

    async def served(self, person: Person, *, known: bool = False) -> Decision:
        """Whether ``person`` is served at all (the organisation part of the rule).

        Without a directory a person named by an admin (a token, the command
        line: no workspace said) is taken as of this workspace; one who says
        their workspace cannot be checked and is not served. A person the
        directory says is deactivated is never served, whatever said their
        workspace: a viewer's session cookie or a token outlives its person's
        account. ``known``: the directory must know the person too, though their
        workspace was said (a request Slack signed names a user id the server
        cannot otherwise check): one it cannot find is not served either.

        Raises:
            AccessCheckUnavailable: the directory cannot say which workspace it serves, or
                the store what the other replicas heard of people.
        """
        if self.directory is None:
            if person.team_id is None:
                return Decision(True, Rule.ORGANISATION, _UNCHECKED.format(user=person.user_id))
            return Decision(False, Rule.ORGANISATION, _NO_WORKSPACE, unknown=True)
        # Asked even when the workspace was said (one users.info, remembered a while).
        profile = await self._profile(person.user_id)
        if profile is not None and profile.deleted:
            return Decision(False, Rule.ORGANISATION, _DEACTIVATED.format(user=person.user_id))
        if profile is None and known and person.team_id is not None:
            return Decision(
                False, Rule.ORGANISATION, _UNKNOWN.format(user=person.user_id), unknown=True
            )
        team = person.team_id or (profile.team_id if profile is not None else None)
        if self.allow_external:
            return Decision(True, Rule.ORGANISATION, _EXTERNAL_ALLOWED)
        if team is None:
            return Decision(
                False, Rule.ORGANISATION, _NO_TEAM.format(user=person.user_id), unknown=True
            )
        home = await self.directory.home_team()
        if admitted(team, home, allow_external=False):
            return Decision(True, Rule.ORGANISATION, _OURS.format(user=person.user_id, team=home))
        return Decision(
            False, Rule.ORGANISATION, _OTHER.format(user=person.user_id, team=team or "unknown")
        )

    async def in_channel(self, person: Person, channel: str) -> Decision:
        """Whether ``person`` is in ``channel`` now, as the directory says (unknown: not)."""
        if self.members is None:
            return Decision(False, Rule.CHANNEL, NO_DIRECTORY, channel=channel, unknown=True)
        try:
            members = await self._members_of(channel)
        except AccessCheckUnavailable as exc:
            log.warning("who is in %s cannot be known now: %s", channel, exc)
            reason = _UNKNOWN_MEMBERS.format(channel=channel, why=exc)
            return Decision(False, Rule.CHANNEL, reason, channel=channel, unknown=True)
        member = person.user_id in members
        reason = (_MEMBER if member else _NOT_MEMBER).format(user=person.user_id, channel=channel)
        return Decision(member, Rule.CHANNEL, reason, channel=channel, member=member)

    async def guests_at(self, where: Where | None) -> bool:
        """Whether a guest of the workspace reads along at ``where``, or nobody can say none does.

        Nobody reads along alone (``None``), nor, without a directory, anywhere
        (nobody can tell a guest: see :meth:`guest`). The workspace's guests are
        listed first (one listing serves every channel), and only when there
        are some is the channel asked who is in it; a conversation not known
        yet (a link in a message being written) may hold any of them. A
        channel the directory cannot see (Slack: ``channel_not_found``) has no
        members it knows of: the bot cannot post there either.
        """
        if where is None or self.members is None or self.guests is None:
            return False
        try:
            await self._caught_up()
            guests = await self.guests.ids()
            if not guests:
                return False
            if where.channel is None:
                return True
            members = await self.members.of(where.channel)
        except AccessCheckUnavailable as exc:
            log.warning("whether guests read in %s cannot be known now: %s", where.channel, exc)
            return True
        return not guests.isdisjoint(members)

    async def person_changed(self, user: dict[str, Any]) -> None:
        """Slack said this of a person (``user_change``, ``team_join``): counts at once, on
        every replica (``bot.access.news``)."""
        user_id = user.get("id")
        if self.directory is not None and isinstance(user_id, str) and user_id:
            # Whether they are a guest or deactivated is asked again, not read from before.
            self.directory.forget(user_id)
        if self.news is not None:
            await self.news.person(user)
        elif self.guests is not None:
            self.guests.heard(user)

    async def channel_changed(self, channel: str) -> None:
        """Someone joined or left ``channel``: its members are asked again, on every replica."""
        if self.news is not None:
            await self.news.channel(channel)
        elif self.members is not None:
            self.members.forget(channel)

    async def _caught_up(self) -> None:
        """What the other replicas heard of people and channels, applied here first.

        Raises:
            AccessCheckUnavailable: the store cannot say now.
        """
        if self.news is not None:
            await self.news.catch_up()

    async def _profile(self, user_id: str) -> Profile | None:
        """What the directory says of ``user_id``, once what the other replicas heard of
        people has been applied (a person made a guest or deactivated is asked again).

        Raises:
            AccessCheckUnavailable: the store cannot say now.
        """
        assert self.directory is not None
        await self._caught_up()
        return await self.directory.profile(user_id)

    async def _members_of(self, channel: str) -> frozenset[str]:
        assert self.members is not None
        await self._caught_up()
        return await self.members.of(channel)

    # ------------------------------------------------------------ documents

    def shown_at(self, where: Where | None) -> frozenset[str]:
        """The scopes everyone at ``where`` may read, guests aside (see :func:`shown_at`)."""
        return shown_at(where, allow_external=self.allow_external)

    async def shown_to_all(self, where: Where | None) -> frozenset[str]:
        """The scopes everyone at ``where`` may read, guests reading along included."""
        guests = await self.guests_at(where)
        return shown_at(where, allow_external=self.allow_external, guests=guests)

    def only_its_own(self, where: Where | None) -> bool:
        """Whether only the place's own documents may be shown there (Slack Connect)."""
        return only_its_own(where, allow_external=self.allow_external)

    async def may_read(
        self, person: Person, document: Readable | str, where: Where | None = None
    ) -> Decision:
        """Whether ``person`` may read ``document`` (or documents of that scope) at ``where``.

        ``where``: the place the words are shown to others too; ``None``: to ``person`` alone.

        Raises:
            AccessCheckUnavailable: the directory cannot say which workspace it serves.
        """
        return (await self.explain(person, document, where))[-1]

    async def explain(
        self, person: Person, document: Readable | str, where: Where | None = None
    ) -> list[Decision]:
        """The checks :meth:`may_read` makes, in order: the first refusal, or the last, decides.

        Raises:
            AccessCheckUnavailable: the directory cannot say which workspace it serves.
        """
        scope = document if isinstance(document, str) else document.scope
        checks = [await self.served(person)]
        if checks[-1].allowed and where is not None:
            checks.append(await self.readable_at(scope, where))
        if checks[-1].allowed:
            if scope == EVERYONE and await self.guest(person):
                checks.append(Decision(False, Rule.EVERYONE, _GUEST.format(user=person.user_id)))
            elif scope == EVERYONE:
                checks.append(Decision(True, Rule.EVERYONE, _FOR_EVERYONE))
            elif is_source_scope(scope):
                checks.append(await self.source_decision(person, scope))
            else:
                checks.append(await self.in_channel(person, scope))
        return checks

    async def readable_at(self, scope: str, where: Where) -> Decision:
        """Whether everyone at ``where`` may read documents of ``scope`` (the place part of
        the rule): what an answer or a hand-off posted there may show, whoever wrote it."""
        if is_source_scope(scope):
            return await self._source_at(scope, where)
        return await self._at(scope, where)

    async def readable_among(
        self, scopes: Iterable[str], *, person: Person | None = None, where: Where | None = None
    ) -> frozenset[str]:
        """Those of ``scopes`` whose documents may be named: to ``person`` (alone, or at
        ``where``), or, without a person, to everyone at ``where``; neither: none.

        Unknown is hidden: a scope the directory cannot decide now is left out.
        """
        readable = set()
        for scope in dict.fromkeys(scopes):
            try:
                if person is not None:
                    decision = await self.may_read(person, scope, where)
                elif where is not None:
                    decision = await self.readable_at(scope, where)
                else:
                    break
            except AccessCheckUnavailable as exc:
                log.warning("whether %s may be named cannot be known now: %s", scope, exc)
                continue
            if decision.allowed:
                readable.add(scope)
        return frozenset(readable)

    # ------------------------------------------------------------ synced documents

    async def guest(self, person: Person) -> bool:
        """Whether ``person`` reads only their own places' documents: a guest of the
        workspace, or one the directory cannot say is not. Without a directory a person
        named by an admin is taken as a member, as :meth:`served` takes them."""
        if self.directory is None:
            return False
        try:
            profile = await self._profile(person.user_id)
        except AccessCheckUnavailable:
            return True
        return profile is None or profile.guest

    async def email_of(self, person: Person) -> str | None:
        """``person``'s email as the directory verified it; ``None``: none known."""
        if self.directory is None:
            return None
        try:
            profile = await self._profile(person.user_id)
        except AccessCheckUnavailable:
            return None
        return profile.email if profile is not None else None

    async def source_decision(self, person: Person, scope: str) -> Decision:
        """Whether the permissions of the synced document of ``scope`` admit ``person``."""
        if self.grants is None:
            return Decision(False, Rule.SOURCE, _NO_GRANTS, unknown=True)
        acl = await self.grants.acl(scope)
        if not acl.known:
            return Decision(False, Rule.SOURCE, _ACL_UNKNOWN, unknown=True)
        if acl.public and not await self.guest(person):
            return Decision(True, Rule.SOURCE, _ACL_PUBLIC.format(until=acl.ending("public")))
        email = await self.email_of(person)
        if email is None:
            return Decision(False, Rule.SOURCE, _NO_EMAIL.format(user=person.user_id))
        return await self._admitted_by(acl, email, person, scope)

    async def _admitted_by(self, acl: Acl, email: str, person: Person, scope: str) -> Decision:
        user = person.user_id
        if email in acl.users:
            until = acl.ending("user", email)
            return Decision(
                True, Rule.SOURCE, _ACL_USER.format(user=user, email=email, until=until)
            )
        domain = email.rsplit("@", 1)[-1]
        if domain in acl.domains:
            until = acl.ending("domain", domain)
            reason = _ACL_DOMAIN.format(user=user, email=email, until=until)
            return Decision(True, Rule.SOURCE, reason)
        assert self.grants is not None
        groups = sorted(await self.grants.groups_of(email, scope) & acl.groups)
        if groups:
            until = acl.ending("group", groups[0])
            reason = _ACL_GROUP.format(user=user, email=email, group=groups[0], until=until)
            return Decision(True, Rule.SOURCE, reason)
        return Decision(False, Rule.SOURCE, _ACL_NONE.format(user=user, email=email))

    async def _source_at(self, scope: str, where: Where) -> Decision:
        """Whether everyone at ``where`` may read the synced document of ``scope``: a public one."""
        place = where.channel or "a conversation not posted yet"
        if self.only_its_own(where):
            return Decision(False, Rule.PLACE, _SHARED.format(place=place), channel=where.channel)
        if await self.guests_at(where):
            return Decision(False, Rule.PLACE, _GUESTS.format(place=place), channel=where.channel)
        acl = await self.grants.acl(scope) if self.grants is not None else None
        if acl is not None and acl.known and acl.public:
            return Decision(
                True, Rule.PLACE, _PUBLIC_THERE.format(place=place), channel=where.channel
            )
        return Decision(False, Rule.PLACE, _NAMED_PEOPLE.format(place=place), channel=where.channel)

    async def source_scopes(self, person: Person, where: Where | None = None) -> frozenset[str]:
        """The scopes of the synced documents ``person`` may read at ``where``.

        Alone (``where`` ``None``): those their verified email, its domain or
        their source groups are granted, and the public ones. Where others read
        too: the public ones only; none in a place shared with another organisation.
        """
        if self.grants is None or self.only_its_own(where):
            return frozenset()
        if where is not None and await self.guests_at(where):
            return frozenset()  # a guest reads along: nothing public in the organisation
        email = await self.email_of(person) if where is None else None
        if await self.guest(person):
            return await self.grants.readable(email, public=False) if email else frozenset()
        return await self.grants.readable(email)

    async def narrowed(self, scopes: frozenset[str]) -> frozenset[str]:
        """``scopes`` as a token narrowed to some channels (``--scope``) reads them.

        The token stands for a part of what its person reads: the channels it
        names and what is for everyone. Of the synced documents that is the
        ones public in the organisation, never those the person's own email or
        source groups are granted.
        """
        public = await self.grants.readable(None) if self.grants is not None else frozenset()
        kept = frozenset(s for s in scopes if not is_source_scope(s) or s in public)
        return OnlyScopes(kept) if isinstance(scopes, OnlyScopes) else kept

    async def readable_channels(
        self, person: Person, channels: Iterable[str], *, strict: bool = False
    ) -> frozenset[str]:
        """Those of ``channels`` whose documents ``person`` may read: the ones they are in now.

        The caller has checked that ``person`` is served. A channel whose
        members cannot be known is left out, or with ``strict`` raises (the
        caller tells the person to try again).

        Raises:
            AccessCheckUnavailable: ``strict``, and a channel's members cannot be known.
        """
        if self.members is None:
            return frozenset()  # nobody can say who is in a channel: none is readable
        try:
            # Once for every channel: a read of the store each would cost a question hundreds.
            await self._caught_up()
        except AccessCheckUnavailable as exc:
            if strict:
                raise
            log.warning("who is in which channel cannot be known now: %s", exc)
            return frozenset()
        readable = set()
        for channel in dict.fromkeys(channels):
            try:
                members = await self.members.of(channel)
            except AccessCheckUnavailable as exc:
                if strict:
                    raise
                log.warning(
                    "who is in %s cannot be known now, so it adds nothing: %s", channel, exc
                )
                continue
            if person.user_id in members:
                readable.add(channel)
        return frozenset(readable)

    async def search_scopes(
        self,
        person: Person,
        where: Where | None = None,
        offered: Iterable[str] = (),
        *,
        strict: bool = False,
    ) -> frozenset[str]:
        """The scopes a search for ``person``, shown at ``where``, is filtered by.

        :meth:`shown_at` ``where``, plus those of the ``offered`` channels
        ``person`` is a member of now; an :class:`OnlyScopes` in a place
        shared with another organisation. The caller has checked that
        ``person`` is served.

        Raises:
            AccessCheckUnavailable: ``strict``, and a channel's members cannot be known.
        """
        shown = await self.shown_to_all(where)
        rest = [c for c in offered if c != EVERYONE and c not in shown and not is_source_scope(c)]
        channels = shown | await self.readable_channels(person, rest, strict=strict)
        if isinstance(shown, OnlyScopes):  # shared with another organisation, or guests there
            return OnlyScopes(channels)
        scopes = frozenset(channels | await self.source_scopes(person, where))
        return OnlyScopes(scopes) if await self.guest(person) else scopes

    async def _at(self, scope: str, where: Where) -> Decision:
        """Whether everyone at ``where`` may read documents of ``scope``."""
        place = where.channel or "a conversation not posted yet"
        shown = await self.shown_to_all(where)
        if visible(shown, scope):
            return Decision(True, Rule.PLACE, _SHOWN.format(place=place), channel=where.channel)
        if self.only_its_own(where):
            return Decision(False, Rule.PLACE, _SHARED.format(place=place), channel=where.channel)
        if isinstance(shown, OnlyScopes) and scope == EVERYONE:
            return Decision(False, Rule.PLACE, _GUESTS.format(place=place), channel=where.channel)
        reason = _NOT_THERE.format(channel=scope, place=place)
        return Decision(False, Rule.PLACE, reason, channel=where.channel)


_UNCHECKED = (
    "{user} was named by an admin (a token or the command line) and nobody can check "
    "their workspace without SLACK_BOT_TOKEN: they are served the documents for everyone."
)
_NO_WORKSPACE = (
    "Nobody can say which workspace a Slack person belongs to without SLACK_BOT_TOKEN, "
    "so a person who says theirs is not served."
)
_NO_TEAM = (
    "Slack could not say which workspace {user} belongs to, so they are not served "
    "(unknown is hidden)."
)
_DEACTIVATED = "Slack says {user} is deactivated: they are served no more."
_UNKNOWN = "Slack does not know {user}, so they are not served (unknown is hidden)."
_EXTERNAL_ALLOWED = "KB_ALLOW_EXTERNAL is on: people of every organisation are served."
_OURS = "{user} belongs to workspace {team}, the one the knowledge base serves."
_OTHER = (
    "{user} belongs to another organisation (team {team}); KB_ALLOW_EXTERNAL is off, "
    "so they are not served."
)
_FOR_EVERYONE = "It is a document for everyone, and everyone served reads those."
_GUEST = (
    "It is a document for everyone, and {user} is a guest of the workspace (or Slack cannot "
    "say they are not): a guest reads only the documents of their own channels and what a "
    "source names them for."
)
_MEMBER = "It belongs to channel {channel}, and Slack lists {user} among its members now."
_NOT_MEMBER = (
    "It belongs to channel {channel}, and Slack does not list {user} among its members now."
)
_UNKNOWN_MEMBERS = "It belongs to channel {channel}. {why} Unknown is hidden."
_NOT_THERE = "It belongs to channel {channel}, and it is not shown in {place}."
_SHOWN = "{place} shows the documents for everyone and its own."
_NO_GRANTS = "It was synced from a source, and no source permissions are known here: hidden."
_ACL_UNKNOWN = (
    "It was synced from a source whose permissions for it could not be read: "
    "nobody reads it until they are (unknown is hidden)."
)
_ACL_PUBLIC = "Its source makes it public in the organisation{until}: everyone served reads it."
_NO_EMAIL = (
    "Its source names the people who may read it, and the directory has no verified email "
    "for {user} to match them by: they read only what is public in the organisation."
)
_ACL_USER = "Its source lets {email} read it{until}, the verified email of {user}."
_ACL_DOMAIN = "Its source lets the domain of {email} ({user}'s verified email) read it{until}."
_ACL_GROUP = "Its source lets group {group} read it{until}, and {email} ({user}) is a member."
_ACL_NONE = (
    "Its source does not let {email} ({user}'s verified email) read it: not by name, "
    "domain or group."
)
_PUBLIC_THERE = "It is public in the organisation, so {place} may show it."
_NAMED_PEOPLE = (
    "Its source lets only named people read it, and everyone in {place} would read it there."
)
_GUESTS = (
    "A guest of the workspace reads in {place} too (or Slack cannot say none does): only its "
    "own documents are shown there, as a guest reads neither those for everyone nor those "
    "public in the organisation."
)
_SHARED = (
    "{place} is shared with another organisation: only its own documents are shown there "
    "(KB_ALLOW_EXTERNAL is off)."
)
