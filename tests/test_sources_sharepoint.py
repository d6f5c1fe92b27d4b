"""SharePoint and OneDrive synced with their permissions, through Microsoft Graph and ``msal``.

The mock (``tests/sharepoint_server.py``) follows Graph v1.0 and the Microsoft
identity platform as documented: the client-credentials grant over https, the
drive's delta with ``@odata.nextLink`` pages and an ``@odata.deltaLink``,
deleted items with a ``deleted`` facet, 410 for an expired delta link, a 302
to a pre-authorised download address, item permissions with inherited ones,
sharing links, and groups' transitive members. ``msal`` and ``requests`` trust
the mock's certificate through ``REQUESTS_CA_BUNDLE``, as a deployment behind
a company CA would. The knowledge base, the sync and the access rule are real;
retries wait on a recorded clock, never a real one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import Result

from bot.access import Where
from core.answer import Engine
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.sources import (
    Acl,
    SourceCredentialsRejected,
    SourceSyncReport,
    source_scope,
    sync_due_sources,
)
from index.sources.sharepoint import SharePointConnector, SharePointSettings
from tests import sources_harness
from tests.clocks import Waits
from tests.servers import DEFAULT_OPENAI_API_KEY, DEFAULT_SHAREPOINT_CLIENT_SECRET, MockSlackAPI
from tests.sharepoint_server import (
    CLIENT_ID,
    SITE_HOST,
    SITE_PATH,
    TENANT,
    Fault,
    Item,
    MockSharePoint,
    group,
    link,
    member,
    site_group,
    user,
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
    kb_cli,
    live_titles,
    sync,
)

SOURCE = "sharepoint-eng"
SITE = f"https://{SITE_HOST}{SITE_PATH}"
ENG = "0c9a6c1e-5d1f-4b8e-9a3e-2f4d6b8a0c1e"  # the Engineering group: alice, dave
kb, slack = sources_harness.kb, sources_harness.slack


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[MockSharePoint]:
    mock = MockSharePoint()
    mock.add(Item("F1", "Nightjar", folder=True, grants=[group(ENG, "Engineering")]))
    mock.add(Item("F0", "Public", folder=True, grants=[link("organization")]))
    mock.add(Item("A", "Office hours.md", f"# Office hours\n\n{HOME}\n".encode(), parent="F0"))
    mock.add(Item("B", "Nightjar.md", f"# Nightjar\n\n{SECRET}\n".encode(), parent="F1"))
    mock.add(Item("C", "Nightjar hiring.txt", CHILD.encode(), parent="F1"))
    mock.add(Item("D", "logo.png", b"\x89PNG...", parent="F1"))  # a format not read: not synced
    mock.groups[ENG] = [
        member("alice@example.com"),
        member("dave@example.com", mail=False),  # known by its userPrincipalName
        {"@odata.type": "#microsoft.graph.group", "id": "nested", "mail": "eng-all@example.com"},
    ]
    with mock.serve():
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", mock.ca_file)
        yield mock


def settings(mock: MockSharePoint, **kw: Any) -> SharePointSettings:
    return SharePointSettings(
        TENANT, CLIENT_ID, site=SITE, graph_url=mock.graph, authority_url=mock.base, **kw
    )


def connector(
    mock: MockSharePoint,
    waits: Waits | None = None,
    budget: float = 30.0,
    options: dict[str, Any] | None = None,
    **kw: Any,
) -> SharePointConnector:
    return SharePointConnector(
        settings(mock, **kw),
        DEFAULT_SHAREPOINT_CLIENT_SECRET,
        sleep=(waits or Waits()).sleep,
        budget_seconds=budget,
        **(options or {}),
    )


def run(
    kb: KnowledgeBase,
    mock: MockSharePoint,
    waits: Waits | None = None,
    options: dict[str, Any] | None = None,
    **kw: Any,
) -> SourceSyncReport:
    """One sync through a connector opened with ``options`` (``max_bytes``...); ``kw`` are
    the source's settings."""
    source = connector(mock, waits, options=options, **kw)
    return sync(kb, SOURCE, "sharepoint", settings(mock).as_dict(), source, waits)


def acl_of(kb: KnowledgeBase, item: str) -> Acl:
    return sources_harness.acl_of(kb, SOURCE, item)


# ------------------------------------------------------------------ the vertical slice


def test_a_library_is_loaded_through_the_delta_with_each_files_permissions(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    report = run(kb, graph)

    assert report.error is None and report.mode == "load"
    assert sorted(report.added) == ["A", "B", "C"]
    # The server capped each delta page at 2: the rest came by following @odata.nextLink.
    deltas = graph.calls_to("/root/delta")
    assert [c[2].get("token") for c in deltas] == [None, "s0.2", "s0.4", "s0.6"]
    checkpoint = kb.store.sources.checkpoint(SOURCE)
    assert checkpoint == f"{graph.graph}/drives/b!Ey9vXyz0ENGlibrary/root/delta?token=s6"
    assert set(live_titles(kb)) == {"Office hours", "Nightjar", "Nightjar hiring"}
    # Inherited from their folders: an organisation-wide sharing link (public), a group.
    assert acl_of(kb, "A") == Acl(public=True)
    assert acl_of(kb, "B") == Acl(groups=frozenset({ENG})) == acl_of(kb, "C")
    # The group was expanded by Graph: mail, else the userPrincipalName; nested groups skipped.
    members = kb.store.sources.group_members(SOURCE, ENG)
    assert members == frozenset({"alice@example.com", "dave@example.com"})
    item = kb.store.sources.items(SOURCE)["B"]
    assert item.url == f"{SITE}/Shared%20Documents/Nightjar.md"
    assert SECRET in kb.canonical_text(item.document_id or 0)
    # The content came from the download address, without the app's token.
    downloads = graph.calls_to("/download/")
    assert len(downloads) == 3 and not any(signed for *_, signed in downloads)

    again = run(kb, graph)
    assert again.mode == "poll" and again.added == [] and again.changed == []
    assert graph.calls_to("/root/delta")[-1][2] == {"token": "s6"}


async def test_a_restricted_file_is_never_searched_for_a_person_it_does_not_admit(
    kb: KnowledgeBase,
    graph: MockSharePoint,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, graph)
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))

    everything = {"Office hours", "Nightjar", "Nightjar hiring"}
    assert await people.titles(ALICE) == everything
    for outsider in (BOB, CAROL, NOMAIL):
        assert await people.titles(outsider) == {"Office hours"}
        shown = await people.shown(outsider)
        assert shown and {s.document for s in shown} == {"Office hours"}
        assert not any("Nightjar" in s.quote for s in shown)
    assert await people.titles(ALICE, Where(channel="C0CHAN0001")) == {"Office hours"}

    cited = people.cited(await people.answer(ALICE), "Nightjar")
    assert cited.origin == f"{SITE}/Shared%20Documents/Nightjar.md"


async def test_a_permission_change_a_move_and_a_deletion_take_effect_within_one_sync(
    kb: KnowledgeBase,
    graph: MockSharePoint,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, graph)
    seen = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0)).titles

    assert "Nightjar" in await seen(ALICE)
    # Alice leaves the group; the hiring note is shared with Bob by a link for him alone.
    graph.groups[ENG] = [member("dave@example.com")]
    graph.items["C"].grants = [link("users", "bob@example.com")]
    report = await asyncio.to_thread(run, kb, graph)
    assert report.error is None and report.changed == []  # no content fetched again
    assert await seen(ALICE) == {"Office hours"}
    assert await seen(BOB) == {"Office hours", "Nightjar hiring"}

    # The public page moves into the restricted folder (its permissions are the new
    # folder's now); the hiring note is deleted.
    graph.move("A", "F1")
    graph.delete("C")
    report = await asyncio.to_thread(run, kb, graph)
    assert report.error is None and report.removed == ["C"]
    assert acl_of(kb, "A") == Acl(groups=frozenset({ENG}))
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}
    assert await seen(BOB) == set()
    assert await seen(ALICE) == set()


def test_a_poll_from_the_delta_link_picks_up_an_edit_and_a_rename(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    before = live_titles(kb)
    graph.edit("A", b"# Opening hours\n\nThe office opens at nine now.\n", name="Opening hours.md")

    report = run(kb, graph)

    assert report.mode == "poll" and report.changed == ["A"] and report.unchanged == []
    titles = live_titles(kb)
    assert set(titles) == {"Opening hours", "Nightjar", "Nightjar hiring"}
    assert titles["Opening hours"] != before["Office hours"]
    # Only what changed was fetched: one download, from the delta link's changes.
    assert [c[1] for c in graph.calls_to("/download/")[3:]] == ["/download/A"]


def test_an_expired_delta_link_loads_the_drive_again(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    graph.edit("B", f"# Nightjar\n\n{SECRET} Revised.\n".encode())
    graph.oldest_delta = graph.sequence  # the saved delta link is now too old

    report = run(kb, graph)

    assert report.error is None and report.mode == "poll"
    assert report.changed == ["B"] and sorted(report.unchanged) == ["A", "C"]
    assert kb.store.sources.checkpoint(SOURCE) == (
        f"{graph.graph}/drives/b!Ey9vXyz0ENGlibrary/root/delta?token=s{graph.sequence}"
    )


# ------------------------------------------------------------------ permissions


def test_sharing_links_people_groups_and_site_groups_map_to_who_may_read(
    graph: MockSharePoint,
) -> None:
    graph.add(Item("E", "anon.txt", b"x", grants=[link("anonymous")]))
    graph.add(Item("G", "existing.txt", b"x", grants=[link("existingAccess"), user("Eve@Example.com")]))  # fmt: skip
    graph.add(Item("H", "owners.txt", b"x", grants=[site_group("Eng Owners")]))
    graph.add(Item("I", "members.txt", b"x", grants=[site_group("Eng Members")]))
    graph.unreadable.add("C")

    source = connector(graph, organisation_groups=("Eng Members",))
    acls = source.permissions(["A", "B", "C", "E", "G", "H", "I", "gone"])

    assert acls["E"] == Acl(public=True)  # anyone with the link: the whole organisation too
    assert acls["G"] == Acl(users=frozenset({"eve@example.com"}))  # existingAccess adds nobody
    assert acls["H"] == Acl(groups=frozenset({"sitegroup:Eng Owners"}))
    assert acls["I"] == Acl(public=True)  # named as the whole organisation
    assert acls["C"].known is False and acls["gone"].known is False
    # A site group's members cannot be read through Graph: it admits nobody.
    [owners] = source.groups(["sitegroup:Eng Owners"])
    assert owners.emails == frozenset() and owners.complete is False
    assert graph.calls_to("/groups/") == []


def test_a_group_whose_members_cannot_be_read_admits_nobody(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    assert source_scope(SOURCE, "B") in kb.store.sources.readable_scopes("alice@example.com")
    graph.fail(f"/groups/{ENG}/transitiveMembers", 403, times=3)
    report = run(kb, graph)
    assert report.error is None
    assert kb.store.sources.group_members(SOURCE, ENG) == frozenset()
    assert source_scope(SOURCE, "B") not in kb.store.sources.readable_scopes("alice@example.com")


# ------------------------------------------------------------------ bad input


def test_an_expired_access_token_is_renewed_and_a_revoked_secret_fails_the_run(
    kb: KnowledgeBase, graph: MockSharePoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    source = connector(graph)
    assert source.listing() == frozenset({"A", "B", "C"})
    graph.expire_tokens()
    assert source.listing() == frozenset({"A", "B", "C"})
    assert graph.issued == 2  # a fresh token after the 401, once

    run(kb, graph)
    graph.expire_tokens()
    graph.secret = "revoked"
    report = run(kb, graph)
    assert report.error is not None
    assert "refused the app (invalid_client, AADSTS7000215)" in report.error
    assert "KB_SHAREPOINT_CLIENT_SECRET" in report.error
    assert len(live_titles(kb)) == 3
    row = kb.store.sources.get(SOURCE)
    assert row.last_error == report.error and row.last_good_at is not None
    assert DEFAULT_SHAREPOINT_CLIENT_SECRET not in report.error
    assert DEFAULT_SHAREPOINT_CLIENT_SECRET not in caplog.text
    assert "graph-access-" not in caplog.text
    assert "tempauth" not in caplog.text  # a download address authorises reading the file


def test_a_download_address_never_reaches_the_log_and_no_one_elses_lines_change(
    kb: KnowledgeBase, graph: MockSharePoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="urllib3")  # every request line urllib3 writes
    graph.fail("/download/A", 503)  # asked twice: the retry's line is hidden the same way

    report = run(kb, graph)

    assert report.error is None and sorted(report.added) == ["A", "B", "C"]
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")]
    downloads = [line for line in lines if "/download/" in line]
    # Each download is still logged (at DEBUG, as urllib3 logs it), its query hidden.
    assert len(downloads) == 4 and "503" in downloads[0]
    assert all("/download/" in line and "?[query hidden]" in line for line in downloads)
    assert "tempauth" not in caplog.text and "ey.A" not in caplog.text
    assert "graph-access-" not in caplog.text  # the app's token: a header, never logged
    assert DEFAULT_SHAREPOINT_CLIENT_SECRET not in caplog.text
    # Graph's own requests are logged as urllib3 writes them, queries and all.
    assert any("/root/delta?" in line and "token=s0.2" in line for line in lines)
    # And any other client's: the connector changed no logger's level, hid nothing else.
    assert logging.getLogger("urllib3.connectionpool").level == logging.NOTSET
    assert logging.getLogger("msal").level == logging.NOTSET
    requests.get(f"{graph.base}/download/A?tempauth=elsewhere", timeout=10).close()
    assert "/download/A?tempauth=elsewhere" in caplog.text


def test_a_failing_sign_in_or_an_unknown_tenant_fails_the_run_and_removes_nothing(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    graph.fail("/oauth2/v2.0/token", 503)
    report = run(kb, graph)
    assert report.error is not None and "sign-in service gave no token" in report.error
    assert len(live_titles(kb)) == 3

    elsewhere = SharePointSettings(
        "fabrikam.onmicrosoft.com", CLIENT_ID, site=SITE, graph_url=graph.graph,
        authority_url=graph.base,
    )  # fmt: skip
    source = SharePointConnector(elsewhere, DEFAULT_SHAREPOINT_CLIENT_SECRET)
    with pytest.raises(SourceCredentialsRejected, match="knows no tenant 'fabrikam"):
        source.listing()


def test_a_token_graph_refuses_fails_the_run_and_removes_nothing(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    graph.fail("/root/delta", 403, times=5)
    report = run(kb, graph)
    assert report.error is not None and "refused the app's token (HTTP 403)" in report.error
    assert len(live_titles(kb)) == 3


def test_429_waits_its_retry_after_and_5xx_back_off_within_the_budget(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    waits = Waits()
    graph.fail("/root/delta", 429, retry_after="7")
    graph.fail("/items/B/content", 503)
    graph.fail("/download/C", 502)
    report = run(kb, graph, waits)
    assert report.error is None and len(report.added) == 3
    assert waits.waits == [7.0, 0.5, 0.5]

    waits = Waits()
    graph.fail("/root/delta", 500, times=10)
    failing = run(kb, graph, waits, budget=3.0)
    # Backing off 0.5 s, then 1 s; 2 s more would pass the 3 s budget: the run stops there.
    assert waits.waits == [0.5, 1.0]
    assert failing.error is not None and "3 s retry budget" in failing.error
    row = kb.store.sources.get(SOURCE)
    assert row.retry_at == waits.now + 2.0
    assert len(live_titles(kb)) == 3


def test_a_garbage_delta_is_refused_and_changes_nothing(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    run(kb, graph)
    graph.faults.append(Fault("/root/delta", 200, body=b"<html>Sign in</html>", times=5))
    failing = run(kb, graph)
    assert failing.error is not None and "not JSON" in failing.error
    assert len(live_titles(kb)) == 3

    graph.faults.clear()
    graph.faults.append(Fault("/root/delta", 200, body=b'{"value": [{"name": "x"}]}', times=5))
    failing = run(kb, graph)
    assert failing.error is not None and "no item" in failing.error
    assert len(live_titles(kb)) == 3


def test_an_item_listed_twice_is_synced_once(kb: KnowledgeBase, graph: MockSharePoint) -> None:
    graph.list_twice = "A"
    report = run(kb, graph)
    assert report.error is None and sorted(report.added) == ["A", "B", "C"]
    assert len(graph.calls_to("/download/A")) == 1
    assert len(kb.store.sources.items(SOURCE)) == 3 and len(live_titles(kb)) == 3


def test_a_download_or_a_next_page_on_another_host_is_refused(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    graph.redirect_to = "https://evil.example/download/A?tempauth=x"
    report = run(kb, graph)
    assert report.error is None and report.added == []
    assert sorted(i for i, _ in report.failed) == ["A", "B", "C"]
    assert "unexpected host" in report.failed[0][1]

    hostile = {"value": [], "@odata.nextLink": "https://evil.example/v1.0/drives/x/root/delta"}
    graph.faults.append(Fault("/root/delta", 200, body=json.dumps(hostile).encode()))
    failing = run(kb, graph)
    assert failing.error is not None and "another site" in failing.error


def test_a_file_too_large_is_skipped_and_said(kb: KnowledgeBase, graph: MockSharePoint) -> None:
    graph.items["C"].size = 5 * 1024**3
    report = run(kb, graph)
    assert sorted(report.added) == ["A", "B"]
    assert [i for i, _ in report.failed] == ["C"] and "over the 20 MB" in report.failed[0][1]
    assert graph.calls_to("/items/C/content") == []


def _long_and_slow(graph: MockSharePoint) -> None:
    """A file listed as 100 bytes and sent as 5,000, one sent a byte every 50 ms (45 s in all)."""
    graph.add(Item("L", "long.txt", b"word " * 1000, parent="F0", size=100))
    graph.add(Item("S", "slow.txt", b"x" * 900, parent="F0"))
    graph.trickle["S"] = 0.05


def _held_to_1000_bytes_and_2_seconds(report: dict[str, Any]) -> None:
    assert report["error"] is None and sorted(report["added"]) == ["A", "B", "C"]
    assert {f["item"]: f["reason"] for f in report["failed"]} == {
        "L": "long.txt is over the 1000 bytes a document may be; skipped.",
        "S": "slow.txt took longer to download than the 2 s one file may take; skipped.",
    }


def test_kb_source_sync_holds_each_file_to_the_upload_limit_and_the_download_timeout(
    index_dir: Path, graph: MockSharePoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_SHAREPOINT_CLIENT_SECRET", DEFAULT_SHAREPOINT_CLIENT_SECRET)
    monkeypatch.setenv("KB_MAX_UPLOAD_BYTES", "1000")
    monkeypatch.setenv("KB_DOWNLOAD_TIMEOUT", "2")
    _long_and_slow(graph)
    kb_cli(
        index_dir, "source", "add", "sharepoint", "--tenant", TENANT, "--client-id", CLIENT_ID,
        "--site", SITE, "--graph-url", graph.graph, "--authority-url", graph.base,
    )  # fmt: skip

    started = time.monotonic()
    synced = kb_cli(index_dir, "source", "sync", "--json")
    took = time.monotonic() - started

    (report,) = json.loads(synced.stdout)
    _held_to_1000_bytes_and_2_seconds(report)
    assert took < 30.0  # the trickle alone would have taken 45 s


def test_the_scheduled_sync_holds_each_file_to_the_upload_limit_and_the_download_timeout(
    index_dir: Path, embedder: Embedder, graph: MockSharePoint
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, max_upload_bytes=1000), embedder=embedder)
    kb.store.sources.add(SOURCE, "sharepoint", settings(graph).as_dict())
    _long_and_slow(graph)
    tokens = {"sharepoint": DEFAULT_SHAREPOINT_CLIENT_SECRET}

    started = time.monotonic()
    (report,) = sync_due_sources(kb, tokens, 0.0, download_seconds=2.0, sleep=Waits().sleep)
    took = time.monotonic() - started

    _held_to_1000_bytes_and_2_seconds(report.as_dict())
    assert took < 30.0


def test_a_file_address_pointing_elsewhere_gives_no_link(
    kb: KnowledgeBase, graph: MockSharePoint
) -> None:
    graph.items["A"].web_url = "javascript:alert(1)"
    graph.items["B"].web_url = "https://evil.example/phish"
    run(kb, graph)
    items = kb.store.sources.items(SOURCE)
    assert (items["A"].url, items["B"].url) == ("", "")
    assert items["C"].url == f"{SITE}/Shared%20Documents/Nightjar%20hiring.txt"


def test_settings_that_cannot_work_say_what_to_give() -> None:
    with pytest.raises(Exception, match="application \\(client\\) id"):
        SharePointSettings(TENANT, "not-a-guid", site=SITE)
    with pytest.raises(Exception, match="--site\\) or a drive id"):
        SharePointSettings(TENANT, CLIENT_ID)
    with pytest.raises(Exception, match="not a SharePoint site address"):
        SharePointSettings(TENANT, CLIENT_ID, site="http://contoso.sharepoint.com/sites/x")
    with pytest.raises(Exception, match="names no tenant"):
        SharePointSettings("common", CLIENT_ID, site=SITE)
    drive = SharePointSettings(TENANT, CLIENT_ID, drive="b!abc")
    assert SharePointSettings.from_dict(drive.as_dict()) == drive


# ------------------------------------------------------------------ the command line


async def test_kb_source_add_sync_list_show_ask_and_remove(
    index_dir: Path,
    graph: MockSharePoint,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: Any,
) -> None:
    monkeypatch.setenv("KB_SHAREPOINT_CLIENT_SECRET", DEFAULT_SHAREPOINT_CLIENT_SECRET)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", DEFAULT_OPENAI_API_KEY)
    monkeypatch.setenv("KB_THRESHOLD", "2.0")

    def cli(*args: str) -> Result:
        return kb_cli(index_dir, *args)

    added = await asyncio.to_thread(
        cli, "source", "add", "sharepoint", "--tenant", TENANT, "--client-id", CLIENT_ID,
        "--site", SITE, "--graph-url", graph.graph, "--authority-url", graph.base, "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["name"] == SOURCE
    bad = await asyncio.to_thread(
        cli, "source", "add", "sharepoint", "--tenant", TENANT, "--client-id", "x", "--drive", "d"
    )
    assert bad.exit_code == 1 and "application (client) id" in bad.output

    synced = await asyncio.to_thread(cli, "source", "sync", "--json")
    assert synced.exit_code == 0, synced.output
    assert sorted(json.loads(synced.stdout)[0]["added"]) == ["A", "B", "C"]
    listed = json.loads((await asyncio.to_thread(cli, "source", "list", "--json")).stdout)
    assert [(r["name"], r["kind"], r["documents"], r["last_error"]) for r in listed] == [
        (SOURCE, "sharepoint", 3, None)
    ]

    shown = await asyncio.to_thread(cli, "show", "Nightjar.md", "--json")
    assert shown.exit_code == 0, shown.output
    origin = json.loads(shown.stdout)["source"]
    assert origin["url"] == f"{SITE}/Shared%20Documents/Nightjar.md"
    assert origin["acl"]["entries"] == [["group", ENG, None]]

    explained = await asyncio.to_thread(
        cli, "access", "explain", "--user", BOB, "Nightjar.md", "--json"
    )
    assert json.loads(explained.stdout)["may_read"] is False
    allowed = await asyncio.to_thread(
        cli, "access", "explain", "--user", ALICE, "Nightjar.md", "--json"
    )
    assert json.loads(allowed.stdout)["may_read"] is True

    asked = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", ALICE, "--json")
    assert asked.exit_code == 0, asked.output
    cited = json.loads(asked.stdout)["sources"][0]
    assert cited["document"] == "Nightjar" and "#char=" in cited["url"]
    denied = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", BOB, "--json")
    refused = json.loads(denied.stdout)
    passages = refused["sources"] + refused["kept"] + refused["beside"]
    assert passages and {p["document"] for p in passages} == {"Office hours"}

    monkeypatch.setenv("KB_SHAREPOINT_CLIENT_SECRET", "")
    unset = await asyncio.to_thread(cli, "source", "sync")
    assert unset.exit_code == 1 and "KB_SHAREPOINT_CLIENT_SECRET" in unset.output

    removed = await asyncio.to_thread(cli, "source", "remove", SOURCE, "--json")
    assert json.loads(removed.stdout) == {"source": SOURCE, "removed": 3}
