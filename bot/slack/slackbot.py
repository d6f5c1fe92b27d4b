"""The knowledge base's tool results as Slackbot shows them: the bot's own answer blocks.

Slackbot calls the MCP tools (``bot.mcp``) as the asking person and renders
the Block Kit a result carries beside its text. These are the blocks the bot
posts for the same answer (:func:`bot.slack.blocks.render_answer`) or the
same passages (:func:`bot.slack.blocks.render_search`), in the person's
language, escaped by the one escaping core, without the buttons: Slackbot
routes a button only to a tool (``tool:`` action ids), so feedback and "Ask a
person" would reach no listener, and an element it does not take drops the
whole payload. The MCP surface reaches this through the contract it states
(``bot.mcp.blocks.SlackbotBlocks``), handed over by ``bot.app``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.blocks import render_answer, render_search
from bot.slack.words import Languages, Words
from core.answer import Answer, SourceRef

__all__ = ["SlackbotBlocks"]


class SlackbotBlocks:
    """Block Kit for Slackbot, in the language the bot speaks to the person in.

    Args:
        client: the Web API client (the person's locale is asked of Slack).
        languages: who is spoken to in which language (the Slack surface's).
    """

    def __init__(self, client: AsyncWebClient, languages: Languages) -> None:
        self.client = client
        self.languages = languages

    async def answer(self, answer: Answer, user_id: str) -> list[dict[str, Any]]:
        """The blocks the bot shows for ``answer``, buttons left out."""
        words = await self._words(user_id, answer.question)
        return render_answer(answer, words=words, buttons=False).blocks

    async def search(
        self,
        written_from: Sequence[SourceRef],
        beside: Sequence[SourceRef],
        user_id: str,
        query: str,
    ) -> list[dict[str, Any]]:
        """The passages a search found, ``[1]``, ``[2]``... linked to each passage."""
        words = await self._words(user_id, query)
        return render_search(written_from, beside, words=words).blocks

    async def _words(self, user_id: str, text: str) -> Words:
        return await self.languages.of(self.client, user_id, text)
