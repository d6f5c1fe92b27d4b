"""Passage links shown in Slack as Work Objects: the unfurl, its flexpane, and who may see which words.

1. Someone posts a passage link (a citation of the bot's, or one they copied),
   or types it (``source: composer``). Slack sends ``link_shared`` with the
   links on the app's unfurl domain; the bot answers ``chat.unfurl`` with
   ``metadata.entities``, one entity per link it accepts (``bot.slack.blocks.entities``).
2. Someone opens the unfurl: ``entity_details_requested``, for that person,
   with a ``trigger_id``; the bot answers ``entity.presentDetails`` with the
   passage, its neighbours and the viewer link, or with an error status.

Both payloads are the sender's to forge. A link is unfurled only when it is on
the link base URL (``KB_PUBLIC_URL``: scheme, host and port, then ``/d/<id>``
or ``/d/<id>/file``, nothing but ``t`` in its query) and its token verifies for
that document and for the scope the document still has. A tampered, expired or
other document's token, another host, a malformed link: no entity at all. A
valid link to a document that was removed, replaced or is no longer searchable:
an entity that says so and names nothing of it. A payload for another
workspace, or without the fields Slack always sends, is ignored with a log line.

Who reads an unfurl: everyone in the conversation, so its words follow the
conversation. The person who posted must be of this workspace (unless
``KB_ALLOW_EXTERNAL``). A document for everyone shows its passage anywhere but
in a conversation shared with another organisation; a channel's document only
in that channel; a synced page only when it is public in the organisation
(``Access.readable_at``, the place part of the rule, as for an answer posted there). Anywhere else the entity says it is a passage from a channel's
documents and shows nothing of it (no title, no text): the link itself still
opens the viewer, which checks its reader again.

The flexpane is one person's, but Slack refreshes the unfurl card with what
the flexpane presents (Work Objects, "Automatic refresh"). So the same
conversation rule holds there, and in addition the person who opened it must
be of this workspace and, for a channel's document, a member of that channel
now (``conversations.members``, remembered for a minute by ``Directory``).
Anything refused gets Slack's own ``restricted`` treatment; a document that is
gone, ``not_found``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.models.metadata import EntityMetadata
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import AccessCheckUnavailable, Person, Where
from bot.slack.blocks import (
    Passage,
    details_error,
    passage_entity,
    restricted_entity,
    unavailable_entity,
    unfurl_metadata,
)
from bot.slack.services import Services
from bot.slack.words import Words, language_of_locale, words_for
from core.errors import BadLinkToken
from core.links import parse_char_fragment
from index.errors import DocumentNotFound
from index.models import DocState
from index.records import DocumentRow

log = logging.getLogger(__name__)

__all__ = [
    "MAX_LINKS",
    "PassageLink",
    "Unfurls",
    "Where",
    "parse_link",
]

# Links looked at in one event: a bound of ours on a hostile payload (Slack sends a few).
MAX_LINKS = 10
_MAX_URL = 4096
_MAX_TOKEN = 512
_DEFAULT_PORTS = {"http": 80, "https": 443}
_ID_RE = re.compile(r"[0-9]{1,18}")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_PAGE_RE = re.compile(r"page=([0-9]{1,9})")
# No canonical text is this long: a larger offset is a forged link, and echoing it
# would make the entity's url and external_ref as long as the poster likes.
_MAX_OFFSET = 10**12
_CONVERSATION_RE = re.compile(r"[CDG][A-Z0-9]{2,}")
_USER_RE = re.compile(r"[UW][A-Z0-9]{2,}")
_SOURCES = frozenset({"conversations_history", "composer"})


# ---------------------------------------------------------------- links


@dataclass(frozen=True)
class PassageLink:
    """A link on the link base URL, parsed; nothing in it is trusted until its token verifies.

    Attributes:
        posted: the URL as it was posted (what ``app_unfurl_url`` must repeat).
        document_id: the document in its path.
        token: its ``t``.
        file: it opens the original (``/d/<id>/file``) rather than the text.
        start, end: its ``#char=a,b`` range, or ``None``.
        page: its ``#page=N``, or ``None``.
    """

    posted: str
    document_id: int
    token: str
    file: bool = False
    start: int | None = None
    end: int | None = None
    page: int | None = None

    @property
    def ref(self) -> str:
        """The entity's ``external_ref.id``: the document, then the range or the page."""
        if self.start is not None and self.end is not None:
            return f"{self.document_id}:{self.start}-{self.end}"
        if self.page is not None:
            return f"{self.document_id}:p{self.page}"
        return str(self.document_id)

    def viewer_url(self, base_url: str) -> str:
        """The link rebuilt by the server from what it parsed: nothing of the posted text but that."""
        path = f"{base_url.rstrip('/')}/d/{self.document_id}{'/file' if self.file else ''}"
        if self.start is not None and self.end is not None:
            return f"{path}?t={self.token}#char={self.start},{self.end}"
        if self.page is not None:
            return f"{path}?t={self.token}#page={self.page}"
        return f"{path}?t={self.token}"


def parse_link(url: object, base_url: str) -> PassageLink | None:
    """The passage link ``url`` is, when it is one on ``base_url``; ``None`` for anything else.

    Same scheme, host and port as ``base_url``, no user name, the path
    ``<base path>/d/<id>`` or ``.../d/<id>/file``, exactly one ``t`` in the
    query, and no fragment but ``#char=a,b`` (text) or ``#page=N`` (file).
    """
    if not isinstance(url, str) or not url or len(url) > _MAX_URL or not url.isascii():
        return None
    if "\\" in url or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        return None
    try:
        parts, base = urlsplit(url), urlsplit(base_url)
        same_origin = _origin(parts.scheme, parts.hostname, parts.port) == _origin(
            base.scheme, base.hostname, base.port
        )
    except ValueError:  # a port that is not a number
        return None
    if not same_origin or parts.username is not None or parts.password is not None:
        return None
    location = _location(parts.path, base.path.rstrip("/"))
    token = _token(parts.query)
    if location is None or token is None:
        return None
    document_id, file = location
    link = PassageLink(posted=url, document_id=document_id, token=token, file=file)
    return _with_fragment(link, parts.fragment)


def _origin(scheme: str, host: str | None, port: int | None) -> tuple[str, str, int | None]:
    scheme = scheme.lower()
    return scheme, (host or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def _location(path: str, prefix: str) -> tuple[int, bool] | None:
    """``(document id, is the file)`` of ``<prefix>/d/<id>[/file]``, else ``None``."""
    if not path.startswith(prefix + "/d/"):
        return None
    rest = path[len(prefix) + 3 :].split("/")
    if not _ID_RE.fullmatch(rest[0]) or len(rest) > 2 or (len(rest) == 2 and rest[1] != "file"):
        return None
    return int(rest[0]), len(rest) == 2


def _token(query: str) -> str | None:
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return None
    tokens = values.get("t") or []
    if set(values) != {"t"} or len(tokens) != 1:
        return None
    token = tokens[0]
    return token if len(token) <= _MAX_TOKEN and _TOKEN_RE.fullmatch(token) else None


def _with_fragment(link: PassageLink, fragment: str) -> PassageLink | None:
    if not fragment:
        return link
    if link.file:
        page = _PAGE_RE.fullmatch(fragment)
        if page is None or int(page.group(1)) < 1:
            return None
        return PassageLink(link.posted, link.document_id, link.token, True, page=int(page.group(1)))
    span = parse_char_fragment(fragment)
    if span is None or max(span) > _MAX_OFFSET:
        return None
    return PassageLink(link.posted, link.document_id, link.token, start=span[0], end=span[1])


# ---------------------------------------------------------------- resolving


@dataclass(frozen=True)
class _Resolved:
    """A link whose token verified: the scope it opens, and its passage (``None``: gone)."""

    scope: str
    passage: Passage | None


class Unfurls:
    """Answers ``link_shared`` and ``entity_details_requested`` (see the module docstring)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.base_url = services.engine.config.link_base_url

    # ------------------------------------------------------------ link_shared

    async def link_shared(
        self,
        client: AsyncWebClient,
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
    ) -> None:
        """Unfurl the passage links of one ``link_shared`` event (or nothing)."""
        target = _unfurl_target(event)
        if target is None or not _from_home(body, context):
            log.warning("ignoring a link_shared event without its fields or for another workspace")
            return
        links = self._links(event)
        if not links:
            return
        place = await self.services.audience.place(client, body, event)
        if not self.services.audience.serves(place):
            log.info("not unfurling passage links posted by a person of another organisation")
            return
        where = Where(channel=target.channel, shared=place.shared_channel)
        words = self.services.languages.default  # everyone in the conversation reads it
        entities = [
            entity
            for link in links
            if (entity := await self._unfurl_entity(link, where, words)) is not None
        ]
        if entities:
            unfurl = client.chat_unfurl(
                channel=target.channel,
                ts=target.ts,
                unfurl_id=target.unfurl_id,
                source=target.source,
                metadata=unfurl_metadata(entities),
            )
            await _call(unfurl)

    def _links(self, event: dict[str, Any]) -> list[PassageLink]:
        raw = event.get("links")
        if not isinstance(raw, list):
            log.warning("ignoring a link_shared event whose links are not a list")
            return []
        links: dict[str, PassageLink] = {}
        for item in raw[:MAX_LINKS]:
            url = item.get("url") if isinstance(item, dict) else None
            link = parse_link(url, self.base_url)
            if link is None:
                log.info("not unfurling a link that is not a passage link of this server")
            else:
                links.setdefault(link.posted, link)
        return list(links.values())

    async def _unfurl_entity(
        self, link: PassageLink, where: Where, words: Words
    ) -> EntityMetadata | None:
        resolved = await asyncio.to_thread(self._resolve, link)
        if resolved is None:
            return None
        url = link.viewer_url(self.base_url)
        if resolved.passage is None:
            return unavailable_entity(link.ref, url, words, unfurl_url=link.posted)
        # Everyone in the conversation reads the unfurl, a guest of the workspace too: the
        # place part of the rule, as for an answer posted there.
        if not (await self.services.access.readable_at(resolved.scope, where)).allowed:
            return restricted_entity(link.ref, url, words, unfurl_url=link.posted)
        return passage_entity(resolved.passage, words, unfurl_url=link.posted)

    # ------------------------------------------------------------ the flexpane

    async def details_requested(
        self,
        client: AsyncWebClient,
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
    ) -> None:
        """Present one person the details of a passage entity, or Slack's error treatment."""
        trigger, user = event.get("trigger_id"), event.get("user")
        if not (isinstance(trigger, str) and trigger and isinstance(user, str)):
            log.warning("ignoring an entity_details_requested event without its trigger or user")
            return
        if not _USER_RE.fullmatch(user) or not _from_home(body, context):
            log.warning("ignoring an entity_details_requested event for another workspace")
            return
        entity = await self._details(client, body, event, user)
        if isinstance(entity, str):
            await _call(
                client.entity_presentDetails(trigger_id=trigger, error=details_error(entity))
            )
        else:
            await _call(client.entity_presentDetails(trigger_id=trigger, metadata=entity))

    async def _details(
        self, client: AsyncWebClient, body: dict[str, Any], event: dict[str, Any], user: str
    ) -> EntityMetadata | str:
        """The flexpane's entity for ``user``, or the error status to present instead."""
        link = self._opened_link(event)
        if link is None:
            return "restricted"
        place = await self.services.audience.place(client, body, {"user": user})
        if not self.services.audience.serves(place):
            log.info("no flexpane for %s, a person of another organisation", user)
            return "restricted"
        resolved = await asyncio.to_thread(self._resolve, link)
        if resolved is None:
            return "restricted"
        if resolved.passage is None:
            return "not_found"
        if not await self._reads(user, resolved.scope, _flexpane_place(body, event)):
            return "restricted"
        words = await self._words_of(client, user, event.get("user_locale"))
        return passage_entity(resolved.passage, words, unfurl_url=None, details=True)

    def _opened_link(self, event: dict[str, Any]) -> PassageLink | None:
        """The link the flexpane is for: the URL unfurled, else the entity's own URL."""
        link = parse_link(event.get("app_unfurl_url"), self.base_url) or parse_link(
            event.get("entity_url"), self.base_url
        )
        if link is None:
            log.info("no flexpane for an entity whose URL is not a passage link of this server")
            return None
        ref = event.get("external_ref")
        if isinstance(ref, dict) and "id" in ref and ref.get("id") != link.ref:
            log.warning("no flexpane for an entity whose external_ref does not match its link")
            return None
        return link

    async def _reads(self, user: str, scope: str, where: Where | None) -> bool:
        """Whether ``user`` may read documents of ``scope`` in a flexpane opened at ``where``
        (the access rule: everyone there, a guest reading along included, and ``user``)."""
        try:
            decision = await self.services.access.may_read(Person(user), scope, where)
        except AccessCheckUnavailable as exc:
            log.info("no flexpane for %s: %s", user, exc)
            return False  # unknown is hidden
        if not decision.allowed:
            log.info("no flexpane for %s: %s", user, decision.reason)
        return decision.allowed

    async def _words_of(self, client: AsyncWebClient, user: str, locale: object) -> Words:
        """The person's words: the locale Slack sent with the event, else their profile's."""
        languages = self.services.languages
        code = language_of_locale(locale if isinstance(locale, str) else None, languages.available)
        return words_for(code) if code else await languages.of(client, user)

    # ------------------------------------------------------------ both

    def _resolve(self, link: PassageLink) -> _Resolved | None:
        """Verify ``link`` and read its passage (in a thread); ``None`` when it is refused."""
        try:
            scope = self.services.engine.signer.verify(link.token, link.document_id)
        except BadLinkToken as exc:
            log.info("not showing a passage link: %s", exc)
            return None
        try:
            doc = self.services.kb.document(link.document_id)
        except DocumentNotFound:
            return _Resolved(scope, None)
        if doc.scope != scope:
            # A link never widens who reads what: the document moved to another scope.
            log.info("not showing a link for scope %r: document %s is in another", scope, doc.id)
            return None
        if doc.state != DocState.INDEXED:
            return _Resolved(scope, None)
        return _Resolved(scope, self._passage(doc, link))

    def _passage(self, doc: DocumentRow, link: PassageLink) -> Passage:
        text = self.services.kb.canonical_text(doc.id)
        chunks = self.services.kb.chunks(doc.id)
        base = Passage(
            ref=link.ref,
            url=link.viewer_url(self.base_url),
            title=doc.title or doc.name,
            page=link.page,
            updated=int(doc.indexed_at) if doc.indexed_at else None,
        )
        span = _span(link, doc, len(text))
        if span is None:
            return base
        start, end = span
        inside = [
            i
            for i, c in enumerate(chunks)
            if (c["start"] < end and c["end"] > start) or c["start"] <= start < c["end"]
        ]
        if not inside:
            return replace(base, text=text[start:end])
        first, last = inside[0], inside[-1]
        return replace(
            base,
            text=text[start:end],
            section=str(chunks[first]["section"] or ""),
            page=link.page or chunks[first]["page"],
            before=str(chunks[first - 1]["content"]) if first > 0 else "",
            after=str(chunks[last + 1]["content"]) if last + 1 < len(chunks) else "",
        )


def _span(link: PassageLink, doc: DocumentRow, length: int) -> tuple[int, int] | None:
    """The range of the canonical text ``link`` names (a page's whole text for ``#page``)."""
    if link.start is not None and link.end is not None:
        return min(link.start, length), min(link.end, length)
    if link.page is None or not doc.page_starts:
        return None
    starts = [int(s) for s in doc.page_starts.split(",")]
    if link.page > len(starts):
        return None
    end = starts[link.page] if link.page < len(starts) else length
    return min(starts[link.page - 1], length), min(end, length)


@dataclass(frozen=True)
class _Target:
    """Where ``chat.unfurl`` puts the unfurl: a posted message, or a message being written."""

    channel: str | None = None
    ts: str | None = None
    unfurl_id: str | None = None
    source: str | None = None


def _unfurl_target(event: dict[str, Any]) -> _Target | None:
    """The target of ``event``'s unfurl; ``None`` when a field Slack always sends is missing."""
    source = event.get("source", "conversations_history")
    user = event.get("user")
    if source not in _SOURCES or not (isinstance(user, str) and _USER_RE.fullmatch(user)):
        return None
    if source == "composer":
        unfurl_id = event.get("unfurl_id")
        return _Target(unfurl_id=unfurl_id, source=source) if _present(unfurl_id) else None
    channel, ts = event.get("channel"), event.get("message_ts")
    if not (isinstance(channel, str) and _CONVERSATION_RE.fullmatch(channel) and _present(ts)):
        return None
    return _Target(channel=channel, ts=ts)


def _present(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 255


def _flexpane_place(body: dict[str, Any], event: dict[str, Any]) -> Where:
    """Where a flexpane is opened: the conversation of the card Slack refreshes from it, whose
    people all read what it presents (one not said: a conversation not known, which may
    hold anyone)."""
    channel = event.get("channel")
    return Where(
        channel=channel
        if isinstance(channel, str) and _CONVERSATION_RE.fullmatch(channel)
        else None,
        shared=bool(body.get("is_ext_shared_channel")),
    )


def _from_home(body: dict[str, Any], context: AsyncBoltContext) -> bool:
    """Whether the payload is for the workspace the bot's token belongs to (``auth.test``)."""
    home = getattr(context.authorize_result, "team_id", None)
    return bool(home) and body.get("team_id") == home


async def _call(request: Awaitable[Any]) -> None:
    """A Web API call whose failure is logged: the event has nobody to tell."""
    try:
        await request
    except SlackApiError as exc:
        log.warning("Slack refused the Work Object: %s", exc.response.get("error", "unknown_error"))
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("Slack could not be reached with a Work Object: %s", type(exc).__name__)
