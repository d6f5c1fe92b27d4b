"""What a Confluence sync asks Confluence for attachments: one search, not a list per page.

A load from scratch lists each page's attachments; every later run finds the
space's attachments with one CQL search (``space = "KEY" and type =
attachment`` through ``/rest/api/content/search``, each result with its page as
``container``), so a run over N unchanged pages makes that search's pages of
results, never a list per page. An attachment added to, replaced on, or deleted
from a page that did not change still comes, changes or goes within one sync.
The mock (``tests/confluence_server.py``) follows Confluence's documented API
and records every request; the knowledge base is real.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.sources import SourceSyncReport, open_connector, sync_source
from index.sources.confluence import ConfluenceSettings
from tests.confluence_server import ACCOUNT, SPACE, Attachment, MockConfluence, Page
from tests.servers import DEFAULT_CONFLUENCE_TOKEN

SOURCE = "confluence-eng"
PAGES = 6


@pytest.fixture
def confluence() -> Iterator[MockConfluence]:
    mock = MockConfluence()
    mock.groups["confluence-users"] = ["alice@example.com"]
    for n in range(PAGES):
        page = str(200 + n)
        mock.page(Page(page, f"Room {n}", f"<h1>Room {n}</h1><p>Room {n} seats {n + 4}.</p>"))
        rota = f"Room {n} is cleaned on day {n}.".encode()
        mock.attach(Attachment(f"att{900 + n}", page, f"rota{n}.txt", rota, "text/plain"))
    with mock.serve():
        yield mock


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


def sync(kb: KnowledgeBase, confluence: MockConfluence) -> SourceSyncReport:
    """One run as kb source sync makes it; Confluence's calls recorded afresh."""
    if not kb.store.sources.all():
        settings = ConfluenceSettings(confluence.base, SPACE, ACCOUNT, ("confluence-users",))
        kb.store.sources.add(SOURCE, "confluence", settings.as_dict())
    confluence.calls.clear()
    row = kb.store.sources.get(SOURCE)
    report = sync_source(kb, SOURCE, open_connector(row, {"confluence": DEFAULT_CONFLUENCE_TOKEN}))
    assert report.error is None, report.error
    return report


def paths(confluence: MockConfluence, fragment: str) -> list[str]:
    return [c[1] for c in confluence.calls if fragment in c[1]]


def test_a_run_after_the_load_lists_the_spaces_attachments_in_one_search_not_per_page(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    loaded = sync(kb, confluence)
    assert len(loaded.added) == 2 * PAGES
    assert len(paths(confluence, "/child/attachment")) == PAGES  # a load lists each page's

    again = sync(kb, confluence)

    assert again.mode == "poll" and again.added == [] and again.changed == []
    assert paths(confluence, "/child/attachment") == []
    searches = paths(confluence, "/rest/api/content/search")
    # The server gives 2 results a page: the search's pages, whatever the number of pages.
    assert len(searches) == math.ceil(PAGES / confluence.page_cap)
    assert paths(confluence, "/download/attachments/") == []  # versions unchanged


def test_an_attachment_added_replaced_or_deleted_on_an_unchanged_page_is_synced_in_one_run(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    sync(kb, confluence)

    confluence.attach(
        Attachment("att999", "201", "keys.md", b"# Keys\n\nAt the desk.", "text/markdown")
    )
    rota = confluence.attachments["att902"]
    rota.data, rota.version = b"Room 2 is cleaned every day.", 2
    del confluence.attachments["att903"]
    report = sync(kb, confluence)

    assert report.added == ["att999"] and report.changed == ["att902"]
    assert report.removed == ["att903"]
    assert paths(confluence, "/child/attachment") == []
    items = kb.store.sources.items(SOURCE)
    assert "att903" not in items and items["att902"].version == "2"
    assert "every day" in kb.canonical_text(items["att902"].document_id or 0)
    assert "At the desk." in kb.canonical_text(items["att999"].document_id or 0)
