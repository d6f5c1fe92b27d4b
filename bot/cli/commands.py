"""The ``kb`` command: the same engine the bot drives, from a shell.

Every listing has ``--json`` for scripts and monitoring. Errors the knowledge
base raises on purpose become one-line messages, never tracebacks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from tqdm import tqdm

from bot.logs import configure_logging
from index.errors import KBError
from index.settings import Settings

if TYPE_CHECKING:  # heavy imports (torch, FAISS) load only for the commands that need them
    from evaluation.results import EvalResult
    from index.knowledge_base import KnowledgeBase

F = TypeVar("F", bound=Callable[..., Any])


def _kb_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KBError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def _settings(ctx: click.Context) -> Settings:
    settings: Settings = ctx.obj["settings"]
    return settings


def _kb(ctx: click.Context) -> KnowledgeBase:
    from index.knowledge_base import KnowledgeBase

    if "kb" not in ctx.obj:
        ctx.obj["kb"] = KnowledgeBase(_settings(ctx))
    return ctx.obj["kb"]


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@click.group()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Data directory (overrides KB_DATA_DIR).",
)
@click.version_option(package_name="slack-kb")
@click.pass_context
def main(ctx: click.Context, data_dir: Path | None) -> None:
    """Slack knowledge-base bot: answers only from your documents, with citations."""
    overrides: dict[str, Any] = {"data_dir": data_dir} if data_dir else {}
    try:
        settings = Settings(**overrides)
    except ValueError as exc:
        raise click.ClickException(f"Invalid configuration: {exc}") from exc
    configure_logging(settings.log_level, settings.log_format)
    ctx.obj = {"settings": settings}


# ---------------------------------------------------------------------- documents


def _doc_summary(d: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id",
        "name",
        "title",
        "kind",
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
        "sha256",
        "created_at",
        "indexed_at",
    )
    return {k: d.get(k) for k in keys}


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--scope", default="*", show_default=True, help="'*' for everyone, or a Slack channel id."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
@_kb_errors
def ingest(ctx: click.Context, paths: tuple[Path, ...], scope: str, as_json: bool) -> None:
    """Add files and folders to the knowledge base.

    Example: kb ingest handbook/ faq.md
    """
    kb = _kb(ctx)
    bar: tqdm | None = None

    def progress(event: str, info: dict[str, Any]) -> None:
        nonlocal bar
        if event == "file":
            if bar is None:
                bar = tqdm(total=info["total"], unit="file", file=sys.stderr, disable=as_json)
            bar.set_postfix_str(Path(info["path"]).name[:40])
            if info["index"]:
                bar.update(1)
        elif event == "embedding" and bar is not None:
            # Large files take a while: show that embedding is moving.
            bar.set_postfix_str(f"{info['document'][:30]}: {info['done']} chunks embedded")

    summary = kb.ingest_paths(list(paths), scope=scope, progress=progress)
    if bar is not None:
        bar.update(1)
        bar.close()
    if as_json:
        _echo_json(
            {
                "indexed": [_doc_summary(d) for d in summary.indexed],
                "failed": [_doc_summary(d) for d in summary.failed],
                "unchanged": [_doc_summary(d) for d in summary.unchanged],
                "skipped": summary.skipped,
                "chunks": summary.chunks,
            }
        )
        return
    for d in summary.failed:
        click.echo(f"failed   {d['name']}: {d['failure_reason']}")
    for s in summary.skipped:
        click.echo(f"skipped  {s}")
    click.echo(
        f"{len(summary.indexed)} indexed ({summary.chunks} chunks), {len(summary.unchanged)} unchanged, "
        f"{len(summary.failed)} failed, {len(summary.skipped)} skipped."
    )
    if summary.failed:
        ctx.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
@_kb_errors
def docs(ctx: click.Context, as_json: bool) -> None:
    """List documents with their state and chunk count.

    Example: kb docs --json
    """
    kb = _kb(ctx)
    stale = {d["id"] for d in kb.stale_documents()}
    rows = [{**_doc_summary(d), "stale": d["id"] in stale} for d in kb.store.documents()]
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("No documents yet. Add some with: kb ingest PATH")
        return
    for r in rows:
        state = r["state"] + (" (stale)" if r["stale"] else "")
        extra = f"  {r['failure_reason']}" if r["failure_reason"] else ""
        click.echo(
            f"{r['id']:>5}  {state:<16} {r['chunk_count']:>5} chunks  {r['scope']:<10} {r['name']}{extra}"
        )


@main.command()
@click.argument("doc")
@click.option(
    "--text", "text", is_flag=True, help="Print the canonical text (what #char offsets refer to)."
)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
@_kb_errors
def show(ctx: click.Context, doc: str, text: bool, as_json: bool) -> None:
    """Show one document (by id, name or sha256 prefix).

    Example: kb show 3 --text
    """
    kb = _kb(ctx)
    row = kb.store.find_document(doc)
    if text:
        click.echo(kb.canonical_text(int(row["id"])), nl=False)
        return
    if as_json:
        _echo_json(_doc_summary(row))
        return
    for k, v in _doc_summary(row).items():
        click.echo(f"{k:>18}: {v}")


@main.command()
@click.argument("doc")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
@_kb_errors
def chunks(ctx: click.Context, doc: str, as_json: bool) -> None:
    """List a document's chunks: id, start, end, section, page, content.

    Example: kb chunks 3
    """
    kb = _kb(ctx)
    row = kb.store.find_document(doc)
    rows = kb.store.chunk_rows(int(row["id"]))
    if as_json:
        _echo_json(rows)
        return
    for c in rows:
        page = f" p.{c['page']}" if c["page"] else ""
        click.echo(f"#{c['id']} [{c['start']}:{c['end']}]{page} {c['section'] or '-'}")
        click.echo(
            "    "
            + c["content"][:200].replace("\n", " ")
            + ("…" if len(c["content"]) > 200 else "")
        )


@main.command()
@click.argument("doc")
@click.pass_context
@_kb_errors
def retry(ctx: click.Context, doc: str) -> None:
    """Index a failed document again from its stored original.

    Example: kb retry report.pdf
    """
    kb = _kb(ctx)
    row = kb.retry(int(kb.store.find_document(doc)["id"]))
    if row["state"] == "indexed":
        click.echo(f"{row['name']}: indexed, {row['chunk_count']} chunks.")
    else:
        raise click.ClickException(f"{row['name']}: failed: {row['failure_reason']}")


@main.command()
@click.argument("doc")
@click.pass_context
@_kb_errors
def rm(ctx: click.Context, doc: str) -> None:
    """Remove a document and its chunks from the knowledge base.

    Example: kb rm old-handbook.md
    """
    kb = _kb(ctx)
    row = kb.remove(int(kb.store.find_document(doc)["id"]))
    click.echo(f"Removed {row['name']} ({row['chunk_count']} chunks).")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@_kb_errors
def reindex(ctx: click.Context, as_json: bool) -> None:
    """Rebuild every document from its stored original with the running configuration.

    Example: kb reindex
    """
    kb = _kb(ctx)
    bar: tqdm | None = None

    def progress(event: str, info: dict[str, Any]) -> None:
        nonlocal bar
        if event == "reindex":
            if bar is None:
                bar = tqdm(total=info["total"], unit="doc", file=sys.stderr, disable=as_json)
            bar.update(1)

    report = kb.reindex(progress=progress)
    if bar is not None:
        bar.close()
    failed = [
        {"id": d["id"], "name": d["name"], "reason": d.get("reindex_error") or d["failure_reason"]}
        for d in report.failed
    ]
    data = {
        "documents": report.documents,
        "chunks": report.chunks,
        "failed": failed,
        "stale_before": report.stale_before,
        "stale_after": report.stale_after,
    }
    if as_json:
        _echo_json(data)
        return
    click.echo(
        f"Reindexed {report.documents} documents ({report.chunks} chunks); {len(report.failed)} failed; "
        f"stale before {report.stale_before}, after {report.stale_after}."
    )
    for f in failed:
        click.echo(f"failed   {f['name']}: {f['reason']}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
@_kb_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """Counts by state, stale documents and whether the indexes agree with the database.

    Example: kb status --json
    """
    st = _kb(ctx).status()
    if as_json:
        _echo_json(st)
        return
    click.echo(f"data dir        {st['data_dir']}")
    click.echo(
        f"documents       {st['documents']}  "
        + ", ".join(f"{k} {v}" for k, v in st["by_state"].items())
    )
    click.echo(f"chunks          {st['chunks']}")
    click.echo(f"stale           {st['stale']}")
    click.echo(f"model           {st['embedding_model']} ({st['dimensions']} d)")
    click.echo(f"indexes in sync {st['index']['in_sync']}")


# ---------------------------------------------------------------------- answering


@main.command()
@click.argument("question")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    help="Channel ids whose documents may be used (repeatable); default: all documents.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the full answer as JSON.")
@click.pass_context
@_kb_errors
def ask(ctx: click.Context, question: str, scopes: tuple[str, ...], as_json: bool) -> None:
    """Ask a question; prints the answer with its cited passages.

    Example: kb ask "How do I rotate the API key?" --json
    """
    from core.answer import build_engine

    engine = build_engine(_settings(ctx), kb=_kb(ctx))

    async def run() -> Any:
        try:
            return await engine.ask(question, scopes=frozenset(scopes) if scopes else None)
        finally:
            await engine.aclose()

    answer = asyncio.run(run())
    if as_json:
        _echo_json(answer.to_dict())
        return
    click.echo(answer.answer)
    if answer.sources:
        click.echo("")
        for s in answer.sources:
            where = " › ".join(p for p in (s.section, f"p. {s.page}" if s.page else "") if p)
            click.echo(
                f"[{s.n}] {s.document}{' › ' + where if where else ''}  (d={s.distance:.3f})"
            )
            quote = " ".join(s.quote.split())
            click.echo(f"    {quote[:240]}{'…' if len(quote) > 240 else ''}")
            click.echo(f"    {s.url}")


@main.command()
@click.option("--port", type=int, default=None, help="Port (overrides KB_PORT).")
@click.pass_context
@_kb_errors
def serve(ctx: click.Context, port: int | None) -> None:
    """Run the bot: Slack (Socket Mode or HTTP events), the document viewer and /healthz.

    Example: kb serve --port 3000
    """
    from bot.app import run_server

    settings = _settings(ctx)
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    run_server(settings)


# ---------------------------------------------------------------------- evaluation


def _evalset(
    corpus: Path | None, questions: Path | None, ood: Path | None
) -> tuple[Path, Path, Path]:
    from evaluation.inputs import BUNDLED_CORPUS, BUNDLED_OOD, BUNDLED_QUESTIONS

    return corpus or BUNDLED_CORPUS, questions or BUNDLED_QUESTIONS, ood or BUNDLED_OOD


def _run_evaluation(
    settings: Settings,
    paths: tuple[Path, Path, Path],
    *,
    strategies: tuple[str, ...] = (),
    thresholds: list[float] | None = None,
    threshold: float | None = None,
    progress: bool = True,
) -> EvalResult:
    from evaluation.inputs import load_ood, load_questions
    from evaluation.run import evaluate
    from index.embed import Embedder

    corpus, questions_path, ood_path = paths
    questions = load_questions(questions_path)
    ood = load_ood(ood_path)
    return evaluate(
        corpus,
        questions,
        ood,
        embedder=Embedder(settings.embedding_model),
        settings=settings,
        strategies=strategies,
        thresholds=thresholds,
        threshold=threshold,
        progress=progress,
    )


_corpus_option = click.option(
    "--corpus",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Folder of documents to index (default: the bundled evaluation set).",
)
_questions_option = click.option(
    "--questions",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="questions.jsonl: id, needle, doc_phrasing, ticket_phrasing.",
)
_ood_option = click.option(
    "--ood",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="ood.jsonl: id, question (questions the knowledge base should refuse).",
)
_budget_option = click.option(
    "--max-bluff-rate",
    type=click.FloatRange(0.0, 1.0),
    default=0.1,
    show_default=True,
    help="Bluff budget: the share of out-of-domain questions allowed to get an answer.",
)


@main.command("eval")
@_corpus_option
@_questions_option
@_ood_option
@click.option("--strategies", is_flag=True, help="Also compare the six chunking strategies A-F.")
@click.option(
    "--threshold", type=float, default=None, help="Threshold to evaluate (default: KB_THRESHOLD)."
)
@_budget_option
@click.option("--json", "as_json", is_flag=True, help="Print every number as JSON.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the tables as Markdown to this file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write distance histograms and the threshold sweep as a PNG.",
)
@click.option(
    "--export-disliked",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Only write this knowledge base's thumbs-down questions as candidate questions (JSON lines) to label.",
)
@click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")
@click.pass_context
@_kb_errors
def eval_(
    ctx: click.Context,
    corpus: Path | None,
    questions: Path | None,
    ood: Path | None,
    strategies: bool,
    threshold: float | None,
    max_bluff_rate: float,
    as_json: bool,
    report_path: Path | None,
    plot_path: Path | None,
    export_disliked: Path | None,
    no_progress: bool,
) -> None:
    """Measure retrieval (Recall@k, MRR, destroyed answers) and what the threshold costs.

    Indexes the corpus in a temporary data dir with the product's own code; no
    language model is called. Without --corpus/--questions/--ood it uses the
    bundled evaluation set.

    Example: kb eval --strategies --report eval.md --plot eval.png
    """
    from evaluation.calibrate import propose_threshold
    from evaluation.report import plot, render
    from evaluation.run import export_disliked as export
    from index.store import Store

    settings = _settings(ctx)
    if export_disliked is not None:
        count = export(Store(settings.data_dir), export_disliked)
        click.echo(
            f"Wrote {count} thumbs-down questions to {export_disliked}; label them before use."
        )
        return
    result = _run_evaluation(
        settings,
        _evalset(corpus, questions, ood),
        strategies=tuple("ABCDEF") if strategies else (),
        threshold=threshold,
        progress=not no_progress,
    )
    chosen = propose_threshold(result.gate.sweep, max_bluff_rate)
    recommended = chosen.threshold if chosen else None
    if report_path is not None:
        report_path.write_text(
            render(result, markdown=True, recommended=recommended), encoding="utf-8"
        )
    if plot_path is not None:
        plot(result, plot_path, recommended=recommended)
    if as_json:
        _echo_json(
            {
                **result.to_dict(),
                "recommended": {
                    "rule": "largest threshold whose out-of-domain bluff rate <= max_bluff_rate",
                    "max_bluff_rate": max_bluff_rate,
                    "threshold": recommended,
                },
            }
        )
        return
    click.echo(render(result, recommended=recommended), nl=False)
    if recommended is not None:
        click.echo(
            f"\nLargest threshold with bluff rate <= {max_bluff_rate:.0%}: {recommended:.3f} "
            f"(configured: {result.gate.threshold:.3f}). See `kb calibrate`."
        )


@main.command()
@_corpus_option
@_questions_option
@_ood_option
@click.option(
    "--from-log",
    "from_log",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Labelled logged questions instead of an evaluation set (JSON lines: question or query_id, and in_domain true/false); searched against this knowledge base.",
)
@_budget_option
@click.option(
    "--step",
    type=click.FloatRange(0.001, 0.5),
    default=0.025,
    show_default=True,
    help="Spacing of the thresholds tried (0.20 to 1.00).",
)
@click.option(
    "--write-env",
    "env_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write KB_THRESHOLD=<proposed> into this .env file, keeping its other lines.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")
@click.pass_context
@_kb_errors
def calibrate(
    ctx: click.Context,
    corpus: Path | None,
    questions: Path | None,
    ood: Path | None,
    from_log: Path | None,
    max_bluff_rate: float,
    step: float,
    env_path: Path | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Propose the refusal threshold for a bluff budget, and show what it costs.

    Picks the largest threshold whose out-of-domain bluff rate is within
    --max-bluff-rate, on the bundled evaluation set, your own set, or your
    logged questions labelled in/out of domain (--from-log).

    Example: kb calibrate --max-bluff-rate 0.1 --write-env .env
    """
    from evaluation import calibrate as cal
    from evaluation.report import render_calibration

    settings = _settings(ctx)
    grid = cal.calibration_grid(step)
    if from_log is not None:
        if corpus or questions or ood:
            raise click.UsageError("Use either --from-log or --corpus/--questions/--ood, not both.")
        kb = _kb(ctx)
        inside, outside = cal.load_labelled_log(from_log, kb.store)
        result = cal.from_log(
            kb,
            inside,
            outside,
            top_k=settings.top_k,
            current_threshold=settings.threshold,
            max_bluff_rate=max_bluff_rate,
            thresholds=grid,
        )
    else:
        evaluation = _run_evaluation(
            settings, _evalset(corpus, questions, ood), thresholds=grid, progress=not no_progress
        )
        result = cal.from_evaluation(evaluation, max_bluff_rate=max_bluff_rate)
    if as_json:
        _echo_json(result.to_dict())
    else:
        click.echo(render_calibration(result), nl=False)
    if result.proposed is None:
        ctx.exit(1)
    if env_path is not None:
        cal.write_env(env_path, result.proposed.threshold)
        if not as_json:
            click.echo(
                f"Wrote {cal.THRESHOLD_ENV}={cal.format_threshold(result.proposed.threshold)} to {env_path}."
            )


if __name__ == "__main__":  # pragma: no cover
    main()
