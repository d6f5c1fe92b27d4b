"""What Slackbot shows of a tool's result: Block Kit beside the text, built by the Slack surface.

Slackbot, calling with Slack identity auth, renders Block Kit a tool returns
in its result's ``_meta.slack.blocks`` when the tool declares
``_meta.slack.supportsBlockKit`` (docs.slack.dev/ai/slackbot-mcp-client).
Those blocks are the bot's own answer blocks: the same citations ``[n]``
linked to the same passages, escaped by the one escaping core
(``bot.slack.blocks``). This surface imports nothing of Slack's, so it states
here what it needs (:class:`SlackbotBlocks`) and the entry point (``bot.app``)
hands it the Slack surface's builder. Without one, or for a caller that is not
Slackbot (a bearer token), results carry text and structured content only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from core.answer import Answer, SourceRef

__all__ = ["SUPPORTS_BLOCK_KIT", "SlackbotBlocks", "slack_meta"]

# A tool's ``_meta``: Slackbot may render the Block Kit its results carry.
SUPPORTS_BLOCK_KIT: dict[str, Any] = {"slack": {"supportsBlockKit": True}}

# A block as Slack takes it: JSON.
Block = dict[str, Any]


class SlackbotBlocks(Protocol):
    """Block Kit for Slackbot, in the asking person's language."""

    async def answer(self, answer: Answer, user_id: str) -> list[Block]:
        """The blocks the bot shows for ``answer``, without the buttons only its own messages serve."""
        ...

    async def search(
        self,
        written_from: Sequence[SourceRef],
        beside: Sequence[SourceRef],
        user_id: str,
        query: str,
    ) -> list[Block]:
        """The passages a search found, numbered ``[1]``, ``[2]``... as its text numbers them."""
        ...


def slack_meta(blocks: list[Block]) -> dict[str, Any]:
    """A tool result's ``_meta`` carrying ``blocks`` for Slackbot."""
    return {"slack": {"blocks": blocks}}
