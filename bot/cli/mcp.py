"""``kb mcp-token``: issue, list and revoke the bearer tokens of MCP clients (``KB_MCP=on``).

A token runs its calls as one Slack person: the documents for everyone and
those of the channels that person is a member of, narrowed with ``--scope`` to
some of them (a scope never adds a channel the person is not in). It is printed once, when created; the store keeps only
its hash (``index.storage.mcp_tokens``).
"""

from __future__ import annotations

import time
from typing import Any

import click

from bot.cli.base import emit, json_option, main, open_kb


@main.group("mcp-token")
def mcp_token() -> None:
    """Bearer tokens of MCP clients: each calls the knowledge base as one Slack person.

    Example: kb mcp-token create --user U0123ABCD --name claude-alice
    """


@mcp_token.command("create")
@click.option("--user", "user_id", required=True, help="Slack user id the calls run as (U...).")
@click.option("--name", required=True, help="A name for the token, shown in the query log.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="CHANNEL",
    help="Narrow the token to this channel id (C.../G...): of the channels the person is a "
    "member of, it searches only these, and of synced sources only what is public in the "
    "organisation; repeat for more. None: all of them.",
)
@click.option(
    "--expires-days",
    type=float,
    default=None,
    help="Days until the token stops working (default: until revoked).",
)
@json_option("Print the token and its record as JSON.")
@click.pass_context
def create(
    ctx: click.Context,
    user_id: str,
    name: str,
    scopes: tuple[str, ...],
    expires_days: float | None,
    as_json: bool,
) -> None:
    """Issue a token for an MCP client and print it once (only its hash is kept).

    Example: kb mcp-token create --user U0123ABCD --name claude-alice --scope C0456EFGH --expires-days 90
    """
    tokens = open_kb(ctx).store.mcp_tokens
    token, record = tokens.issue(name, user_id=user_id, scopes=scopes, expires_in_days=expires_days)
    data = {"token": token, **record.to_dict(time.time())}

    def text() -> None:
        click.echo(token)
        click.echo(
            f"Token {record.name!r} for {record.user_id} ({_scopes_text(record.scopes)}, "
            f"{_expiry_text(record.expires_at)}). Copy it now: it is not shown again.",
            err=True,
        )

    emit(data, as_json, text)


@mcp_token.command("list")
@json_option("Print the tokens as JSON.")
@click.pass_context
def list_tokens(ctx: click.Context, as_json: bool) -> None:
    """List the tokens issued (never the tokens themselves): person, scopes, state, expiry.

    Example: kb mcp-token list
    """
    now = time.time()
    rows: list[dict[str, Any]] = [t.to_dict(now) for t in open_kb(ctx).store.mcp_tokens.tokens()]

    def text() -> None:
        if not rows:
            click.echo("No MCP tokens. Issue one with kb mcp-token create.")
        for r in rows:
            click.echo(
                f"{r['name']:<24} {r['user']:<12} {r['state']:<8} "
                f"{_expiry_text(r['expires_at'])}  {_scopes_text(tuple(r['scopes']))}"
            )

    emit(rows, as_json, text)


@mcp_token.command("revoke")
@click.argument("name")
@json_option("Print the revoked token's record as JSON.")
@click.pass_context
def revoke(ctx: click.Context, name: str, as_json: bool) -> None:
    """Revoke a token: from now on every call with it gets 401.

    Example: kb mcp-token revoke claude-alice
    """
    record = open_kb(ctx).store.mcp_tokens.revoke(name)
    emit(
        record.to_dict(time.time()),
        as_json,
        lambda: click.echo(f"Revoked {record.name!r} ({record.user_id})."),
    )


def _scopes_text(scopes: tuple[str, ...]) -> str:
    if not scopes:
        return "the person's channels"
    return "the person's channels among " + ", ".join(scopes)


def _expiry_text(expires_at: float | None) -> str:
    if expires_at is None:
        return "no expiry"
    return "expires " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires_at))
