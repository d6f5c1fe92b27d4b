"""Approval requests: documents for everyone from people who are not publishers.

Such a document is indexed but ``awaiting_approval``: no answer uses it. The
admins get one message with Approve and Reject buttons, in
``KB_APPROVALS_CHANNEL`` or, when that is unset (or the bot may not post
there, or people who may not read the document read there too: a guest of the
workspace, another organisation), by direct message to each ``KB_ADMIN_USERS`` id. It shows who wants to add what, the start of the text
with a link to all of it, what approving would replace, and the latest
changes to the knowledge base. A click by an admin approves the document
(searchable, replacing the current version of its name) or rejects it
(deleted), and every admin's copy of the request says so; a click by anyone
else, or on a message that is not a request for that document, changes nothing. The uploader is told the
outcome by direct message, and their upload status is updated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Access, Person, Where
from bot.slack.blocks import (
    Rendered,
    audited_scopes,
    escape,
    is_user_id,
    mention,
    render_approval_request,
    render_notice,
    render_upload_status,
)
from bot.slack.config import SlackConfig
from bot.slack.people import Roles, channel_readers
from bot.slack.words import Languages, Words
from core.answer import Engine
from index.errors import KBError, NotAwaitingApproval
from index.knowledge_base import KnowledgeBase, Placement
from index.names import display_name
from index.records import AuditEntry, DocumentRow
from index.storage import APPROVAL, STATUS, PostedMessage

log = logging.getLogger(__name__)

__all__ = ["Approvals", "Ticket"]

RECENT_CHANGES = 5
# Enough of the text for the preview; the link opens the rest.
PREVIEW_READ_CHARS = 2000


@dataclass(frozen=True)
class Ticket:
    """What an approval request's buttons carry: the document, and where its uploader's status is."""

    document_id: int
    status_channel: str = ""
    status_ts: str = ""

    def encode(self) -> str:
        """The buttons' ``value``."""
        data = {"d": self.document_id, "c": self.status_channel, "t": self.status_ts}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, value: str) -> Ticket | None:
        """The ticket in a button's ``value``, or ``None`` when it is not one."""
        try:
            data = json.loads(value)
        except (ValueError, RecursionError):  # deep nesting exhausts the decoder's stack
            return None
        if not isinstance(data, dict) or type(data.get("d")) is not int:
            return None
        return cls(data["d"], str(data.get("c") or ""), str(data.get("t") or ""))


@dataclass(frozen=True)
class _Decision:
    document: DocumentRow
    approved: bool
    admin: str
    replaced: int = 0


class Approvals:
    """Sends approval requests and carries out the admins' decisions.

    Args:
        kb: the knowledge base.
        config: where requests go (``approvals_channel`` or the admins' DMs).
        roles: who is an admin.
        engine: signs the link to the whole document.
        languages: the words of each person; requests, which several admins may
            read and any one of them decides, are in the default language
            (``KB_DEFAULT_LANGUAGE``), and so is the decision written on them.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        config: SlackConfig,
        roles: Roles,
        engine: Engine,
        languages: Languages,
        access: Access,
    ) -> None:
        self.kb = kb
        self.config = config
        self.roles = roles
        self.engine = engine
        self.languages = languages
        self.access = access

    # ------------------------------------------------------------ requests

    async def request(
        self, client: AsyncWebClient, placement: Placement, *, status_channel: str, status_ts: str
    ) -> bool:
        """Ask the admins to decide on ``placement.document``; ``True`` when one got the request.

        ``status_channel`` and ``status_ts`` name the uploader's status message,
        updated once an admin decided.
        """
        doc = placement.document
        if not self.config.approvals_channel and not self.config.admin_user_ids:
            log.warning("document %s awaits approval, but no admin is configured to ask", doc.id)
            return False
        ticket = Ticket(doc.id, status_channel, status_ts)
        recent = await asyncio.to_thread(self.kb.audit_log.entries, RECENT_CHANGES)
        scopes = audited_scopes(recent)
        if status_channel and status_ts:
            await self._remember(doc.id, STATUS, PostedMessage(status_channel, status_ts))
        channel = self.config.approvals_channel
        posted = None
        if channel:
            # Everyone in the channel reads the request: only what they all may read is named,
            # and the document itself is quoted only where they all may read it once approved.
            where = await channel_readers(client, channel) or Where(channel=channel)
            named = await self.access.readable_among(scopes | {doc.scope}, where=where)
            if doc.scope in named:
                rendered = await self._render(placement, ticket, recent, named)
                posted = await _post(client, channel, rendered, doc.id)
            else:
                log.warning(
                    "document %s: not asked in %s, where people who may not read it read too "
                    "(a guest of the workspace, another organisation) or Slack cannot say "
                    "who does; %s",
                    doc.id,
                    channel,
                    "asking the admins by DM"
                    if self.config.admin_user_ids
                    else "no KB_ADMIN_USERS id to ask by DM, so nobody is asked",
                )
        if posted is None:
            copies = []
            for admin in sorted(self.config.admin_user_ids):
                named = await self.access.readable_among(scopes, person=Person(admin))
                rendered = await self._render(placement, ticket, recent, named)
                copies.append(await _post(client, admin, rendered, doc.id))
            sent = [c for c in copies if c is not None]
        else:
            sent = [posted]
        # Every copy, in the store: whichever replica gets the decision updates them all.
        for copy in sent:
            await self._remember(doc.id, APPROVAL, copy)
        return bool(sent)

    async def _remember(self, doc_id: int, kind: str, message: PostedMessage) -> None:
        try:
            await asyncio.to_thread(
                self.kb.messages.record, doc_id, kind, message.channel, message.ts
            )
        except KBError as exc:  # a full disk: that message's buttons will be refused
            log.warning("%s message of document %s not recorded: %s", kind, doc_id, exc)

    async def _render(
        self,
        placement: Placement,
        ticket: Ticket,
        recent: list[AuditEntry],
        named: frozenset[str],
    ) -> Rendered:
        doc = placement.document
        text = await asyncio.to_thread(self.kb.canonical_text, doc.id)
        return render_approval_request(
            doc,
            beside=placement.beside,
            preview=text[:PREVIEW_READ_CHARS],
            url=self.engine.document_link(doc),
            value=ticket.encode(),
            recent=recent,
            named=named,
            words=self.languages.default,
        )

    # ------------------------------------------------------------ decisions

    async def decide(
        self, client: AsyncWebClient, body: dict[str, Any], value: str, *, approve: bool
    ) -> None:
        """Carry out an Approve or Reject click, if an admin made it."""
        user = str((body.get("user") or {}).get("id", ""))
        container = body.get("container") or {}
        channel, ts = str(container.get("channel_id", "")), str(container.get("message_ts", ""))
        ticket = Ticket.decode(value)
        if ticket is None:
            log.warning("ignoring an approval click with a malformed value %r", value)
            return
        admin = await self.roles.is_admin(client, user)
        words = await self.languages.of(client, user)  # the clicker's, told alone
        if not admin:
            log.info(
                "%s (not an admin) clicked on the request for document %s", user, ticket.document_id
            )
            await _tell_clicker(client, channel, user, words.APPROVAL_NOT_ADMIN)
            return
        posted = self.kb.messages
        doc_id = ticket.document_id
        if not await asyncio.to_thread(posted.is_of, doc_id, APPROVAL, channel, ts):
            # The value and the message are the clicker's to forge: only a request the
            # bot posted for that document is acted on, and nothing else is edited.
            log.warning(
                "%s clicked on a request for document %s it is not (%s %s)",
                user,
                doc_id,
                channel,
                ts,
            )
            await _tell_clicker(client, channel, user, words.BUTTON_NOT_HERE)
            return
        try:
            decision = await asyncio.to_thread(self._decide, doc_id, user, approve)
        except NotAwaitingApproval as exc:
            text = words.approval_decided_already(escape(str(exc)))
            await _tell_clicker(client, channel, user, text)
            return
        copies = await asyncio.to_thread(posted.of, doc_id, APPROVAL)
        for copy in copies:  # every admin's copy, not only the one clicked
            with contextlib.suppress(SlackApiError):
                await client.chat_update(
                    channel=copy.channel,
                    ts=copy.ts,
                    **_decided(decision, self.languages.default).as_kwargs(),
                )
        statuses = await asyncio.to_thread(posted.of, doc_id, STATUS)
        uploader = await self.languages.of(client, decision.document.uploader)
        await _tell_uploader(client, statuses, decision, uploader)

    def _decide(self, doc_id: int, admin: str, approve: bool) -> _Decision:
        if not approve:
            return _Decision(self.kb.reject(doc_id, actor=admin), approved=False, admin=admin)
        published = self.kb.approve(doc_id, actor=admin)
        return _Decision(published.document, True, admin, replaced=len(published.replaced))


def _decided(decision: _Decision, words: Words) -> Rendered:
    """The approval request once decided: who decided what, and no buttons any more."""
    doc = decision.document
    name = escape(display_name(doc.name))
    admin, uploader = mention(decision.admin), mention(doc.uploader)
    if decision.approved:
        return render_notice(words.approval_approved(admin, name, uploader, decision.replaced))
    return render_notice(words.approval_rejected(admin, name, uploader))


async def _post(
    client: AsyncWebClient, channel: str, rendered: Rendered, doc_id: int
) -> PostedMessage | None:
    """Post one copy of a request; where it went (a DM's channel id, not the admin's), or ``None``."""
    try:
        resp = await client.chat_postMessage(channel=channel, **rendered.as_kwargs())
    except SlackApiError as exc:
        log.warning("approval request for document %s not sent to %s: %s", doc_id, channel, exc)
        return None
    return PostedMessage(str(resp.get("channel") or channel), str(resp.get("ts") or ""))


async def _tell_clicker(client: AsyncWebClient, channel: str, user: str, text: str) -> None:
    with contextlib.suppress(SlackApiError):
        await client.chat_postEphemeral(channel=channel, user=user, text=text)


async def _tell_uploader(
    client: AsyncWebClient, statuses: list[PostedMessage], decision: _Decision, words: Words
) -> None:
    """Update the uploader's status message and tell them by DM (best effort: logged, never raised)."""
    doc = decision.document
    name, admin = escape(display_name(doc.name)), mention(decision.admin)
    if decision.approved:
        text = words.upload_approved(name, doc.chunk_count, admin)
        if decision.replaced:
            text += " " + words.UPLOAD_REPLACED
    else:
        text = words.upload_rejected(name, admin)
    rendered = render_upload_status(text, words=words)
    # The status the bot recorded, never one a button's value names.
    for status in statuses:
        try:
            await client.chat_update(channel=status.channel, ts=status.ts, **rendered.as_kwargs())
        except SlackApiError as exc:
            log.info("upload status of document %s not updated: %s", doc.id, exc)
    if is_user_id(doc.uploader):
        try:
            await client.chat_postMessage(channel=doc.uploader, **rendered.as_kwargs())
        except SlackApiError as exc:
            log.warning("could not tell %s about document %s: %s", doc.uploader, doc.id, exc)
