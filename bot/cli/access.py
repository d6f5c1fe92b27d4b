"""``kb access``: who may read what, as every surface decides it (``bot.access``).

``kb access explain --user U… DOC`` says whether that person may read that
document and why: whether they are served, the rule that decides (a document
for everyone, a channel's members, a synced document's source permissions
matched by the person's verified email), the channel, their membership as Slack
says it now, or why it cannot be known (and so is hidden). ``kb ask --as U…``
answers as that person. Both ask Slack with ``SLACK_BOT_TOKEN``, and say so
when there is none.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from bot.cli.base import emit, json_option, main, open_kb, settings_of

if TYPE_CHECKING:  # the rule loads only for the commands that ask it
    from bot.access import Access, Where
    from index.knowledge_base import KnowledgeBase

NO_TOKEN_NOTE = (
    "SLACK_BOT_TOKEN is not set, so nobody can say which channels {user} is in: "
    "only the documents for everyone are read as them."
)


def open_access(ctx: click.Context) -> Access:
    """The access rule of the configured workspace (over no directory without a bot token)."""
    from bot.access import SourceGrants, slack_access

    grants = SourceGrants(open_kb(ctx).store)
    return slack_access(settings_of(ctx).access_config(), grants=grants)


async def scopes_as(
    access: Access, kb: KnowledgeBase, user: str, channels: tuple[str, ...]
) -> frozenset[str]:
    """The scopes a question asked as ``user`` searches: their channels, narrowed to ``channels``.

    Raises:
        NotServed: ``user`` is not served (another organisation, deactivated).
        AccessCheckUnavailable: Slack cannot be asked right now.
    """
    from bot.access import NotServed, Person
    from index.models import EVERYONE, DocState

    person = Person(user)
    served = await access.served(person)
    if not served.allowed:
        raise NotServed(served.reason)
    if access.members is None:
        return await access.source_scopes(person)
    indexed = await asyncio.to_thread(kb.store.documents, DocState.INDEXED)
    offered = sorted({d.scope for d in indexed} - {EVERYONE})
    if channels:
        offered = [c for c in offered if c in channels]
    return await access.search_scopes(person, None, offered, strict=True)


@main.group("access")
def access_group() -> None:
    """Who may read what: the one rule Slack, the viewer, Work Objects and MCP ask.

    Example: kb access explain --user U0123ABCD falcon.md
    """


@access_group.command("explain")
@click.option("--user", "user_id", required=True, help="The Slack user id (U...) asking.")
@click.argument("doc")
@click.option(
    "--in",
    "channel",
    default=None,
    metavar="CHANNEL",
    help="Shown in this channel to everyone there (an answer or a Work Object posted in it); "
    "default: read by the person alone (the viewer, a DM, an MCP tool, kb ask --as).",
)
@click.option(
    "--shared",
    is_flag=True,
    help="The channel of --in is shared with another organisation (Slack Connect).",
)
@json_option("Print the decision and every check as JSON.")
@click.pass_context
def explain(
    ctx: click.Context, user_id: str, doc: str, channel: str | None, shared: bool, as_json: bool
) -> None:
    """Say whether a person may read a document (by id, name or sha256 prefix), and why.

    The checks in order: whether the person is served (this workspace, not
    deactivated), whether the place shows the document (with --in), and the
    document's own rule: everyone, or the members of its channel as Slack
    lists them now. A check that cannot be made hides the document.

    Example: kb access explain --user U0123ABCD 12 --json
    """
    from bot.access import Person, Where
    from index.sources import document_source

    kb = open_kb(ctx)
    row = kb.find(doc)
    origin = document_source(kb, row.scope)
    access = open_access(ctx)
    where = Where(channel=channel, shared=shared) if channel or shared else None
    checks = asyncio.run(access.explain(Person(user_id), row, where))
    decision = checks[-1]
    data: dict[str, Any] = {
        "user": user_id,
        "document": {
            "id": row.id,
            "name": row.name,
            "scope": row.scope,
            "state": row.state,
            "source": origin,
        },
        "where": _where(where),
        "may_read": decision.allowed,
        **{k: v for k, v in decision.to_dict().items() if k != "allowed"},
        "searchable": row.state == "indexed",
        "checks": [c.to_dict() for c in checks],
    }

    def text() -> None:
        verb = "may read" if decision.allowed else "may not read"
        click.echo(f"{user_id} {verb} document {row.id} ({row.name}).")
        if origin is not None:
            click.echo(f"  from {origin['source']}, read by {origin['acl']['readers']}")
        for check in checks:
            click.echo(f"  {'yes' if check.allowed else 'no ':<3}  {check.rule:<12} {check.reason}")
        if row.state != "indexed":
            click.echo(f"It is not searchable now ({row.state}): no surface shows it.")

    emit(data, as_json, text)


def _where(where: Where | None) -> dict[str, Any] | None:
    return None if where is None else {"channel": where.channel, "shared": where.shared}
