"""The connector contract: what a place documents live in (Confluence, a drive, Notion) gives.

A :class:`Connector` answers four questions, each on its own so that each can
run on its own schedule:

* :meth:`Connector.load` — every document, from scratch (a first sync);
* :meth:`Connector.poll` — what changed since a checkpoint it gave before;
* :meth:`Connector.listing` — the ids of every document there now, and
  nothing else (cheap): what is in the knowledge base and not in the listing
  was deleted, or moved out of reach, and is removed;
* :meth:`Connector.permissions` — the current :class:`Acl` of documents
  already synced, and the members of the groups they name, without fetching
  their content again.

A :class:`SourceDocument` carries its bytes and media type, never text: the
product extracts and chunks it itself, so every passage keeps exact offsets.
It carries its :class:`Acl` too; a connector that cannot read a document's
permissions gives :data:`UNKNOWN_ACL`, which admits nobody.

Errors a connector raises are :class:`SourceFailed` (its ``retry_after``
says when a rate-limited or failing source may be asked again) and
:class:`SourceCredentialsRejected` (a token expired or revoked: no retry helps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from index.errors import KBError

__all__ = [
    "Acl",
    "Batch",
    "ChangedPermissions",
    "Connector",
    "GroupMembers",
    "SOURCE_SCOPE_PREFIX",
    "SourceCredentialsRejected",
    "SourceDocument",
    "SourceError",
    "SourceFailed",
    "UNKNOWN_ACL",
    "after_organisation_groups",
    "is_source_scope",
    "source_scope",
]

# A synced document is filed under a scope of its own, never a channel's nor
# everyone's: who reads it is its Acl's to say (bot.access asks the store).
SOURCE_SCOPE_PREFIX = "source:"


def source_scope(source: str, item: str) -> str:
    """The scope every version of ``source``'s item ``item`` is filed under."""
    return f"{SOURCE_SCOPE_PREFIX}{source}:{item}"


def is_source_scope(scope: str) -> bool:
    """Whether ``scope`` is a synced document's (its Acl decides), not a channel's."""
    return scope.startswith(SOURCE_SCOPE_PREFIX)


class SourceError(KBError):
    """A source is configured wrongly (a bad name, URL, space, or no credentials)."""


class SourceFailed(KBError):
    """A source could not be read now (unreachable, 5xx, rate-limited, a malformed answer).

    Attributes:
        retry_after: seconds the source asked to wait (HTTP ``Retry-After``); ``None``: not said.
    """

    status = 502

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class SourceCredentialsRejected(SourceFailed):
    """The source refused the credentials (expired, revoked, too few scopes): an admin must act."""


# An Acl entry's kinds, in the order its entries are listed.
_KINDS = ("public", "user", "group", "domain")


@dataclass(frozen=True)
class Acl:
    """Who may read a document, as its source says.

    A person reads it when any entry admits them: their verified email is a
    user entry, they are a member of a group entry, their email's domain is a
    domain entry, or it is public in the organisation. ``known`` false: the
    source's permissions could not be read, and it admits nobody.

    An entry the source grants until a time (a Drive permission's
    ``expirationTime``, a Graph sharing's ``expirationDateTime``) is in
    ``until``: whoever reads the permissions asks :meth:`at` for those that
    still admit at their own clock's now, so a grant stops admitting when it
    expires, not when the next sync reads it. Where several grants name the
    same entry, the one lasting longest counts (:meth:`granting`).

    Attributes:
        users: emails, lower-cased.
        groups: the source's group names (their members: :class:`GroupMembers`).
        domains: email domains, lower-cased.
        public: everyone in the organisation.
        known: the permissions were read.
        until: ``(kind, principal, epoch seconds)`` of each entry that stops admitting
            then (``public`` has principal ``""``); an entry not in it lasts.
    """

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    domains: frozenset[str] = frozenset()
    public: bool = False
    known: bool = True
    until: frozenset[tuple[str, str, float]] = frozenset()

    def __post_init__(self) -> None:
        # Only the entries there expire: one taken out (``replace``) takes its time along.
        if self.until:
            held = {(k, p) for k, p, _ in self._rows()}
            kept = frozenset(u for u in self.until if (u[0], u[1]) in held)
            object.__setattr__(self, "until", kept)

    @classmethod
    def of(
        cls,
        users: Iterable[str] = (),
        groups: Iterable[str] = (),
        domains: Iterable[str] = (),
        *,
        public: bool = False,
    ) -> Acl:
        """An Acl with emails and domains lower-cased and blanks left out; none expires."""
        rows = [("public", "", None)] if public else []
        rows += [("user", u, None) for u in users]
        rows += [("group", g, None) for g in groups]
        rows += [("domain", d, None) for d in domains]
        return cls.granting(rows)

    @classmethod
    def granting(cls, grants: Iterable[tuple[str, str, float | None]]) -> Acl:
        """The Acl of ``(kind, principal, until)`` grants (``until`` ``None``: it lasts).

        Emails and domains are lower-cased, blanks and kinds not known left out. Where
        several name the same entry, the one lasting longest counts: one that lasts
        beats any that expires. None: a known Acl that admits nobody.
        """
        entries = ((_entry(kind, principal), until) for kind, principal, until in grants)
        return cls._longest((*key, until) for key, until in entries if key is not None)

    @classmethod
    def _longest(cls, rows: Iterable[tuple[str, str, float | None]]) -> Acl:
        """The Acl of entries as they are (no unknown among them), the longest of each kept."""
        longest: dict[tuple[str, str], float | None] = {}
        for kind, principal, until in rows:
            held = longest.get((kind, principal), until)
            longest[kind, principal] = None if held is None or until is None else max(held, until)
        found: dict[str, set[str]] = {"user": set(), "group": set(), "domain": set()}
        for kind, principal in longest:
            if kind in found:
                found[kind].add(principal)
        return cls(
            frozenset(found["user"]),
            frozenset(found["group"]),
            frozenset(found["domain"]),
            any(kind == "public" for kind, _ in longest),
            until=frozenset((k, p, t) for (k, p), t in longest.items() if t is not None),
        )

    def _rows(self) -> list[tuple[str, str, float | None]]:
        ends = {(k, p): t for k, p, t in self.until}
        rows = [("public", "")] if self.public else []
        rows += [("user", u) for u in sorted(self.users)]
        rows += [("group", g) for g in sorted(self.groups)]
        rows += [("domain", d) for d in sorted(self.domains)]
        return [(k, p, ends.get((k, p))) for k, p in rows]

    @property
    def entries(self) -> list[tuple[str, str, float | None]]:
        """As ``(kind, principal, until)`` rows: kind ``user``, ``group``, ``domain``,
        ``public`` or ``unknown``; ``until`` the epoch seconds it stops admitting, or
        ``None``."""
        if not self.known:
            return [("unknown", "", None)]
        return self._rows()

    @classmethod
    def from_entries(cls, rows: Iterable[tuple[str, str, float | None]]) -> Acl:
        """From :attr:`entries` rows; none, or an ``unknown`` one, is :data:`UNKNOWN_ACL`.

        Every row is kept as it is, expired or not: :meth:`at` says which admit now.
        """
        grants: list[tuple[str, str, float | None]] = []
        any_row = False
        for kind, principal, until in rows:
            any_row = True
            if kind == "unknown":
                return UNKNOWN_ACL
            if kind == "public":
                grants.append((kind, "", until))
            elif kind in _KINDS:
                grants.append((kind, principal, until))
        return cls._longest(grants) if any_row else UNKNOWN_ACL

    def at(self, now: float) -> Acl:
        """These permissions at ``now`` (epoch seconds): without the entries expired by
        then. None left: an Acl that admits nobody (still known)."""
        if not self.known or not any(t <= now for _, _, t in self.until):
            return self
        return Acl._longest(row for row in self._rows() if row[2] is None or row[2] > now)

    def ending(self, kind: str, principal: str = "") -> str:
        """`` until <time>`` for people where the entry ``kind`` ``principal`` expires;
        ``""`` where it lasts (or is not an entry)."""
        ends = next((t for k, p, t in self.until if (k, p) == (kind, principal)), None)
        return "" if ends is None else f" until {_when(ends)}"

    def without_public(self) -> Acl:
        """These permissions, no longer public in the organisation (unknown stays unknown)."""
        return replace(self, public=False) if self.known else self

    def describe(self) -> str:
        """One line for people: who it admits, and until when where that ends."""
        if not self.known:
            return "unknown (nobody may read it until its permissions are read)"
        parts = []
        for kind, principal, _ in self._rows():
            part = "everyone in the organisation" if kind == "public" else f"{kind} {principal}"
            parts.append(part + self.ending(kind, principal))
        return ", ".join(parts) or "nobody"


def _when(epoch: float) -> str:
    """An epoch time for people: ``2026-12-07 17:30:00 UTC``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _entry(kind: str, principal: str) -> tuple[str, str] | None:
    """An Acl entry's ``(kind, principal)`` with emails and domains lower-cased; ``None``:
    a blank principal, or a kind not known."""
    if kind == "public":
        return kind, ""
    if kind not in _KINDS:
        return None
    name = principal if kind == "group" else principal.strip().lower()
    if kind == "domain":
        name = name.lstrip("@")
    return (kind, name) if name else None


UNKNOWN_ACL = Acl(known=False)


def after_organisation_groups(before: Iterable[str], after: Iterable[str], acl: Acl) -> Acl:
    """A synced document's permissions ``acl`` once the groups standing for everyone in the
    organisation are ``after``, not ``before`` (``kb source readers``).

    A group no longer standing for everyone stops making anything public now:
    what else still admits everyone (anonymous access, an organisation link)
    comes back with the next sync, which reads every permission again. A group
    newly named widens nothing before that sync reads what it may read.
    """
    return acl.without_public() if set(before) - set(after) else acl


@dataclass(frozen=True)
class SourceDocument:
    """One document as a source gives it.

    Attributes:
        item: the source's own id for it, stable across edits, renames and moves.
        title: what people call it.
        url: where it opens in the source ("open in Confluence").
        data: its bytes, as the product's extractor reads them.
        filename: a name whose suffix says the format (``.html``, ``.pdf``...).
        media_type: the bytes' media type.
        acl: who may read it.
        version: the source's version of it; the same version is not fetched twice.
        fetch: where given, ``data`` is empty and this fetches the bytes, called only when
            ``version`` is not the one recorded; ``None`` from it: gone since it was listed.
            A file the product will not take raises a ``KBError`` (``TooLarge``...): that
            item fails, the rest syncs.
    """

    item: str
    title: str
    url: str
    data: bytes
    filename: str
    media_type: str
    acl: Acl
    version: str = ""
    fetch: Callable[[], bytes | None] | None = None


@dataclass(frozen=True)
class Batch:
    """What a load or a poll gives: documents, and where the next poll resumes.

    Attributes:
        documents: the documents changed (all of them for a load).
        checkpoint: opaque to everyone but the connector; saved once the batch is in.
        failed: items that could not be read, with the reason (kept as they were).
    """

    documents: Iterator[SourceDocument]
    checkpoint: str
    failed: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class GroupMembers:
    """A source group's members by email; ``complete`` false: only some could be read."""

    group: str
    emails: frozenset[str]
    complete: bool = True


class Connector(Protocol):
    """A place documents are synced from (see the module's docstring).

    ``settings``: what it was opened with (its kind's settings class, ``as_dict``):
    a run checks them against the source's record once it holds the source.
    """

    kind: str
    settings: Any

    def load(self) -> Batch:
        """Every document there now, and the checkpoint to poll from.

        Raises:
            SourceFailed: the source cannot be read now.
        """

    def poll(self, checkpoint: str) -> Batch:
        """The documents changed since ``checkpoint``, and the next checkpoint.

        Raises:
            SourceFailed: the source cannot be read now.
        """

    def listing(self) -> frozenset[str]:
        """The ids of every document there now (complete, or it raises).

        Raises:
            SourceFailed: the source cannot list them all now.
        """

    def permissions(self, items: Iterable[str]) -> dict[str, Acl]:
        """The current Acl of each of ``items`` (:data:`UNKNOWN_ACL` where unreadable).

        Raises:
            SourceFailed: the source cannot be read now.
        """

    def groups(self, names: Iterable[str]) -> list[GroupMembers]:
        """The members of each group of ``names``, expanded by the source's API.

        Raises:
            SourceFailed: the source cannot be read now.
        """


@runtime_checkable
class ChangedPermissions(Protocol):
    """A connector that can tell whose permissions changed since its checkpoint, so that a
    run asks the source only about those (Google Drive: its changes log)."""

    def permissions_changed(
        self, checkpoint: str, recorded: Mapping[str, Acl]
    ) -> dict[str, Acl] | None:
        """The current Acl of each of ``recorded`` (item -> the Acl last recorded) whose
        permissions may have changed since ``checkpoint``; the others are as recorded.
        ``None``: that cannot be told, and :meth:`Connector.permissions` reads them all.

        Raises:
            SourceFailed: the source cannot be read now.
        """
