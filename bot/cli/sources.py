"""``kb source``: the places documents are synced from with their permissions (``index.sources``).

``kb source add confluence --url URL --space KEY`` or ``kb source add notion
--public`` records a source (never its credential: that stays in the settings,
``KB_CONFLUENCE_TOKEN``, ``KB_NOTION_TOKEN``, or in a secret file it names);
``kb source list``
``kb source add confluence --url URL --space KEY`` (or ``gdrive --drive ID``)
records a source (never its credential: that stays in the settings,
``KB_CONFLUENCE_TOKEN``, ``KB_GDRIVE_CREDENTIALS``, or in a secret file it
names); ``kb source list``
shows each with its last run; ``kb source sync [NAME]`` runs them;
``kb source readers NAME`` changes who reads one in place;
``kb source remove NAME`` removes one and its documents.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from bot.cli.base import emit, json_option, main, open_kb, settings_of

SYNC_FAILED_EXIT = 1


@main.group("source")
def source_group() -> None:
    """Sources synced with their permissions (Confluence, Google Drive, SharePoint, Notion).

    Example: kb source add confluence --url https://example.atlassian.net/wiki --space ENG
    """


@source_group.group("add")
def add_group() -> None:
    """Record a source of one kind; its documents come with the next kb source sync.

    Example: kb source add confluence --url https://example.atlassian.net/wiki --space ENG
    """


def name_option(default: str) -> Any:
    """``--name``: what to call the source."""
    return click.option(
        "--name", default=None, help=f"What to call the source (default: {default}, lower-cased)."
    )


def token_file_option(setting: str) -> Any:
    """``--token-file``: a secret file holding the source's credential."""
    return click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=f"A file holding the credential (default: {setting}).",
    )


def record_source(
    ctx: click.Context,
    kind: str,
    name: str,
    settings: dict[str, Any],
    token_file: Path | None,
    as_json: bool,
    where: str,
) -> None:
    """Check ``settings`` for ``kind``, record the source, and say where it reads its token."""
    from index.sources import TOKEN_SETTINGS, check_name
    from index.sources import settings_of as checked

    name = check_name(name)
    if token_file is not None:
        settings["token_file"] = str(token_file.resolve())
    row = open_kb(ctx).store.sources.add(name, kind, checked(kind, settings))

    def text() -> None:
        click.echo(f"Source {row.name} ({row.kind}) recorded: {where}.")
        token = row.settings.get("token_file") or TOKEN_SETTINGS[row.kind]
        click.echo(f"Its credential is read from {token} when it syncs: kb source sync {row.name}")

    emit(row.as_dict(), as_json, text)


@add_group.command("confluence")
@click.option(
    "--url",
    required=True,
    help="The site: https://NAME.atlassian.net/wiki, or the Data Center base URL.",
)
@click.option("--space", required=True, help="The space key.")
@name_option("confluence-SPACE")
@click.option(
    "--user",
    default="",
    help="Cloud: the account's email (its API token is the credential); empty: a Data Center "
    "personal access token.",
)
@token_file_option("KB_CONFLUENCE_TOKEN")
@click.option(
    "--organisation-group",
    "organisation_groups",
    multiple=True,
    help="A group that stands for everyone in the organisation (confluence-users); what it may "
    "read is public in the organisation. Repeatable.",
)
@json_option("Print the recorded source as JSON.")
@click.pass_context
def add_confluence(
    ctx: click.Context,
    url: str,
    space: str,
    name: str | None,
    user: str,
    token_file: Path | None,
    organisation_groups: tuple[str, ...],
    as_json: bool,
) -> None:
    """A Confluence space (Cloud or Data Center).

    Example: kb source add confluence --url https://example.atlassian.net/wiki --space ENG
    --user bot@example.com --organisation-group confluence-users
    """
    settings: dict[str, Any] = {
        "url": url,
        "space": space,
        "user": user,
        "organisation_groups": list(organisation_groups),
    }
    record_source(
        ctx,
        "confluence",
        name or f"confluence-{space}".lower(),
        settings,
        token_file,
        as_json,
        f"{url}, space {space}",
    )


@add_group.command("sharepoint")
@click.option("--tenant", required=True, help="The directory (tenant) id, or its domain.")
@click.option("--client-id", required=True, help="The app registration's application (client) id.")
@click.option(
    "--site",
    default="",
    help="A SharePoint site's address (https://contoso.sharepoint.com/sites/NAME): its default "
    "document library is synced.",
)
@click.option("--drive", default="", help="Or a drive's id (a OneDrive, another library).")
@name_option("sharepoint-SITE or sharepoint-DRIVE")
@token_file_option("KB_SHAREPOINT_CLIENT_SECRET")
@click.option(
    "--organisation-group",
    "organisation_groups",
    multiple=True,
    help="A group id or site group name that stands for everyone in the organisation; what it "
    "may read is public in the organisation. Repeatable.",
)
@click.option(
    "--graph-url",
    default="https://graph.microsoft.com/v1.0",
    show_default=True,
    help="Microsoft Graph (another for national clouds).",
)
@click.option(
    "--authority-url",
    default="https://login.microsoftonline.com",
    show_default=True,
    help="Microsoft's sign-in service (another for national clouds).",
)
@json_option("Print the recorded source as JSON.")
@click.pass_context
def add_sharepoint(
    ctx: click.Context,
    tenant: str,
    client_id: str,
    site: str,
    drive: str,
    name: str | None,
    token_file: Path | None,
    organisation_groups: tuple[str, ...],
    graph_url: str,
    authority_url: str,
    as_json: bool,
) -> None:
    """A SharePoint site's document library, or a OneDrive or library by drive id (Microsoft Graph).

    Example: kb source add sharepoint --tenant contoso.onmicrosoft.com --client-id GUID
    --site https://contoso.sharepoint.com/sites/Eng
    """
    settings: dict[str, Any] = {
        "tenant": tenant,
        "client_id": client_id,
        "site": site,
        "drive": drive,
        "organisation_groups": list(organisation_groups),
        "graph_url": graph_url,
        "authority_url": authority_url,
    }
    default = site.rstrip("/").rsplit("/", 1)[-1] if site else drive[-12:]
    default = re.sub(r"[^a-z0-9._-]+", "-", default.lower()).strip("-.")
    record_source(
        ctx,
        "sharepoint",
        name or f"sharepoint-{default}".lower(),
        settings,
        token_file,
        as_json,
        site or f"drive {drive}",
    )


@add_group.command("notion")
@name_option("notion")
@token_file_option("KB_NOTION_TOKEN")
@click.option(
    "--public", is_flag=True, help="Everyone in the organisation reads every page of the source."
)
@click.option(
    "--user", "users", multiple=True, help="An email of a person who reads it. Repeatable."
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    help="workspace: the workspace's members as Notion lists them, by email (Notion's API has "
    "no other groups). Repeatable.",
)
@click.option(
    "--domain", "domains", multiple=True, help="An email domain whose people read it. Repeatable."
)
@click.option(
    "--api-url", default="https://api.notion.com", help="Notion's API (or a proxy in front of it)."
)
@json_option("Print the recorded source as JSON.")
@click.pass_context
def add_notion(
    ctx: click.Context,
    name: str | None,
    token_file: Path | None,
    public: bool,
    users: tuple[str, ...],
    groups: tuple[str, ...],
    domains: tuple[str, ...],
    api_url: str,
    as_json: bool,
) -> None:
    """The pages and databases shared with a Notion integration.

    Notion shows an integration no page's permissions: say who reads the source
    with --public, --user, --group workspace or --domain; with none, nobody does.

    Example: kb source add notion --name notion-eng --domain example.com
    """
    settings: dict[str, Any] = {
        "public": public,
        "users": list(users),
        "groups": list(groups),
        "domains": list(domains),
        "api_url": api_url,
    }
    readers = "everyone in the organisation" if public else ", ".join([*users, *groups, *domains])
    where = f"pages shared with the integration, read by {readers or 'nobody (none was named)'}"
    record_source(ctx, "notion", name or "notion", settings, token_file, as_json, where)


@add_group.command("gdrive")
@click.option(
    "--drive", default="", help="A shared drive's id (from its address: drive/folders/ID)."
)
@click.option(
    "--folder", default="", help="A folder's id: only what is under it, at any depth, is synced."
)
@name_option("gdrive-DRIVE or gdrive-FOLDER")
@click.option(
    "--subject",
    default="",
    help="A user the service account acts as (domain-wide delegation); empty: the service "
    "account itself, with the drive or folder shared with it.",
)
@click.option(
    "--anyone-public",
    is_flag=True,
    help="A file anyone with its link may open is public in the organisation (default: such a "
    "link admits nobody more than the file's other permissions).",
)
@click.option("--api-url", default="", help="Google's API base, for a proxy (default: Google's).")
@token_file_option("KB_GDRIVE_CREDENTIALS")
@json_option("Print the recorded source as JSON.")
@click.pass_context
def add_gdrive(
    ctx: click.Context,
    drive: str,
    folder: str,
    name: str | None,
    subject: str,
    anyone_public: bool,
    api_url: str,
    token_file: Path | None,
    as_json: bool,
) -> None:
    """A Google shared drive, or a folder (read by a service account).

    Example: kb source add gdrive --drive 0AEngDriveId --subject kb-reader@example.com
    """
    settings: dict[str, Any] = {
        "drive": drive,
        "folder": folder,
        "subject": subject,
        "anyone_public": anyone_public,
        "api_url": api_url,
    }
    where = f"folder {folder}" if folder else f"shared drive {drive}"
    record_source(
        ctx,
        "gdrive",
        name or f"gdrive-{folder or drive}".lower(),
        settings,
        token_file,
        as_json,
        where,
    )


@source_group.command("readers")
@click.argument("name")
@click.option(
    "--public", is_flag=True, help="Notion: everyone in the organisation reads every page."
)
@click.option("--user", "users", multiple=True, help="Notion: a person's email. Repeatable.")
@click.option(
    "--group", "groups", multiple=True, help="Notion: workspace (its members). Repeatable."
)
@click.option("--domain", "domains", multiple=True, help="Notion: an email domain. Repeatable.")
@click.option(
    "--anyone-public",
    is_flag=True,
    help="Google Drive: a file anyone with its link may open is public in the organisation.",
)
@click.option(
    "--organisation-group",
    "organisation_groups",
    multiple=True,
    help="Confluence, SharePoint: a group that stands for everyone in the organisation. "
    "Repeatable.",
)
@json_option("Print the change as JSON.")
@click.pass_context
def readers(
    ctx: click.Context,
    name: str,
    public: bool,
    users: tuple[str, ...],
    groups: tuple[str, ...],
    domains: tuple[str, ...],
    anyone_public: bool,
    organisation_groups: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change who reads a source's documents in place; the readers named replace its readers.

    Every synced document's permissions change at once: whom the new readers no
    longer admit is shown none of them from now on. What only the source can
    tell (which Drive files have a link, who a group holds) comes with the next
    sync. A reader option the source's kind lacks is refused; none named
    leaves none (a Notion source is then read by nobody). Audited.

    Example: kb source readers notion-board --user ceo@example.com --user cfo@example.com
    """
    from index.sources import change_readers

    given = {
        "public": public,
        "users": list(users),
        "groups": list(groups),
        "domains": list(domains),
        "anyone_public": anyone_public,
        "organisation_groups": list(organisation_groups),
    }
    change = change_readers(open_kb(ctx), name, {k: v for k, v in given.items() if v})

    def text() -> None:
        click.echo(
            f"Source {change.source} ({change.kind}): the permissions of its "
            f"{change.documents} documents follow its new readers now; what only the source "
            f"can tell comes with the next sync: kb source sync {change.source}"
        )

    emit(change.as_dict(), as_json, text)


@source_group.command("list")
@json_option("Print the sources as JSON.")
@click.pass_context
def list_sources(ctx: click.Context, as_json: bool) -> None:
    """List the sources, their documents and how their last sync went.

    Example: kb source list --json
    """
    kb = open_kb(ctx)
    rows = [
        {**row.as_dict(), "documents": len(kb.store.sources.items(row.name))}
        for row in kb.store.sources.all()
    ]

    def text() -> None:
        if not rows:
            click.echo(
                "No sources yet. Add one with: kb source add confluence --url URL --space KEY"
            )
        for r in rows:
            state = "ok" if r["last_error"] is None else f"FAILING: {r['last_error']}"
            click.echo(
                f"{r['name']:<24} {r['kind']:<11} {r['documents']:>6} documents  "
                f"last good sync {_when(r['last_good_at'])}  {state}"
            )

    emit(rows, as_json, text)


@source_group.command("sync")
@click.argument("name", required=False)
@click.option("--full", is_flag=True, help="Load everything again instead of polling the changes.")
@json_option("Print each source's report as JSON.")
@click.pass_context
def sync_command(ctx: click.Context, name: str | None, full: bool, as_json: bool) -> None:
    """Sync one source, or all: prune what is gone, refresh permissions, fetch what changed.

    Exits 1 when a source failed (its reason is in the report and in kb source list).

    Example: kb source sync confluence-eng
    """
    from index.sources import DownloadLimits, open_and_sync

    kb = open_kb(ctx)
    settings = settings_of(ctx)
    tokens = settings.source_tokens()
    limits = DownloadLimits(kb.config.max_upload_bytes, settings.download_timeout)
    rows = [kb.store.sources.get(name)] if name else kb.store.sources.all()
    reports = []
    for row in rows:
        if full:
            kb.store.sources.set_checkpoint(row.name, "")
        reports.append(open_and_sync(kb, row, tokens, limits).as_dict())

    def text() -> None:
        for r in reports:
            if r["error"]:
                click.echo(f"{r['source']}: FAILED: {r['error']}")
                continue
            if r["mode"] == "busy":
                click.echo(f"{r['source']}: another process is syncing it; left to it")
                continue
            click.echo(
                f"{r['source']} ({r['mode']}): {len(r['added'])} added, {len(r['changed'])} "
                f"changed, {r['unchanged']} unchanged, {len(r['removed'])} removed, "
                f"{r['permissions']} permissions refreshed, {len(r['failed'])} failed"
            )
            for f in r["failed"]:
                click.echo(f"  failed {f['item']}: {f['reason']}")

    emit(reports, as_json, text)
    if any(r["error"] for r in reports):
        sys.exit(SYNC_FAILED_EXIT)


@source_group.command("remove")
@click.argument("name")
@json_option("Print what was removed as JSON.")
@click.pass_context
def remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Remove a source and every document synced from it.

    Example: kb source remove confluence-eng
    """
    from index.sources import remove_source_documents

    kb = open_kb(ctx)
    kb.store.sources.get(name)
    removed = remove_source_documents(kb, name)
    data = {"source": name, "removed": removed}
    emit(data, as_json, lambda: click.echo(f"Source {name} removed, with its {removed} documents."))


def _when(at: float | None) -> str:
    if at is None:
        return "never"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")
