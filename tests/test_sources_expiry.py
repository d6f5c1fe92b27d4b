"""A grant a source gives until a time stops admitting then, with no sync in between.

Google Drive gives a user or group permission an ``expirationTime`` (RFC 3339);
Graph gives a SharePoint/OneDrive permission or sharing link an
``expirationDateTime``. A grant still to expire is stored with its time, and
every read decides at the store's clock: the scopes a search is filtered by,
the access rule's decision for one document (what the viewer and every surface
ask), and the readers ``kb access explain`` shows. Each source is its local
mock synced by its real connector into a real knowledge base, on SQLite and on
Postgres; the access rule reads through a store of its own (as the bot's
server does) whose clock the test moves: no sleep, and no sync after the
first ones. A store made before grants had an expiry is migrated and keeps its
grants.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.access import Access, Person, SlackDirectory, SourceGrants, web_client
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.sources import Acl, acl_of_scope, source_scope
from index.sources.gdrive import GDriveConnector, GDriveSettings
from index.sources.sharepoint import SharePointConnector, SharePointSettings
from index.storage import SourceItem, Store
from index.storage.schema import MIGRATIONS
from tests import sources_harness
from tests.clocks import FakeTime, Waits
from tests.gdrive_server import DOC, DRIVE, FOLDER, File, MockDrive, Permission
from tests.servers import DEFAULT_SHAREPOINT_CLIENT_SECRET, MockSlackAPI
from tests.sharepoint_server import (
    CLIENT_ID,
    SITE_HOST,
    SITE_PATH,
    TENANT,
    Item,
    MockSharePoint,
    link,
    user,
)
from tests.sources_harness import ALICE, BOB, CAROL, SECRET, kb_cli, sync

slack = sources_harness.slack

HOUR = 3600.0
# When the sharings below expire: a week from the real now (a connector drops a sharing
# already expired by its own clock when it syncs; these are still to come).
ENDS = float(int(datetime.now(UTC).timestamp()) + 7 * 24 * 3600)


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _shown(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder, database_url: str) -> KnowledgeBase:
    """A real knowledge base on SQLite, then on Postgres."""
    return KnowledgeBase(
        IndexConfig(data_dir=index_dir, database_url=database_url), embedder=embedder
    )


@pytest.fixture
def time_now() -> FakeTime:
    """The reading store's clock: the real now, moved only by the test."""
    return FakeTime(now=datetime.now(UTC).timestamp())


@pytest.fixture
def reader(index_dir: Path, database_url: str, time_now: FakeTime) -> Iterator[Store]:
    """The store the access rule reads, as the bot's server opens it, on ``time_now``."""
    store = Store(index_dir, database_url=database_url, clock=time_now.clock)
    yield store
    store.close()


def _access(slack: MockSlackAPI, store: Store) -> Access:
    client = web_client(slack.bot_token, slack.api_url)
    return Access(SlackDirectory(client), allow_external=False, grants=SourceGrants(store))


async def _readers(access: Access, scope: str, *people: str) -> set[str]:
    """Those of ``people`` the rule lets read ``scope``, checked that the scopes a search
    of theirs is filtered by say the same as the rule's decision for the document."""
    found = set()
    for person in people:
        searched = scope in await access.search_scopes(Person(person))
        decided = (await access.may_read(Person(person), scope)).allowed
        assert searched == decided, (person, searched, decided)
        if decided:
            found.add(person)
    return found


# ------------------------------------------------------------------ Google Drive


def _sync_drive(kb: KnowledgeBase, mock: MockDrive) -> None:
    settings = GDriveSettings(drive="", folder="fold", api_url=mock.base)
    connector = GDriveConnector(settings, mock.key_file(), sleep=Waits().sleep)
    report = sync(kb, "gdrive-eng", "gdrive", settings.as_dict(), connector)
    assert report.error is None, report.error


async def test_a_drive_sharing_stops_admitting_when_it_expires_with_no_sync_between(
    kb: KnowledgeBase,
    index_dir: Path,
    database_url: str,
    slack: MockSlackAPI,
    reader: Store,
    time_now: FakeTime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Alice is given the plan twice, until ENDS and an hour later: the later one counts.
    # Bob until ENDS and for good: for good counts. Carol until ENDS only.
    drive = MockDrive()
    body = f"<html><body><h1>Plan</h1><p>{SECRET}</p></body></html>".encode()
    with drive.serve():
        drive.put(File("fold", "Handbook", FOLDER, drive=None, parents=["root"]))
        grants = [
            Permission("user", email="alice@example.com", expires=_rfc3339(ENDS)),
            Permission("user", email="alice@example.com", expires=_rfc3339(ENDS + HOUR)),
            Permission("user", email="bob@example.com", expires=_rfc3339(ENDS)),
            Permission("user", email="bob@example.com"),
            Permission("user", email="carol@elsewhere.example", expires=_rfc3339(ENDS)),
        ]
        drive.put(File("plan", "Plan", DOC, body, permissions=grants, drive=None, parents=["fold"]))
        _sync_drive(kb, drive)
        # A poll before the expiry: nothing changed in Drive, and nothing will say it did.
        _sync_drive(kb, drive)

    scope = source_scope("gdrive-eng", "plan")
    assert acl_of_scope(reader.sources, scope) == Acl.granting(
        [
            ("user", "alice@example.com", ENDS + HOUR),
            ("user", "bob@example.com", None),
            ("user", "carol@elsewhere.example", ENDS),
        ]
    )
    access = _access(slack, reader)
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE, BOB, CAROL}

    # What an admin is shown: who reads it, and until when.
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    monkeypatch.setenv("KB_DATABASE_URL", database_url)
    item = reader.sources.item_of_scope(scope)
    assert item is not None and item.document_id is not None
    result = await asyncio.to_thread(
        kb_cli, index_dir, "access", "explain", "--user", ALICE, str(item.document_id), "--json"
    )
    assert result.exit_code == 0, result.output
    explained: dict[str, Any] = json.loads(result.stdout)
    assert explained["may_read"] is True
    assert f"alice@example.com read it until {_shown(ENDS + HOUR)}" in explained["reason"]
    assert explained["document"]["source"]["acl"]["readers"] == (
        f"user alice@example.com until {_shown(ENDS + HOUR)}, user bob@example.com, "
        f"user carol@elsewhere.example until {_shown(ENDS)}"
    )

    await time_now.advance(ENDS - time_now.now - 1)
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE, BOB, CAROL}
    await time_now.advance(1)  # ENDS: carol's only grant ends
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE, BOB}
    refused = await access.may_read(Person(CAROL), scope)
    assert "carol@elsewhere.example" in refused.reason
    await time_now.advance(HOUR)  # alice's longer grant ends too; bob's lasts
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {BOB}
    assert acl_of_scope(reader.sources, scope).describe() == "user bob@example.com"


async def test_a_drive_poll_that_asks_for_no_permission_keeps_each_ones_expiry(
    kb: KnowledgeBase, slack: MockSlackAPI, reader: Store, time_now: FakeTime
) -> None:
    # On a shared drive a poll confirms the permissions of every file Drive's changes log
    # does not name as they were recorded, asking Drive nothing: the expiry stays, and
    # the grant stops admitting at its time though no run ever reads it again.
    drive = MockDrive()
    body = f"<html><body><h1>Plan</h1><p>{SECRET}</p></body></html>".encode()
    grants = [
        Permission("user", email="alice@example.com", expires=_rfc3339(ENDS)),
        Permission("user", email="bob@example.com"),
    ]
    with drive.serve():
        drive.put(File("plan", "Plan", DOC, body, permissions=grants))
        settings = GDriveSettings(drive=DRIVE, api_url=drive.base)
        asked = []
        for _ in range(2):
            drive.calls.clear()
            connector = GDriveConnector(settings, drive.key_file(), sleep=Waits().sleep)
            report = sync(kb, "gdrive-eng", "gdrive", settings.as_dict(), connector)
            assert report.error is None, report.error
            asked.append(len(drive.calls_to("/files/plan/permissions")))
        assert asked == [1, 0]  # the load read them; the poll asked nothing

    scope = source_scope("gdrive-eng", "plan")
    assert reader.sources.acl_rows(scope) == [
        ("user", "alice@example.com", ENDS),
        ("user", "bob@example.com", None),
    ]
    access = _access(slack, reader)
    assert await _readers(access, scope, ALICE, BOB) == {ALICE, BOB}
    await time_now.advance(ENDS - time_now.now)
    assert await _readers(access, scope, ALICE, BOB) == {BOB}


# ------------------------------------------------------------------ SharePoint / OneDrive


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[MockSharePoint]:
    mock = MockSharePoint()
    with mock.serve():
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", mock.ca_file)
        yield mock


def _sync_graph(kb: KnowledgeBase, mock: MockSharePoint) -> None:
    settings = SharePointSettings(
        TENANT,
        CLIENT_ID,
        site=f"https://{SITE_HOST}{SITE_PATH}",
        graph_url=mock.graph,
        authority_url=mock.base,
    )
    connector = SharePointConnector(settings, DEFAULT_SHAREPOINT_CLIENT_SECRET, sleep=Waits().sleep)
    report = sync(kb, "sp-eng", "sharepoint", settings.as_dict(), connector)
    assert report.error is None, report.error


async def test_a_sharepoint_link_and_permission_stop_admitting_when_they_expire(
    kb: KnowledgeBase,
    slack: MockSlackAPI,
    graph: MockSharePoint,
    reader: Store,
    time_now: FakeTime,
) -> None:
    # An organisation link until ENDS (everyone reads it till then), carol's own
    # permission an hour longer, alice's for good.
    grants = [
        link("organization", expires=_rfc3339(ENDS)),
        user("carol@elsewhere.example", expires=_rfc3339(ENDS + HOUR)),
        user("alice@example.com"),
    ]
    graph.add(Item("plan", "plan.md", f"# Plan\n\n{SECRET}\n".encode(), "root", grants=grants))
    _sync_graph(kb, graph)
    _sync_graph(kb, graph)  # a delta poll before the expiry: nothing changed

    scope = source_scope("sp-eng", "plan")
    assert acl_of_scope(reader.sources, scope).describe() == (
        f"everyone in the organisation until {_shown(ENDS)}, user alice@example.com, "
        f"user carol@elsewhere.example until {_shown(ENDS + HOUR)}"
    )
    access = _access(slack, reader)
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE, BOB, CAROL}
    assert scope in await access.narrowed(frozenset({scope}))  # public, for a narrowed token
    bob = await access.may_read(Person(BOB), scope)
    assert f"public in the organisation until {_shown(ENDS)}" in bob.reason

    await time_now.advance(ENDS - time_now.now)
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE, CAROL}
    assert scope not in await access.narrowed(frozenset({scope}))
    await time_now.advance(HOUR)
    assert await _readers(access, scope, ALICE, BOB, CAROL) == {ALICE}


# ------------------------------------------------------------------ a store from before


def _as_before_expiries(store: Store) -> None:
    """Make ``store`` what a release before expiries left: ``source_acl`` without ``until``,
    the migration that adds it not applied."""
    migrations = (
        "_kb_migrations" if store.database.dialect == "postgresql" else "_sqlite_migrations"
    )
    with store.transaction() as db:
        db.execute("ALTER TABLE source_acl DROP COLUMN until")
        db.execute(
            f"DELETE FROM {migrations} WHERE migration_set = ? AND name = ?",
            ["kb", "0023_source_acl_until"],
        )


def test_a_store_from_before_expiries_is_migrated_and_keeps_its_grants(
    tmp_path: Path, database_url: str
) -> None:
    data_dir = tmp_path / "kb"
    old = Store(data_dir, database_url=database_url)
    _as_before_expiries(old)
    scope = source_scope("wiki", "plan")
    old.sources.add("wiki", "confluence", {"url": "https://wiki.example.com", "space": "ENG"})
    with old.transaction() as db:
        db.execute(
            """INSERT INTO source_items (source, item, scope, url, title, version, sha256,
                   synced_at, acl_synced_at) VALUES (?, ?, ?, '', 'Plan', '1', '', 1.0, 1.0)""",
            ["wiki", "plan", scope],
        )
        for kind, principal in [("user", "alice@example.com"), ("domain", "example.org")]:
            db.execute(
                "INSERT INTO source_acl (scope, kind, principal) VALUES (?, ?, ?)",
                [scope, kind, principal],
            )
    old.close()

    later = FakeTime(now=ENDS + 365 * 24 * HOUR)
    store = Store(data_dir, database_url=database_url, clock=later.clock)
    try:
        assert "0023_source_acl_until" in store.database.applied_migrations(MIGRATIONS)
        assert store.sources.acl_rows(scope) == [
            ("domain", "example.org", None),
            ("user", "alice@example.com", None),
        ]
        # Grants that lasted before last now: whenever they are read, they admit.
        assert store.sources.readable_scopes("alice@example.com") == {scope}
        assert store.sources.readable_scopes("dave@example.org") == {scope}
        assert store.sources.readable_scopes("bob@example.com") == frozenset()
        assert acl_of_scope(store.sources, scope).describe() == (
            "user alice@example.com, domain example.org"
        )
        # And a grant written now may expire.
        item = store.sources.item_of_scope(scope)
        assert isinstance(item, SourceItem)
        store.sources.set_acl(
            scope, Acl.granting([("user", "bob@example.com", later.now + 1)]).entries
        )
        assert store.sources.readable_scopes("bob@example.com") == {scope}
        later.now += 1
        assert store.sources.readable_scopes("bob@example.com") == frozenset()
        assert acl_of_scope(store.sources, scope) == Acl()
    finally:
        store.close()
