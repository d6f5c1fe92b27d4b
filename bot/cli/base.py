"""What every ``kb`` command shares: the group, the settings, the opened knowledge base, output.

The group turns a ``KBError`` into a one-line message (never a traceback) in
one place, and ``json_option`` / ``emit`` give every listing the same
``--json`` switch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bot.logs import configure_logging
from bot.settings import Settings
from index.errors import KBError

if TYPE_CHECKING:  # heavy imports (torch, FAISS) load only for the commands that need them
    from tqdm import tqdm

    from index.knowledge_base import KnowledgeBase

F = TypeVar("F", bound=Callable[..., Any])


class KBGroup(click.Group):
    """A click group whose commands report ``KBError`` as a plain error message."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a knowledge-base error becomes ``Error: <sentence>``, exit 1."""
        try:
            return super().invoke(ctx)
        except KBError as exc:
            raise click.ClickException(str(exc)) from exc


def settings_of(ctx: click.Context) -> Settings:
    """The settings the group read from the environment and the command line."""
    settings: Settings = ctx.obj["settings"]
    return settings


def open_kb(ctx: click.Context, *, keep_earlier_model: bool = True) -> KnowledgeBase:
    """The knowledge base of the configured data dir, opened once per command.

    ``keep_earlier_model=False`` opens one built on the earlier default model on the
    configured model instead (``kb reindex`` moves it: ``index.kept_model``).
    """
    from index.knowledge_base import KnowledgeBase

    if "kb" not in ctx.obj:
        ctx.obj["kb"] = KnowledgeBase(
            settings_of(ctx).index_config(), keep_earlier_model=keep_earlier_model
        )
    kb: KnowledgeBase = ctx.obj["kb"]
    return kb


def json_option(help_text: str = "Print as JSON.") -> Callable[[F], F]:
    """The ``--json`` switch, passed to the command as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def output_file_option(flag: str, dest: str, help_text: str) -> Callable[[F], F]:
    """An optional path of a file the command writes besides its output."""
    return click.option(
        flag, dest, type=click.Path(dir_okay=False, path_type=Path), default=None, help=help_text
    )


class ProgressBar:
    """A progress bar on stderr, made when the work reports its total; silent when ``quiet``."""

    def __init__(self, unit: str, *, quiet: bool) -> None:
        self.unit = unit
        self.quiet = quiet
        self.bar: tqdm | None = None

    def step(self, total: int, *, advance: bool = True, note: str | None = None) -> None:
        """One more unit of ``total`` done (or only a new ``note`` when not ``advance``)."""
        if self.bar is None:
            from tqdm import tqdm  # with the first bar: `kb serve` draws none

            self.bar = tqdm(total=total, unit=self.unit, file=sys.stderr, disable=self.quiet)
        if note is not None:
            self.bar.set_postfix_str(note)
        if advance:
            self.bar.update(1)

    def note(self, text: str) -> None:
        """Show ``text`` beside the bar, once it exists."""
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def reach(self, done: int, total: int, *, note: str | None = None) -> None:
        """Show ``done`` of ``total`` (the bar made or its total changed as needed)."""
        self.step(total, advance=False, note=note)
        assert self.bar is not None
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def embedding(self, info: dict[str, Any]) -> None:
        """Show an ``"embedding"`` event's passages embedded beside the bar, once it exists."""
        self.note(f"{info['document'][:30]}: {info['done']:,}/{info['total']:,} passages")

    def close(self, *, last_step: bool = False) -> None:
        """Count the unit still in progress (``last_step``) and close the bar."""
        if self.bar is not None:
            if last_step:
                self.bar.update(1)
            self.bar.close()


def emit(data: Any, as_json: bool, text: Callable[[], None]) -> None:
    """Print ``data`` as JSON, or call ``text`` to print it for a person."""
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        text()


@click.group(cls=KBGroup)
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
    configure_logging(settings.log_level, settings.log_format, settings.secret_values())
    ctx.obj = {"settings": settings}
