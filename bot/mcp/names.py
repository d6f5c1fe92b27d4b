"""The names agents call the knowledge base's MCP tools by.

Apart from ``tools`` so that what only names them (the Slackbot skill, its
command) does not load the MCP SDK the tools are served with.
"""

from __future__ import annotations

__all__ = ["ASK_TOOL", "SEARCH_TOOL"]

SEARCH_TOOL = "search_knowledge_base"
ASK_TOOL = "ask_knowledge_base"
