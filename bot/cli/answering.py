"""``kb`` commands that answer: ask a question from a shell, serve the bot."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from bot.cli.base import emit, json_option, main, open_kb, settings_of

if TYPE_CHECKING:  # the engine (and the model client) load only when a question is asked
    from core.answer import Answer, SourceRef

QUOTE_CHARS = 240


@main.command()
@click.argument("question")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    help="Channel ids whose documents may be used (repeatable); default: all documents.",
)
@json_option("Print the full answer as JSON.")
@click.pass_context
def ask(ctx: click.Context, question: str, scopes: tuple[str, ...], as_json: bool) -> None:
    """Ask a question; prints the answer with its cited passages.

    Answers as Slack would. With --json: the outcome, the answer, grounded,
    model_called, its sources, the passages kept, and timings_ms.

    Example: kb ask "How do I rotate the API key?" --json
    """
    from core.answer import Asker, build_engine

    engine = build_engine(settings_of(ctx).engine_config(), open_kb(ctx))

    async def run() -> Answer:
        try:
            return await engine.ask(
                question,
                scopes=frozenset(scopes) if scopes else None,
                asker=Asker(surface="cli"),
            )
        finally:
            await engine.aclose()

    answer = asyncio.run(run())
    emit(answer.to_dict(), as_json, lambda: _print_answer(answer))


def _print_answer(answer: Answer) -> None:
    from bot.slack.messages import BESIDE_HEADER, UNCITED_FALLBACK, UNSUPPORTED_WARNING
    from core.answer import Outcome
    from core.gate import MAX_RELATED

    # The engine's text for a related outcome already says these are not an answer.
    if answer.outcome == Outcome.UNSUPPORTED:
        click.echo(UNSUPPORTED_WARNING.removeprefix(":warning: "))
    click.echo(answer.answer)
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
    for s in passages:
        where = " › ".join(p for p in (s.section, f"p. {s.page}" if s.page else "") if p)
        mark = f"[{s.n}]" if numbered else "-"
        click.echo(f"{mark} {s.document}{' › ' + where if where else ''}  (d={s.distance:.3f})")
        quote = " ".join(s.quote.split())
        click.echo(f"    {quote[:QUOTE_CHARS]}{'…' if len(quote) > QUOTE_CHARS else ''}")
        if s.url:
            click.echo(f"    {s.url}")


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
