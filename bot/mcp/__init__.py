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

from bot.mcp.blocks import SlackbotBlocks
from bot.mcp.people import People, Person
from bot.mcp.server import MAX_BODY_BYTES, MCP_ENDPOINT, MCP_PATH, McpConfig, McpEndpoint, attach
from bot.mcp.skill import SERVER_ID, SKILL, Skill, skill_file
from bot.mcp.tools import MAX_QUERY_CHARS

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
