"""Notion synced with the readers its admin names, through ``notion-client``, from a local mock.

The mock (``tests/notion_server.py``) follows Notion's API as documented:
``search`` and ``data_sources.query`` paged by ``start_cursor``/``next_cursor``
with the server capping ``page_size``, ``blocks.children.list`` per block,
``users.list``, bearer secrets, 429 ``rate_limited`` with ``Retry-After``, 404
``object_not_found`` for what is not shared. The knowledge base is real (SQLite,
FAISS, the bundled model), and so is the access rule: Slack's ``users.info``
(the mock Slack Web API) gives each person's email, and a search is filtered by
the scopes ``Access.search_scopes`` returns, before the gate and the model.
Retries wait on a recorded clock, never a real one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from core.answer import Engine
from index.knowledge_base import KnowledgeBase
from index.sources import (
    Acl,
    SourceError,
    SourceFailed,
    SourceSyncReport,
    source_scope,
)
from index.sources.notion import NotionConnector, NotionSettings
from tests import sources_harness
from tests.clocks import Waits
from tests.notion_server import Block, DataSource, Fault, MockNotion, Page, block, notion_id, text
from tests.servers import (
    DEFAULT_NOTION_TOKEN,
    DEFAULT_OPENAI_API_KEY,
    UNREACHABLE_RESPONSE_URL,
    MockSlackAPI,
)
from tests.sources_harness import (
    ALICE,
    BOB,
    HOME,
    NOMAIL,
    SECRET,
    SECRET_Q,
    AsPeople,
    kb_cli,
    live_titles,
    sync,
)
from tests.sources_harness import CHILD as ROW

SOURCE = "notion"
# alice is a member of the workspace the source names; bob is not named by the source.
kb, slack = sources_harness.kb, sources_harness.slack

HOME_ID, SECRET_ID, ROW_ID, SUB_ID = notion_id(1), notion_id(2), notion_id(3), notion_id(4)
PROJECTS = notion_id(0x50)


def _home_blocks() -> list[Block]:
    toggle_child = block("paragraph", "Badges are at the front desk.")
    table = Block(
        "table",
        {"table_width": 2, "has_column_header": True, "has_row_header": False},
        [
            Block("table_row", {"cells": [text("Day"), text("Hours")]}),
            Block("table_row", {"cells": [text("Saturday"), text("closed")]}),
        ],
    )
    return [
        block("heading_1", "Opening"),
        block("paragraph", HOME),
        block("bulleted_list_item", "Bring your badge", [block("paragraph", "Lost? Ask Eve.")]),
        block("bulleted_list_item", "Sign the visitor book"),
        block("numbered_list_item", "Knock"),
        block("to_do", "Water the plants", checked=True),
        block("code", "make open-office", language="shell"),
        block("quote", "Doors close at six sharp."),
        block("toggle", "Visitors", [toggle_child]),
        table,
        Block("child_page", {"title": "Kitchen rules"}),
    ]


@pytest.fixture
def notion() -> Iterator[MockNotion]:
    mock = MockNotion()
    mock.person("Alice", "alice@example.com")
    mock.person("Dave", "dave@example.com")
    mock.page(Page(HOME_ID, "Office hours", _home_blocks()))
    mock.page(Page(SECRET_ID, "Nightjar", [block("paragraph", SECRET)]))
    mock.page(Page(SUB_ID, "Kitchen rules", [block("paragraph", "Wash your cup.")], parent=HOME_ID))
    mock.sources[PROJECTS] = DataSource(PROJECTS, "Projects")
    status = {"id": "s1", "type": "select", "select": {"name": "Hiring", "color": "blue"}}
    owner = {"id": "p1", "type": "people", "people": [{"object": "user", "id": "u-bob"}]}
    mock.page(
        Page(
            ROW_ID,
            "Nightjar hiring",
            [block("paragraph", ROW)],
            data_source=PROJECTS,
            shared=False,  # shared through its database, not on its own
            in_search=False,  # not in search's index yet: only the data source's query has it
            properties={"Status": status, "Owner": owner},
        )
    )
    with mock.serve():
        yield mock


ALICE_ONLY = NotionSettings(users=("alice@example.com",))


def connector(
    mock: MockNotion,
    settings: NotionSettings = ALICE_ONLY,
    waits: Waits | None = None,
    budget: float = 30.0,
    **options: Any,
) -> NotionConnector:
    settings = NotionSettings(**{**settings.__dict__, "api_url": mock.base})
    sleep = (waits or Waits()).sleep
    return NotionConnector(
        settings, DEFAULT_NOTION_TOKEN, sleep=sleep, budget_seconds=budget, **options
    )


def run(
    kb: KnowledgeBase,
    mock: MockNotion,
    settings: NotionSettings = ALICE_ONLY,
    waits: Waits | None = None,
    **kw: Any,
) -> SourceSyncReport:
    source = connector(mock, settings, waits, **kw)
    return sync(kb, SOURCE, "notion", source.settings.as_dict(), source, waits)


def acl_of(kb: KnowledgeBase, item: str) -> Acl:
    return sources_harness.acl_of(kb, SOURCE, item)


ALL = {"Office hours", "Nightjar", "Nightjar hiring", "Kitchen rules"}


# ------------------------------------------------------------------ the vertical slice


def test_every_shared_page_and_database_row_is_loaded_rendered_from_its_blocks(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    report = run(kb, notion)

    assert report.error is None and report.mode == "load"
    assert sorted(report.added) == sorted([HOME_ID, SECRET_ID, ROW_ID, SUB_ID])
    assert set(live_titles(kb)) == ALL
    # The server capped each page of results at 2: the rest came by next_cursor.
    searches = notion.calls_to("/v1/search")
    assert any("start_cursor" in body for _, _, body in searches)
    # A page's blocks too, 2 at a time, and the children of a block that has some.
    home_calls = notion.calls_to(f"/v1/blocks/{HOME_ID}/children")
    assert len(home_calls) == 6 and home_calls[1][2]["start_cursor"]
    # The row search had not indexed yet came from its data source's query.
    assert notion.calls_to(f"/v1/data_sources/{PROJECTS}/query")
    home = kb.store.sources.items(SOURCE)[HOME_ID]
    assert home.url == f"https://www.notion.so/{HOME_ID.replace('-', '')}"
    text_of_home = kb.canonical_text(home.document_id or 0)
    for words in (
        HOME, "Opening", "Bring your badge", "Lost? Ask Eve.", "Knock", "[x] Water the plants",
        "make open-office", "Doors close at six sharp.", "Visitors", "Badges are at the front desk.",
        "Saturday", "closed", "Kitchen rules",
    ):  # fmt: skip
        assert words in text_of_home, words
    # A nested block's children were asked for, a sub-page's were not (a document of its own).
    assert "Wash your cup." not in text_of_home
    row = kb.canonical_text(kb.store.sources.items(SOURCE)[ROW_ID].document_id or 0)
    assert ROW in row and "Hiring" in row and "u-bob" not in row
    assert all(acl_of(kb, i) == Acl.of(users=["alice@example.com"]) for i in (HOME_ID, ROW_ID))

    again = run(kb, notion)
    assert again.mode == "poll" and again.added == [] and again.changed == []
    assert sorted(again.unchanged) == sorted([HOME_ID, SECRET_ID, ROW_ID, SUB_ID])


async def test_a_reader_the_source_does_not_name_never_gets_a_passage(
    kb: KnowledgeBase,
    notion: MockNotion,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, notion)
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))

    assert await people.titles(ALICE) == ALL
    for outsider in (BOB, NOMAIL):
        assert await people.titles(outsider) == set()
        assert await people.shown(outsider) == []

    cited = people.cited(await people.answer(ALICE), "Nightjar")
    assert cited.origin == f"https://www.notion.so/{SECRET_ID.replace('-', '')}"


def test_a_source_naming_no_reader_is_read_by_nobody(kb: KnowledgeBase, notion: MockNotion) -> None:
    report = run(kb, notion, NotionSettings())
    assert report.error is None and len(report.added) == 4
    assert acl_of(kb, SECRET_ID).known is False
    for email in ("alice@example.com", "bob@example.com", None):
        assert kb.store.sources.readable_scopes(email) == frozenset()


def test_the_workspace_group_is_expanded_through_users_list_and_refreshed_each_sync(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    workspace = NotionSettings(groups=("workspace",))
    run(kb, notion, workspace)
    scope = source_scope(SOURCE, SECRET_ID)
    assert acl_of(kb, SECRET_ID) == Acl.of(groups=["workspace"])
    assert kb.store.sources.group_members(SOURCE, "workspace") == {
        "alice@example.com",
        "dave@example.com",
    }
    assert scope in kb.store.sources.readable_scopes("alice@example.com")
    assert scope not in kb.store.sources.readable_scopes("bob@example.com")
    assert len(notion.calls_to("/v1/users")) >= 2  # paged: 2 people and the bot, 2 a page

    # Alice leaves the workspace: one sync later she reads nothing of it.
    notion.users = [u for u in notion.users if u["person"]["email"] != "alice@example.com"]
    run(kb, notion, workspace)
    assert scope not in kb.store.sources.readable_scopes("alice@example.com")
    assert scope in kb.store.sources.readable_scopes("dave@example.com")

    # Without the capability to read emails, the group admits nobody: it is never widened,
    # and what users.list no longer confirms is not kept.
    notion.user_emails = False
    report = run(kb, notion, workspace)
    assert report.error is None
    assert kb.store.sources.readable_scopes("dave@example.com") == frozenset()
    notion.user_emails = True
    run(kb, notion, workspace)
    assert scope in kb.store.sources.readable_scopes("dave@example.com")


def test_other_groups_and_bad_readers_are_refused_when_the_source_is_added() -> None:
    with pytest.raises(SourceError, match="only group it can list"):
        NotionSettings(groups=("eng",))
    with pytest.raises(SourceError, match="not an email address"):
        NotionSettings(users=("alice",))
    with pytest.raises(SourceError, match="not an email domain"):
        NotionSettings(domains=("not a domain",))
    assert NotionSettings(domains=("@Example.com",)).acl == Acl.of(domains=["example.com"])
    assert NotionSettings(public=True).acl == Acl(public=True)


async def test_unsharing_trashing_and_a_new_reader_take_effect_within_one_sync(
    kb: KnowledgeBase,
    notion: MockNotion,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, notion)
    seen = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0)).titles

    assert await seen(BOB) == set()
    # The admin names Bob's domain too: no content is fetched again for it.
    wider = NotionSettings(users=("alice@example.com",), domains=("example.com",))
    report = await asyncio.to_thread(run, kb, notion, wider)
    assert report.error is None and report.changed == []
    assert await seen(BOB) == ALL

    # A page no longer shared, a row trashed: gone in the next sync, documents and all.
    notion.pages[SECRET_ID].shared = False
    notion.pages[ROW_ID].in_trash = True
    notion.pages[SUB_ID].archived = True
    report = await asyncio.to_thread(run, kb, notion, wider)
    assert sorted(report.removed) == sorted([SECRET_ID, ROW_ID, SUB_ID])
    assert set(live_titles(kb)) == {"Office hours"}
    assert await seen(BOB) == {"Office hours"}
    assert set(kb.store.sources.items(SOURCE)) == {HOME_ID}


def test_a_poll_reads_search_newest_first_down_to_the_checkpoint(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    for n in range(10, 16):  # older pages, so that the poll has pages it need not read
        old = datetime(2026, 11, 1, 9, n, tzinfo=UTC)
        notion.page(Page(notion_id(n), f"Old {n}", [block("paragraph", f"Old note {n}.")], old))
    run(kb, notion)
    page = notion.pages[HOME_ID]
    page.title = "Opening hours"
    page.blocks = [block("paragraph", "Office hours: the Copenhagen office opens at nine now.")]
    page.edited = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    notion.calls.clear()

    report = run(kb, notion)

    assert report.mode == "poll" and report.changed == [HOME_ID]
    assert "Opening hours" in live_titles(kb) and "Office hours" not in live_titles(kb)
    searches = [b for _, _, b in notion.calls_to("/v1/search") if "sort" in b]
    assert searches[0]["filter"] == {"property": "object", "value": "page"}
    assert searches[0]["sort"] == {"timestamp": "last_edited_time", "direction": "descending"}
    # Stopped at the first page older than the checkpoint less the overlap: two pages of
    # results (the edit, then the others of 2026-12-01), never the November ones.
    assert len(searches) == 2
    assert not any(f"/v1/blocks/{notion_id(10)}" in c[1] for c in notion.calls)
    query = notion.calls_to(f"/v1/data_sources/{PROJECTS}/query")[-1][2]
    assert query["filter"]["last_edited_time"] == {"on_or_after": "2026-12-01T08:00:00.000Z"}


# ------------------------------------------------------------------ the command line


async def test_kb_source_add_sync_list_ask_as_and_remove(
    index_dir: Path,
    notion: MockNotion,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: Any,
) -> None:
    monkeypatch.setenv("KB_NOTION_TOKEN", DEFAULT_NOTION_TOKEN)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", DEFAULT_OPENAI_API_KEY)
    monkeypatch.setenv("KB_THRESHOLD", "2.0")

    def cli(*args: str) -> Result:
        return kb_cli(index_dir, *args)

    added = await asyncio.to_thread(
        cli, "source", "add", "notion", "--api-url", notion.base, "--user", "alice@example.com",
        "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["settings"]["users"] == ["alice@example.com"]
    refused = await asyncio.to_thread(cli, "source", "add", "notion", "--group", "eng")
    assert refused.exit_code == 1 and "only group it can list" in refused.output

    synced = await asyncio.to_thread(cli, "source", "sync", "--json")
    assert synced.exit_code == 0, synced.output
    assert len(json.loads(synced.stdout)[0]["added"]) == 4
    listed = json.loads((await asyncio.to_thread(cli, "source", "list", "--json")).stdout)
    assert [(r["name"], r["kind"], r["documents"], r["last_error"]) for r in listed] == [
        (SOURCE, "notion", 4, None)
    ]

    shown = await asyncio.to_thread(cli, "show", "Nightjar.html", "--json")
    assert shown.exit_code == 0, shown.output
    origin = json.loads(shown.stdout)["source"]
    assert origin["url"] == f"https://www.notion.so/{SECRET_ID.replace('-', '')}"
    assert origin["acl"]["entries"] == [["user", "alice@example.com", None]]
    explained = await asyncio.to_thread(
        cli, "access", "explain", "--user", BOB, "Nightjar.html", "--json"
    )
    decision = json.loads(explained.stdout)
    assert (decision["may_read"], decision["rule"]) == (False, "source")

    asked = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", ALICE, "--json")
    assert asked.exit_code == 0, asked.output
    cited = json.loads(asked.stdout)["sources"][0]
    assert cited["document"] == "Nightjar" and "#char=" in cited["url"]
    assert cited["origin"] == f"https://www.notion.so/{SECRET_ID.replace('-', '')}"
    denied = json.loads(
        (await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", BOB, "--json")).stdout
    )
    assert denied["sources"] + denied["kept"] + denied["beside"] == []

    removed = await asyncio.to_thread(cli, "source", "remove", SOURCE, "--json")
    assert json.loads(removed.stdout) == {"source": SOURCE, "removed": 4}


def test_a_source_without_a_secret_says_where_to_put_it(
    index_dir: Path, notion: MockNotion
) -> None:
    kb_cli(index_dir, "source", "add", "notion", "--api-url", notion.base, "--public")
    result = kb_cli(index_dir, "source", "sync")
    assert result.exit_code == 1 and "KB_NOTION_TOKEN" in result.output
    assert notion.calls == []


def test_a_source_that_cannot_be_opened_leaves_the_next_one_syncing(
    index_dir: Path, notion: MockNotion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kb source sync`` as the schedule does it: a source without its credential fails
    alone, recorded, and the next is synced."""
    monkeypatch.setenv("KB_NOTION_TOKEN", DEFAULT_NOTION_TOKEN)
    wiki = ("--url", "https://wiki.example.com", "--space", "ENG", "--name", "a-wiki")
    assert kb_cli(index_dir, "source", "add", "confluence", *wiki).exit_code == 0
    kb_cli(index_dir, "source", "add", "notion", "--api-url", notion.base, "--public")
    result = kb_cli(index_dir, "source", "sync", "--json")
    assert result.exit_code == 1
    wiki_report, notion_report = json.loads(result.stdout)
    assert wiki_report["source"] == "a-wiki" and "KB_CONFLUENCE_TOKEN" in wiki_report["error"]
    assert notion_report["source"] == SOURCE and not notion_report["error"]
    assert notion_report["added"] and notion.calls
    listed = json.loads(kb_cli(index_dir, "source", "list", "--json").stdout)
    assert "KB_CONFLUENCE_TOKEN" in {s["name"]: s for s in listed}["a-wiki"]["last_error"]


# ------------------------------------------------------------------ bad input


def test_a_revoked_secret_fails_the_run_removes_nothing_and_is_never_shown(
    kb: KnowledgeBase, notion: MockNotion, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run(kb, notion)
    notion.token = "ntn_revoked"
    report = run(kb, notion)
    assert report.error is not None and "refused the integration's secret" in report.error
    assert len(live_titles(kb)) == 4
    row = kb.store.sources.get(SOURCE)
    assert row.last_error == report.error and row.last_good_at is not None
    assert DEFAULT_NOTION_TOKEN not in caplog.text and DEFAULT_NOTION_TOKEN not in report.error


def test_a_missing_capability_fails_the_run_saying_which(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    notion.faults.append(
        Fault("/v1/search", 403, body=b'{"object":"error","status":403,'
              b'"code":"restricted_resource","message":"Insufficient permissions."}')
    )  # fmt: skip
    report = run(kb, notion)
    assert report.error is not None and "Read content" in report.error
    assert live_titles(kb) == {}


def test_429_waits_its_retry_after_and_500s_back_off_within_the_budget(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    waits = Waits()
    notion.fail("/v1/search", 429, retry_after="7")
    notion.fail(f"/v1/blocks/{SECRET_ID}", 503)
    report = run(kb, notion, waits=waits)
    assert report.error is None and len(report.added) == 4
    assert waits.waits == [7.0, 0.5]

    waits = Waits()
    notion.fail("/v1/search", 500, times=10)
    failing = run(kb, notion, waits=waits, budget=3.0)
    assert waits.waits == [0.5, 1.0]
    assert failing.error is not None and "3 s retry budget" in failing.error
    row = kb.store.sources.get(SOURCE)
    assert row.retry_at == waits.now + 2.0
    assert len(live_titles(kb)) == 4


def test_a_garbage_page_and_a_garbage_listing_are_refused_and_change_nothing(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    notion.pages[SUB_ID].garbage = True
    report = run(kb, notion)
    assert report.error is None and [item for item, _ in report.failed] == [SUB_ID]
    assert set(live_titles(kb)) == ALL - {"Kitchen rules"}

    notion.faults.append(Fault("/v1/search", 200, body=b"<html>Login</html>"))
    failing = run(kb, notion)
    assert failing.error is not None and "not JSON" in failing.error
    assert set(live_titles(kb)) == ALL - {"Kitchen rules"}

    notion.faults.append(Fault("/v1/search", 200, body=b'{"object": "list", "has_more": false}'))
    assert "without results" in (run(kb, notion).error or "")
    assert set(live_titles(kb)) == ALL - {"Kitchen rules"}


def test_an_item_listed_twice_is_synced_once(kb: KnowledgeBase, notion: MockNotion) -> None:
    notion.list_twice = HOME_ID
    report = run(kb, notion)
    assert report.repeated == [HOME_ID]
    assert len(report.added) == 4 and len(kb.store.sources.items(SOURCE)) == 4


def test_a_page_address_pointing_elsewhere_opens_on_notion(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    notion.pages[HOME_ID].url = "https://evil.example/phish"
    notion.pages[SECRET_ID].url = "javascript:alert(1)"
    notion.pages[SUB_ID].url = "https://acme.notion.site/Kitchen-rules-4"
    run(kb, notion)
    items = kb.store.sources.items(SOURCE)
    for item in (HOME_ID, SECRET_ID):
        assert items[item].url == f"https://www.notion.so/{item.replace('-', '')}"
    assert items[SUB_ID].url == "https://acme.notion.site/Kitchen-rules-4"


def test_a_page_gone_between_its_listing_and_its_blocks_is_skipped_not_failed(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    gone = b'{"object":"error","status":404,"code":"object_not_found","message":"Could not find"}'
    notion.faults.append(Fault(f"/v1/blocks/{SECRET_ID}/children", 404, body=gone))
    report = run(kb, notion)
    assert report.error is None and report.failed == []
    assert sorted(report.added) == sorted([HOME_ID, ROW_ID, SUB_ID])
    assert "Nightjar" not in live_titles(kb)


def test_an_unreachable_api_backs_off_within_the_budget_then_says_so() -> None:
    waits = Waits()
    settings = NotionSettings(public=True, api_url=UNREACHABLE_RESPONSE_URL.rsplit("/", 1)[0])
    unreachable = NotionConnector(
        settings, DEFAULT_NOTION_TOKEN, sleep=waits.sleep, budget_seconds=3.0
    )
    with pytest.raises(SourceFailed, match=r"unreachable\) past the 3 s retry budget"):
        unreachable.listing()
    assert waits.waits == [0.5, 1.0]


def test_a_page_of_too_many_blocks_is_skipped_and_said_the_others_sync(
    kb: KnowledgeBase, notion: MockNotion
) -> None:
    report = run(kb, notion, max_blocks=8)  # Office hours has 11 blocks, and 3 nested
    assert report.error is None
    assert report.failed == [(HOME_ID, "This page has more than 8 blocks; it was skipped.")]
    assert set(live_titles(kb)) == ALL - {"Office hours"}
