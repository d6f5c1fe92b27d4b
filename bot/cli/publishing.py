"""``kb`` commands over who changed what: the audit log, restoring versions, approvals.

Run on the server, these act as the operator: their audit entries name ``cli``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from bot.cli.base import ProgressBar, emit, json_option, main, open_kb, settings_of
from bot.cli.documents import summary
from index.records import AuditEntry

DEFAULT_AUDIT_LIMIT = 50
OPERATOR = "cli"
SHA_CHARS = 12


@main.command()
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_AUDIT_LIMIT,
    show_default=True,
    help="How many of the latest changes to show.",
)
@json_option("Print the entries as JSON.")
@click.pass_context
def audit(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Show the latest changes to the knowledge base: who added, replaced, approved, restored...

    Newest first. Each entry has the time, who (a Slack user id, or "cli"),
    the action (add, replace, remove, submit, approve, reject, reindex,
    restore), the document and its scope, and the sha256 of the content before
    and after.

    Example: kb audit --limit 20
    """
    from index.storage import Store

    # The log only: no need to load the embedding model for this.
    entries = Store(settings_of(ctx).data_dir).audit_log.entries(limit)

    def text() -> None:
        if not entries:
            click.echo("No changes recorded yet.")
        for e in entries:
            click.echo(_audit_line(e))

    emit([e.to_dict() for e in entries], as_json, text)


def _audit_line(e: AuditEntry) -> str:
    when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    document = f"#{e.document_id} {e.name} ({e.scope})" if e.document_id is not None else ""
    change = f"{_short(e.old_sha256)} -> {_short(e.new_sha256)}" if document else ""
    parts = [f"{e.id:>5}", when, f"{e.actor:<12}", f"{e.action:<8}", document, change, e.detail]
    return "  ".join(p for p in parts if p)


def _short(sha256: str | None) -> str:
    return sha256[:SHA_CHARS] if sha256 else "-"


@main.command()
@click.argument("doc")
@json_option("Print the restored version and the one it replaced as JSON.")
@click.pass_context
def restore(ctx: click.Context, doc: str, as_json: bool) -> None:
    """Bring back the previous version of a document; the current one is kept as replaced.

    DOC is a replaced version (by id or sha256 prefix), or a document (by id
    or name), whose newest earlier version is restored. Running it again
    swaps back.

    Example: kb restore expenses.md
    """
    kb = open_kb(ctx)
    bar = ProgressBar("passage", quiet=as_json)

    def progress(event: str, info: dict[str, Any]) -> None:
        if event == "embedding":
            bar.reach(info["done"], info["total"], note=info["document"][:40])

    done = kb.restore(kb.find(doc).id, actor=OPERATOR, progress=progress)
    bar.close()
    row = done.document
    data = {"restored": summary(row), "replaced": [summary(r) for r in done.replaced]}

    def text() -> None:
        click.echo(f"Restored {row.name} (#{row.id}, {row.chunk_count} chunks).")
        for old in done.replaced:
            click.echo(f"It replaces #{old.id}, kept as an earlier version.")

    emit(data, as_json, text)


@main.command()
@click.argument("doc")
@click.pass_context
def approve(ctx: click.Context, doc: str) -> None:
    """Approve a document awaiting approval: it is used for answers from now on.

    The same as an admin's Approve button in Slack, for when no admin was
    reachable there (the uploader is not told).

    Example: kb approve 12
    """
    kb = open_kb(ctx)
    done = kb.approve(kb.find(doc).id, actor=OPERATOR)
    replaced = (
        f"; it replaces #{', #'.join(str(r.id) for r in done.replaced)}" if done.replaced else ""
    )
    click.echo(f"Approved {done.document.name} (#{done.document.id}){replaced}.")


@main.command()
@click.argument("doc")
@click.pass_context
def reject(ctx: click.Context, doc: str) -> None:
    """Reject a document awaiting approval: it is deleted from the knowledge base.

    The same as an admin's Reject button in Slack, for when no admin was
    reachable there (the uploader is not told).

    Example: kb reject 12
    """
    kb = open_kb(ctx)
    row = kb.reject(kb.find(doc).id, actor=OPERATOR)
    click.echo(f"Rejected and removed {row.name} (#{row.id}).")
