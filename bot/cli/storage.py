"""``kb migrate-store``: move the knowledge base of the data dir into a shared Postgres database."""

from __future__ import annotations

import click

from bot.cli.base import ProgressBar, emit, json_option, main, settings_of


@main.command("migrate-store")
@click.option(
    "--to",
    "url",
    default=None,
    metavar="postgresql://...",
    help="The empty Postgres database to fill (default: KB_DATABASE_URL, which keeps the "
    "password off the command line).",
)
@json_option("Print the counts and checksums as JSON.")
@click.pass_context
def migrate_store(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """Copy the SQLite knowledge base of the data dir (every table, the originals) into Postgres.

    The copy is one transaction, checked table by table (rows and checksums)
    before it commits; a database that is not empty is refused, and a failed
    copy leaves it empty, so it can be run again. Then set KB_DATABASE_URL on
    every replica.

    Example: KB_DATABASE_URL=postgresql://kb:PASSWORD@db/kb kb migrate-store
    """
    from index.storage import migrate_store as copy_store

    settings = settings_of(ctx)
    target = url or settings.database_url.get_secret_value()
    if not target:
        raise click.UsageError(
            "Give the target database: --to postgresql://... or KB_DATABASE_URL."
        )
    bars: dict[str, ProgressBar] = {}

    def progress(table: str, done: int, total: int) -> None:
        bar = bars.setdefault(table, ProgressBar(table, quiet=as_json))
        bar.reach(done, total, note=f"{done}/{total}")
        if done >= total:
            bar.close()

    report = copy_store(settings.data_dir, target, progress=progress)
    data = report.to_dict()

    def text() -> None:
        click.echo(f"from {data['source']}")
        click.echo(f"to   {data['target']}")
        for t in data["tables"]:
            mark = "ok" if t["matches"] else "MISMATCH"
            click.echo(
                f"{t['table']:<12} {t['rows']:>8} rows  sha256-sum {t['checksum'][:16]}  {mark}"
            )
        click.echo("Copied and checked. Set KB_DATABASE_URL on every replica and restart them.")

    emit(data, as_json, text)
