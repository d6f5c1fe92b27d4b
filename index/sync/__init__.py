"""``kb sync``: folders, URL lists and sitemaps kept in the knowledge base (``sources``), and the
policy every fetched URL goes through (``fetch``), whose addresses pass the one address policy
(``addresses``); sources another part of the product lists and reads, such as Slack canvases,
synced the same way (``listed``)."""

from __future__ import annotations

from index.sync.addresses import address_refusal
from index.sync.fetch import DEFAULT_READ_TIMEOUT, DEFAULT_TOTAL_TIMEOUT, FetchPolicy
from index.sync.listed import ItemFailed, ItemGone, ListedItem, source_link, sync_listed
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
    "ItemFailed",
    "ItemGone",
    "ListedItem",
    "MAX_SYNC_URLS",
    "SourceReport",
    "SyncConfigError",
    "SyncSource",
    "address_refusal",
    "load_sources",
    "source_from_argument",
    "source_link",
    "sync_listed",
    "sync_sources",
]
