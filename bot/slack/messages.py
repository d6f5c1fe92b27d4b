"""The bot's words in English, its source language: ``messages.X`` is ``words_for("en").X``.

For tests and tools that check what an English-speaking person sees. The bot
itself speaks through the :class:`bot.slack.words.Words` of whoever it
answers, chosen by :mod:`bot.slack.words`; nothing in ``bot/`` imports this.
"""

from __future__ import annotations

from typing import Any

from bot.slack.words import SOURCE_LANGUAGE, words_for


def __getattr__(name: str) -> Any:
    return getattr(words_for(SOURCE_LANGUAGE), name)
