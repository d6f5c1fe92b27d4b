"""Who reads a source, changed in place with ``kb source readers``, for every kind alike.

A Notion source's readers are its pages' permissions: narrowed, the person no
longer named gets no passage the moment the command returns, and one newly
named gets one, before any sync; the next sync keeps the new readers. A Drive
source's ``--anyone-public`` turned off hides the files with a link at once;
turned on, the next sync (which reads the links) widens them. Sources synced
from the local mocks of Notion's and Drive's APIs (``tests/notion_server.py``,
``tests/gdrive_server.py``), the knowledge base real, the access rule real
(Slack's ``users.info`` from the mock Slack Web API gives each person's email).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bot.access import Access, Person, SlackDirectory, SourceGrants, web_client
from bot.cli import main
from core.answer import Engine
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import AuditAction
from index.sources import (
    UNKNOWN_ACL,
    Acl,
    SourceSyncReport,
    open_connector,
    source_scope,
    sync_source,
)
from index.sources.confluence import ConfluenceSettings
from index.sources.gdrive import GDriveSettings
from index.sources.notion import NotionSettings
from index.sources.sharepoint import SharePointSettings
from tests.gdrive_server import DOC, DRIVE, File, MockDrive, Permission
from tests.notion_server import MockNotion, Page, block, notion_id
from tests.servers import DEFAULT_NOTION_TOKEN, MockSlackAPI

NOTION = "notion-board"
DRIVE_SOURCE = "gdrive-eng"
ALICE = "U0ALICE001"  # alice@example.com
BOB = "U0BOB00001"  # bob@example.com
CAROL = "U0CAROL001"  # carol@example.com

SECRET = "Project Nightjar: the launch budget is 4 million euros, approved by the board."
SECRET_Q = "What is the launch budget of Project Nightjar?"
SECRET_ID = notion_id(2)


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


@pytest.fixture
def notion() -> Iterator[MockNotion]:
    mock = MockNotion()
    mock.page(Page(SECRET_ID, "Nightjar", [block("paragraph", SECRET)]))
    with mock.serve():
        yield mock


@pytest.fixture
async def slack() -> AsyncIterator[MockSlackAPI]:
    async with MockSlackAPI() as server:
        for user, name in ((ALICE, "alice"), (BOB, "bob"), (CAROL, "carol")):
            server.set_user(user, name=name)
        yield server


def kb_cli(index_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--data-dir", str(index_dir), *args])


def sync(kb: KnowledgeBase, name: str, tokens: dict[str, str]) -> SourceSyncReport:
    """A run of ``name`` with the connector its recorded settings open, as kb source sync does."""
    report = sync_source(kb, name, open_connector(kb.store.sources.get(name), tokens))
    assert report.error is None, report.error
    return report


def add_notion(kb: KnowledgeBase, mock: MockNotion, *users: str) -> None:
    settings = NotionSettings(users=users, api_url=mock.base)
    kb.store.sources.add(NOTION, "notion", settings.as_dict())
    sync(kb, NOTION, {"notion": DEFAULT_NOTION_TOKEN})


def acl_of(kb: KnowledgeBase, source: str, item: str) -> Acl:
    return Acl.from_entries(kb.store.sources.acl_rows(source_scope(source, item)))


# ------------------------------------------------------------------ Notion


async def test_narrowing_hides_a_notion_page_at_once_and_a_new_reader_reads_it_at_once(
    kb: KnowledgeBase,
    index_dir: Path,
    notion: MockNotion,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(add_notion, kb, notion, "alice@example.com", "bob@example.com")
    access = Access(
        SlackDirectory(web_client(slack.bot_token, slack.api_url)),
        allow_external=False,
        grants=SourceGrants(kb.store),
    )
    engine = engine_for(threshold=2.0, related_threshold=2.0)

    async def passages(user: str) -> set[str]:
        """The documents of every passage an answer to ``user`` shows."""
        answer = await engine.ask(SECRET_Q, scopes=await access.search_scopes(Person(user)))
        return {c.document for c in answer.sources + answer.kept + answer.beside}

    assert await passages(ALICE) == {"Nightjar"}
    assert await passages(CAROL) == set()
    calls_before = len(notion.calls)

    changed = await asyncio.to_thread(
        kb_cli, index_dir, "source", "readers", NOTION,
        "--user", "bob@example.com", "--user", "carol@example.com",
    )  # fmt: skip
    assert changed.exit_code == 0, changed.output
    assert "1 documents" in changed.output

    # No sync ran, nothing was asked of Notion: the readers are the admin's word.
    assert len(notion.calls) == calls_before
    assert await passages(ALICE) == set()
    assert await passages(CAROL) == {"Nightjar"}
    assert await passages(BOB) == {"Nightjar"}
    assert acl_of(kb, NOTION, SECRET_ID) == Acl.of(users=["bob@example.com", "carol@example.com"])

    # The next sync opens the source with its new readers and keeps them.
    await asyncio.to_thread(sync, kb, NOTION, {"notion": DEFAULT_NOTION_TOKEN})
    assert await passages(ALICE) == set()
    assert await passages(CAROL) == {"Nightjar"}

    entry = kb.audit_log.entries(1)[0]
    assert entry.action == AuditAction.READERS and entry.actor == "cli"
    assert "alice@example.com" in entry.detail.split("->")[0]
    assert "alice@example.com" not in entry.detail.split("->")[1]
    assert "carol@example.com" in entry.detail.split("->")[1]


def test_naming_no_reader_leaves_the_notion_source_read_by_nobody(
    kb: KnowledgeBase, index_dir: Path, notion: MockNotion
) -> None:
    add_notion(kb, notion, "alice@example.com")
    scope = source_scope(NOTION, SECRET_ID)
    assert scope in kb.store.sources.readable_scopes("alice@example.com")

    changed = kb_cli(index_dir, "source", "readers", NOTION, "--json")

    assert changed.exit_code == 0, changed.output
    assert acl_of(kb, NOTION, SECRET_ID).known is False
    for email in ("alice@example.com", "bob@example.com", None):
        assert kb.store.sources.readable_scopes(email) == frozenset()
    recorded = kb.store.sources.get(NOTION).settings
    assert recorded["users"] == [] and recorded["public"] is False
    assert recorded["api_url"] == notion.base  # what is not a reader is kept


def test_a_reader_option_the_kind_lacks_or_a_bad_reader_is_refused_and_nothing_changes(
    kb: KnowledgeBase, index_dir: Path, notion: MockNotion
) -> None:
    add_notion(kb, notion, "alice@example.com")
    before = kb.store.sources.get(NOTION).settings
    entries = len(kb.audit_log.entries())

    foreign = kb_cli(index_dir, "source", "readers", NOTION, "--anyone-public")
    bad = kb_cli(index_dir, "source", "readers", NOTION, "--user", "alice")
    unknown = kb_cli(index_dir, "source", "readers", "no-such-source", "--public")

    assert foreign.exit_code == 1 and "--anyone-public" in foreign.output
    assert "--user" in foreign.output and "--domain" in foreign.output
    assert bad.exit_code == 1 and "not an email address" in bad.output
    assert unknown.exit_code == 1 and "No source is named" in unknown.output
    assert kb.store.sources.get(NOTION).settings == before
    assert acl_of(kb, NOTION, SECRET_ID) == Acl.of(users=["alice@example.com"])
    assert len(kb.audit_log.entries()) == entries


def test_readers_are_not_changed_while_a_sync_of_the_source_runs(
    kb: KnowledgeBase, index_dir: Path, notion: MockNotion
) -> None:
    add_notion(kb, notion, "alice@example.com")
    # A run holds the source's lock; it started with the old readers and would write
    # them back over new ones, so the change waits for it.
    with kb.store.exclusive(f"source-{NOTION}") as held:
        assert held
        refused = kb_cli(index_dir, "source", "readers", NOTION, "--public")
    assert refused.exit_code == 1 and "syncing now" in refused.output
    assert acl_of(kb, NOTION, SECRET_ID) == Acl.of(users=["alice@example.com"])

    done = kb_cli(index_dir, "source", "readers", NOTION, "--public")
    assert done.exit_code == 0, done.output
    assert acl_of(kb, NOTION, SECRET_ID) == Acl(public=True)


def test_a_run_opened_before_the_readers_changed_does_not_write_the_old_ones_back(
    kb: KnowledgeBase, index_dir: Path, notion: MockNotion
) -> None:
    add_notion(kb, notion, "alice@example.com", "bob@example.com")
    # A scheduled round opened its connector (with the readers then) before the change.
    opened_before = open_connector(kb.store.sources.get(NOTION), {"notion": DEFAULT_NOTION_TOKEN})
    done = kb_cli(index_dir, "source", "readers", NOTION, "--user", "alice@example.com")
    assert done.exit_code == 0, done.output

    report = sync_source(kb, NOTION, opened_before)
    assert report.mode == "busy"
    assert acl_of(kb, NOTION, SECRET_ID) == Acl.of(users=["alice@example.com"])

    fresh = open_connector(kb.store.sources.get(NOTION), {"notion": DEFAULT_NOTION_TOKEN})
    assert sync_source(kb, NOTION, fresh).error is None
    assert acl_of(kb, NOTION, SECRET_ID) == Acl.of(users=["alice@example.com"])


# ------------------------------------------------------------------ Google Drive


@pytest.fixture
def drive() -> Iterator[MockDrive]:
    mock = MockDrive()
    with mock.serve():
        body = f"<html><body><h1>Nightjar</h1><p>{SECRET}</p></body></html>".encode()
        mock.put(File("link", "Nightjar", DOC, body, permissions=[Permission("anyone")]))
        mock.put(
            File(
                "team",
                "Team page",
                DOC,
                b"<html><body><p>The team meets on Mondays.</p></body></html>",
                permissions=[Permission("anyone"), Permission("user", email="bob@example.com")],
            )
        )
        yield mock


def test_anyone_public_turned_off_hides_link_files_at_once_and_turned_on_waits_for_a_sync(
    kb: KnowledgeBase, index_dir: Path, drive: MockDrive
) -> None:
    settings = GDriveSettings(drive=DRIVE, anyone_public=True, api_url=drive.base)
    kb.store.sources.add(DRIVE_SOURCE, "gdrive", settings.as_dict())
    tokens = {"gdrive": drive.key_file()}
    sync(kb, DRIVE_SOURCE, tokens)
    link, team = source_scope(DRIVE_SOURCE, "link"), source_scope(DRIVE_SOURCE, "team")
    assert kb.store.sources.readable_scopes("carol@example.com") == {link, team}

    off = kb_cli(index_dir, "source", "readers", DRIVE_SOURCE)

    assert off.exit_code == 0, off.output
    assert kb.store.sources.readable_scopes("carol@example.com") == frozenset()
    assert kb.store.sources.readable_scopes(None) == frozenset()
    # The file's other permissions still admit whom they admitted.
    assert kb.store.sources.readable_scopes("bob@example.com") == {team}
    assert kb.store.sources.get(DRIVE_SOURCE).settings["anyone_public"] is False

    on = kb_cli(index_dir, "source", "readers", DRIVE_SOURCE, "--anyone-public")
    assert on.exit_code == 0, on.output
    # Which files have a link is Drive's to say: nothing widens before the sync reads it.
    assert kb.store.sources.readable_scopes("carol@example.com") == frozenset()
    sync(kb, DRIVE_SOURCE, tokens)
    assert kb.store.sources.readable_scopes("carol@example.com") == {link, team}
    actions = [e.action for e in kb.audit_log.entries(2)]
    assert actions == [AuditAction.READERS, AuditAction.READERS]


# ------------------------------------------------------------------ Confluence, SharePoint


def test_an_organisation_group_dropped_makes_nothing_public_and_one_added_waits_for_a_sync() -> (
    None
):
    site = {"url": "https://example.atlassian.net/wiki", "space": "ENG"}
    both = ConfluenceSettings.from_dict({**site, "organisation_groups": ["staff", "contractors"]})
    staff = ConfluenceSettings.from_dict({**site, "organisation_groups": ["staff"]})
    public = Acl.of(users=["bob@example.com"], public=True)

    assert staff.acl_now(both, public) == Acl.of(users=["bob@example.com"])
    assert both.acl_now(staff, public) == public  # widening: the sync reads what it may read
    assert both.acl_now(staff, Acl.of(users=["bob@example.com"])) == Acl.of(
        users=["bob@example.com"]
    )
    assert staff.acl_now(both, UNKNOWN_ACL) == UNKNOWN_ACL  # unknown stays nobody's
    drive = {"tenant": "contoso.onmicrosoft.com", "client_id": "6731de76-14a6-49ae-97bc-6eba6914391e",
             "drive": "b!Ey9vAbC"}  # fmt: skip
    visitors = SharePointSettings.from_dict({**drive, "organisation_groups": ["Eng Visitors"]})
    none = SharePointSettings.from_dict(drive)
    assert none.acl_now(visitors, public) == Acl.of(users=["bob@example.com"])
