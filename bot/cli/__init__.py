"""The ``kb`` command: the same engine the bot drives, from a shell.

``base`` holds the group and what commands share; each other module adds its
commands to the group when imported: ``documents`` (ingest, docs, show,
chunks, retry, rm, reindex, status), ``publishing`` (audit, restore, approve,
reject), ``answering`` (ask, serve) and ``evaluation`` (eval, calibrate,
export-disliked).
"""

from bot.cli import answering, documents, evaluation, publishing
from bot.cli.base import main

__all__ = ["answering", "documents", "evaluation", "main", "publishing"]
