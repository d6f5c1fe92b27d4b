"""Storage: the source of truth, on SQLite in the data dir or Postgres (``KB_DATABASE_URL``).

``Store`` (``store``) keeps documents, chunks, originals (``originals``) and
``meta``, and holds its parts over the same database: the query log
(``query_log``), feedback, Slack deliveries, the audit log, hand-offs, the bot's
messages about each document (``messages``: ``STATUS`` and ``APPROVAL``),
values accepted once (``used_states``: sign-in states, MCP requests' Slack signatures),
the MCP clients' tokens (``mcp_tokens``), the uploads in progress (``uploads``) and
the synced sources' records (``sources``) and what Slack told one replica of people and
channels, for the others (``people_heard``).
``database`` is the contract the two databases (``sqlite``, ``postgres``)
implement and ``connect`` picks one; ``schema`` is the migrations, ``workers``
the indexing locks, ``migrate`` ``kb migrate-store``.
"""

from __future__ import annotations

from index.storage.mcp_tokens import McpToken, McpTokenError, McpTokens
from index.storage.messages import APPROVAL, STATUS, PostedMessage
from index.storage.migrate import migrate_store
from index.storage.people_heard import HEARD_KEEP_SECONDS, Heard, HeardKind, PeopleHeard
from index.storage.sources import SourceItem, SourceRecords, SourceRow, UnknownSource
from index.storage.store import INTERRUPTED, INTERRUPTED_KIND, NewDocument, Store
from index.storage.uploads import Upload
from index.storage.used_states import UsedStates

__all__ = [
    "APPROVAL",
    "HEARD_KEEP_SECONDS",
    "Heard",
    "HeardKind",
    "INTERRUPTED",
    "INTERRUPTED_KIND",
    "McpToken",
    "McpTokenError",
    "McpTokens",
    "NewDocument",
    "PeopleHeard",
    "PostedMessage",
    "STATUS",
    "SourceItem",
    "SourceRecords",
    "SourceRow",
    "Store",
    "UnknownSource",
    "Upload",
    "UsedStates",
    "migrate_store",
]
