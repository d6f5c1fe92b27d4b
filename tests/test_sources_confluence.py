"""Confluence synced with its permissions, through ``atlassian-python-api``, from a local mock.

The mock (``tests/confluence_server.py``) follows Confluence Cloud's REST API v1
as documented: ``start``/``limit`` capped by the server with ``_links.next``,
basic auth, 429 with ``Retry-After``, 404 for a page gone. The knowledge base
is real (SQLite, FAISS, the bundled model), and so is the access rule: Slack's
``users.info`` (the mock Slack Web API) gives each person's email, and a
search is filtered by the scopes ``Access.search_scopes`` returns, before the
gate and the model. Retries wait on a recorded clock, never a real one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import Result

from bot.access import Person, Where
from bot.mcp import Person as ToolCaller
from bot.mcp.people import scopes_of
from bot.server import routes
from bot.slack.blocks.answers import render_answer
from bot.slack.words import words_for
from core.answer import Engine
from core.links import passage_url
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.sources import (
    Acl,
    SourceSyncReport,
    source_scope,
    sync_due_sources,
    sync_source,
)
from index.sources.confluence import ConfluenceConnector, ConfluenceSettings
from index.storage import SourceItem, Store
from tests import sources_harness
from tests.clocks import Waits
from tests.confluence_server import (
    ACCOUNT,
    SPACE,
    Attachment,
    Fault,
    MockConfluence,
    Page,
    Space,
)
from tests.conftest_bot import ADMIN_ID, BotFactory
from tests.docs_factory import text_pdf
from tests.home_tab import admin_bot, open_home
from tests.servers import (
    DEFAULT_CONFLUENCE_TOKEN,
    DEFAULT_OPENAI_API_KEY,
    MockSlackAPI,
    app_mention_event,
    event_body,
    message_im_event,
)
from tests.sources_harness import (
    ALICE,
    BOB,
    CAROL,
    CHILD,
    HOME,
    NOMAIL,
    SECRET,
    SECRET_Q,
    AsPeople,
    access_over,
    kb_cli,
    live_titles,
    sync,
    titles_searched,
)
from tests.test_slack_unfurl import link_shared_event

SOURCE = "confluence-eng"
# alice is in group eng; bob is not; carol's email Confluence does not know.
kb, slack = sources_harness.kb, sources_harness.slack


def _page(page_id: str, title: str, text: str, **kw: Any) -> Page:
    return Page(page_id, title, f"<h1>{title}</h1><p>{text}</p>", **kw)


@pytest.fixture
def confluence() -> Iterator[MockConfluence]:
    mock = MockConfluence()
    mock.groups["confluence-users"] = ["alice@example.com", "bob@example.com"]
    mock.groups["eng"] = ["alice@example.com", "dave@example.com"]
    mock.page(_page("101", "Office hours", HOME))
    mock.page(_page("102", "Nightjar", SECRET, parent="101", read_groups=["eng"]))
    mock.page(_page("103", "Nightjar hiring", CHILD, parent="102"))
    with mock.serve():
        yield mock


def connector(
    mock: MockConfluence, waits: Waits | None = None, budget: float = 30.0, **options: Any
) -> ConfluenceConnector:
    settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ("confluence-users",))
    return ConfluenceConnector(
        settings,
        DEFAULT_CONFLUENCE_TOKEN,
        sleep=(waits or Waits()).sleep,
        budget_seconds=budget,
        **options,
    )


def run(
    kb: KnowledgeBase, mock: MockConfluence, waits: Waits | None = None, **kw: Any
) -> SourceSyncReport:
    settings = {"url": mock.base, "space": SPACE}
    return sync(kb, SOURCE, "confluence", settings, connector(mock, waits, **kw), waits)


# ------------------------------------------------------------------ the vertical slice


def test_a_space_is_loaded_page_by_page_with_each_pages_permissions(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    report = run(kb, confluence)

    assert report.error is None and report.mode == "load"
    assert sorted(report.added) == ["101", "102", "103"]
    # The server capped each page of results at 2: the rest came by following _links.next.
    searches = confluence.calls_to("/rest/api/search")
    assert len(searches) >= 2 and searches[1][2]["start"] == "2"
    assert set(live_titles(kb)) == {"Office hours", "Nightjar", "Nightjar hiring"}
    acl = {
        item: Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, item)))
        for item in ("101", "102", "103")
    }
    # The space is read by confluence-users, named as the whole organisation.
    assert acl["101"] == Acl(public=True)
    # A restricted page and its child (restrictions are inherited): the group's members.
    assert acl["102"] == Acl(users=frozenset({"alice@example.com", "dave@example.com"}))
    assert acl["103"] == acl["102"]
    item = kb.store.sources.items(SOURCE)["102"]
    assert item.url == f"{confluence.base}/spaces/ENG/pages/102"
    text = kb.canonical_text(item.document_id or 0)
    assert SECRET in text

    again = run(kb, confluence)
    assert again.mode == "poll" and again.added == [] and again.changed == []
    assert sorted(again.unchanged) == ["101", "102", "103"]


async def test_a_restricted_page_is_never_searched_for_a_person_it_does_not_admit(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, confluence)
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))

    everything = {"Office hours", "Nightjar", "Nightjar hiring"}
    assert await people.titles(ALICE) == everything
    for outsider in (BOB, CAROL, NOMAIL):
        assert await people.titles(outsider) == {"Office hours"}
        shown = await people.shown(outsider)
        assert shown and {s.document for s in shown} == {"Office hours"}
        assert not any("Nightjar" in s.quote or s.origin.endswith("/102") for s in shown)
    # Shown in a channel everyone there reads: only what is public in the organisation.
    assert await people.titles(ALICE, Where(channel="C0CHAN0001")) == {"Office hours"}

    # Related passages, never the model: the same filter comes first.
    related = AsPeople(slack, kb, engine_for(threshold=0.0, related_threshold=2.0))
    nearby = await related.answer(BOB)
    assert nearby.outcome == "related" and not nearby.model_called
    assert {s.document for s in nearby.sources + nearby.kept + nearby.beside} == {"Office hours"}

    answered = await people.answer(ALICE)
    cited = people.cited(answered, "Nightjar")
    assert cited.origin == f"{confluence.base}/spaces/ENG/pages/102"
    # In Slack, beside the passage's own link, a link to the page in Confluence.
    shown = json.dumps(render_answer(answered, words=words_for("fr")).blocks, ensure_ascii=False)
    assert f"<{cited.origin}|ouvrir l’original>" in shown


async def test_a_permission_change_a_deletion_and_a_move_take_effect_within_one_sync(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, confluence)
    seen = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0)).titles

    assert "Nightjar" in await seen(ALICE)
    # Alice leaves the group; the public home page gets a restriction of its own.
    confluence.groups["eng"] = ["dave@example.com"]
    confluence.pages["101"].read_users = ["bob@example.com"]
    report = await asyncio.to_thread(run, kb, confluence)
    assert report.error is None and report.changed == []  # no content fetched again
    assert await seen(ALICE) == set()
    assert await seen(BOB) == {"Office hours"}

    # Deleted, and moved to another space: gone in the next sync, documents and all.
    nightjar = kb.store.sources.items(SOURCE)["102"].document_id
    del confluence.pages["103"]
    confluence.pages["101"].read_users = []
    confluence.pages["101"].space = "HR"
    confluence.spaces["HR"] = Space("HR", users=["bob@example.com"])
    report = await asyncio.to_thread(run, kb, confluence)
    assert sorted(report.removed) == ["101", "103"]
    assert set(live_titles(kb)) == {"Nightjar"}
    assert await seen(BOB) == set()
    assert kb.store.document(nightjar or 0).state == DocState.INDEXED


async def test_a_token_narrowed_to_channels_reads_only_the_public_synced_pages(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    """An MCP token made with --scope stands for part of what its person reads: the
    channels it names and what is for everyone, not their own source grants."""
    await asyncio.to_thread(run, kb, confluence)
    access = access_over(slack, kb)
    engine = engine_for(threshold=2.0, related_threshold=2.0)
    whole = await scopes_of(ToolCaller(ALICE, None, "laptop", None), access, kb)
    narrowed = await scopes_of(
        ToolCaller(ALICE, None, "ci-bot", frozenset({"C0CHAN0001"})), access, kb
    )
    assert await titles_searched(engine, kb, whole) == {
        "Office hours",
        "Nightjar",
        "Nightjar hiring",
    }
    assert await titles_searched(engine, kb, narrowed) == {"Office hours"}


def test_an_edited_page_replaces_its_document_and_a_renamed_one_leaves_no_copy(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    run(kb, confluence)
    before = live_titles(kb)
    page = confluence.pages["101"]
    page.title, page.version = "Opening hours", 2
    page.body = "<p>Office hours: the Copenhagen office opens at nine now.</p>"
    page.modified = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)

    report = run(kb, confluence)

    assert report.changed == ["101"]
    titles = live_titles(kb)
    assert set(titles) == {"Opening hours", "Nightjar", "Nightjar hiring"}
    assert titles["Opening hours"] != before["Office hours"]
    # The poll asked only for what changed since the last one (a day's overlap).
    last = confluence.calls_to("/rest/api/search")[-1][2]["cql"]
    assert 'lastmodified >= "2026-11-30"' in last


# ------------------------------------------------------------------ the command line


async def test_kb_source_add_sync_list_show_explain_ask_and_remove(
    index_dir: Path,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: Any,
) -> None:
    monkeypatch.setenv("KB_CONFLUENCE_TOKEN", DEFAULT_CONFLUENCE_TOKEN)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", DEFAULT_OPENAI_API_KEY)
    monkeypatch.setenv("KB_THRESHOLD", "2.0")

    def cli(*args: str) -> Result:
        return kb_cli(index_dir, *args)

    added = await asyncio.to_thread(
        cli, "source", "add", "confluence", "--url", confluence.base, "--space", SPACE,
        "--user", ACCOUNT, "--organisation-group", "confluence-users", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["name"] == SOURCE
    twice = await asyncio.to_thread(
        cli, "source", "add", "confluence", "--url", confluence.base, "--space", SPACE
    )
    assert twice.exit_code == 1 and "exists" in twice.output

    synced = await asyncio.to_thread(cli, "source", "sync", "--json")
    assert synced.exit_code == 0, synced.output
    assert sorted(json.loads(synced.stdout)[0]["added"]) == ["101", "102", "103"]
    listed = json.loads((await asyncio.to_thread(cli, "source", "list", "--json")).stdout)
    assert [(r["name"], r["documents"], r["last_error"]) for r in listed] == [(SOURCE, 3, None)]

    shown = await asyncio.to_thread(cli, "show", "Nightjar.html", "--json")
    assert shown.exit_code == 0, shown.output
    origin = json.loads(shown.stdout)["source"]
    assert origin["url"] == f"{confluence.base}/spaces/ENG/pages/102"
    assert origin["acl"]["entries"] == [
        ["user", "alice@example.com", None],
        ["user", "dave@example.com", None],
    ]
    assert origin["synced_at"] > 0

    explained = await asyncio.to_thread(
        cli, "access", "explain", "--user", BOB, "Nightjar.html", "--json"
    )
    decision = json.loads(explained.stdout)
    assert (decision["may_read"], decision["rule"]) == (False, "source")
    assert "bob@example.com" in decision["reason"]
    allowed = await asyncio.to_thread(
        cli, "access", "explain", "--user", ALICE, "Nightjar.html", "--json"
    )
    assert json.loads(allowed.stdout)["may_read"] is True

    asked = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", ALICE, "--json")
    assert asked.exit_code == 0, asked.output
    answer = json.loads(asked.stdout)
    cited = answer["sources"][0]
    assert cited["document"] == "Nightjar" and "#char=" in cited["url"]
    assert cited["origin"] == f"{confluence.base}/spaces/ENG/pages/102"
    denied = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", BOB, "--json")
    assert denied.exit_code == 0, denied.output
    refused = json.loads(denied.stdout)
    passages = refused["sources"] + refused["kept"] + refused["beside"]
    assert passages and {p["document"] for p in passages} == {"Office hours"}

    removed = await asyncio.to_thread(cli, "source", "remove", SOURCE, "--json")
    assert json.loads(removed.stdout) == {"source": SOURCE, "removed": 3}
    docs = json.loads((await asyncio.to_thread(cli, "docs", "--json")).stdout)
    assert [d for d in docs if d["state"] == "indexed"] == []


def test_a_source_without_a_credential_says_where_to_put_it(
    index_dir: Path, confluence: MockConfluence
) -> None:
    kb_cli(index_dir, "source", "add", "confluence", "--url", confluence.base, "--space", SPACE)
    result = kb_cli(index_dir, "source", "sync")
    assert result.exit_code == 1
    assert "KB_CONFLUENCE_TOKEN" in result.output
    bad = kb_cli(index_dir, "source", "add", "confluence", "--url", "ftp:x", "--space", "ENG")
    assert bad.exit_code == 1 and "not a Confluence address" in bad.output


# ------------------------------------------------------------------ bad input


def test_an_expired_token_fails_the_run_and_removes_nothing(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    run(kb, confluence)
    confluence.token = "expired"
    report = run(kb, confluence)
    assert report.error is not None and "refused the credentials (HTTP 401)" in report.error
    assert len(live_titles(kb)) == 3
    row = kb.store.sources.get(SOURCE)
    assert row.last_error == report.error and row.last_good_at is not None


def test_429_waits_its_retry_after_and_500s_back_off_within_the_budget(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    waits = Waits()
    confluence.fail("/rest/api/search", 429, retry_after="7")
    confluence.fail("/rest/api/content/102", 503)
    report = run(kb, confluence, waits)
    assert report.error is None and len(report.added) == 3
    assert waits.waits == [7.0, 0.5]

    waits = Waits()
    confluence.fail("/rest/api/search", 500, times=10)
    failing = run(kb, confluence, waits, budget=3.0)
    # Backing off 0.5 s, then 1 s; 2 s more would pass the 3 s budget: the run stops there.
    assert waits.waits == [0.5, 1.0]
    assert failing.error is not None and "3 s retry budget" in failing.error
    row = kb.store.sources.get(SOURCE)
    assert row.retry_at == waits.now + 2.0
    assert row.last_good_at is not None and row.last_error == failing.error
    assert len(live_titles(kb)) == 3


@pytest.mark.parametrize("asked", ["inf", "Infinity", "1e400", "nan", "-inf"])
def test_a_retry_after_that_is_no_number_of_seconds_is_not_said(
    kb: KnowledgeBase, confluence: MockConfluence, asked: str
) -> None:
    # Read as given, "inf" put the source's next run at infinity: never synced again.
    waits = Waits()
    confluence.fail("/rest/api/search", 429, retry_after=asked)
    report = run(kb, confluence, waits)
    assert report.error is None and len(report.added) == 3
    assert waits.waits == [0.5]  # the first back-off step, as for a 429 that says nothing
    assert kb.store.sources.get(SOURCE).retry_at is None


def test_a_retry_after_of_years_is_waited_a_day_at_most(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    waits = Waits()
    confluence.fail("/rest/api/search", 429, retry_after=str(10**12))
    report = run(kb, confluence, waits)
    assert report.error is not None and report.retry_after == 86400.0
    assert kb.store.sources.get(SOURCE).retry_at == waits.now + 86400.0


def test_a_garbage_page_and_a_garbage_listing_are_refused_and_change_nothing(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.pages["103"].garbage = True
    report = run(kb, confluence)
    assert report.error is None
    assert [item for item, _ in report.failed] == ["103"]
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}

    confluence.faults.append(Fault("/rest/api/search", 200, body=b"<html>Login</html>", times=5))
    failing = run(kb, confluence)
    assert failing.error is not None and "not JSON" in failing.error
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}


def _page_with(confluence: MockConfluence, item: str, **fields: Any) -> None:
    """Confluence answers ``item`` as it would, with ``fields`` replaced."""
    page = json.loads(confluence._content(item)[2])
    confluence.faults.append(
        Fault(f"/rest/api/content/{item}", 200, body=json.dumps({**page, **fields}).encode())
    )


@pytest.mark.parametrize("version", [[3], "3", 3.5, None])
def test_a_page_whose_version_is_not_an_object_is_synced(
    kb: KnowledgeBase, confluence: MockConfluence, version: object
) -> None:
    # Read with .get, a version that is not an object raised AttributeError out of the run.
    _page_with(confluence, "103", version=version)
    report = run(kb, confluence)
    assert report.error is None and sorted(report.added) == ["101", "102", "103"]


def test_a_page_whose_space_is_not_an_object_fails_alone(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    _page_with(confluence, "103", space=SPACE)
    report = run(kb, confluence)
    assert report.error is None and sorted(report.added) == ["101", "102"]
    assert [item for item, _ in report.failed] == ["103"]


@pytest.mark.parametrize("ancestors", [{"id": "102"}, ["102"], [102], "102"])
def test_a_page_whose_ancestors_cannot_be_read_is_read_by_nobody(
    kb: KnowledgeBase, confluence: MockConfluence, ancestors: object
) -> None:
    # Its ancestors' restrictions are its own: unread, nobody may read it (they raised
    # TypeError or AttributeError out of the run).
    _page_with(confluence, "103", ancestors=ancestors)
    report = run(kb, confluence)
    assert report.error is None and "103" in report.added
    scope = source_scope(SOURCE, "103")
    assert Acl.from_entries(kb.store.sources.acl_rows(scope)).known is False


@pytest.mark.parametrize(
    "restrictions",
    [
        {"read": []},
        {"read": True},
        {"read": {"restrictions": []}},
        {"read": {"restrictions": {"user": []}}},
        {"read": {"restrictions": {"user": {"results": {}}}}},
        {"read": {"restrictions": {"group": {"results": 0}}}},
        {"read": {"restrictions": {"user": {"results": "alice@example.com"}}}},
    ],
)
def test_restrictions_of_another_shape_hide_the_page_from_everyone(
    kb: KnowledgeBase, confluence: MockConfluence, restrictions: dict[str, Any]
) -> None:
    # An empty list or 0 where an object or a list belongs read as "no restrictions": the
    # page went to its whole space; true raised AttributeError out of the run.
    confluence.faults.append(
        Fault("/rest/api/content/103/restriction", 200, body=json.dumps(restrictions).encode())
    )
    report = run(kb, confluence)
    assert report.error is None and "103" in report.added
    scope = source_scope(SOURCE, "103")
    assert Acl.from_entries(kb.store.sources.acl_rows(scope)).known is False


@pytest.mark.parametrize(
    "change",
    [
        {"anonymousAccess": "false"},  # read as true: the space went to everyone
        {"anonymousAccess": 1},
        {"anonymousAccess": [False]},
        {"operation": ["read", "space"], "anonymousAccess": True},
        {"subjects": [], "anonymousAccess": True, "operation": "read"},
    ],
)
def test_a_space_permission_of_another_shape_grants_nothing(
    kb: KnowledgeBase, confluence: MockConfluence, change: dict[str, Any]
) -> None:
    # Entries that are not objects raised AttributeError out of the run; an anonymousAccess
    # that is not true made the space public.
    space = confluence._space(confluence.spaces[SPACE])
    read, *others = space["permissions"]
    read = {**read, "subjects": {}, **change}  # no group: only anonymousAccess could grant
    space["permissions"] = ["read", 7, read, *others]
    confluence.faults.append(
        Fault(f"/rest/api/space/{SPACE}", 200, body=json.dumps(space).encode())
    )
    report = run(kb, confluence)
    assert report.error is None and "101" in report.added
    acl = Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, "101")))
    assert not acl.public


def test_an_item_listed_twice_is_synced_once(kb: KnowledgeBase, confluence: MockConfluence) -> None:
    confluence.list_twice = "101"
    report = run(kb, confluence)
    assert report.repeated == ["101"]
    assert sorted(report.added) == ["101", "102", "103"]
    assert len(kb.store.sources.items(SOURCE)) == 3
    assert len(live_titles(kb)) == 3


def test_restrictions_the_api_will_not_show_hide_the_page_from_everyone(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.fail("/rest/api/content/103/restriction", 403, times=3)
    run(kb, confluence)
    scope = source_scope(SOURCE, "103")
    assert Acl.from_entries(kb.store.sources.acl_rows(scope)).known is False
    for email in ("alice@example.com", "dave@example.com", None):
        assert scope not in kb.store.sources.readable_scopes(email)


def test_a_person_confluence_hides_the_email_of_admits_nobody(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.hidden_emails.add("dave@example.com")
    run(kb, confluence)
    acl = Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, "102")))
    assert acl.users == frozenset({"alice@example.com"})


async def test_a_deactivated_confluence_account_grants_the_slack_person_of_its_email_nothing(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    # dave left: his Atlassian account is deactivated, still a member of eng and named on a
    # page's restrictions (Confluence's v1 user objects say nothing of it). Someone in Slack
    # whose confirmed email is dave's reads nothing through it.
    dave = "U0DAVE0001"
    slack.set_user(dave, name="dave")
    confluence.pages["103"].read_users = ["alice@example.com", "dave@example.com"]
    confluence.account_status["dave@example.com"] = "inactive"
    confluence.account_status["closed@example.com"] = "closed"
    confluence.groups["eng"].append("closed@example.com")
    report = await asyncio.to_thread(run, kb, confluence)
    assert report.error is None
    for item in ("102", "103"):
        acl = Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, item)))
        assert acl.users == frozenset({"alice@example.com"}), item
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))
    assert await people.titles(dave) == {"Office hours"}
    assert await people.titles(ALICE) == {"Office hours", "Nightjar", "Nightjar hiring"}
    # Each account was asked about once in the run, with Atlassian's bulk lookup.
    asked = [account for ids in confluence.bulk_asked for account in ids]
    assert sorted(asked) == ["acct-alice", "acct-closed", "acct-dave"]


def test_a_user_lookup_confluence_refuses_fails_the_run_and_removes_nothing(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    assert run(kb, confluence).error is None
    before = Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, "102")))
    # The account may no longer view user profiles: whether anyone is active is unknown.
    confluence.fail("/api/v2/users-bulk", 403, times=5)
    fresh = connector(confluence)
    report = sync(kb, SOURCE, "confluence", {"url": confluence.base, "space": SPACE}, fresh)
    assert report.error is not None
    assert sorted(kb.store.sources.items(SOURCE)) == ["101", "102", "103"]
    assert Acl.from_entries(kb.store.sources.acl_rows(source_scope(SOURCE, "102"))) == before


def test_a_next_link_to_another_site_is_refused(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    hostile = {"results": [], "_links": {"base": "http://evil.example/wiki", "next": "/rest/api/x"}}
    confluence.faults.append(Fault("/rest/api/search", 200, body=json.dumps(hostile).encode()))
    report = run(kb, confluence)
    assert report.error is not None and "another site" in report.error
    assert not any("evil" in c[1] for c in confluence.calls)


# ------------------------------------------------------------------ the store, on both databases


def test_the_store_reads_who_may_read_on_sqlite_and_postgres(
    tmp_path: Path, database_url: str
) -> None:
    store = Store(tmp_path / "kb-data", database_url=database_url)
    records = store.sources
    records.add("wiki", "confluence", {"url": "https://x.example", "space": "A"})
    rows = {
        "pub": Acl(public=True),
        "named": Acl.of(users=["A@Example.com"]),
        "team": Acl.of(groups=["eng"]),
        "domain": Acl.of(domains=["@partner.example"]),
        "unknown": Acl(known=False),
    }
    for item, acl in rows.items():
        scope = source_scope("wiki", item)
        records.put_item(
            SourceItem("wiki", item, scope, None, "", item, "", "", 1.0, 1.0), acl.entries
        )
    records.set_group_members("wiki", "eng", ["bob@example.com"])

    def readable(email: str | None) -> set[str]:
        return {s.rsplit(":", 1)[-1] for s in records.readable_scopes(email)}

    assert readable(None) == {"pub"}
    assert readable("a@example.com") == {"pub", "named"}
    assert readable("bob@example.com") == {"pub", "team"}
    assert readable("x@partner.example") == {"pub", "domain"}
    records.delete("wiki")
    assert records.readable_scopes("bob@example.com") == frozenset()


# ------------------------------------------------------------------ the schedule in kb serve


async def test_a_due_source_is_synced_by_one_process_and_a_failing_one_shows_on_readyz(
    kb: KnowledgeBase, confluence: MockConfluence, engine_for: Callable[..., Engine]
) -> None:
    waits = Waits()
    settings = ConfluenceSettings(confluence.base, SPACE, ACCOUNT, ("confluence-users",))
    kb.store.sources.add(SOURCE, "confluence", settings.as_dict())
    tokens = {"confluence": DEFAULT_CONFLUENCE_TOKEN}
    every = 300.0

    def due() -> list[SourceSyncReport]:
        return sync_due_sources(kb, tokens, every, clock=waits.clock, sleep=waits.sleep)

    # Another replica holds the source's lock: this one leaves it alone, recording nothing.
    with kb.store.exclusive(f"source-{SOURCE}") as held:
        assert held
        [busy] = await asyncio.to_thread(due)
    assert busy.mode == "busy" and confluence.calls == []
    assert kb.store.sources.get(SOURCE).last_run_at is None

    [first] = await asyncio.to_thread(due)
    assert first.mode == "load" and len(first.added) == 3
    calls = len(confluence.calls)
    assert await asyncio.to_thread(due) == []  # synced a moment ago: not due
    assert len(confluence.calls) == calls

    # Five minutes on, Confluence rate-limits with a Retry-After past the budget: the run
    # stops at once, the source says so, and it is not asked again before that time.
    waits.now += every
    confluence.fail("/rest/api/search", 429, retry_after="900", times=1)
    [limited] = await asyncio.to_thread(due)
    assert limited.error is not None and limited.retry_after == 900.0
    assert waits.waits == []
    calls = len(confluence.calls)
    waits.now += 600.0  # past the schedule, not past Retry-After
    assert await asyncio.to_thread(due) == []
    assert len(confluence.calls) == calls
    waits.now += 300.0
    [again] = await asyncio.to_thread(due)
    assert again.error is None and again.mode == "poll"
    again_at = kb.store.sources.get(SOURCE).last_good_at
    confluence.token = "revoked"
    waits.now += every
    [revoked] = await asyncio.to_thread(due)
    assert revoked.error is not None

    engine = engine_for()
    app = web.Application(middlewares=routes.MIDDLEWARES)
    app[routes.KB] = kb
    app[routes.ENGINE] = engine
    routes.setup(app)
    async with TestClient(TestServer(app)) as http:
        ready = await (await http.get("/readyz")).json()
    [health] = ready["sources"]
    assert (health["name"], health["ok"]) == (SOURCE, False)
    assert health["last_good_at"] == again_at
    # Why is for the admins (kb status, the Home tab), not for whoever reaches /readyz.
    assert "last_error" not in health
    assert "refused the credentials" in str(kb.store.sources.get(SOURCE).last_error)
    assert DEFAULT_CONFLUENCE_TOKEN not in json.dumps(ready)


def test_a_page_address_pointing_elsewhere_opens_on_the_configured_site(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.pages["101"].webui = "//evil.example/phish"
    confluence.pages["102"].webui = "javascript:alert(1)"
    run(kb, confluence)
    items = kb.store.sources.items(SOURCE)
    for item in ("101", "102"):
        assert items[item].url == f"{confluence.base}/pages/viewpage.action?pageId={item}"


def test_a_run_stopped_midway_keeps_what_it_indexed_and_the_next_resumes(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.fail("/rest/api/content/103", 500, times=10)
    stopped = run(kb, confluence, Waits(), budget=1.0)
    assert stopped.error is not None and sorted(stopped.added) == ["101", "102"]
    assert kb.store.sources.checkpoint(SOURCE) is None  # saved only once a batch is in
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}

    confluence.faults.clear()
    resumed = run(kb, confluence)
    assert resumed.error is None and resumed.mode == "load"
    assert resumed.added == ["103"] and sorted(resumed.unchanged) == ["101", "102"]
    assert kb.store.sources.checkpoint(SOURCE) is not None
    assert kb.store.sources.get(SOURCE).last_error is None


# ------------------------------------------------------------------ more bad input


def acl_of(kb: KnowledgeBase, item: str, source: str = SOURCE) -> Acl:
    return sources_harness.acl_of(kb, source, item)


def test_a_group_that_cannot_be_listed_now_fails_the_run_and_shuts_nobody_out(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    run(kb, confluence)
    confluence.fail("/rest/api/group/eng/member", 503, times=10)
    failing = run(kb, confluence, Waits(), budget=1.0)
    # Said, with when to retry: not a run that ends "ok" with the group's people left out.
    assert failing.error is not None and "1 s retry budget" in failing.error
    assert failing.retry_after is not None
    assert acl_of(kb, "102").users == {"alice@example.com", "dave@example.com"}
    assert kb.store.sources.get(SOURCE).last_error == failing.error

    confluence.faults.clear()
    confluence.groups["eng"] = ["dave@example.com"]
    assert run(kb, confluence).error is None
    assert acl_of(kb, "102").users == {"dave@example.com"}


async def test_one_email_behind_two_source_identities_reads_what_either_may(
    kb: KnowledgeBase, confluence: MockConfluence, slack: MockSlackAPI
) -> None:
    # Two accounts (acct-Alice, acct-alice) show one email in two letter cases, in two spaces.
    confluence.pages["101"].read_users = ["Alice@Example.COM"]
    confluence.spaces["SEC"] = Space("SEC", users=["alice@example.com"])
    confluence.page(_page("201", "Vault", "The vault opens with the brass key.", space="SEC"))
    run(kb, confluence)
    kb.store.sources.add("wiki-sec", "confluence", {"url": confluence.base, "space": "SEC"})
    settings = ConfluenceSettings(confluence.base, "SEC", ACCOUNT, ("confluence-users",))
    sec = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
    assert sync_source(kb, "wiki-sec", sec).added == ["201"]
    access = access_over(slack, kb)
    alice = await access.search_scopes(Person(ALICE))
    assert {source_scope(SOURCE, "101"), source_scope("wiki-sec", "201")} <= alice
    for other in (BOB, CAROL, NOMAIL):
        scopes = await access.search_scopes(Person(other))
        assert not scopes & {source_scope(SOURCE, "101"), source_scope("wiki-sec", "201")}


async def test_a_page_moved_from_a_public_space_to_a_restricted_one_is_rescoped_in_one_sync(
    kb: KnowledgeBase, confluence: MockConfluence, slack: MockSlackAPI
) -> None:
    confluence.spaces["SEC"] = Space("SEC", users=["alice@example.com"])
    vault = _page("201", "Vault", "The vault opens with the brass key.", space="SEC")
    vault.modified = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)  # days after the ENG pages
    confluence.page(vault)
    kb.store.sources.add("wiki-sec", "confluence", {"url": confluence.base, "space": "SEC"})
    settings = ConfluenceSettings(confluence.base, "SEC", ACCOUNT, ("confluence-users",))

    def both() -> None:
        assert run(kb, confluence).error is None
        sec = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
        assert sync_source(kb, "wiki-sec", sec).error is None

    both()
    access = access_over(slack, kb)
    assert source_scope(SOURCE, "101") in await access.search_scopes(Person(BOB))
    # A move is no edit: the page keeps its last-modified date, older than either checkpoint.
    confluence.pages["101"].space = "SEC"
    both()
    moved = source_scope("wiki-sec", "101")
    assert source_scope(SOURCE, "101") not in {d.scope for d in kb.documents()}
    assert moved not in await access.search_scopes(Person(BOB))
    assert moved in await access.search_scopes(Person(ALICE))
    items = kb.store.sources.items("wiki-sec")
    assert acl_of(kb, "101", "wiki-sec").users == {"alice@example.com"}
    assert kb.store.document(items["101"].document_id or 0).state == DocState.INDEXED


def test_a_page_over_the_size_limit_fails_alone_and_the_rest_syncs(
    index_dir: Path, embedder: Embedder, confluence: MockConfluence
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, max_upload_bytes=64_000), embedder=embedder)
    confluence.pages["103"].body = "<p>" + "Nightjar hiring plans. " * 5_000 + "</p>"
    report = run(kb, confluence)
    assert report.error is None and sorted(report.added) == ["101", "102"]
    [(item, reason)] = report.failed
    assert item == "103" and "over the 64000 bytes upload limit" in reason
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}
    assert kb.store.sources.items(SOURCE)["103"].document_id is None  # its permissions only


def test_a_rename_loop_leaves_each_page_under_its_own_title_once(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    run(kb, confluence)
    first, third = confluence.pages["101"], confluence.pages["103"]
    for step in (1, 2):  # A becomes B and B becomes A, then back again
        first.title, third.title = third.title, first.title
        for page in (first, third):
            page.version += 1
            page.modified = datetime(2026, 12, 2 + step, 10, 0, tzinfo=UTC)
        report = run(kb, confluence)
        assert report.error is None and sorted(report.changed) == ["101", "103"]
        titles = live_titles(kb)
        assert len(titles) == 3 and len(kb.store.documents(DocState.INDEXED)) == 3
        items = kb.store.sources.items(SOURCE)
        for item, page in (("101", first), ("103", third)):
            assert items[item].title == page.title
            assert titles[page.title] == items[item].document_id
    assert HOME in kb.canonical_text(titles["Office hours"])


async def test_credentials_revoked_mid_run_say_so_and_remove_or_show_nothing(
    kb: KnowledgeBase, confluence: MockConfluence, slack: MockSlackAPI
) -> None:
    access = access_over(slack, kb)
    # A first load: page 101 comes whole, then Confluence refuses the token for everything.
    confluence.revoke_at = "/rest/api/content/102"
    stopped = run(kb, confluence)
    assert stopped.error is not None and "refused the credentials (HTTP 401)" in stopped.error
    assert stopped.added == ["101"] and stopped.removed == []
    assert kb.store.sources.checkpoint(SOURCE) is None  # the next run loads again
    assert set(live_titles(kb)) == {"Office hours"}
    assert set(kb.store.sources.items(SOURCE)) == {"101"}

    confluence.token, confluence.revoke_at = DEFAULT_CONFLUENCE_TOKEN, None
    assert run(kb, confluence).error is None
    before = {item: acl_of(kb, item) for item in ("101", "102", "103")}
    texts = {t: kb.canonical_text(i) for t, i in live_titles(kb).items()}
    # A poll: every page edited, 102 opened to everyone; the token is revoked after the
    # first page's permissions were read, before the second's.
    for page in confluence.pages.values():
        page.body, page.version = page.body + "<p>Edited.</p>", page.version + 1
        page.modified = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    confluence.pages["102"].read_groups = []
    confluence.revoke_at = "/rest/api/content/102"
    stopped = run(kb, confluence)
    assert stopped.error is not None and "refused the credentials (HTTP 401)" in stopped.error
    assert stopped.removed == [] and stopped.changed == []
    assert {t: kb.canonical_text(i) for t, i in live_titles(kb).items()} == texts
    assert {item: acl_of(kb, item) for item in ("101", "102", "103")} == before
    for outsider in (BOB, CAROL):
        readable = await access.search_scopes(Person(outsider))
        assert readable & {source_scope(SOURCE, i) for i in ("102", "103")} == set()
    row = kb.store.sources.get(SOURCE)
    assert row.last_error == stopped.error and DEFAULT_CONFLUENCE_TOKEN not in stopped.error


async def test_a_dm_answers_from_the_pages_the_askers_own_permissions_grant(
    make_bot: BotFactory, confluence: MockConfluence
) -> None:
    bot = await make_bot(documents=False, threshold=2.0, related_threshold=2.0)
    await asyncio.to_thread(run, bot.kb, confluence)
    # Alone with the bot, Alice (in eng) reads the restricted page; Bob does not.
    await bot.event(message_im_event(SECRET_Q, user=ALICE, channel="D0ALICE001"))
    alice = json.dumps(await bot.answer(1))
    assert "4 million euros" in alice
    await bot.event(message_im_event(SECRET_Q, user=BOB, channel="D0BOB00001"))
    bob = json.dumps(await bot.answer(2))
    assert "Office hours" in bob and "Nightjar" not in bob
    # In a channel everyone there reads the answer: only what is public in the organisation.
    await bot.event(app_mention_event(SECRET_Q, user=ALICE))
    channel = json.dumps(await bot.answer(3))
    assert "Office hours" in channel and "Nightjar" not in channel
    await bot.idle()


async def test_leaving_a_group_takes_effect_even_when_the_poll_then_fails(
    kb: KnowledgeBase, confluence: MockConfluence, slack: MockSlackAPI
) -> None:
    confluence.spaces["SEC"] = Space("SEC", groups=["eng"])
    confluence.page(_page("201", "Vault", "The vault opens with the brass key.", space="SEC"))
    kb.store.sources.add("wiki-sec", "confluence", {"url": confluence.base, "space": "SEC"})
    settings = ConfluenceSettings(confluence.base, "SEC", ACCOUNT, ("confluence-users",))

    def sec_run() -> SourceSyncReport:
        sec = ConfluenceConnector(
            settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep, budget_seconds=1.0
        )
        return sync_source(kb, "wiki-sec", sec)

    assert sec_run().added == ["201"]
    access = access_over(slack, kb)
    vault = source_scope("wiki-sec", "201")
    assert vault in await access.search_scopes(Person(ALICE))
    # Alice leaves eng; the listing answers, then the poll fails past its budget.
    confluence.groups["eng"] = ["dave@example.com"]
    confluence.faults.append(Fault("/rest/api/search", 500, times=10, after=1))
    failed = sec_run()
    assert failed.error is not None and "retry budget" in failed.error
    assert vault not in await access.search_scopes(Person(ALICE))


# ------------------------------------------------------------------ attachments

ANNEX = "Nightjar annex: the contingency reserve is 600 thousand euros, held by the finance team."
ANNEX_Q = "How large is the Nightjar contingency reserve?"
ROTA = "Front desk rota: Mia covers Mondays, Jonas covers Tuesdays and Fridays."
PDF = "application/pdf"


def downloads(mock: MockConfluence) -> list[str]:
    return [path for _, path, _ in mock.calls_to("/wiki/download/attachments/")]


async def test_an_attachment_is_its_own_document_read_by_whom_its_page_admits(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    confluence.attach(Attachment("att9001", "102", "Nightjar annex.pdf", text_pdf([ANNEX]), PDF))
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    confluence.attach(Attachment("att9003", "101", "photos.zip", b"PK\x03\x04", "application/zip"))
    confluence.attach(Attachment("att9004", "101", "Desk", b"Desk hours.", "text/markdown"))
    report = await asyncio.to_thread(run, kb, confluence)

    assert report.error is None and report.failed == []
    # A zip is not read; a name with no suffix is read by its media type.
    assert sorted(report.added) == ["101", "102", "103", "att9001", "att9002", "att9004"]
    # Page 101's three attachments came two a page: the second page by _links.next.
    listed = confluence.calls_to("/rest/api/content/101/child/attachment")
    assert [c[2].get("start") for c in listed][:2] == [None, "2"]
    items = kb.store.sources.items(SOURCE)
    assert kb.store.document(items["att9004"].document_id or 0).name == "Desk.md"
    annex = items["att9001"]
    assert annex.title == "Nightjar annex.pdf" and annex.version == "1"
    assert annex.url == (
        f"{confluence.base}/pages/viewpageattachments.action?pageId=102"
        "&preview=%2F102%2Fatt9001%2FNightjar%20annex.pdf"
    )
    assert acl_of(kb, "att9001") == acl_of(kb, "102")
    assert acl_of(kb, "att9001").users == {"alice@example.com", "dave@example.com"}
    assert acl_of(kb, "att9002") == Acl(public=True)
    # The permission sync knows each attachment's page from the listing; without one it
    # asks Confluence for the attachment's container.
    assert confluence.calls_to("/rest/api/content/att") == []
    alone = connector(confluence).permissions(["att9001", "att9404"])
    assert alone == {"att9001": acl_of(kb, "102"), "att9404": Acl(known=False)}
    assert confluence.calls_to("/rest/api/content/att9001")[0][2] == {"expand": "container"}

    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))
    for outsider in (BOB, CAROL):
        assert "Nightjar annex.pdf" not in await people.titles(outsider, question=ANNEX_Q)
        shown = await people.shown(outsider, ANNEX_Q)
        assert not any("600 thousand" in s.quote for s in shown)
    answered = await people.answer(ALICE, ANNEX_Q)
    cited = people.cited(answered, "Nightjar annex.pdf", anchor="#page=1")
    assert cited.origin == annex.url
    assert "600 thousand" in cited.quote


async def test_restricting_or_deleting_the_page_reaches_its_attachments_within_one_sync(
    kb: KnowledgeBase,
    confluence: MockConfluence,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    confluence.attach(Attachment("att9005", "101", "annex.pdf", text_pdf([ANNEX]), PDF))
    await asyncio.to_thread(run, kb, confluence)
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))

    async def seen(user: str) -> set[str]:
        return await people.titles(user, question="Who covers the front desk on Mondays?")

    assert "rota.txt" in await seen(BOB)
    # The page gets a restriction: its attachments follow it, nothing fetched again.
    confluence.pages["101"].read_users = ["alice@example.com"]
    before = len(downloads(confluence))
    report = await asyncio.to_thread(run, kb, confluence)
    assert report.error is None and report.changed == []
    assert len(downloads(confluence)) == before
    assert "rota.txt" not in await seen(BOB) and "rota.txt" in await seen(ALICE)
    assert acl_of(kb, "att9002").users == {"alice@example.com"}

    # One attachment deleted, then the page with the other: each gone in the next sync.
    del confluence.attachments["att9005"]
    report = await asyncio.to_thread(run, kb, confluence)
    assert report.error is None and report.removed == ["att9005"]
    assert "annex.pdf" not in set(live_titles(kb))
    rota = kb.store.sources.items(SOURCE)["att9002"].document_id
    del confluence.pages["101"]
    report = await asyncio.to_thread(run, kb, confluence)
    assert report.error is None and sorted(report.removed) == ["101", "att9002"]
    assert rota is not None and rota not in live_titles(kb).values()
    assert "rota.txt" not in await seen(ALICE)


def test_an_attachment_over_the_size_limit_is_reported_and_the_rest_syncs(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    huge = Attachment("att9006", "101", "scan.pdf", b"%PDF-1.4", PDF, size=900 * 2**20)
    confluence.attach(huge)
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    report = run(kb, confluence)

    assert report.error is None and "att9002" in report.added and "att9006" not in report.added
    [(item, reason)] = report.failed
    assert item == "att9006" and reason == "scan.pdf is over the 20 MB a document may be; skipped."
    assert not any("scan.pdf" in path for path in downloads(confluence))
    # Not listed as a document either: the next run polls, it does not reload everything.
    again = run(kb, confluence)
    assert again.mode == "poll" and again.error is None and again.added == []


def test_an_attachment_larger_than_it_says_is_cut_off_at_the_limit(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    lying = Attachment("att9008", "101", "big.txt", b"x" * 5_000, "text/plain", size=100)
    confluence.attach(lying)
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    report = run(kb, confluence, max_bytes=4_000)
    assert report.error is None and "att9002" in report.added
    assert report.failed == [
        ("att9008", "big.txt is over the 4000 bytes a document may be; skipped.")
    ]
    # Its permissions are recorded, no document: the next run tries it again and says so.
    assert kb.store.sources.items(SOURCE)["att9008"].document_id is None
    again = run(kb, confluence, max_bytes=4_000)
    assert again.mode == "poll" and [item for item, _ in again.failed] == ["att9008"]


def test_an_unchanged_attachment_is_not_fetched_again_and_a_new_version_is(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    rota = confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    run(kb, confluence)
    assert len(downloads(confluence)) == 1

    again = run(kb, confluence)
    assert again.mode == "poll" and "att9002" in again.unchanged
    assert len(downloads(confluence)) == 1

    # A new version on a page that did not change, and a new attachment beside it.
    rota.data, rota.version = (ROTA + " Saturdays: closed.").encode(), 2
    confluence.attach(
        Attachment(
            "att9007",
            "103",
            "plan.md",
            b"# Hiring plan\n\nThree engineers join in March.",
            "text/markdown",
        )
    )
    third = run(kb, confluence)
    assert third.mode == "poll" and third.changed == ["att9002"] and third.added == ["att9007"]
    assert len(downloads(confluence)) == 3
    item = kb.store.sources.items(SOURCE)["att9002"]
    assert item.version == "2" and "Saturdays" in kb.canonical_text(item.document_id or 0)


def test_an_attachment_whose_download_points_elsewhere_is_refused(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    confluence.download_host = "http://attacker.example"
    report = run(kb, confluence)
    assert report.error is None and "att9002" not in report.added
    assert report.failed == [("att9002", "Confluence gave no download on its own site; skipped.")]


def test_attachment_listings_and_downloads_wait_out_429s_and_5xx_in_the_budget(
    kb: KnowledgeBase, confluence: MockConfluence
) -> None:
    confluence.attach(Attachment("att9002", "101", "rota.txt", ROTA.encode(), "text/plain"))
    waits = Waits()
    confluence.fail("/child/attachment", 429, retry_after="4")
    confluence.fail("/wiki/download/attachments/101/rota.txt", 503)
    report = run(kb, confluence, waits)
    assert report.error is None and "att9002" in report.added
    assert waits.waits == [4.0, 0.5]

    # Failing past the budget: the run fails saying so, and removes nothing.
    waits = Waits()
    confluence.fail("/content/search", 500, times=50)
    report = run(kb, confluence, waits, budget=3.0)
    assert report.error == (
        "Confluence kept failing (HTTP 500) past the 3 s retry budget; "
        "the next sync retries in 2 s."
    )
    assert report.removed == [] and waits.waits == [0.5, 1.0]
    assert "rota.txt" in live_titles(kb)


async def test_a_link_to_a_page_public_in_the_organisation_unfurls_in_a_channel_as_answers_quote_it(
    make_bot: BotFactory, confluence: MockConfluence
) -> None:
    # Everyone in a channel may read a page public in the organisation: an answer there
    # quotes it, and so does its link's card, the same rule at the same place. A page the
    # source restricts to some people stays a card without its words.
    bot = await make_bot(documents=False)
    await asyncio.to_thread(run, bot.kb, confluence)
    items = bot.kb.store.sources.items(SOURCE)
    shown = {}
    for item in ("101", "102"):
        doc = bot.kb.document(items[item].document_id or 0)
        (chunk, *_) = bot.kb.chunks(doc.id)
        token = bot.services.engine.signer.token(doc.id, doc.scope)
        url = passage_url(
            bot.settings.link_base_url,
            doc.id,
            token,
            start=chunk["start"],
            end=chunk["end"],
            page=None,
            is_pdf=False,
        )
        event = link_shared_event([url])
        bot.slack.share_links(event)
        calls = len(bot.slack.calls("chat.unfurl"))
        assert (await bot.post(event_body(event))).status == 200
        await bot.idle()
        (entity,) = bot.slack.calls("chat.unfurl")[calls]["metadata"]["entities"]
        shown[item] = json.dumps(entity)
    assert "Office hours" in shown["101"] and HOME[:40] in shown["101"]
    assert "Nightjar" not in shown["102"] and SECRET[:40] not in shown["102"]


async def test_an_admins_home_names_the_synced_pages_they_may_read_without_asking_slack_of_each(
    make_bot: BotFactory, confluence: MockConfluence
) -> None:
    # After a change of model every synced page is stale, and the admin's Home lists them.
    # Whether the admin may read each is the access rule's: a page public in the organisation
    # is named, one the source restricts to others is not, and no page is taken for a Slack
    # channel whose members Slack is asked for.
    bot = await admin_bot(make_bot, documents=False)
    await asyncio.to_thread(run, bot.kb, confluence)
    for item in bot.kb.store.sources.items(SOURCE).values():
        bot.kb.store.update_document(item.document_id or 0, pipeline_version="chunker-old")
    text = json.dumps(await open_home(bot, ADMIN_ID))
    assert "Office `hours.html`" in text and "Nightjar" not in text.replace("\\u", "")
    asked = [c["channel"] for c in bot.slack.calls("conversations.members", include_rejected=True)]
    assert not [c for c in asked if not c.startswith(("C", "G"))]
