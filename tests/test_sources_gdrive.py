"""Google Drive synced with its permissions, through ``google-api-python-client``, from a local mock.

The mock (``tests/gdrive_server.py``) follows the Drive API v3, the Directory
API and Google's token endpoint as documented: a service account's signed JWT
for a token, ``pageToken``/``nextPageToken`` capped by the server, the changes
log with ``newStartPageToken``, shared-drive members inherited by each file,
429 with ``Retry-After``, 403 ``rateLimitExceeded``, 401 for an expired token.
The client is built from the discovery documents it ships (no network). The
knowledge base is real (SQLite, FAISS, the bundled model), and so is the access
rule: Slack's ``users.info`` (the mock Slack Web API) gives each person's
email. Retries wait on a recorded clock, never a real one.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from openpyxl import Workbook
from pptx import Presentation

from bot.access import Where
from core.answer import Engine
from index.knowledge_base import KnowledgeBase
from index.sources import Acl, SourceError, SourceSyncReport, source_scope, sync_source
from index.sources.gdrive import GDriveConnector, GDriveSettings
from tests import sources_harness
from tests.clocks import Waits
from tests.gdrive_server import (
    DOC,
    DRIVE,
    DROP,
    FOLDER,
    SHEET,
    SLIDES,
    Fault,
    File,
    MockDrive,
    Permission,
    user,
)
from tests.servers import DEFAULT_GDRIVE_TOKEN, DEFAULT_OPENAI_API_KEY, MockSlackAPI
from tests.sources_harness import (
    ALICE,
    BOB,
    CAROL,
    HOME,
    NOMAIL,
    SECRET,
    SECRET_Q,
    AsPeople,
    kb_cli,
    live_titles,
    sync,
)

SOURCE = "gdrive-eng"
kb, slack = sources_harness.kb, sources_harness.slack
BUDGET_ROW = "Nightjar travel budget"
ENG = "eng@example.com"  # alice and, through the nested group, dave
OWNER = "owner@example.com"  # the shared drive's organizer: inherited by every file


def doc(file_id: str, title: str, text: str, *grants: Permission, **kw: Any) -> File:
    body = f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>"
    return File(file_id, title, DOC, body.encode(), permissions=list(grants), **kw)


def sheet_bytes(*rows: tuple[str, int]) -> bytes:
    book = Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["Item", "Euros"])
    for row in rows:
        sheet.append(list(row))
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


@pytest.fixture
def drive() -> Iterator[MockDrive]:
    mock = MockDrive()
    mock.groups[ENG] = [user("alice@example.com"), {"email": "leads@example.com", "type": "GROUP"}]
    mock.groups["leads@example.com"] = [user("dave@example.com")]
    mock.drive_members = [Permission("user", "organizer", email=OWNER)]
    with mock.serve():
        mock.put(doc("home", "Office hours", HOME, Permission("domain", domain="example.com")))
        mock.put(doc("night", "Nightjar", SECRET, Permission("group", email=ENG)))
        mock.put(
            File(
                "budget",
                "Budget sheet",
                SHEET,
                sheet_bytes((BUDGET_ROW, 12000)),
                permissions=[Permission("group", "writer", email=ENG)],
            )
        )
        mock.put(File("logo", "logo.png", "image/png", b"\x89PNG\r\n"))  # not read: never listed
        yield mock


def settings(mock: MockDrive, **kw: Any) -> GDriveSettings:
    return GDriveSettings(**{"drive": DRIVE, "api_url": mock.base, **kw})


def connector(
    mock: MockDrive,
    waits: Waits | None = None,
    budget: float = 30.0,
    options: dict[str, Any] | None = None,
    **kw: Any,
) -> GDriveConnector:
    return GDriveConnector(
        settings(mock, **kw),
        mock.key_file(),
        sleep=(waits or Waits()).sleep,
        budget_seconds=budget,
        **(options or {}),
    )


def run(
    kb: KnowledgeBase,
    mock: MockDrive,
    waits: Waits | None = None,
    options: dict[str, Any] | None = None,
    **kw: Any,
) -> SourceSyncReport:
    """One sync through a connector opened with ``options`` (``max_bytes``...); ``kw`` are
    the source's settings."""
    source = connector(mock, waits, options=options, **kw)
    return sync(kb, SOURCE, "gdrive", settings(mock).as_dict(), source, waits)


def acl_of(kb: KnowledgeBase, item: str) -> Acl:
    return sources_harness.acl_of(kb, SOURCE, item)


# ------------------------------------------------------------------ the vertical slice


def test_a_shared_drive_is_loaded_page_by_page_exported_with_each_files_permissions(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    report = run(kb, drive)

    assert report.error is None and report.mode == "load"
    assert sorted(report.added) == ["budget", "home", "night"]  # the PNG is not read
    # The server capped each page at 2: the rest came by following nextPageToken.
    listings = drive.calls_to("/drive/v3/files")
    pages = [c for c in listings if c[1] == "/drive/v3/files"]
    assert len(pages) >= 2 and "pageToken" in pages[1][2]
    assert pages[0][2]["corpora"] == "drive" and pages[0][2]["driveId"] == DRIVE
    # Docs exported as HTML, Sheets as XLSX; nothing downloaded raw that Google would refuse.
    exports = {c[1]: c[2]["mimeType"] for c in drive.calls_to("/export")}
    assert exports["/drive/v3/files/home/export"] == "text/html"
    assert exports["/drive/v3/files/budget/export"].endswith("spreadsheetml.sheet")
    items = kb.store.sources.items(SOURCE)
    assert SECRET in kb.canonical_text(items["night"].document_id or 0)
    assert BUDGET_ROW in kb.canonical_text(items["budget"].document_id or 0)
    assert items["night"].url == "https://docs.google.com/document/d/night/edit?usp=drivesdk"
    # Each grant mapped; the drive's organizer inherited by every file.
    assert acl_of(kb, "home") == Acl.of(users=[OWNER], domains=["example.com"])
    assert acl_of(kb, "night") == Acl.of(users=[OWNER], groups=[ENG])
    # The group expanded through the Directory API, nested groups included.
    assert kb.store.sources.group_members(SOURCE, ENG) == {"alice@example.com", "dave@example.com"}
    assert json.loads(kb.store.sources.checkpoint(SOURCE) or "{}")["page_token"] == "5"

    again = run(kb, drive)
    assert again.mode == "poll" and again.added == [] and again.changed == []


async def test_a_file_is_never_searched_for_a_person_its_permissions_do_not_admit(
    kb: KnowledgeBase,
    drive: MockDrive,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, drive)
    people = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0))

    everything = {"Office hours", "Nightjar", "Budget sheet"}
    assert await people.titles(ALICE) == everything
    assert await people.titles(BOB) == {"Office hours"}
    for outsider in (CAROL, NOMAIL):  # another domain; no confirmed email
        assert await people.titles(outsider) == set()
    shown = await people.shown(BOB)
    assert shown and {s.document for s in shown} == {"Office hours"}
    assert not any("Nightjar" in s.quote for s in shown)
    # In a channel: only what is public in the organisation, and a domain grant is not.
    assert await people.titles(ALICE, Where(channel="C0X")) == set()

    cited = people.cited(await people.answer(ALICE), "Nightjar")
    assert cited.origin == "https://docs.google.com/document/d/night/edit?usp=drivesdk"


async def test_a_permission_change_a_trashing_and_a_deletion_take_effect_within_one_sync(
    kb: KnowledgeBase,
    drive: MockDrive,
    slack: MockSlackAPI,
    engine_for: Callable[..., Engine],
) -> None:
    await asyncio.to_thread(run, kb, drive)
    seen = AsPeople(slack, kb, engine_for(threshold=2.0, related_threshold=2.0)).titles

    assert "Nightjar" in await seen(ALICE)
    # Alice leaves the group; the home page is unshared from the domain, shared with Bob.
    drive.groups[ENG] = [{"email": "leads@example.com", "type": "GROUP"}]
    drive.files["home"].permissions = [Permission("user", email="bob@example.com")]
    report = await asyncio.to_thread(run, kb, drive)
    assert report.error is None and report.changed == []  # no content indexed again
    assert await seen(ALICE) == set()
    assert await seen(BOB) == {"Office hours"}

    drive.edit("home", trashed=True)
    drive.delete("budget")
    report = await asyncio.to_thread(run, kb, drive)
    assert sorted(report.removed) == ["budget", "home"]
    assert set(live_titles(kb)) == {"Nightjar"}
    assert await seen(BOB) == set()


def test_a_poll_from_the_page_token_picks_up_an_edit_and_a_new_file(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    run(kb, drive)
    before = live_titles(kb)
    drive.edit("home", name="Opening hours", content=b"<p>The Copenhagen office opens at nine.</p>")
    drive.put(doc("new", "Parking", "Parking is behind the building.", Permission("anyone")))
    drive.edit("home")  # the same file changed twice: fetched once

    report = run(kb, drive)

    assert report.mode == "poll" and report.changed == ["home"] and report.added == ["new"]
    assert report.repeated == []
    titles = live_titles(kb)
    assert set(titles) == {"Opening hours", "Nightjar", "Budget sheet", "Parking"}
    assert titles["Opening hours"] != before["Office hours"]
    # Only the changes since the saved token were asked for, and the content of what changed.
    polls = [c for c in drive.calls if c[1] == "/drive/v3/changes"]
    assert polls[0][2]["pageToken"] == "5" and polls[-1][2]["pageToken"] == "7"
    assert len(drive.calls_to("/drive/v3/files/night/export")) == 1
    assert kb.store.sources.items(SOURCE)["home"].version == "3"
    # Anyone with the link: no wider than the file's other permissions, unless the admin opts in.
    assert acl_of(kb, "new") == Acl.of(users=[OWNER])


def test_slides_are_exported_as_pptx_and_a_pdf_is_downloaded_as_it_is(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Quarterly review"
    slide.placeholders[1].text = "Revenue grew by nine percent in the third quarter."
    out = io.BytesIO()
    deck.save(out)
    drive.put(File("deck", "Review", SLIDES, out.getvalue(), permissions=[]))
    drive.put(File("memo", "memo", "text/markdown", b"# Memo\nThe fire drill is on Monday."))

    report = run(kb, drive)

    assert {"deck", "memo"} <= set(report.added) and report.failed == []
    [export] = drive.calls_to("/drive/v3/files/deck/export")
    assert export[2]["mimeType"].endswith("presentationml.presentation")
    items = kb.store.sources.items(SOURCE)
    assert "nine percent" in kb.canonical_text(items["deck"].document_id or 0)
    assert kb.store.document(items["memo"].document_id or 0).name == "memo.md"
    assert kb.store.document(items["deck"].document_id or 0).name == "Review.pptx"
    assert [c[2].get("alt") for c in drive.calls if c[1] == "/drive/v3/files/memo"] == ["media"]


def test_anyone_with_the_link_is_public_in_the_organisation_only_when_opted_in(
    drive: MockDrive,
) -> None:
    drive.put(doc("open", "Menu", "The canteen serves soup on Fridays.", Permission("anyone")))
    closed = connector(drive).permissions(["open"])
    opened = connector(drive, anyone_public=True).permissions(["open"])
    assert closed == {"open": Acl.of(users=[OWNER])}
    assert opened == {"open": Acl.of(users=[OWNER], public=True)}


def test_a_folder_source_syncs_what_is_under_it_at_any_depth(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.put(File("fold", "Handbook", FOLDER))
    drive.put(File("sub", "Travel", FOLDER, parents=["fold"]))
    drive.put(
        File("rules", "travel.md", "text/markdown", b"# Travel\nBook trains.", parents=["sub"])
    )
    drive.put(File("pdfless", "README", "text/plain", b"Read me first.", parents=["fold"]))
    drive.put(File("loop", "Again", FOLDER, parents=["sub"]))
    drive.edit("sub", parents=["fold", "loop"])  # a folder inside its own child: walked once
    kb.store.sources.add("handbook", "gdrive", settings(drive, folder="fold").as_dict())

    report = sync_source(kb, "handbook", connector(drive, folder="fold"))

    assert report.error is None and sorted(report.added) == ["pdfless", "rules"]
    items = kb.store.sources.items("handbook")
    assert kb.store.document(items["pdfless"].document_id or 0).name == "README.txt"
    # Moved out of the folder: gone within one sync; a new file under it comes by the poll.
    drive.edit("rules", parents=["0Aelsewhere"])
    drive.put(File("faq", "faq.txt", "text/plain", b"Ask the office.", parents=["sub"]))
    again = sync_source(kb, "handbook", connector(drive, folder="fold"))
    assert again.removed == ["rules"] and again.added == ["faq"]


# ------------------------------------------------------------------ the command line


async def test_kb_source_add_gdrive_sync_list_show_and_ask(
    index_dir: Path,
    drive: MockDrive,
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: Any,
    tmp_path: Path,
) -> None:
    key = tmp_path / "key.json"
    key.write_text(drive.key_file(), encoding="utf-8")
    key.chmod(0o600)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", DEFAULT_OPENAI_API_KEY)
    monkeypatch.setenv("KB_THRESHOLD", "2.0")

    def cli(*args: str) -> Result:
        return kb_cli(index_dir, *args)

    added = await asyncio.to_thread(
        cli, "source", "add", "gdrive", "--drive", DRIVE, "--api-url", drive.base,
        "--token-file", str(key), "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    recorded = json.loads(added.stdout)
    assert recorded["name"] == f"gdrive-{DRIVE}".lower() and "private_key" not in added.stdout
    name = recorded["name"]

    synced = await asyncio.to_thread(cli, "source", "sync", name, "--json")
    assert synced.exit_code == 0, synced.output
    assert sorted(json.loads(synced.stdout)[0]["added"]) == ["budget", "home", "night"]
    listed = json.loads((await asyncio.to_thread(cli, "source", "list", "--json")).stdout)
    assert [(r["name"], r["kind"], r["documents"]) for r in listed] == [(name, "gdrive", 3)]

    shown = json.loads((await asyncio.to_thread(cli, "show", "Nightjar.html", "--json")).stdout)
    assert shown["source"]["acl"]["entries"] == [["user", OWNER, None], ["group", ENG, None]]

    asked = await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", ALICE, "--json")
    assert asked.exit_code == 0, asked.output
    cited = json.loads(asked.stdout)["sources"][0]
    assert cited["document"] == "Nightjar" and "#char=" in cited["url"]
    assert cited["origin"].startswith("https://docs.google.com/document/d/night/")
    denied = json.loads(
        (await asyncio.to_thread(cli, "ask", SECRET_Q, "--as", BOB, "--json")).stdout
    )
    passages = denied["sources"] + denied["kept"] + denied["beside"]
    assert passages and {p["document"] for p in passages} == {"Office hours"}

    removed = await asyncio.to_thread(cli, "source", "remove", name, "--json")
    assert json.loads(removed.stdout) == {"source": name, "removed": 3}
    # The same key through KB_GDRIVE_CREDENTIALS, for a source without a key file.
    monkeypatch.setenv("KB_GDRIVE_CREDENTIALS", drive.key_file())
    other = await asyncio.to_thread(
        cli, "source", "add", "gdrive", "--drive", DRIVE, "--api-url", drive.base, "--name", "two"
    )
    assert other.exit_code == 0, other.output
    assert "KB_GDRIVE_CREDENTIALS" in other.output
    two = await asyncio.to_thread(cli, "source", "sync", "two", "--json")
    assert two.exit_code == 0, two.output
    assert sorted(json.loads(two.stdout)[0]["added"]) == ["budget", "home", "night"]


def test_a_missing_or_unusable_credential_and_bad_settings_say_what_to_do(
    index_dir: Path, drive: MockDrive, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb_cli(index_dir, "source", "add", "gdrive", "--drive", DRIVE, "--api-url", drive.base)
    missing = kb_cli(index_dir, "source", "sync")
    assert missing.exit_code == 1 and "KB_GDRIVE_CREDENTIALS" in missing.output
    monkeypatch.setenv("KB_GDRIVE_CREDENTIALS", "not-a-key")
    garbled = kb_cli(index_dir, "source", "sync")
    assert garbled.exit_code == 1 and "not a service account's JSON key" in garbled.output
    assert "not-a-key" not in garbled.output
    neither = kb_cli(index_dir, "source", "add", "gdrive", "--name", "x")
    assert neither.exit_code == 1 and "--drive (a shared drive) or --folder" in neither.output
    bad = kb_cli(index_dir, "source", "add", "gdrive", "--folder", "../etc", "--name", "y")
    assert bad.exit_code == 1 and "not a Google Drive folder id" in bad.output


# ------------------------------------------------------------------ bad input


def test_an_expired_token_is_renewed_and_a_revoked_key_fails_the_run_removing_nothing(
    kb: KnowledgeBase, drive: MockDrive, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run(kb, drive)
    same = connector(drive)
    assert sync_source(kb, SOURCE, same).error is None
    drive.revoke_tokens()  # the hour is up: Drive says 401, the client gets a new token, goes on
    renewed = sync_source(kb, SOURCE, same)
    assert renewed.error is None and len(drive.tokens) == 2  # Drive's and the Directory's

    drive.revoke_tokens()
    drive.key_revoked = True
    report = run(kb, drive)
    assert report.error is not None and "refused the service account's key" in report.error
    assert "invalid_grant" in report.error
    assert len(live_titles(kb)) == 3
    row = kb.store.sources.get(SOURCE)
    assert row.last_error == report.error and row.last_good_at is not None
    # Neither the key nor a token reached a log line or the error.
    secret = json.loads(drive.key_file())["private_key"].splitlines()[5]
    for text in (caplog.text, report.error, json.dumps(report.as_dict())):
        assert secret not in text and DEFAULT_GDRIVE_TOKEN not in text


def test_an_access_token_refused_after_renewal_fails_closed_as_credentials(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    run(kb, drive)
    drive.fail("/drive/v3/files", 401, times=10, reason="authError")
    report = run(kb, drive)
    assert report.error is not None and "refused the credentials (HTTP 401" in report.error
    assert len(live_titles(kb)) == 3


def test_429_and_rate_limit_403_wait_and_500s_back_off_within_the_budget(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    waits = Waits()
    drive.fail("/drive/v3/files", 429, retry_after="7")
    drive.fail("/drive/v3/files/night/export", 503)
    drive.fail("/drive/v3/files/home/permissions", 403, reason="userRateLimitExceeded")
    drive.fail("/drive/v3/files/budget/export", DROP)
    report = run(kb, drive, waits)
    assert report.error is None and len(report.added) == 3
    assert waits.waits == [7.0, 0.5, 0.5, 0.5]

    waits = Waits()
    drive.fail("/drive/v3/files", 500, times=10)
    failing = run(kb, drive, waits, budget=3.0)
    # Backing off 0.5 s, then 1 s; 2 s more would pass the 3 s budget: the run stops there.
    assert waits.waits == [0.5, 1.0]
    assert failing.error is not None and "3 s retry budget" in failing.error
    row = kb.store.sources.get(SOURCE)
    assert row.retry_at == waits.now + 2.0 and row.last_error == failing.error
    assert len(live_titles(kb)) == 3


def test_a_garbage_listing_is_refused_and_a_file_google_will_not_give_is_skipped(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.fail("/drive/v3/files/budget/export", 403, reason="exportSizeLimitExceeded")
    report = run(kb, drive)
    assert report.error is None
    assert [item for item, _ in report.failed] == ["budget"]
    assert "exportSizeLimitExceeded" in report.failed[0][1]
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}

    drive.faults.append(Fault("/drive/v3/files", 200, body=b"<html>Sign in</html>"))
    failing = run(kb, drive)
    assert failing.error is not None and "not JSON" in failing.error
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}
    # Only some files, and Drive says so: the others must not be taken for deleted.
    partial = {"files": [drive.files["home"].as_json()], "incompleteSearch": True}
    drive.faults.append(Fault("/drive/v3/files", 200, body=json.dumps(partial).encode()))
    incomplete = run(kb, drive)
    assert incomplete.error is not None and "listing is incomplete" in incomplete.error
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}
    nameless = {"files": [{"id": "x1", "mimeType": DOC}]}
    drive.faults.append(Fault("/drive/v3/files", 200, body=json.dumps(nameless).encode()))
    refused = run(kb, drive)
    assert refused.error is not None and "without a name" in refused.error
    assert set(live_titles(kb)) == {"Office hours", "Nightjar"}


def test_an_oversized_file_is_skipped_before_it_is_downloaded(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.put(File("huge", "scan.pdf", "application/pdf", b"%PDF-1.4", size=900 * 2**20))
    report = run(kb, drive)
    assert [item for item, _ in report.failed] == ["huge"] and "900 MB" in report.failed[0][1]
    assert not [c for c in drive.calls_to("/drive/v3/files/huge") if c[2].get("alt") == "media"]


def test_an_item_listed_twice_is_synced_once(kb: KnowledgeBase, drive: MockDrive) -> None:
    drive.list_twice = "home"
    report = run(kb, drive)
    assert report.repeated == ["home"]
    assert sorted(report.added) == ["budget", "home", "night"]
    assert len(kb.store.sources.items(SOURCE)) == 3


def test_permissions_or_members_google_will_not_show_admit_nobody(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.hidden_permissions.add("home")
    drive.hidden_groups.add("leads@example.com")
    run(kb, drive)
    scope = source_scope(SOURCE, "home")
    assert acl_of(kb, "home").known is False
    for email in ("bob@example.com", OWNER, None):
        assert scope not in kb.store.sources.readable_scopes(email)
    # The nested group is expanded by Google itself; a group it hides admits nobody through it.
    assert kb.store.sources.group_members(SOURCE, ENG) == {"alice@example.com", "dave@example.com"}
    members = connector(drive).groups(["leads@example.com", "nobody@example.com"])
    assert [(g.emails, g.complete) for g in members] == [(frozenset(), False)] * 2


def test_a_link_pointing_elsewhere_opens_the_file_in_drive_by_its_id(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.files["home"].web_view_link = "https://evil.example/phish"
    drive.files["night"].web_view_link = "javascript:alert(1)"
    run(kb, drive)
    items = kb.store.sources.items(SOURCE)
    for item in ("home", "night"):
        assert items[item].url == f"https://drive.google.com/open?id={item}"


def test_drive_answers_only_the_scopes_the_key_asks_for(drive: MockDrive) -> None:
    connector(drive).listing()
    scopes = set().union(*drive.tokens.values())
    assert scopes == {"https://www.googleapis.com/auth/drive.readonly"}
    connector(drive).groups([ENG])
    assert {frozenset(s) for s in drive.tokens.values()} == {
        frozenset({"https://www.googleapis.com/auth/drive.readonly"}),
        frozenset({"https://www.googleapis.com/auth/admin.directory.group.member.readonly"}),
    }


def test_a_file_gone_between_listing_and_permissions_is_hidden_and_the_run_goes_on(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    run(kb, drive)
    drive.files["home"].permissions.append(Permission("user", email="eve@example.com"))
    drive.fail("/drive/v3/files/home/permissions", 404, reason="notFound")
    report = run(kb, drive)
    assert report.error is None and report.permissions == 3
    assert acl_of(kb, "home").known is False
    assert source_scope(SOURCE, "home") not in kb.store.sources.readable_scopes("bob@example.com")


def test_a_drive_not_shared_with_the_account_says_to_share_it(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.fail("/drive/v3/files", 404, reason="notFound")
    report = run(kb, drive)
    assert report.error is not None and "share it with the service account" in report.error
    assert kb.store.sources.items(SOURCE) == {}


def test_a_key_that_cannot_sign_is_refused_before_any_request(drive: MockDrive) -> None:
    key = json.loads(drive.key_file())
    key["private_key"] = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    with pytest.raises(SourceError, match="readable private_key") as raised:
        GDriveConnector(settings(drive), json.dumps(key))
    assert "bm90IGEga2V5" not in str(raised.value)
    with pytest.raises(SourceError, match="service account's JSON key"):
        GDriveConnector(settings(drive), json.dumps({**key, "type": "authorized_user"}))
    assert drive.calls == [] and drive.tokens == {}
