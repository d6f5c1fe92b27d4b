"""The ``kb`` command: the same engine the bot drives, from a shell.

``base`` holds the group and what commands share; each other module adds its
commands to the group when imported: ``documents`` (ingest, docs, show,
chunks, retry, rm, reindex, status), ``publishing`` (audit, restore, approve,
reject), ``answering`` (ask, serve), ``evaluation`` (eval, calibrate,
export-disliked), ``syncing`` (sync), ``sources`` (source add, list, sync, remove),
``storage`` (migrate-store), ``mcp`` (mcp-token create, list, revoke), ``slackbot``
(slackbot-skill), ``access`` (access explain) and ``canvases`` (canvases sync).
"""

from bot.cli import (
    access,
    answering,
    canvases,
    documents,
    evaluation,
    mcp,
    publishing,
    slackbot,
    sources,
    storage,
    syncing,
)
from bot.cli.base import main

__all__ = [
    "access",
    "answering",
    "canvases",
    "documents",
    "evaluation",
    "main",
    "mcp",
    "publishing",
    "slackbot",
    "sources",
    "storage",
    "syncing",
]
