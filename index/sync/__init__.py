"""``kb sync``: folders, URL lists and sitemaps kept in the knowledge base (``sources``), and the
policy every fetched URL goes through (``fetch``), whose addresses pass the one address policy
(``addresses``)."""

from __future__ import annotations

from index.sync.addresses import address_refusal
from index.sync.fetch import DEFAULT_READ_TIMEOUT, DEFAULT_TOTAL_TIMEOUT, FetchPolicy
from index.sync.sources import (
    DEFAULT_SYNC_UPLOADER,
    MAX_SYNC_URLS,
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
    "MAX_SYNC_URLS",
    "SourceReport",
    "SyncConfigError",
    "SyncSource",
    "address_refusal",
    "load_sources",
    "source_from_argument",
    "sync_sources",
]
