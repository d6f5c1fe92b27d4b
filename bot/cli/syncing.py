"""``kb sync``: keep folders, URL lists and sitemaps in the knowledge base (``index.sync.sources``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from bot.cli.base import ProgressBar, emit, json_option, main, open_kb, settings_of
from index.models import EVERYONE
from index.sync import (
    DEFAULT_READ_TIMEOUT,
    DEFAULT_SYNC_UPLOADER,
    DEFAULT_TOTAL_TIMEOUT,
    FetchPolicy,
    SourceReport,
    SyncConfigError,
    SyncSource,
    load_sources,
    source_from_argument,
    sync_sources,
)


@main.command()
@click.argument("sources", nargs=-1)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file of [[source]] tables (README, 'Keeping a folder or a site in sync').",
)
@click.option("--id", "source_id", default=None, help="Id of the one source given as argument.")
@click.option(
    "--scope",
    default=EVERYONE,
    show_default=True,
    help=f"'{EVERYONE}' for everyone, or a Slack channel id (sources given as arguments).",
)
@click.option(
    "--uploader",
    default=DEFAULT_SYNC_UPLOADER,
    show_default=True,
    help="Who the documents are credited to: a Slack user id or a name (arguments).",
)
@click.option(
    "--allow-host", "allow_hosts", multiple=True, help="A host redirects may lead to (repeatable)."
)
@click.option(
    "--allow-private",
    is_flag=True,
    help="Fetch from private, loopback and link-local addresses (an intranet site).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_READ_TIMEOUT,
    show_default=True,
    help="Seconds to wait for a server to connect or send more.",
)
@click.option(
    "--max-time",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TOTAL_TIMEOUT,
    show_default=True,
    help="Seconds one download may take in all.",
)
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@json_option("Print the summary as JSON.")
@click.pass_context
def sync(
    ctx: click.Context,
    sources: tuple[str, ...],
    config_file: Path | None,
    source_id: str | None,
    scope: str,
    uploader: str,
    allow_hosts: tuple[str, ...],
    allow_private: bool,
    timeout: float,
    max_time: float,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Keep folders, URLs and sitemaps in sync: new and changed items indexed, removed ones removed.

    Exits 1 when a source or an item failed; every other one is still synced.

    Example: kb sync /mnt/share/handbook https://docs.example.com/sitemap.xml
    """
    chosen = _sources(sources, config_file, source_id, scope, uploader, allow_hosts)
    settings = settings_of(ctx)
    policy = FetchPolicy(
        allow_hosts=frozenset(h.lower() for h in allow_hosts),
        allow_private=allow_private,
        max_bytes=settings.max_upload_bytes,
        connect_timeout=min(timeout, 10.0),
        read_timeout=timeout,
        total_timeout=max_time,
    )
    kb = open_kb(ctx)
    bar = ProgressBar("item", quiet=as_json)

    def progress(event: str, info: dict[str, Any]) -> None:
        if event == "item":
            bar.step(info["total"], advance=bool(info["index"]), note=str(info["item"])[-40:])

    reports = sync_sources(kb, chosen, policy=policy, dry_run=dry_run, progress=progress)
    bar.close(last_step=True)
    data = {"dry_run": dry_run, "sources": [r.as_dict() for r in reports]}
    emit(data, as_json, lambda: print_reports(reports, dry_run))
    if not all(r.ok for r in reports):
        sys.exit(1)


def _sources(
    args: tuple[str, ...],
    config_file: Path | None,
    source_id: str | None,
    scope: str,
    uploader: str,
    allow_hosts: tuple[str, ...],
) -> list[SyncSource]:
    if not args and config_file is None:
        raise click.UsageError("Give a folder, a URL or a sitemap, or --config FILE.")
    if source_id and len(args) != 1:
        raise click.UsageError("--id names one source: give exactly one folder or URL with it.")
    try:
        chosen = load_sources(config_file) if config_file else []
        chosen += [
            source_from_argument(
                a, source_id=source_id, scope=scope, uploader=uploader, allow_hosts=allow_hosts
            )
            for a in args
        ]
    except SyncConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    return chosen


def print_reports(reports: list[SourceReport], dry_run: bool) -> None:
    """Each source's report for a person: what changed, failed or was skipped, then the counts."""
    would = "would be " if dry_run else ""
    for r in reports:
        click.echo(f"{r.source} ({r.location})")
        if r.error:
            click.echo(f"  error    {r.error}")
        if r.truncated:
            click.echo(f"  stopped  {r.truncated}")
        for verb, items in (("added", r.added), ("changed", r.changed), ("removed", r.removed)):
            for item in items:
                click.echo(f"  {verb:<8} {item}")
        for item, reason in r.failed:
            click.echo(f"  failed   {item}: {reason}")
        for s in r.skipped:
            click.echo(f"  skipped  {s}")
        click.echo(
            f"  {len(r.added)} added, {len(r.changed)} changed, {len(r.removed)} removed "
            f"{would}- {len(r.unchanged)} unchanged, {len(r.failed)} failed, "
            f"{len(r.skipped)} skipped."
        )
