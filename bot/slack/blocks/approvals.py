"""Approvals as Block Kit: the request with Approve / Reject, and the audit log's lines.

Everything the uploader wrote (the file's name, title, preview) is escaped and
its links inert; actors are shown as code, so a list of changes pings nobody.
"""

from __future__ import annotations

from collections.abc import Sequence

from slack_sdk.models.blocks import Block, ConfirmObject

from bot.slack.blocks.actions import APPROVE_ACTION_ID, REJECT_ACTION_ID
from bot.slack.blocks.elements import (
    Rendered,
    actions,
    button,
    context,
    pack,
    plain_text,
    section,
)
from bot.slack.blocks.mrkdwn import (
    code,
    escape,
    inert_links,
    label,
    mention,
    quote,
    safe_url,
    scope_label,
    unnamed_document,
)
from bot.slack.words import Words
from index.names import display_name
from index.records import AuditEntry, DocumentRow

PREVIEW_CHARS = 600
MAX_LISTED_VERSIONS = 3
APPROVAL_BLOCK_ID = "kb_approval"


def audit_lines(entries: Sequence[AuditEntry], words: Words, named: frozenset[str]) -> list[str]:
    """One line per change, newest first; actors as code, so a list of changes pings nobody.

    ``named``: the scopes whose documents everyone reading may read (the access rule); a
    document of any other is said to be one of its channel's, never named.
    """
    lines = []
    for e in entries:
        when = words.when(e.at)
        action = words.AUDIT_ACTIONS.get(str(e.action), str(e.action))
        document = _document_label(e, named, words)
        lines.append(words.audit_line(when, code(e.actor), action, document))
    return lines


def audited_scopes(entries: Sequence[AuditEntry]) -> frozenset[str]:
    """The scopes of the documents ``entries`` name (what the access rule is asked of)."""
    return frozenset(e.scope for e in entries if e.document_id is not None)


def _document_label(entry: AuditEntry, named: frozenset[str], words: Words) -> str:
    if entry.document_id is None:
        return ""
    if entry.scope not in named:
        return unnamed_document(entry.scope, entry.document_id, words)
    name = escape(display_name(entry.name))
    return f"*{name}* #{entry.document_id} ({scope_label(entry.scope, words)})"


def _approval_buttons(doc: DocumentRow, value: str, words: Words) -> Block:
    confirm = ConfirmObject(
        title=plain_text(words.REJECT_CONFIRM_TITLE),
        text=plain_text(words.reject_confirm_text(display_name(doc.name))),
        confirm=plain_text(words.REJECT_CONFIRM_YES),
        deny=plain_text(words.REJECT_CONFIRM_NO),
        style="danger",
    )
    reject = button(REJECT_ACTION_ID, words.REJECT, value, "danger", confirm=confirm)
    approve = button(APPROVE_ACTION_ID, words.APPROVE, value, "primary")
    return actions([approve, reject], block_id=APPROVAL_BLOCK_ID)


def render_approval_request(
    doc: DocumentRow,
    *,
    beside: Sequence[DocumentRow],
    preview: str,
    url: str,
    value: str,
    recent: Sequence[AuditEntry],
    named: frozenset[str],
    words: Words,
) -> Rendered:
    """The message asking the admins to approve or reject ``doc``.

    Args:
        beside: the searchable documents an approval would replace.
        preview: the start of its canonical text (escaped here: the uploader wrote it).
        url: a link to the whole document in the viewer.
        value: what the buttons carry back (``bot.slack.approvals.Ticket``).
        recent: the latest audit entries, for context.
        named: the scopes whose documents everyone reading the request may read.
        words: the admins' language (``KB_DEFAULT_LANGUAGE``: a request goes to several).
    """
    name = label(doc.name)
    head = words.approval_request(
        mention(doc.uploader), name, scope_label(doc.scope, words), doc.chunk_count
    )
    blocks: list[Block] = [section(head)]
    if doc.title and doc.title != doc.name:
        # Answers cite a document by its title: the admin approves that too.
        blocks.append(context(words.approval_title(label(doc.title))))
    if beside:
        listed = [
            words.approval_version(escape(display_name(d.name)), d.id, code(d.uploader))
            for d in beside[:MAX_LISTED_VERSIONS]
        ]
        blocks.append(section(words.approval_replaces(listed)))
    shown = quote(inert_links(preview), PREVIEW_CHARS)
    link = f"<{safe_url(url)}|{words.APPROVAL_OPEN}>"
    blocks.append(section(f"> {shown}\n{link}" if shown else link))
    blocks.append(_approval_buttons(doc, value, words))
    if recent:
        blocks += [
            section(t)
            for t in pack(audit_lines(recent, words, named), words.APPROVAL_RECENT_HEADER)
        ]
    return Rendered.build(head, blocks)
