"""``kb sync``: folders, URL lists and sitemaps kept in the knowledge base (``sources``), and the
policy every fetched URL goes through (``fetch``)."""

from __future__ import annotations

from index.sync.fetch import DEFAULT_READ_TIMEOUT, DEFAULT_TOTAL_TIMEOUT, FetchPolicy
from index.sync.sources import (
    DEFAULT_SYNC_UPLOADER,
    SourceReport,
    SyncConfigError,
    SyncSource,
    load_sources,
    source_from_argument,
    sync_sources,
)

__all__ = [
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_SYNC_UPLOADER",
    "DEFAULT_TOTAL_TIMEOUT",
    "FetchPolicy",
    "SourceReport",
    "SyncConfigError",
    "SyncSource",
    "load_sources",
    "source_from_argument",
    "sync_sources",
]
