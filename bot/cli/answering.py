"""``kb`` commands that answer: ask a question from a shell, see who asked what, serve the bot."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from bot.cli.access import NO_TOKEN_NOTE, open_access, scopes_as
from bot.cli.base import emit, json_option, main, open_kb, settings_of

if TYPE_CHECKING:  # the engine (and the model client) load only when a question is asked
    from core.answer import Answer, SourceRef
    from index.records import AskedQuestion

QUOTE_CHARS = 240
QUESTIONS_LIMIT = 50
# Where questions are asked (core.answer.Asker.surface).
SURFACES = ("slack", "cli", "mcp")


@main.command()
@click.argument("question")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    help="Channel ids whose documents may be used (repeatable); default: all documents.",
)
@click.option(
    "--as",
    "as_user",
    default=None,
    metavar="USER",
    help="Answer as this Slack user (U...) would be answered: the documents for everyone and "
    "those of the channels they are a member of now (asked of Slack with SLACK_BOT_TOKEN; "
    "without it, the documents for everyone only); --scope narrows those channels.",
)
@json_option("Print the full answer as JSON.")
@click.pass_context
def ask(
    ctx: click.Context,
    question: str,
    scopes: tuple[str, ...],
    as_user: str | None,
    as_json: bool,
) -> None:
    """Ask a question; prints the answer with its cited passages.

    Answers as Slack would. With --json: the outcome, the answer, grounded,
    model_called, its sources, the passages kept, and timings_ms.

    Example: kb ask "How do I rotate the API key?" --as U0123ABCD --json
    """
    from core.answer import Asker, build_engine

    kb = open_kb(ctx)
    access = open_access(ctx) if as_user else None
    if access is not None and access.members is None:
        click.echo(NO_TOKEN_NOTE.format(user=as_user), err=True)
    engine = build_engine(settings_of(ctx).engine_config(kb.config.embedding_model), kb)

    async def run() -> Answer:
        try:
            searched = frozenset(scopes) if scopes else None
            if access is not None and as_user:
                searched = await scopes_as(access, kb, as_user, scopes)
            return await engine.ask(
                question, scopes=searched, asker=Asker(user=as_user, surface="cli")
            )
        finally:
            await engine.aclose()

    answer = asyncio.run(run())
    emit(answer.to_dict(), as_json, lambda: _print_answer(answer))


def _print_answer(answer: Answer) -> None:
    from bot.slack.messages import BESIDE_HEADER, UNCITED_FALLBACK, UNSUPPORTED_WARNING
    from core.answer import Outcome
    from core.gate import MAX_RELATED
    from core.quoting import escaped

    # The engine's text for a related outcome already says these are not an answer.
    if answer.outcome == Outcome.UNSUPPORTED:
        click.echo(UNSUPPORTED_WARNING.removeprefix(":warning: "))
    # The model's words: no terminal control sequence, tag or entry of its own.
    click.echo(escaped(answer.answer))
    if answer.outcome == Outcome.UNSUPPORTED and answer.kept:
        click.echo(f"\n{UNCITED_FALLBACK}")
        _print_passages(answer.kept[:MAX_RELATED])
    else:
        if answer.sources:
            click.echo("")
        _print_passages(answer.sources)
    if answer.beside:
        click.echo(f"\n{BESIDE_HEADER}")
        _print_passages(answer.beside, numbered=False)
    if answer.links_note:
        click.echo(f"\n{answer.links_note}")


def _print_passages(passages: list[SourceRef], *, numbered: bool = True) -> None:
    from core.quoting import one_line, passage_lines, quoted

    for s in passages:
        section = one_line(s.section)
        where = " › ".join(p for p in (section, f"p. {s.page}" if s.page else "") if p)
        mark = f"[{s.n}]" if numbered else "-"
        name = one_line(s.document)
        click.echo(f"{mark} {name}{' › ' + where if where else ''}  (d={s.distance:.3f})")
        # A passage as a document wrote it, on one quoted line: nothing in it passes for an entry.
        quote = " ".join(" ".join(passage_lines(s.quote)).split())
        short = f"{quote[:QUOTE_CHARS]}{'…' if len(quote) > QUOTE_CHARS else ''}"
        click.echo(quoted(short, mark="    > "))
        if s.url:
            click.echo(f"    {s.url}")


@main.command()
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=QUESTIONS_LIMIT,
    show_default=True,
    help="How many of the latest questions to show.",
)
@click.option(
    "--surface",
    type=click.Choice(SURFACES),
    default=None,
    help="Only the questions asked there (default: everywhere).",
)
@json_option("Print the questions as JSON, with everything the query log holds.")
@click.pass_context
def questions(ctx: click.Context, limit: int, surface: str | None, as_json: bool) -> None:
    """Show who asked what: the latest questions, newest first, on every surface.

    Each line has the time, where it was asked (slack, cli, or mcp with the
    name of the agent's token), who asked (a Slack user id) and in which
    channel, the outcome (answered, related, refused, stopped...) and the
    question.

    Example: kb questions --surface mcp --limit 20
    """
    from index.storage import Store

    # The log only: no need to load the embedding model for this.
    asked = Store(settings_of(ctx).data_dir).queries.latest(limit, surface=surface)

    def text() -> None:
        if not asked:
            click.echo("No questions asked yet.")
        for q in asked:
            click.echo(_question_line(q))

    emit([q.to_dict() for q in asked], as_json, text)


def _question_line(q: AskedQuestion) -> str:
    from bot.logs import escape

    r = q.record
    when = datetime.fromtimestamp(q.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    where = f"{r.surface}:{r.client}" if r.client else r.surface
    # The question is whatever a person or an agent typed: shown inert, on one line.
    question = escape(" ".join(r.question.split()))
    short = question[:QUOTE_CHARS] + ("…" if len(question) > QUOTE_CHARS else "")
    parts = [f"{q.id:>6}", when, f"{where:<18}", f"{r.user or '-':<12}", f"{r.channel or '-':<12}"]
    return "  ".join([*parts, f"{r.outcome:<17}", short])


@main.command()
@click.option("--port", type=int, default=None, help="Port (overrides KB_PORT).")
@click.pass_context
def serve(ctx: click.Context, port: int | None) -> None:
    """Run the bot: Slack (Socket Mode or HTTP events), the document viewer and /healthz.

    Example: kb serve --port 3000
    """
    from bot.app import run_server

    settings = settings_of(ctx)
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    run_server(settings)
