"""The reference docs, generated from the code so that they cannot drift from it.

``docs/configuration.md`` is written from ``Settings.model_fields`` (variable,
default, what it accepts, its description; grouped as ``.env.example`` is) and
``docs/cli.md`` from the ``kb`` command's click help, rendered at a fixed width
as ``kb <name> --help`` prints it, and ``docs/modules.md`` from the product's
modules, each with the first line of its docstring. Nothing depends on the
machine: no terminal width, and the home and working directories are written
``~`` and ``.``.

``python -m bot.docs`` rewrites the three files; ``tests/test_docs.py`` regenerates
them in memory and fails, naming that command, when a file on disk differs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
import click
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from bot.settings import example_value, setting_groups

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python -m bot.docs"
# The width of the help in docs/cli.md: an 80-column terminal's, whatever this one's is.
HELP_WIDTH = 80


def configuration_md() -> str:
    """The text of ``docs/configuration.md``."""
    groups = setting_groups()
    envs = [env for _, fields in groups for env, _ in fields]
    lines = [
        "# Configuration",
        "",
        _generated_note("`bot/settings.py`"),
        "",
        "Every setting is read from the environment or from `.env` in the working directory",
        "(variable names in any case); [`.env.example`](../.env.example) lists them all with",
        "their help and defaults, ready to copy. A value outside what a setting accepts stops",
        "`kb` and the server at start, with an error naming the variable.",
        "",
    ]
    lines += [f"- [{title}](#{anchor(title)})" for title, _ in groups]
    for title, fields in groups:
        lines += ["", f"## {title}", "", "| Variable | Default | Accepts | Description |"]
        lines.append("|---|---|---|---|")
        for env, info in fields:
            default = example_value(info.default)
            cells = [
                f"`{env}`",
                f"`{default}`" if default else "empty",
                _accepts(info),
                _markdown(info.description or "", envs),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return _symbolic("\n".join(lines) + "\n")


def cli_md() -> str:
    """The text of ``docs/cli.md``."""
    from bot.cli import main

    root = click.Context(
        main, info_name="kb", terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH
    )
    names = main.list_commands(root)
    lines = [
        "# The `kb` command",
        "",
        _generated_note("the click commands in `bot/cli/`"),
        "",
        "`kb` runs on the server, with the same settings as the bot",
        "([configuration.md](configuration.md)). The global option `--data-dir DIR` goes before",
        "the command and overrides `KB_DATA_DIR`. Every listing also prints `--json`, for",
        "scripts and monitoring. A knowledge-base error ends the command with `Error: ` and a",
        "sentence saying what to do, and exit status 1.",
        "",
        "| Command | What it does |",
        "|---|---|",
    ]
    for name in names:
        command = main.commands[name]
        summary = _markdown(command.get_short_help_str(limit=1000), [])
        lines.append(f"| [`kb {name}`](#{anchor('kb ' + name)}) | {summary} |")
    lines += ["", "## `kb`", "", "```text", main.get_help(root), "```"]
    for name in names:
        lines += _help(main.commands[name], name, root, "##")
    return _symbolic("\n".join(lines) + "\n")


def _help(command: click.Command, name: str, parent: click.Context, level: str) -> list[str]:
    """The section of ``command`` as ``--help`` prints it; a group's commands below it."""
    ctx = click.Context(
        command,
        info_name=name,
        parent=parent,
        terminal_width=HELP_WIDTH,
        max_content_width=HELP_WIDTH,
    )
    title = ctx.command_path.removeprefix(parent.find_root().info_name or "").strip()
    lines = ["", f"{level} `kb {title}`", "", "```text", command.get_help(ctx), "```"]
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            lines += _help(command.commands[sub], sub, ctx, level + "#")
    return lines


# The product's packages, in the order of the dependency direction (bot -> core -> index).
PACKAGES = ("bot", "core", "evaluation", "index", "studies")


def modules_md() -> str:
    """The text of ``docs/modules.md``."""
    lines = [
        "# Modules",
        "",
        _generated_note("each module's docstring"),
        "",
        "Every module of the product with the first line of its docstring; the rooms they",
        "make up are in [CONTRIBUTING.md](../CONTRIBUTING.md). A package's face is its",
        "`__init__`: what others may import from it.",
    ]
    for package in PACKAGES:
        lines += ["", f"## `{package}/`", "", "| Module | What it does |", "|---|---|"]
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            lines.append(f"| `{relative}` | {_markdown(_first_line(path), [])} |")
    return "\n".join(lines) + "\n"


def _first_line(path: Path) -> str:
    """The first line of a module's docstring ("" when it has none)."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


# Each generated file, by its path from the repository's root.
GENERATED: dict[str, Callable[[], str]] = {
    "docs/configuration.md": configuration_md,
    "docs/cli.md": cli_md,
    "docs/modules.md": modules_md,
}


def generated() -> dict[str, str]:
    """Each generated file's path and the text it must hold."""
    return {path: make() for path, make in GENERATED.items()}


def write(root: Path = ROOT) -> list[str]:
    """Rewrite the generated files under ``root`` that differ; return their paths."""
    changed = []
    for path, text in generated().items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def _generated_note(source: str) -> str:
    return f"<!-- Generated from {source} by `{REGENERATE}`: edit the code, not this file. -->"


def _accepts(info: FieldInfo) -> str:
    """What a setting accepts, from its type and its constraints."""
    kind = info.annotation
    # An optional number (KB_THRESHOLD, unset by default) accepts what the number does.
    present = [a for a in get_args(kind) if a is not type(None)]
    if type(None) in get_args(kind) and len(present) == 1:
        kind = present[0]
    if get_origin(kind) is Literal:
        return " or ".join(f"`{value}`" for value in get_args(kind))
    if kind is bool:
        return "`true` or `false`"
    names: dict[Any, str] = {int: "integer", float: "number", SecretStr: "secret", Path: "path"}
    bounds = []
    for meta in info.metadata:
        for cls, sign in (
            (annotated_types.Gt, ">"),
            (annotated_types.Ge, ">="),
            (annotated_types.Lt, "<"),
            (annotated_types.Le, "<="),
        ):
            if isinstance(meta, cls):
                bounds.append(f"{sign} {getattr(meta, cls.__name__.lower())}")
    return " ".join([names.get(kind, "text"), ", ".join(bounds)]).strip()


def _markdown(text: str, envs: list[str]) -> str:
    """Plain help as one table cell: variables as code, Markdown's specials escaped."""
    # A variable, with the value or the path it is given (KB_VIEWER_AUTH=slack, KB_DATA_DIR/x).
    known = (
        re.compile(r"\b(?:" + "|".join(map(re.escape, envs)) + r")\b(?:[=/][\w.:+-]*\w)?")
        if envs
        else None
    )
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        part = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
        parts[i] = known.sub(lambda m: f"`{m[0]}`", part) if known else part
    return "`".join(parts).replace("|", r"\|")


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _symbolic(text: str) -> str:
    """The text with this machine's home and working directories written ``~`` and ``.``."""
    for path, name in ((Path.cwd(), "."), (Path.home(), "~")):
        if len(path.parts) > 1:
            text = re.sub(re.escape(str(path)) + r"(?![\w.-])", name, text)
    return text


def main() -> None:
    """``python -m bot.docs``: rewrite the generated docs, say which changed."""
    changed = write()
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print("the generated docs are up to date")


if __name__ == "__main__":
    main()
