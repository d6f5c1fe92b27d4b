"""``kb canvases sync``: the canvases of Slack channels as documents of those channels (``bot.slack.canvases``)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import click

from bot.cli.base import emit, json_option, main, open_kb, settings_of
from bot.cli.syncing import print_reports

if TYPE_CHECKING:
    from index.sync import SourceReport


@main.group()
def canvases() -> None:
    """Slack canvases kept as documents of their channel (docs/canvases.md)."""


@canvases.command("sync")
@click.option(
    "--channel",
    "channels",
    multiple=True,
    help="A channel id whose canvases to sync (repeatable); default: KB_CANVAS_CHANNELS.",
)
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@json_option("Print the summary as JSON.")
@click.pass_context
def sync(ctx: click.Context, channels: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Sync channels' canvases now: new and edited ones indexed, deleted ones removed.

    Exits 1 when a channel or a canvas failed; every other one is still synced.

    Example: kb canvases sync --channel C0123ABCD
    """
    from bot.access import web_client
    from bot.slack.canvases import Canvases
    from bot.slack.config import is_channel_id

    settings = settings_of(ctx)
    chosen = sorted(set(channels) or settings.canvas_channel_ids)
    if not chosen:
        raise click.UsageError("Give --channel C..., or set KB_CANVAS_CHANNELS.")
    bad = [c for c in chosen if not is_channel_id(c)]
    if bad:
        raise click.UsageError(f"Not a channel id: {', '.join(bad)} (C... or G...).")
    token = settings.slack_bot_token.get_secret_value()
    if not token:
        raise click.UsageError("SLACK_BOT_TOKEN is not set: canvases are read with the bot token.")
    keeper = Canvases(open_kb(ctx), chosen)

    async def run() -> list[SourceReport]:
        client = web_client(token, settings.slack_api_url)
        return [await keeper.sync(client, c, dry_run=dry_run) for c in chosen]

    reports = asyncio.run(run())
    data = {"dry_run": dry_run, "sources": [r.as_dict() for r in reports]}
    emit(data, as_json, lambda: print_reports(reports, dry_run))
    if not all(r.ok for r in reports):
        sys.exit(1)
