"""``kb`` commands over the documents: ingest, list, show, retry, remove, reindex, status.

They act as the operator: what they change is audited as ``cli``, and ``kb
ingest`` publishes like an admin (documents for everyone need no approval).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from bot.cli.base import ProgressBar, emit, json_option, main, open_kb, settings_of
from index.models import EVERYONE, DocState
from index.records import DocumentRow
from index.sources import document_source, source_health

# What a listing shows of a document row (the canonical text and worker pid stay out).
SUMMARY_FIELDS = (
    "id",
    "name",
    "title",
    "kind",
    "language",
    "state",
    "chunk_count",
    "scope",
    "size",
    "failure_reason",
    "window_splits",
    "embedding_model",
    "pipeline_version",
    "extractor_version",
    "uploader",
    "publish",
    "replaced_by",
    "sha256",
    "created_at",
    "indexed_at",
)
QUOTE_CHARS = 200


def _copy(doc: DocumentRow) -> dict[str, Any]:
    """A document an ingested one repeats, as ``kb ingest --json`` names it."""
    return {"id": doc.id, "name": doc.name, "title": doc.title, "scope": doc.scope}


def _named(docs: list[DocumentRow]) -> str:
    """Documents an ingested one repeats, as ``kb ingest`` names them."""
    return ", ".join(f"{c.title or c.name} (id {c.id}, scope {c.scope})" for c in docs)


def summary(doc: DocumentRow) -> dict[str, Any]:
    """The fields of a document that listings show, in listing order."""
    values = asdict(doc)
    return {k: values[k] for k in SUMMARY_FIELDS}


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--scope",
    default=EVERYONE,
    show_default=True,
    help=f"'{EVERYONE}' for everyone, or a Slack channel id.",
)
@json_option("Print the summary as JSON.")
@click.pass_context
def ingest(ctx: click.Context, paths: tuple[Path, ...], scope: str, as_json: bool) -> None:
    """Add files and folders to the knowledge base.

    Reads Markdown (.md), plain text (.txt), HTML (.html, .xhtml), PDF (.pdf;
    scanned pages by OCR), Word (.docx, .docm; templates .dotx, .dotm),
    PowerPoint (.pptx, .pptm; .potx, .potm, .ppsx, .ppsm), Excel (.xlsx, .xlsm;
    .xltx, .xltm) and CSV (.csv, .tsv).

    A file that cannot be read fails with its reason and the others go on:
    damaged files, zip bombs (a package expanding past 100 MB, or a part over
    1 MB expanding more than 200 times) and workbooks of more than 1,000,000
    cells are refused; legacy .doc/.xls/.ppt files (in a folder too) and
    OpenDocument files fail with the advice to save them as .docx/.xlsx/.pptx,
    password-protected ones with the advice to remove the password. Images,
    archives and other files fail as unsupported; in a folder they are skipped and listed.

    A file whose text is the same as a document's already in the knowledge
    base (passage for passage, as answers compare copies) is indexed all the
    same, and that document is named ("repeats"); so is a document whose text
    is nearly the same, the same document in another format or version, say
    ("near": answers cite both).

    Exits 1 when a file failed or was refused (too large, or no room on the disk).

    Example: kb ingest handbook/ faq.md
    """
    kb = open_kb(ctx)
    bar = ProgressBar("file", quiet=as_json)

    def progress(event: str, info: dict[str, Any]) -> None:
        if event == "file":
            # Told before each file: the one before it is done.
            name = Path(info["path"]).name[:40]
            bar.step(info["total"], advance=bool(info["index"]), note=name)
        elif event == "embedding":
            # Large files take a while: show that embedding is moving.
            bar.embedding(info)

    result = kb.ingest_paths(list(paths), scope=scope, progress=progress)
    bar.close(last_step=True)
    # Whoever runs kb reads every document: each copy is named, whatever its scope.
    found = kb.repeats_of([d.id for d in result.indexed])
    told = [(d, found[d.id]) for d in result.indexed if d.id in found]
    repeats = [(d, r.same) for d, r in told if r.same]
    near = [(d, r.near) for d, r in told if r.near]

    def text() -> None:
        for d, copies in repeats:
            click.echo(f"repeats  {d.name}: the same text as {_named(copies)}")
        for d, copies in near:
            click.echo(f"near     {d.name}: nearly the same text as {_named(copies)}")
        for d in result.failed:
            click.echo(f"failed   {d.name}: {d.failure_reason}")
        for r in result.refused:
            click.echo(f"refused  {r}")
        for s in result.skipped:
            click.echo(f"skipped  {s}")
        refused = f"{len(result.refused)} refused, " if result.refused else ""
        click.echo(
            f"{len(result.indexed)} indexed ({result.chunks} chunks), "
            f"{len(result.unchanged)} unchanged, {len(result.failed)} failed, "
            f"{refused}{len(result.skipped)} skipped."
        )

    data = {
        "indexed": [summary(d) for d in result.indexed],
        "failed": [summary(d) for d in result.failed],
        "unchanged": [summary(d) for d in result.unchanged],
        "refused": result.refused,
        "skipped": result.skipped,
        "chunks": result.chunks,
        "repeats": [
            {"id": d.id, "name": d.name, "copies": [_copy(c) for c in copies]}
            for d, copies in repeats
        ],
        "near": [
            {"id": d.id, "name": d.name, "copies": [_copy(c) for c in copies]} for d, copies in near
        ],
    }
    fit = kb.language_fit()
    data["languages"] = fit.to_dict()
    emit(data, as_json, text)
    if fit.advice and not as_json:
        click.echo(f"warning: {fit.advice}", err=True)
    if (result.failed or result.refused) and not as_json:
        ctx.exit(1)


@main.command()
@json_option()
@click.pass_context
def docs(ctx: click.Context, as_json: bool) -> None:
    """List documents with their state, chunk count, language, scope and whether they are stale.

    Example: kb docs --json
    """
    kb = open_kb(ctx)
    stale = {d.id for d in kb.stale_documents()}
    rows = [
        {**summary(d), "stale": d.id in stale, "source": document_source(kb, d.scope)}
        for d in kb.documents()
    ]

    def text() -> None:
        if not rows:
            click.echo("No documents yet. Add some with: kb ingest PATH")
        for r in rows:
            state = r["state"] + (" (stale)" if r["stale"] else "")
            extra = f"  {r['failure_reason']}" if r["failure_reason"] else ""
            if r["source"]:
                extra += f"  from {r['source']['source']}, read by {r['source']['acl']['readers']}"
            click.echo(
                f"{r['id']:>5}  {state:<16} {r['chunk_count']:>5} chunks  "
                f"{r['language'] or '-':<3} {r['scope']:<10} {r['name']}{extra}"
            )

    emit(rows, as_json, text)


@main.command()
@click.argument("doc")
@click.option(
    "--text", "text", is_flag=True, help="Print the canonical text (what #char offsets refer to)."
)
@json_option()
@click.pass_context
def show(ctx: click.Context, doc: str, text: bool, as_json: bool) -> None:
    """Show one document (by id, name or sha256 prefix).

    Example: kb show 3 --text
    """
    kb = open_kb(ctx)
    row = kb.find(doc)
    if text:
        click.echo(kb.canonical_text(row.id), nl=False)
        return
    fields = {**summary(row), "source": document_source(kb, row.scope)}

    def lines() -> None:
        for k, v in fields.items():
            if k != "source":
                click.echo(f"{k:>18}: {v}")
        if origin := fields["source"]:
            click.echo(f"{'source':>18}: {origin['source']} (item {origin['item']})")
            click.echo(f"{'opens at':>18}: {origin['url']}")
            click.echo(f"{'read by':>18}: {origin['acl']['readers']}")
            click.echo(f"{'synced at':>18}: {origin['synced_at']}")
            click.echo(f"{'permissions at':>18}: {origin['acl_synced_at']}")

    emit(fields, as_json, lines)


@main.command()
@click.argument("doc")
@json_option()
@click.pass_context
def chunks(ctx: click.Context, doc: str, as_json: bool) -> None:
    """List a document's chunks: id, start, end, section, page, content.

    Example: kb chunks 3
    """
    kb = open_kb(ctx)
    rows = kb.chunks(kb.find(doc).id)

    def text() -> None:
        for c in rows:
            page = f" p.{c['page']}" if c["page"] else ""
            click.echo(f"#{c['id']} [{c['start']}:{c['end']}]{page} {c['section'] or '-'}")
            content = c["content"]
            more = "…" if len(content) > QUOTE_CHARS else ""
            click.echo("    " + content[:QUOTE_CHARS].replace("\n", " ") + more)

    emit(rows, as_json, text)


@main.command()
@click.argument("doc")
@click.pass_context
def retry(ctx: click.Context, doc: str) -> None:
    """Index a failed document again from its stored original.

    Example: kb retry report.pdf
    """
    kb = open_kb(ctx)
    row = kb.retry(kb.find(doc).id)
    if row.state == DocState.FAILED:
        raise click.ClickException(f"{row.name}: failed: {row.failure_reason}")
    if row.state != DocState.INDEXED:
        click.echo(f"{row.name}: {row.state}.")
        return
    click.echo(f"{row.name}: indexed, {row.chunk_count} chunks.")


@main.command()
@click.argument("doc")
@click.pass_context
def rm(ctx: click.Context, doc: str) -> None:
    """Remove a document and its chunks from the knowledge base.

    Example: kb rm old-handbook.md
    """
    kb = open_kb(ctx)
    row = kb.remove(kb.find(doc).id)
    click.echo(f"Removed {row.name} ({row.chunk_count} chunks).")


@main.command()
@json_option("Print the report as JSON.")
@click.pass_context
def reindex(ctx: click.Context, as_json: bool) -> None:
    """Rebuild every document from its stored original with the running configuration.

    The new index is built beside the live one, which keeps answering, then
    swapped in.

    A knowledge base still on the earlier default model (all-MiniLM-L6-v2)
    moves to the configured one; a running kb serve answers on it once restarted.

    Example: kb reindex
    """
    kb = open_kb(ctx, keep_earlier_model=False)
    bar = ProgressBar("doc", quiet=as_json)

    def progress(event: str, info: dict[str, Any]) -> None:
        if event == "reindex":
            # Told before each document: the one before it is done.
            bar.step(info["total"], advance=bool(info["index"]), note=info["document"][:40])
        elif event == "embedding":
            bar.embedding(info)

    report = kb.reindex(progress=progress)
    bar.close(last_step=True)
    failed = [
        {
            "id": failure.document.id,
            "name": failure.document.name,
            "reason": failure.reason or failure.document.failure_reason,
        }
        for failure in report.failed
    ]
    skipped = [
        {"id": s.document.id, "name": s.document.name, "reason": s.reason} for s in report.skipped
    ]

    def text() -> None:
        click.echo(
            f"Reindexed {report.documents} documents ({report.chunks} chunks); "
            f"{len(report.failed)} failed; {len(report.skipped)} skipped; "
            f"stale before {report.stale_before}, after {report.stale_after}."
        )
        for f in failed:
            click.echo(f"failed   {f['name']}: {f['reason']}")
        for s in skipped:
            click.echo(f"skipped  {s['name']}: {s['reason']}")

    data = {
        "documents": report.documents,
        "chunks": report.chunks,
        "failed": failed,
        "skipped": skipped,
        "stale_before": report.stale_before,
        "stale_after": report.stale_after,
    }
    emit(data, as_json, text)


@main.command()
@json_option()
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Counts by state, stale documents and whether the indexes agree with the database.

    Example: kb status --json
    """
    kb = open_kb(ctx)
    st = kb.status()
    st["sources"] = source_health(kb)
    thresholds = settings_of(ctx).thresholds(kb.config.embedding_model)
    st["thresholds"] = {
        "answer": thresholds.answer,
        "related": thresholds.related,
        "calibrated_for": thresholds.model,
        "origin": thresholds.origin,
        "calibrated": thresholds.calibrated,
    }

    def text() -> None:
        by_state = ", ".join(f"{k} {v}" for k, v in st["by_state"].items())
        click.echo(f"data dir        {st['data_dir']}")
        click.echo(f"database        {st['database']}")
        click.echo(f"documents       {st['documents']}  {by_state}")
        click.echo(f"chunks          {st['chunks']}")
        click.echo(f"stale           {st['stale']}")
        click.echo(f"model           {st['embedding_model']} ({st['dimensions']} d)")
        if st["kept_model"]:
            click.echo(f"EARLIER MODEL   {st['kept_model']['note']}")
        for_model = f" for {thresholds.model}" if thresholds.model else ""
        click.echo(
            f"thresholds      answer {thresholds.answer:.3f}, related {thresholds.related:.3f}"
            f" ({thresholds.origin}{for_model})"
        )
        shares = st["languages"]["shares"]
        listed = ", ".join(f"{code} {share:.0%}" for code, share in shares.items()) or "-"
        click.echo(f"languages       {listed}")
        if st["languages"]["advice"]:
            click.echo(f"WRONG MODEL     {st['languages']['advice']}")
        click.echo(f"indexes in sync {st['index']['in_sync']}")
        if st["index"]["degraded"]:
            click.echo(f"DEGRADED        {st['index']['degraded']}")
        if st["read_only"]:
            click.echo(f"READ-ONLY       {st['read_only']}")
        if sandbox := st["reader_sandbox"]:
            click.echo(f"readers         {sandbox['summary']}")
        for source in st["sources"]:
            state = "ok" if source["ok"] else f"FAILING: {source['last_error']}"
            click.echo(f"source          {source['name']}: {state}")

    emit(st, as_json, text)
