"""The ``kb`` command: the same engine the bot drives, from a shell.

``base`` holds the group and what commands share; each other module adds its
commands to the group when imported: ``documents`` (ingest, docs, show,
chunks, retry, rm, reindex, status), ``publishing`` (audit, restore, approve,
reject), ``answering`` (ask, serve), ``evaluation`` (eval, calibrate,
export-disliked), ``syncing`` (sync), ``sources`` (source add, list, sync, remove), ``storage`` (migrate-store), ``mcp``
(mcp-token create, list, revoke) and ``access`` (access explain).
"""

from bot.cli import (
    access,
    answering,
    documents,
    evaluation,
    mcp,
    publishing,
    sources,
    storage,
    syncing,
)
from bot.cli.base import main

__all__ = [
    "access",
    "answering",
    "documents",
    "evaluation",
    "main",
    "mcp",
    "publishing",
    "sources",
    "storage",
    "syncing",
]
