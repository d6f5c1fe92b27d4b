"""Sources whose items another part of the product lists and reads (Slack canvases).

Such a source is synced exactly like ``kb sync``'s folders and sites
(``index.sync.sources``): the same record in the store's ``meta`` table, the
same lock, an unchanged item (same sha256, document still live) left alone, a
changed one added through the upload path so that its new version replaces the
old one (a version that fails leaves the old one searchable), a gone one
removed. What differs: the caller hands over the listing, each item's title
and link, and says an item is gone by raising :class:`ItemGone` from its
reader. Its listing comes from an answer that says what exists (not a share
that may have failed to mount), so an empty listing removes every item; a
listing that could not be had is the caller's to report, and removes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.records import DocumentRow
from index.sync.fetch import FetchFailed
from index.sync.sources import Reader, SourceReport, SyncSource, _Run

__all__ = ["ItemFailed", "ItemGone", "ListedItem", "source_link", "sync_listed"]

# How a synced document's name begins: its source's id, then this (index.sync.sources).
_SEPARATOR = " › "


class ItemGone(FetchFailed):
    """A listed item no longer exists at its source, or the product may no longer read it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(key, reason, gone=True)


class ItemFailed(KBError):
    """A listed item could not be read this time; its document, if any, stays as it was."""


@dataclass(frozen=True)
class ListedItem:
    """One item of a listed source.

    Attributes:
        read: its bytes and a file name the extractor understands; raises
            :class:`ItemGone` when it is gone, :class:`ItemFailed` when it cannot
            be read now.
        title: the title its document is given.
        link: where people open it at its source (kept in the source's record).
    """

    read: Reader
    title: str | None = None
    link: str | None = None


def sync_listed(
    kb: KnowledgeBase,
    source: SyncSource,
    listing: Mapping[str, ListedItem],
    *,
    dry_run: bool = False,
) -> SourceReport:
    """Bring ``source``'s documents in line with ``listing`` (item key -> item).

    Runs under the source's lock (one run at a time, across processes); another
    run in progress leaves this one reporting so.
    """
    with kb.store.exclusive(f"sync-{source.id}") as acquired:
        if not acquired:
            busy = "another sync of this source is running; this one left it alone"
            return SourceReport(source.id, source.location, error=busy)
        report = _ListedRun(kb, source, listing, dry_run).sync()
    kb.refresh_search()
    return report


class _ListedRun(_Run):
    """One run of a listed source: the listing given, the titles and links its items carry."""

    empty_listing_is_final = True

    def __init__(
        self,
        kb: KnowledgeBase,
        source: SyncSource,
        listing: Mapping[str, ListedItem],
        dry_run: bool,
    ) -> None:
        super().__init__(kb, source, None, dry_run, None)
        self.listed = dict(listing)

    def _listing(self) -> dict[str, Reader]:
        return {key: item.read for key, item in self.listed.items()}

    def _title(self, key: str) -> str | None:
        return self.listed[key].title

    def _save_record(self) -> None:
        for key, record in self.items.items():
            link = self.listed[key].link if key in self.listed else None
            if link:
                record["link"] = link
        super()._save_record()


def source_link(kb: KnowledgeBase, doc: DocumentRow) -> str | None:
    """Where people open ``doc``'s item at its listed source (a canvas's permalink), if it has one.

    Only the live document the source's record names gets it, and only an
    ``https`` link: a document someone named like a source's gets none.
    """
    source_id, separator, _ = doc.name.partition(_SEPARATOR)
    if not separator:
        return None
    raw = kb.store.get_meta(f"sync:{source_id}")
    if raw is None:
        return None
    try:
        items = json.loads(raw).get("items") or {}
    except (ValueError, AttributeError):
        return None
    for item in items.values():
        link = item.get("link") if isinstance(item, dict) else None
        same = isinstance(item, dict) and str(item.get("doc")) == str(doc.id)
        if same and isinstance(link, str) and link.startswith("https://"):
            return link
    return None
