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

import ast
import functools
import importlib
from pathlib import Path
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
    """``name`` of ``__all__``, from its module, loaded when first used (PEP 562): a server
    without ``KB_MCP`` (and ``kb slackbot-skill``) so never loads the MCP SDK."""
    home = _homes().get(name) if name in __all__ else None
    if home is None:
        raise AttributeError(f"module 'bot.mcp' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


@functools.cache
def _homes() -> dict[str, str]:
    """Each name the ``TYPE_CHECKING`` block imports, and its module.

    The block is read from this file, not run: it is the one place a name's module is
    written, for the type checker and ``__getattr__`` alike. Ruff refuses an import there
    that ``__all__`` does not list (F401), and tests/test_imports.py a name of ``__all__``
    that is not imported there, so the two cannot drift.
    """
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }
