"""A source's API as hostile input: what it answers must never stall a sync, lose a document
or crash the run.

The attacker controls (or has broken) the source's answers: a next page that is the
page just read, a ``Retry-After`` of nothing for ever, a time stamp in the year 9999
or the year 1, a download larger than it says. Each source is its local mock
(``tests/*_server.py``) answering as its documentation describes, with the hostile
answer queued in place of one; the connector and the sync are the real ones, into a
real knowledge base. Retries wait on a recorded clock. Each attack here worked before
its fix, but those a comment calls held (a redirect to another host, a source that never
answers, a hostile title), which guard what already held.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from bot.access import web_client
from bot.slack.canvases import Canvases
from index.config import DEFAULT_MAX_UPLOAD_BYTES, IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.sources import Acl, SourceFailed, source_health, sync_due_sources
from index.sources.fields import MAX_EMPTY_PAGES, MAX_PAGES, Listing
from index.sources.notion import NotionConnector, NotionSettings
from tests import (
    confluence_server,
    gdrive_server,
    sharepoint_server,
    sources_harness,
    test_sources_confluence,
    test_sources_gdrive,
    test_sources_notion,
    test_sources_sharepoint,
)
from tests.clocks import Waits
from tests.notion_server import Block, Fault, MockNotion, Page, block, notion_id, text
from tests.servers import (
    CHANNEL_ID,
    DEFAULT_CONFLUENCE_TOKEN,
    DEFAULT_NOTION_TOKEN,
    MockSlackAPI,
    threaded_http_server,
)
from tests.sources_harness import live_titles
from tests.test_sources_notion import ALL, SECRET_ID, run

# Each source's mock and the knowledge base, bound here by name for pytest.
kb, slack = sources_harness.kb, sources_harness.slack
notion = test_sources_notion.notion
confluence = test_sources_confluence.confluence
drive = test_sources_gdrive.drive
graph = test_sources_sharepoint.graph


def _endless(cursor: str) -> bytes:
    """A page of Notion's results that says more follow at ``cursor``, whatever was asked."""
    return json.dumps(
        {"object": "list", "results": [], "has_more": True, "next_cursor": cursor}
    ).encode()


# ------------------------------------------------------------------ pagination


def test_a_notion_cursor_that_comes_back_fails_the_listing_at_once(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    assert run(kb, notion).error is None
    notion.calls.clear()
    # Every search answers the cursor it was given (or, first, "again"): a cycle.
    notion.faults.append(Fault("/v1/search", 200, body=_endless("again"), times=100_000))

    report = run(kb, notion)

    assert report.error is not None and "given before" in report.error
    assert len(notion.calls_to("/v1/search")) == 2
    assert set(live_titles(kb)) == ALL  # nothing removed


def test_a_notion_page_whose_blocks_page_on_for_ever_is_skipped_early(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    # Each page of the block list holds more blocks and a fresh cursor: no cycle to see,
    # only more and more blocks. The page is skipped once past its blocks' limit.
    notion.endless = SECRET_ID
    report = run(kb, notion, max_blocks=50)

    assert report.error is None
    assert [i for i, _ in report.failed] == [SECRET_ID] and "50 blocks" in report.failed[0][1]
    assert len(notion.calls_to(f"/v1/blocks/{SECRET_ID}/children")) == 26  # 2 blocks a page
    assert set(live_titles(kb)) == ALL - {"Nightjar"}


# ------------------------------------------------------------------ rate limits


def test_a_retry_after_of_zero_for_ever_runs_out_of_budget(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    waits = Waits()
    notion.fail("/v1/search", 429, retry_after="0", times=100_000)

    report = run(kb, notion, waits=waits, budget=30.0)

    assert report.error is not None and "30 s retry budget" in report.error
    assert len(notion.calls_to("/v1/search")) <= 12
    assert 0 < sum(waits.waits) <= 30.0


# ------------------------------------------------------------------ time


def test_a_notion_page_edited_in_the_year_9999_does_not_hide_later_edits(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    home = next(p for p in notion.pages.values() if p.title == "Office hours")
    home.edited = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    assert run(kb, notion).error is None

    secret = notion.pages[SECRET_ID]
    secret.blocks = [block("paragraph", "Project Nightjar moved to April.")]
    secret.edited = datetime.now(UTC)
    report = run(kb, notion)

    assert report.error is None and report.changed == [SECRET_ID]
    shown = kb.canonical_text(kb.store.sources.items("notion")[SECRET_ID].document_id or 0)
    assert "moved to April" in shown


def test_a_confluence_page_modified_in_the_year_9999_does_not_hide_later_edits(
    kb: KnowledgeBase, confluence: confluence_server.MockConfluence
) -> None:
    confluence.pages["101"].modified = datetime(9999, 12, 31, 23, 0, tzinfo=UTC)
    assert test_sources_confluence.run(kb, confluence).error is None

    page = confluence.pages["103"]
    page.body, page.version = "<p>Nightjar hiring moved to April.</p>", page.version + 1
    page.modified = datetime.now(UTC)
    report = test_sources_confluence.run(kb, confluence)

    assert report.error is None and report.changed == ["103"]


def test_a_notion_page_edited_in_the_year_1_fails_nothing(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    for page in notion.pages.values():
        page.edited = datetime(1, 1, 1, 0, 0, tzinfo=UTC)
    assert run(kb, notion).error is None

    secret = notion.pages[SECRET_ID]
    secret.blocks = [block("paragraph", "Project Nightjar moved to April.")]
    secret.edited = datetime.now(UTC)
    report = run(kb, notion)

    assert report.error is None and report.changed == [SECRET_ID]


def test_a_confluence_next_link_to_the_page_itself_fails_the_listing_at_once(
    kb: KnowledgeBase, confluence: confluence_server.MockConfluence
) -> None:
    assert test_sources_confluence.run(kb, confluence).error is None
    before = set(live_titles(kb))
    confluence.calls.clear()
    itself = {"results": [], "size": 0, "_links": {"base": confluence.base, "next": "/rest/api/search?cursor=again"}}  # fmt: skip
    body = json.dumps(itself).encode()
    confluence.faults.append(
        confluence_server.Fault("/rest/api/search", 200, body=body, times=100_000)
    )

    report = test_sources_confluence.run(kb, confluence)

    assert report.error is not None and "given before" in report.error
    assert len([c for c in confluence.calls if "/rest/api/search" in c[1]]) == 2
    assert set(live_titles(kb)) == before


def test_a_drive_page_token_that_comes_back_fails_the_listing_at_once(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    assert test_sources_gdrive.run(kb, drive).error is None
    before = set(live_titles(kb))
    drive.calls.clear()
    body = json.dumps({"kind": "drive#fileList", "files": [], "nextPageToken": "again"}).encode()
    drive.faults.append(gdrive_server.Fault("/drive/v3/files", 200, body=body, times=100_000))

    report = test_sources_gdrive.run(kb, drive)

    assert report.error is not None and "given before" in report.error
    assert len([c for c in drive.calls if c[1].endswith("/drive/v3/files")]) == 2
    assert set(live_titles(kb)) == before


def test_a_listing_of_pages_that_each_hold_something_ends_at_the_ceiling() -> None:
    """Every connector follows its pages through one ``Listing``: page ``MAX_PAGES`` is
    followed, the one after it fails the run, each page holding results and a fresh cursor."""
    listing = Listing("Notion")
    for page in range(2, MAX_PAGES + 1):
        assert listing.next_page(f"cursor-{page}", empty=False) == f"cursor-{page}"
    with pytest.raises(SourceFailed, match=f"more than {MAX_PAGES} pages"):
        listing.next_page("cursor-beyond", empty=False)


def test_a_listing_remembers_its_pages_in_a_few_bytes_each_however_long_the_cursors() -> None:
    """A source may send a next page of any length: a listing of 1,000 pages of 64 KB
    cursors keeps a few bytes a page to tell one given before (was: each cursor whole,
    64 MB), and a cursor given again still fails the run."""
    listing = Listing("Notion")
    tracemalloc.start()
    try:
        for page in range(1000):
            listing.next_page(f"{page:08d}" + "x" * 65_536, empty=False)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 1000 * 1024
    with pytest.raises(SourceFailed, match="given before"):
        listing.next_page("00000007" + "x" * 65_536, empty=False)


# Held: Drive may answer a few empty pages, each with a next page, while it searches.
def test_a_few_empty_drive_pages_in_a_row_are_followed(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    drive.empty_pages = 3

    report = test_sources_gdrive.run(kb, drive)

    assert report.error is None and set(report.added) == {"home", "night", "budget"}


def test_drive_pages_that_stay_empty_with_a_fresh_token_each_fail_the_listing_early(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    assert test_sources_gdrive.run(kb, drive).error is None
    before = set(live_titles(kb))
    drive.calls.clear()
    # A thousand empty pages before the files: no token comes back, none holds anything.
    drive.empty_pages = 1000

    report = test_sources_gdrive.run(kb, drive)

    assert report.error is not None and f"{MAX_EMPTY_PAGES} empty pages" in report.error
    assert len([c for c in drive.calls if c[1].endswith("/drive/v3/files")]) == MAX_EMPTY_PAGES
    assert set(live_titles(kb)) == before


def test_a_graph_next_link_to_the_page_itself_fails_the_delta_at_once(
    kb: KnowledgeBase, graph: sharepoint_server.MockSharePoint
) -> None:
    assert test_sources_sharepoint.run(kb, graph).error is None
    before = set(live_titles(kb))
    graph.calls.clear()
    itself = {"value": [], "@odata.nextLink": f"{graph.graph}/drives/d/root/delta?token=again"}
    body = json.dumps(itself).encode()
    graph.faults.append(sharepoint_server.Fault("/root/delta", 200, body=body, times=100_000))

    report = test_sources_sharepoint.run(kb, graph)

    assert report.error is not None and "given before" in report.error
    assert len(graph.calls_to("/root/delta")) == 2
    assert set(live_titles(kb)) == before


def test_a_notion_table_row_of_another_shape_fails_nothing_else(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    # A table whose row is not an object, and a block carrying a "_children" of its own.
    table = Block("table", {"table_width": 1}, [Block("table_row", {"cells": "garbage"})])
    table.children[0].body = "garbage"  # type: ignore[assignment]
    smuggled = Block("paragraph", {"rich_text": text("Plain words.")}, extra={"_children": "x"})
    notion.page(Page(notion_id(9), "Hostile table", [table, smuggled, block("paragraph", "Kept.")]))

    report = test_sources_notion.run(kb, notion)

    assert report.error is None
    assert set(live_titles(kb)) == ALL | {"Hostile table"}


# ------------------------------------------------------------------ shapes


def test_a_drive_role_sent_as_a_list_admits_nobody_and_the_run_goes_on(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    night = drive.files["night"]
    night.permissions = [gdrive_server.Permission("group", ["reader"], email=test_sources_gdrive.ENG)]  # type: ignore[arg-type]  # fmt: skip

    report = test_sources_gdrive.run(kb, drive)

    assert report.error is None and "night" in report.added
    # The group admits nobody (no role Drive documents), the drive's organizer still reads.
    assert test_sources_gdrive.acl_of(kb, "night") == Acl.of([test_sources_gdrive.OWNER])


def test_a_graph_link_type_sent_as_a_list_admits_nobody_and_the_run_goes_on(
    kb: KnowledgeBase, graph: sharepoint_server.MockSharePoint
) -> None:
    hostile = sharepoint_server.link("organization")
    hostile["link"]["type"] = ["view"]
    graph.items["F0"].grants = [hostile]

    report = test_sources_sharepoint.run(kb, graph)

    assert report.error is None and "A" in report.added
    acl = test_sources_sharepoint.acl_of(kb, "A")  # not public: no link type it reads
    assert (acl.public, acl.users, acl.groups) == (False, frozenset(), frozenset())


# ------------------------------------------------------------------ redirects


class _Elsewhere:
    """Another host's server: it records the headers of every request it gets."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    @contextmanager
    def serve(self) -> Iterator[str]:
        seen = self.headers

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                seen.append({k.lower(): v for k, v in self.headers.items()})
                body = b'{"results": [], "files": [], "value": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        with threaded_http_server(Handler) as port:
            # "localhost", not 127.0.0.1: another host to every client.
            yield f"http://localhost:{port}"


# Held: requests and httplib2 drop the Authorization header on a redirect, Notion's SDK does
# not follow one.
def test_a_confluence_redirect_to_another_host_carries_no_token(
    kb: KnowledgeBase, confluence: confluence_server.MockConfluence
) -> None:
    elsewhere = _Elsewhere()
    with elsewhere.serve() as there:
        confluence.faults.append(
            confluence_server.Fault("/rest/api/search", 302, {"Location": f"{there}/steal"})
        )
        test_sources_confluence.run(kb, confluence)

    # requests follows it, without the Authorization header.
    assert elsewhere.headers and all("authorization" not in h for h in elsewhere.headers)
    assert not any(DEFAULT_CONFLUENCE_TOKEN in str(h) for h in elsewhere.headers)


def test_a_drive_redirect_to_another_host_carries_no_token(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    elsewhere = _Elsewhere()
    with elsewhere.serve() as there:
        drive.faults.append(
            gdrive_server.Fault("/drive/v3/files", 302, {"Location": f"{there}/steal"})
        )
        test_sources_gdrive.run(kb, drive)

    # httplib2 follows it, without the Authorization header.
    assert elsewhere.headers and all("authorization" not in h for h in elsewhere.headers)


def test_a_notion_redirect_to_another_host_is_not_followed(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    elsewhere = _Elsewhere()
    with elsewhere.serve() as there:
        notion.faults.append(Fault("/v1/search", 307, {"Location": f"{there}/steal"}))
        report = run(kb, notion)

    assert report.error is not None and elsewhere.headers == []


# ------------------------------------------------------------------ downloads


def test_a_drive_file_listed_small_and_served_huge_is_read_no_further_than_the_limit(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    huge = b"word " * ((DEFAULT_MAX_UPLOAD_BYTES + 2**20) // 5)
    drive.put(gdrive_server.File("huge", "notes.txt", "text/plain", huge, size=100))

    report = test_sources_gdrive.run(kb, drive)

    assert report.error is None and set(report.added) == {"home", "night", "budget"}
    assert [i for i, _ in report.failed] == ["huge"] and "over the 20 MB" in report.failed[0][1]
    # Asked for with a Range, as Drive honours it: one byte past the limit tells.
    assert drive.served["huge"] == DEFAULT_MAX_UPLOAD_BYTES + 1
    assert "notes" not in {d.name for d in kb.documents()}


def test_a_drive_export_larger_than_the_limit_is_cut_while_it_is_read(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    # An export comes whole (no Range), here more than a connector limited to 40 KB takes.
    long = "<p>" + "Many words about the office. " * 4000 + "</p>"
    drive.put(test_sources_gdrive.doc("long", "Long notes", long))

    report = test_sources_gdrive.run(kb, drive, options={"max_bytes": 40_000})

    assert report.error is None and set(report.added) == {"home", "night", "budget"}
    assert [i for i, _ in report.failed] == ["long"]
    assert "Long notes is over the 40000 bytes" in report.failed[0][1]


def test_a_drive_download_that_trickles_fails_that_file_alone_at_its_deadline(
    kb: KnowledgeBase, drive: gdrive_server.MockDrive
) -> None:
    # A byte every 5 s (the test's clock): 2,000 bytes would take 10,000 s.
    waits = Waits()
    drive.put(gdrive_server.File("slow", "slow.txt", "text/plain", b"x" * 2000))
    drive.trickle, drive.trickle_clock = {"slow"}, waits

    report = test_sources_gdrive.run(
        kb, drive, options={"clock": waits.clock, "download_seconds": 120.0}
    )

    assert report.error is None and set(report.added) == {"home", "night", "budget"}
    assert [i for i, _ in report.failed] == ["slow"]
    assert "took longer to download than the 120 s" in report.failed[0][1]
    # Stopped once past the deadline: what the connection held then, not the whole file.
    assert waits.now - 2_000_000.0 < 2000 * 5


def test_a_confluence_attachment_that_trickles_fails_alone_at_its_deadline(
    kb: KnowledgeBase, confluence: confluence_server.MockConfluence
) -> None:
    # A byte every 5 s (the test's clock): 2,000 bytes would take 10,000 s.
    waits = Waits()
    slow = confluence_server.Attachment("att7001", "101", "slow.txt", b"x" * 2000, "text/plain")
    confluence.attach(slow)
    confluence.trickle, confluence.trickle_clock = {"att7001"}, waits

    report = test_sources_confluence.run(kb, confluence, clock=waits.clock)

    assert report.error is None and {"101", "102", "103"} <= set(report.added)
    assert [i for i, _ in report.failed] == ["att7001"]
    assert "took longer to download than the 120 s" in report.failed[0][1]
    assert waits.now - 2_000_000.0 < 2000 * 5


def test_a_graph_download_that_trickles_is_cut_at_its_deadline_on_the_wall_clock(
    kb: KnowledgeBase, graph: sharepoint_server.MockSharePoint
) -> None:
    # A byte every 50 ms: the whole file would take 60 s, each byte well within the read
    # timeout. The deadline is real time here: a read must not wait for a whole chunk.
    graph.add(sharepoint_server.Item("S", "slow.txt", b"x" * 1200, parent="F0"))
    graph.trickle["S"] = 0.05

    started = time.monotonic()
    report = test_sources_sharepoint.run(kb, graph, options={"download_seconds": 2.0})
    took = time.monotonic() - started

    assert report.error is None and {"A", "B", "C"} <= set(report.added)
    assert [i for i, _ in report.failed] == ["S"]
    assert "took longer to download than the 2 s" in report.failed[0][1]
    assert took < 30.0  # the trickle alone would have taken 60 s


# ------------------------------------------------------------------ one source, every source


def test_json_nested_past_the_parsers_depth_fails_its_source_alone(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    # Two sources on one schedule; the first search either makes is answered with JSON nested
    # deeper than a parser goes (RecursionError, not ValueError).
    for name in ("notion-a", "notion-b"):
        kb.store.sources.add(name, "notion", NotionSettings(api_url=notion.base).as_dict())
    bomb = b"[" * 200_000 + b"]" * 200_000
    notion.faults.append(Fault("/v1/search", 200, body=bomb))

    reports = sync_due_sources(
        kb, {"notion": DEFAULT_NOTION_TOKEN}, 0.0, sleep=Waits().sleep, budget_seconds=30.0
    )

    assert sorted(r.ok for r in reports) == [False, True]
    failed = next(r for r in reports if not r.ok)
    assert "nested too deeply" in (failed.error or "")
    good = next(r for r in reports if r.ok)
    assert len(good.added) == len(ALL)
    health = {h["name"]: h["ok"] for h in source_health(kb)}
    assert health == {failed.source: False, good.source: True}


def test_an_answer_no_connector_expected_fails_its_source_alone(
    kb: KnowledgeBase, notion: MockNotion, caplog: pytest.LogCaptureFixture
) -> None:
    # Two sources on one schedule; the first search either makes is answered as gzip that is
    # no gzip: the SDK raises an error of its HTTP client's (httpx.DecodingError) that the
    # connector does not translate.
    for name in ("notion-a", "notion-b"):
        kb.store.sources.add(name, "notion", NotionSettings(api_url=notion.base).as_dict())
    notion.faults.append(
        Fault("/v1/search", 200, {"Content-Encoding": "gzip"}, b"not gzip at all " * 8)
    )

    with caplog.at_level(logging.ERROR, logger="index.sources.sync"):
        reports = sync_due_sources(
            kb, {"notion": DEFAULT_NOTION_TOKEN}, 0.0, sleep=Waits().sleep, budget_seconds=30.0
        )

    assert sorted(r.ok for r in reports) == [False, True]
    failed = next(r for r in reports if not r.ok)
    assert "unexpected error (DecodingError)" in (failed.error or "")
    good = next(r for r in reports if r.ok)
    assert len(good.added) == len(ALL)
    health = {h["name"]: h for h in source_health(kb)}
    assert health[failed.source]["last_error"] == failed.error
    assert health[good.source]["ok"] is True
    (record,) = [r for r in caplog.records if failed.source in r.getMessage()]
    assert record.exc_info is not None and DEFAULT_NOTION_TOKEN not in caplog.text


# ------------------------------------------------------------------ Slack's canvases


async def test_a_channel_whose_canvas_properties_are_of_another_shape_fails_alone(
    slack: MockSlackAPI, index_dir: Path, embedder: Embedder
) -> None:
    # conversations.info of the first channel answers its properties in shapes Slack does not
    # document; the second channel's canvases still sync in the same round, and it is said.
    other = "C0OTHER001"
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    keeper = Canvases(kb, [CHANNEL_ID, other])
    canvas = slack.add_canvas(other, "Release rota", "## Rota\n\nThe rota changes on Mondays.\n")
    usual = slack._m_conversations_info

    def info(params: dict[str, Any]) -> dict[str, Any]:
        found = usual(params)
        if params.get("channel") == CHANNEL_ID:
            found["channel"]["properties"] = {"canvas": "F0", "tabs": ["garbage", 7]}
        return found

    slack.on("conversations.info", info)
    slack.on("files.list", lambda p: {"ok": True, "files": [], "paging": {"pages": "many"}} if p.get("channel") == CHANNEL_ID else slack._m_files_list(p))  # fmt: skip

    reports = await keeper.sync_all(web_client(slack.bot_token, slack.api_url))

    assert len(reports) == 2
    hostile = next(r for r in reports if CHANNEL_ID in r.source)
    fine = next(r for r in reports if other in r.source)
    assert fine.added == [canvas["id"]] and fine.ok
    # Refused, removing nothing: a canvas left unread would be removed as gone.
    assert hostile.error is not None and "shape" in hostile.error


# ------------------------------------------------------------------ deletion


def test_a_notion_page_whose_archived_flag_is_no_boolean_is_not_removed(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    assert run(kb, notion).error is None
    notion.pages[SECRET_ID].archived = "false"  # type: ignore[assignment]
    notion.pages[SECRET_ID].in_trash = "no"  # type: ignore[assignment]

    report = run(kb, notion)

    assert report.error is None and report.removed == []
    assert set(live_titles(kb)) == ALL


def test_a_notion_block_inside_itself_is_read_once(kb: KnowledgeBase, notion: MockNotion) -> None:
    # A toggle whose children are itself, twice: followed naively, 2**24 block lists.
    loop = block("toggle", "Round and round")
    loop.children = [loop, loop]
    page = notion.page(Page(notion_id(10), "Loop", [loop, block("paragraph", "After the loop.")]))

    report = run(kb, notion)

    assert report.error is None and page.id in report.added
    assert len(notion.calls_to(f"/v1/blocks/{loop.id}/children")) == 1
    shown = kb.canonical_text(kb.store.sources.items("notion")[page.id].document_id or 0)
    assert "Round and round" in shown and "After the loop." in shown


def test_a_notion_id_that_is_a_path_fails_that_page_alone(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    # An id with "../" would be a path in the block list's address: another endpoint.
    notion.page(Page("../../users", "Traversal", [block("paragraph", "Where am I?")]))

    report = run(kb, notion)

    assert report.error is None and set(live_titles(kb)) == ALL
    assert [i for i, _ in report.failed] == ["../../users"]
    assert all(
        c[1].startswith(("/v1/search", "/v1/blocks/", "/v1/data_sources/")) for c in notion.calls
    )


def test_a_confluence_id_that_is_a_path_fails_that_page_alone(
    kb: KnowledgeBase, confluence: confluence_server.MockConfluence
) -> None:
    # An id with "../" would be a path in the page's address: another endpoint of the site.
    confluence.page(confluence_server.Page("../../space/ENG", "Traversal", "<p>Where am I?</p>"))

    report = test_sources_confluence.run(kb, confluence)

    assert report.error is None and "../../space/ENG" in [i for i, _ in report.failed]
    # The site's REST API, and the account lookup of the REST API v2 (whose accounts are active).
    assert all(
        c[1].startswith("/wiki/rest/api/") or c[1] == "/wiki/api/v2/users-bulk"
        for c in confluence.calls
    )


# ------------------------------------------------------------------ silence


# Held: each request's timeout, then the budget's back-offs.
def test_a_source_that_accepts_and_never_answers_fails_the_run_within_the_budget(
    kb: KnowledgeBase,
) -> None:
    asked: list[str] = []
    done = threading.Event()

    class Silent(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            done.wait(30)  # never answers while the test runs

        def log_message(self, *args: Any) -> None:
            pass

    waits = Waits()
    with threaded_http_server(Silent) as port:
        try:
            settings = NotionSettings(public=True, api_url=f"http://127.0.0.1:{port}")
            source = NotionConnector(
                settings, DEFAULT_NOTION_TOKEN, sleep=waits.sleep, budget_seconds=10.0, timeout=1
            )
            report = sources_harness.sync(kb, "silent", "notion", settings.as_dict(), source, waits)
        finally:
            done.set()

    # Each request timed out after a second; the back-offs (0.5, 1, 2, 4 s) spent the budget.
    assert report.error is not None and "10 s retry budget" in report.error
    assert waits.waits == [0.5, 1.0, 2.0, 4.0] and len(asked) == 5


# ------------------------------------------------------------------ titles


# Held: a title becomes a display name (short, no controls) as an upload's does.
def test_a_title_of_mentions_a_bidi_override_and_100k_characters_is_kept_short_and_inert(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    hostile = "<!channel> <@U0ALICE001> \u202eexe.txt " + "x" * 100_000
    notion.page(Page(notion_id(11), hostile, [block("paragraph", "Body words.")]))

    report = run(kb, notion)

    assert report.error is None and notion_id(11) in report.added
    (title,) = set(live_titles(kb)) - ALL
    assert len(title) <= 200 and "\u202e" not in title
    doc = kb.store.document(kb.store.sources.items("notion")[notion_id(11)].document_id or 0)
    assert "/" not in doc.name and "\u202e" not in doc.name and len(doc.name) <= 200
