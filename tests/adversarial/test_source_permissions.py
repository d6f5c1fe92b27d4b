"""What a source's permissions mean in a real tenant: each read as the source documents it.

The attacker is a person of the organisation with a Slack account and a
verified email, who reads through the product what their source would not
show them: a document shared with a group of the same name in another
source, a file shared with the domain only to those holding its link, a
permission of a role the source added since, a sharing that has expired, a
group named like the one standing for everyone. Each source is its local
mock (``tests/*_server.py``), synced by its real connector into a real
knowledge base, and the access rule is the real one, with Slack (the mock
Web API) as the directory of people, asked through ``kb access explain`` and
the scopes every search is filtered by. Each attack here worked before its fix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.access import Person, Where, visible
from index.knowledge_base import KnowledgeBase
from index.sources import Acl, source_scope
from index.sources.confluence import ConfluenceConnector, ConfluenceSettings
from index.sources.gdrive import GDriveConnector, GDriveSettings
from index.sources.sharepoint import SharePointConnector, SharePointSettings
from tests import sources_harness
from tests.clocks import Waits
from tests.confluence_server import ACCOUNT, SPACE, MockConfluence, Page, Space
from tests.gdrive_server import DOC, DRIVE, FOLDER, File, MockDrive, Permission
from tests.servers import (
    DEFAULT_CONFLUENCE_TOKEN,
    DEFAULT_SHAREPOINT_CLIENT_SECRET,
    MockSlackAPI,
)
from tests.sharepoint_server import (
    CLIENT_ID,
    SITE_HOST,
    SITE_PATH,
    TENANT,
    Item,
    MockSharePoint,
    group,
    link,
    member,
    site_group,
    user,
)
from tests.sources_harness import ALICE, BOB, CAROL, SECRET, access_over, acl_of, kb_cli, sync

kb, slack = sources_harness.kb, sources_harness.slack


# ------------------------------------------------------------------ groups of two sources


@pytest.fixture
def two_sites() -> Iterator[tuple[MockConfluence, MockConfluence]]:
    """Two Confluence sites, each with a group ``developers`` of its own people: alice on
    the first, bob on the second. Each site's space is read by its ``developers``."""
    first, second = MockConfluence(), MockConfluence()
    for mock, person, title, text in (
        (first, "alice@example.com", "Nightjar", SECRET),
        (second, "bob@example.com", "Lobby", "The lobby is on the ground floor."),
    ):
        mock.spaces[SPACE] = Space(SPACE, groups=["developers"])
        mock.groups["developers"] = [person]
        mock.page(Page(title.lower(), title, f"<h1>{title}</h1><p>{text}</p>"))
    with first.serve(), second.serve():
        yield first, second


def _sync_site(kb: KnowledgeBase, name: str, mock: MockConfluence) -> None:
    settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ())
    connector = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
    report = sync(kb, name, "confluence", {"url": mock.base, "space": SPACE}, connector)
    assert report.error is None and report.added


async def test_a_group_of_another_source_with_the_same_name_admits_nobody(
    kb: KnowledgeBase,
    index_dir: Path,
    two_sites: tuple[MockConfluence, MockConfluence],
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Bob is in the second site's developers, never the first's: the first site's page,
    # read by its own developers, is not his to open (the viewer asks the same rule).
    first, second = two_sites
    _sync_site(kb, "wiki-one", first)
    _sync_site(kb, "wiki-two", second)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)

    def explain(user: str, name: str) -> dict[str, object]:
        result = kb_cli(index_dir, "access", "explain", "--user", user, name, "--json")
        assert result.exit_code == 0, result.output
        decision: dict[str, object] = json.loads(result.stdout)
        return decision

    bob = await asyncio.to_thread(explain, BOB, "Nightjar.html")
    assert (bob["may_read"], bob["rule"]) == (False, "source")
    assert "developers" not in str(bob["reason"])
    alice = await asyncio.to_thread(explain, ALICE, "Nightjar.html")
    assert alice["may_read"] is True and "developers" in str(alice["reason"])
    lobby = await asyncio.to_thread(explain, BOB, "Lobby.html")
    assert lobby["may_read"] is True
    # A search was always filtered by the source's own groups: it stays so.
    access = access_over(slack, kb)
    assert source_scope("wiki-one", "nightjar") not in await access.search_scopes(Person(BOB))
    assert source_scope("wiki-one", "nightjar") in await access.search_scopes(Person(ALICE))


def test_a_restriction_on_a_page_deeper_than_the_ancestors_read_is_never_left_out(
    kb: KnowledgeBase,
) -> None:
    # Ancestors come from the space's top down: past the 64 the sync reads, the ones left
    # out were the nearest, and a restriction there bound the page.
    mock = MockConfluence()
    mock.groups["confluence-users"] = ["alice@example.com", "bob@example.com"]
    parent = None
    for depth in range(70):
        page = Page(f"p{depth}", f"Level {depth}", f"<p>Level {depth}.</p>", parent=parent)
        page.read_users = ["alice@example.com"] if depth == 68 else []
        mock.page(page)
        parent = page.id
    mock.pages["p69"].body = f"<h1>Deep</h1><p>{SECRET}</p>"
    with mock.serve():
        settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ("confluence-users",))
        connector = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
        assert (
            sync(kb, "wiki", "confluence", {"url": mock.base, "space": SPACE}, connector).error
            is None
        )
    assert acl_of(kb, "wiki", "p0") == Acl(public=True)
    assert acl_of(kb, "wiki", "p64") == Acl(public=True)  # 64 ancestors, each read
    deep = acl_of(kb, "wiki", "p69")
    assert not deep.public and "bob@example.com" not in deep.users


# ------------------------------------------------------------------ emails, as Slack and a source spell them

KATE = "U0KATE0001"  # Kate@Example.COM: kate@example.com, in capitals
KELVIN = "U0KELVIN01"  # an address spelt with the Kelvin sign (U+212A) where kate has a k


async def test_an_email_with_a_compatibility_letter_is_no_one_elses(
    kb: KnowledgeBase,
    index_dir: Path,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Lower-cased, the Kelvin sign is a plain k: a confirmed "\u212aate@example.com" (a
    # mailbox a catch-all delivers) would be kate's. Capitals are still the same address.
    slack.set_user(KATE, name="kate")["profile"]["email"] = "Kate@Example.COM"
    slack.set_user(KELVIN, name="kelvin")["profile"]["email"] = "\u212aate@example.com"
    mock = MockConfluence()
    mock.groups["confluence-users"] = ["kate@example.com", "bob@example.com"]
    page = Page("301", "Salaries", f"<h1>Salaries</h1><p>{SECRET}</p>")
    page.read_users = ["kate@example.com"]
    mock.page(page)
    with mock.serve():
        _sync_site(kb, "wiki", mock)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)

    def may_read(user: str) -> object:
        result = kb_cli(index_dir, "access", "explain", "--user", user, "Salaries.html", "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["may_read"]

    assert await asyncio.to_thread(may_read, KATE) is True
    assert await asyncio.to_thread(may_read, KELVIN) is False
    access = access_over(slack, kb)
    assert source_scope("wiki", "301") not in await access.search_scopes(Person(KELVIN))
    assert source_scope("wiki", "301") in await access.search_scopes(Person(KATE))


# ------------------------------------------------------------------ Slack guests

GUEST = "U0GUEST001"  # gina@example.com, a single-channel guest: in #guests only
GUESTS, STAFF = "C0GUESTS01", "C0STAFF001"


async def test_a_guest_reads_only_their_channels_and_what_a_source_names_them_for(
    kb: KnowledgeBase,
    index_dir: Path,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Slack shows a guest only the channels they are in: neither what is for the whole
    # workspace nor what a source makes public in the organisation is theirs. What their
    # channel holds, and what a source grants their own email, is.
    guest = slack.set_user(GUEST, name="gina")
    guest.update(is_restricted=True, is_ultra_restricted=True)
    slack.set_members(GUESTS, [GUEST, BOB])
    slack.set_members(STAFF, [BOB])
    for name, scope in (("handbook.md", "*"), ("briefing.md", GUESTS), ("payroll.md", STAFF)):
        added = kb.add_bytes(f"# {name}\n\n{SECRET}\n".encode(), name, scope=scope)
        kb.index_document(added.document.id)
    # Office: public in the organisation (its space is read by confluence-users, named as
    # everyone). Contract: on another site, whose space and page name gina.
    office_site, contract_site = MockConfluence(), MockConfluence()
    office_site.groups["confluence-users"] = ["bob@example.com"]
    office_site.page(Page("401", "Office", f"<h1>Office</h1><p>{SECRET}</p>"))
    contract_site.spaces[SPACE] = Space(SPACE, users=["gina@example.com"])
    contract_site.page(Page("402", "Contract", f"<h1>Contract</h1><p>{SECRET}</p>"))
    contract_site.pages["402"].read_users = ["gina@example.com"]
    for name, mock in (("wiki", office_site), ("legal", contract_site)):
        with mock.serve():
            settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ("confluence-users",))
            reads = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
            recorded = {"url": mock.base, "space": SPACE}
            assert sync(kb, name, "confluence", recorded, reads).error is None
    office, contract = source_scope("wiki", "401"), source_scope("legal", "402")

    access = access_over(slack, kb)
    gina = await access.search_scopes(Person(GUEST), None, [GUESTS, STAFF])
    assert not visible(gina, "*") and not visible(gina, office)
    assert visible(gina, GUESTS) and visible(gina, contract) and not visible(gina, STAFF)
    bob = await access.search_scopes(Person(BOB), None, [GUESTS, STAFF])
    assert visible(bob, "*") and visible(bob, office) and visible(bob, STAFF)
    # Asked where the guest reads along (a channel they are in): not for everyone either.
    there = await access.search_scopes(Person(GUEST), Where(GUESTS), [])
    assert visible(there, GUESTS) and not visible(there, "*")

    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)

    def may_read(user: str, name: str) -> object:
        result = kb_cli(index_dir, "access", "explain", "--user", user, name, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["may_read"]

    assert await asyncio.to_thread(may_read, GUEST, "handbook.md") is False
    assert await asyncio.to_thread(may_read, GUEST, "Office.html") is False
    assert await asyncio.to_thread(may_read, GUEST, "Contract.html") is True
    assert await asyncio.to_thread(may_read, GUEST, "briefing.md") is True
    assert await asyncio.to_thread(may_read, BOB, "handbook.md") is True


# ------------------------------------------------------------------ Google Drive


@pytest.fixture
def drive() -> MockDrive:
    """A Drive API not serving yet: each test puts its files in once it serves."""
    return MockDrive()


def _doc(file_id: str, *grants: Permission, **kw: Any) -> File:
    body = f"<html><body><h1>{file_id}</h1><p>{SECRET}</p></body></html>".encode()
    return File(file_id, file_id.capitalize(), DOC, body, permissions=list(grants), **kw)


def _sync_drive(kb: KnowledgeBase, mock: MockDrive, **kw: Any) -> None:
    settings = GDriveSettings(**{"drive": DRIVE, "api_url": mock.base, **kw})
    connector = GDriveConnector(settings, mock.key_file(), sleep=Waits().sleep)
    assert sync(kb, "gdrive-eng", "gdrive", settings.as_dict(), connector).error is None


async def test_a_drive_file_only_its_link_finds_in_the_domain_is_not_the_whole_domains(
    kb: KnowledgeBase, index_dir: Path, slack: MockSlackAPI, drive: MockDrive
) -> None:
    # "Anyone at example.com with the link" (allowFileDiscovery false), a link as any other:
    # bob has none, and nothing tells who was given it. One people may find is the domain's.
    with drive.serve():
        alice = Permission("user", email="alice@example.com")
        link = Permission("domain", domain="example.com", discoverable=False)
        drive.put(_doc("linked", alice, link))
        drive.put(_doc("listed", Permission("domain", domain="example.com")))
        _sync_drive(kb, drive)
        assert acl_of(kb, "gdrive-eng", "linked").domains == frozenset()
        bob = await access_over(slack, kb).search_scopes(Person(BOB))
        assert source_scope("gdrive-eng", "linked") not in bob
        assert source_scope("gdrive-eng", "listed") in bob
        # The admin's word that a link is the organisation's (--anyone-public) opens it.
        _sync_drive(kb, drive, anyone_public=True)
        assert acl_of(kb, "gdrive-eng", "linked").domains == {"example.com"}
        # Taken back, the link is nobody's at once, before any sync.
        off = kb_cli(index_dir, "source", "readers", "gdrive-eng")
        assert off.exit_code == 0, off.output
        assert acl_of(kb, "gdrive-eng", "linked") == Acl.of(users=["alice@example.com"])


async def test_a_drive_role_drive_did_not_document_admits_nobody(
    kb: KnowledgeBase, slack: MockSlackAPI, drive: MockDrive
) -> None:
    with drive.serve():
        odd = Permission("user", "publishedReader", email="bob@example.com")
        drive.put(_doc("odd", odd, Permission("user", "commenter", email="alice@example.com")))
        _sync_drive(kb, drive)
        assert acl_of(kb, "gdrive-eng", "odd").users == {"alice@example.com"}
        access = access_over(slack, kb)
        assert source_scope("gdrive-eng", "odd") not in await access.search_scopes(Person(BOB))
        assert source_scope("gdrive-eng", "odd") in await access.search_scopes(Person(ALICE))


async def test_a_drive_sharing_whose_expiration_time_has_passed_admits_nobody(
    kb: KnowledgeBase, slack: MockSlackAPI, drive: MockDrive
) -> None:
    # Expiration times are set on user and group permissions of files outside shared drives.
    soon = (datetime.now(UTC) + timedelta(days=30)).isoformat().replace("+00:00", "Z")
    with drive.serve():
        drive.put(File("fold", "Handbook", FOLDER, drive=None, parents=["root"]))
        past = Permission("user", email="bob@example.com", expires="2026-01-05T10:00:00.000Z")
        until = Permission("user", email="alice@example.com", expires=soon)
        drive.put(_doc("lapsed", past, until, drive=None, parents=["fold"]))
        odd = Permission("user", email="bob@example.com", expires="next Tuesday")
        drive.put(_doc("garbled", odd, drive=None, parents=["fold"]))
        _sync_drive(kb, drive, drive="", folder="fold")
        assert acl_of(kb, "gdrive-eng", "lapsed").users == {"alice@example.com"}
        assert acl_of(kb, "gdrive-eng", "garbled").users == frozenset()
        access = access_over(slack, kb)
        bob = await access.search_scopes(Person(BOB))
        assert not bob & {source_scope("gdrive-eng", i) for i in ("lapsed", "garbled")}
        assert source_scope("gdrive-eng", "lapsed") in await access.search_scopes(Person(ALICE))


async def test_a_drive_file_in_a_folder_with_limited_access_is_not_the_drives_members(
    kb: KnowledgeBase, slack: MockSlackAPI, drive: MockDrive
) -> None:
    # Bob reads the whole shared drive, but a folder with limited access lets in only its
    # own people, the drive's organizers and owners. A published reader sees only what was
    # published: the file as it is now is not theirs.
    drive.drive_members = [
        Permission("user", "organizer", email="owner@example.com"),
        Permission("user", "reader", email="bob@example.com"),
    ]
    with drive.serve():
        alice = Permission("user", email="alice@example.com")
        drive.put(_doc("salaries", alice, limited=True))
        carol = Permission("user", email="carol@elsewhere.example", view="published")
        drive.put(_doc("draft", carol))
        drive.put(_doc("roadmap", alice))
        _sync_drive(kb, drive)
    assert acl_of(kb, "gdrive-eng", "salaries").users == {"alice@example.com", "owner@example.com"}
    assert "carol@elsewhere.example" not in acl_of(kb, "gdrive-eng", "draft").users
    assert "bob@example.com" in acl_of(kb, "gdrive-eng", "roadmap").users
    access = access_over(slack, kb)
    bob = await access.search_scopes(Person(BOB))
    assert source_scope("gdrive-eng", "salaries") not in bob
    assert source_scope("gdrive-eng", "roadmap") in bob
    assert source_scope("gdrive-eng", "draft") not in await access.search_scopes(Person(CAROL))
    assert source_scope("gdrive-eng", "salaries") in await access.search_scopes(Person(ALICE))


async def test_a_shared_drive_for_its_members_only_opens_no_file_to_others(
    kb: KnowledgeBase, slack: MockSlackAPI, drive: MockDrive
) -> None:
    # Alice was given a file before the drive let only its members reach its files: Drive
    # keeps listing her permission, and she opens nothing. Lifted, she reads it again; set
    # again, her grant is gone within one sync.
    drive.drive_members = [Permission("user", "organizer", email="owner@example.com")]
    drive.drive_members_only = True
    memo = source_scope("gdrive-eng", "memo")
    with drive.serve():
        drive.put(_doc("memo", Permission("user", email="alice@example.com")))
        _sync_drive(kb, drive)
        assert acl_of(kb, "gdrive-eng", "memo") == Acl.of(users=["owner@example.com"])
        access = access_over(slack, kb)
        assert memo not in await access.search_scopes(Person(ALICE))
        drive.drive_members_only = False
        _sync_drive(kb, drive)
        assert memo in await access.search_scopes(Person(ALICE))
        drive.drive_members_only = True
        _sync_drive(kb, drive)
        assert memo not in await access.search_scopes(Person(ALICE))


# ------------------------------------------------------------------ SharePoint and OneDrive


@pytest.fixture
def graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[MockSharePoint]:
    mock = MockSharePoint()
    with mock.serve():
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", mock.ca_file)
        yield mock


def _sync_graph(kb: KnowledgeBase, mock: MockSharePoint, *organisation: str) -> None:
    site = f"https://{SITE_HOST}{SITE_PATH}"
    settings = SharePointSettings(
        TENANT,
        CLIENT_ID,
        site=site,
        graph_url=mock.graph,
        authority_url=mock.base,
        organisation_groups=organisation,
    )
    connector = SharePointConnector(settings, DEFAULT_SHAREPOINT_CLIENT_SECRET, sleep=Waits().sleep)
    assert sync(kb, "sp-eng", "sharepoint", settings.as_dict(), connector).error is None


def _md(item: str, *grants: dict[str, Any], parent: str = "root") -> Item:
    return Item(item, f"{item}.md", f"# {item}\n\n{SECRET}\n".encode(), parent, grants=list(grants))


async def test_a_group_named_like_the_site_group_standing_for_everyone_is_not_everyone(
    kb: KnowledgeBase, slack: MockSlackAPI, graph: MockSharePoint
) -> None:
    # The admin named the site group "Eng Members" as everyone; anyone may make a Microsoft
    # 365 group of that display name, alice alone in it, and share a file with it.
    made = "7d1e0c2a-3b4c-4d5e-8f90-a1b2c3d4e5f6"
    graph.groups[made] = [member("alice@example.com")]
    graph.add(_md("Private", group(made, "Eng Members")))
    graph.add(_md("Handbook", site_group("Eng Members")))
    _sync_graph(kb, graph, "Eng Members")
    assert acl_of(kb, "sp-eng", "Private") == Acl(groups=frozenset({made}))
    assert acl_of(kb, "sp-eng", "Handbook") == Acl(public=True)
    access = access_over(slack, kb)
    bob = await access.search_scopes(Person(BOB))
    assert source_scope("sp-eng", "Private") not in bob
    assert source_scope("sp-eng", "Handbook") in bob
    assert source_scope("sp-eng", "Private") in await access.search_scopes(Person(ALICE))


async def test_a_file_request_link_on_a_folder_opens_none_of_its_files(
    kb: KnowledgeBase, slack: MockSlackAPI, graph: MockSharePoint
) -> None:
    # An anonymous upload-only link (createOnly) on a folder: people drop their files in,
    # and nobody but those the files are shared with may read them.
    graph.add(
        Item("Drop", "Applications", folder=True, grants=[link("anonymous", kind="createOnly")])
    )
    graph.add(_md("cv", user("alice@example.com"), parent="Drop"))
    graph.add(_md("menu", link("organization", kind="view")))
    _sync_graph(kb, graph)
    assert acl_of(kb, "sp-eng", "cv") == Acl.of(users=["alice@example.com"])
    bob = await access_over(slack, kb).search_scopes(Person(BOB))
    assert source_scope("sp-eng", "cv") not in bob
    assert source_scope("sp-eng", "menu") in bob


async def test_a_sharing_link_past_its_expiration_opens_nothing(
    kb: KnowledgeBase, slack: MockSlackAPI, graph: MockSharePoint
) -> None:
    graph.add(_md("lapsed", link("organization", expires="2026-01-05T10:00:00Z")))
    graph.add(_md("garbled", link("organization", expires="soon")))
    # Graph's DateTime.MinValue says no expiration is set.
    graph.add(_md("lasting", link("organization", expires="0001-01-01T00:00:00Z")))
    _sync_graph(kb, graph)
    # Admitting nobody, each is stored with no entry, which reads back as unknown: hidden.
    assert not acl_of(kb, "sp-eng", "lapsed").public
    assert not acl_of(kb, "sp-eng", "garbled").public
    assert acl_of(kb, "sp-eng", "lasting") == Acl(public=True)
    bob = await access_over(slack, kb).search_scopes(Person(BOB))
    assert not bob & {source_scope("sp-eng", i) for i in ("lapsed", "garbled")}
    assert source_scope("sp-eng", "lasting") in bob
