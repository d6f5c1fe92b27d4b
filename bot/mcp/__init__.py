"""The MCP surface: the knowledge base as tools for agents (``kb serve`` with ``KB_MCP=on``).

``server`` is the ``/mcp`` endpoint (the official SDK behind a door that
refuses, authenticates and rate-limits), ``tools`` the two tools
(``search_knowledge_base``, ``ask_knowledge_base``), ``auth`` who may call
(bearer tokens from ``kb mcp-token``, or Slack's signed identity), ``people``
which documents the caller may search (the access rule, ``bot.access``),
``limits`` the rate limit per person, ``blocks`` what Slackbot is shown beside
a result's text (the Slack surface's Block Kit, handed over by ``bot.app``),
``skill`` the organisation's Slackbot skill bound to this server.
It imports nothing of the Slack surface.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.mcp.blocks import SlackbotBlocks
    from bot.mcp.people import People, Person
    from bot.mcp.server import (
        MAX_BODY_BYTES,
        MCP_ENDPOINT,
        MCP_PATH,
        McpConfig,
        McpEndpoint,
        attach,
    )
    from bot.mcp.skill import SERVER_ID, SKILL, Skill, skill_file
    from bot.mcp.tools import MAX_QUERY_CHARS

# Each name others may use, and its module: loaded when first used, so that a
# server without KB_MCP (and `kb slackbot-skill`) never loads the MCP SDK.
_HOMES = {
    "MAX_BODY_BYTES": "bot.mcp.server",
    "MAX_QUERY_CHARS": "bot.mcp.tools",
    "MCP_ENDPOINT": "bot.mcp.server",
    "MCP_PATH": "bot.mcp.server",
    "McpConfig": "bot.mcp.server",
    "McpEndpoint": "bot.mcp.server",
    "People": "bot.mcp.people",
    "Person": "bot.mcp.people",
    "SERVER_ID": "bot.mcp.skill",
    "SKILL": "bot.mcp.skill",
    "Skill": "bot.mcp.skill",
    "SlackbotBlocks": "bot.mcp.blocks",
    "attach": "bot.mcp.server",
    "skill_file": "bot.mcp.skill",
}

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_QUERY_CHARS",
    "MCP_ENDPOINT",
    "MCP_PATH",
    "McpConfig",
    "McpEndpoint",
    "People",
    "Person",
    "SERVER_ID",
    "SKILL",
    "Skill",
    "SlackbotBlocks",
    "attach",
    "skill_file",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'bot.mcp' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
