"""Canvases synced before they were credited to their source are its once the store opens.

Such canvases were credited to ``slack-canvases``, a name an upload may have
too: an upload named like one replaced it. The store's migration
``0020_canvases_credited_to_their_source`` credits every version of each to its
source (``source:canvases-<channel>``). The canvases are synced through the real
listed-source sync (``index.sync.sync_listed``) as the earlier release did, the
store is the one that release left (its tables are this release's: the
migration changes rows only, so it is simply not recorded as applied), and the
knowledge base is real.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.slack.canvases import source_of
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Publish, source_uploader
from index.sync import ListedItem, SyncSource, sync_listed

CHANNEL = "C0ENG00001"
CANVAS = "F0CANVAS01"
OLD_CREDIT = "slack-canvases"
MIGRATION = "0020_canvases_credited_to_their_source"
V1 = "# Visitor policy\n\nVisitors sign the book at the front desk and wear a badge all day."
V2 = "# Visitor policy\n\nVisitors sign the book at the front desk; badges go back at six."


def listing(text: str) -> dict[str, ListedItem]:
    link = f"https://example.slack.com/docs/T0TEAM0001/{CANVAS}"
    return {CANVAS: ListedItem(lambda: (text.encode(), f"{CANVAS}.md"), "Visitor policy", link)}


def old_release_store(data_dir: Path, embedder: Embedder) -> tuple[int, int]:
    """A store as the release before the migration left it: a canvas credited ``slack-canvases``
    (as that release's ``source_of`` did), and a folder-synced file credited so by its config.
    """
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    old = SyncSource(
        id=f"canvases-{CHANNEL}",
        scope=CHANNEL,
        uploader=OLD_CREDIT,
        origin=source_of(CHANNEL).origin,
    )
    assert sync_listed(kb, old, listing(V1)).added == [CANVAS]
    canvas = next(d.id for d in kb.documents() if d.name.startswith(f"canvases-{CHANNEL}"))
    notes = kb.add_bytes(
        b"# Notes\n\nThe kitchen closes at five.",
        "notes.md",
        uploader=OLD_CREDIT,
        scope=CHANNEL,
        publish=Publish.DIRECT,
    ).document.id
    kb.index_document(notes)
    kb.store.close()
    with sqlite3.connect(data_dir / "kb.sqlite") as db:
        db.execute("DELETE FROM _sqlite_migrations WHERE name = ?", [MIGRATION])
    db.close()
    return canvas, notes


def test_an_old_canvas_is_its_sources_once_the_store_opens_and_no_upload_replaces_it(
    tmp_path: Path, embedder: Embedder
) -> None:
    data_dir = tmp_path / "kb"
    canvas, notes = old_release_store(data_dir, embedder)

    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)

    row = kb.store.document(canvas)
    assert row.uploader == source_uploader(f"canvases-{CHANNEL}") == source_of(CHANNEL).uploader
    # Not named like a canvas: a credit its own config gave, left as it was.
    assert kb.store.document(notes).uploader == OLD_CREDIT

    # A member's upload of the same name to the channel sits beside the canvas.
    upload = kb.add_bytes(
        b"# Visitor policy\n\nMy own notes on visitors.",
        row.name,
        uploader="U0ALICE001",
        scope=CHANNEL,
        publish=Publish.DIRECT,
    ).document
    assert kb.index_document(upload.id).state == DocState.INDEXED
    assert kb.store.document(canvas).state == DocState.INDEXED

    # The canvas's next change is its new version: the old one replaced, kept to restore.
    report = sync_listed(kb, source_of(CHANNEL), listing(V2))
    assert report.changed == [CANVAS]
    old = kb.store.document(canvas)
    assert old.state == DocState.REPLACED and old.replaced_by is not None
    assert kb.store.document(old.replaced_by).uploader == source_of(CHANNEL).uploader
    assert kb.store.document(upload.id).state == DocState.INDEXED
