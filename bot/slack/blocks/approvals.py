"""Approvals as Block Kit: the request with Approve / Reject, and the audit log's lines.

Everything the uploader wrote (the file's name, title, preview) is escaped and
its links inert; actors are shown as code, so a list of changes pings nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from slack_sdk.models.blocks import Block, ConfirmObject

from bot.slack import messages
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
)
from index.names import display_name
from index.records import AuditEntry, DocumentRow

PREVIEW_CHARS = 600
MAX_LISTED_VERSIONS = 3
APPROVAL_BLOCK_ID = "kb_approval"


def audit_lines(entries: Sequence[AuditEntry]) -> list[str]:
    """One line per change, newest first; actors as code, so a list of changes pings nobody."""
    lines = []
    for e in entries:
        when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        action = messages.AUDIT_ACTIONS.get(str(e.action), str(e.action))
        document = _document_label(e.document_id, e.name, e.scope)
        lines.append(messages.audit_line(when, code(e.actor), action, document))
    return lines


def _document_label(doc_id: int | None, name: str, scope: str) -> str:
    if doc_id is None:
        return ""
    return f"*{escape(display_name(name))}* #{doc_id} ({scope_label(scope)})"


def _approval_buttons(doc: DocumentRow, value: str) -> Block:
    confirm = ConfirmObject(
        title=plain_text(messages.REJECT_CONFIRM_TITLE),
        text=plain_text(messages.reject_confirm_text(display_name(doc.name))),
        confirm=plain_text(messages.REJECT_CONFIRM_YES),
        deny=plain_text(messages.REJECT_CONFIRM_NO),
        style="danger",
    )
    reject = button(REJECT_ACTION_ID, messages.REJECT, value, "danger", confirm=confirm)
    approve = button(APPROVE_ACTION_ID, messages.APPROVE, value, "primary")
    return actions([approve, reject], block_id=APPROVAL_BLOCK_ID)


def render_approval_request(
    doc: DocumentRow,
    *,
    beside: Sequence[DocumentRow],
    preview: str,
    url: str,
    value: str,
    recent: Sequence[AuditEntry],
) -> Rendered:
    """The message asking the admins to approve or reject ``doc``.

    Args:
        beside: the searchable documents an approval would replace.
        preview: the start of its canonical text (escaped here: the uploader wrote it).
        url: a link to the whole document in the viewer.
        value: what the buttons carry back (``bot.slack.approvals.Ticket``).
        recent: the latest audit entries, for context.
    """
    name = label(doc.name)
    head = messages.approval_request(
        mention(doc.uploader), name, scope_label(doc.scope), doc.chunk_count
    )
    blocks: list[Block] = [section(head)]
    if doc.title and doc.title != doc.name:
        # Answers cite a document by its title: the admin approves that too.
        blocks.append(context(messages.approval_title(label(doc.title))))
    if beside:
        listed = [
            f"*{escape(display_name(d.name))}* #{d.id} from {code(d.uploader)}"
            for d in beside[:MAX_LISTED_VERSIONS]
        ]
        blocks.append(section(messages.approval_replaces(listed)))
    shown = quote(inert_links(preview), PREVIEW_CHARS)
    link = f"<{safe_url(url)}|{messages.APPROVAL_OPEN}>"
    blocks.append(section(f"> {shown}\n{link}" if shown else link))
    blocks.append(_approval_buttons(doc, value))
    if recent:
        blocks += [section(t) for t in pack(audit_lines(recent), messages.APPROVAL_RECENT_HEADER)]
    return Rendered.build(head, blocks)
