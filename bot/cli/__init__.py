"""The ``kb`` command."""

from bot.cli.commands import main

__all__ = ["main"]
