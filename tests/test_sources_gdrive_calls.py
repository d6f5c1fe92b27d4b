"""What a Google Drive sync asks Drive: an unchanged file costs no call of its own.

The mock (``tests/gdrive_server.py``) follows Drive's documented behaviour: a
change of a file's sharing is a change of the file in ``changes.list`` (its
``version`` one higher); a change of the shared drive's members is not a change
of each file; ``permissions.list`` of the drive itself gives its members. Every
request is recorded, so the calls of a run are counted: over N unchanged files
a run makes the listing's pages, one page of changes and one of the drive's
members, never one call per file. A sharing change, a change of the drive's
members, or of a folder, still takes effect within one sync. The knowledge
base is real (SQLite, FAISS, the bundled model).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.sources import SourceSyncReport, open_connector, source_scope, sync_source
from index.sources.gdrive import GDriveSettings
from tests.gdrive_server import DOC, DRIVE, FOLDER, File, MockDrive, Permission

SOURCE = "gdrive-eng"
FILES = 12
OWNER = "owner@example.com"  # the shared drive's organizer: inherited by every file


def doc(n: int) -> File:
    body = f"<html><body><h1>Note {n}</h1><p>Room {n} is booked on day {n}.</p></body></html>"
    return File(
        f"note{n:02d}",
        f"Note {n}",
        DOC,
        body.encode(),
        permissions=[Permission("user", email=f"reader{n}@example.com")],
    )


@pytest.fixture
def drive() -> Iterator[MockDrive]:
    mock = MockDrive()
    mock.drive_members = [Permission("user", "organizer", email=OWNER)]
    with mock.serve():
        for n in range(FILES):
            mock.put(doc(n))
        yield mock


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


def sync(kb: KnowledgeBase, drive: MockDrive) -> SourceSyncReport:
    """One run of the source as kb source sync makes it; Drive's calls recorded afresh."""
    if not kb.store.sources.all():
        settings = GDriveSettings(drive=DRIVE, api_url=drive.base)
        kb.store.sources.add(SOURCE, "gdrive", settings.as_dict())
    drive.calls.clear()
    row = kb.store.sources.get(SOURCE)
    report = sync_source(kb, SOURCE, open_connector(row, {"gdrive": drive.key_file()}))
    assert report.error is None, report.error
    return report


def file_permission_calls(drive: MockDrive) -> list[str]:
    """The files whose own permissions the run asked for."""
    paths = [c[1] for c in drive.calls if c[1].endswith("/permissions")]
    return sorted(p.split("/")[-2] for p in paths if DRIVE not in p)


def readers_of(kb: KnowledgeBase, email: str) -> set[str]:
    scopes = kb.store.sources.readable_scopes(email)
    return {i for i in kb.store.sources.items(SOURCE) if source_scope(SOURCE, i) in scopes}


def test_a_run_over_unchanged_files_makes_the_listings_pages_of_calls_not_one_a_file(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    loaded = sync(kb, drive)
    assert len(loaded.added) == FILES
    assert len(file_permission_calls(drive)) == FILES  # the first load reads each once

    again = sync(kb, drive)

    assert again.mode == "poll" and again.permissions == FILES and again.changed == []
    assert file_permission_calls(drive) == []
    paths = [c[1] for c in drive.calls]
    # The slim listing's pages (the server gives 2 files a page), one page of changes,
    # one of the drive's members, its restrictions once: nothing per file.
    assert paths.count("/drive/v3/files") == math.ceil(FILES / drive.page_cap)
    assert paths.count("/drive/v3/changes") == 1
    assert paths.count(f"/drive/v3/files/{DRIVE}/permissions") == 1
    assert paths.count(f"/drive/v3/drives/{DRIVE}") == 1
    assert len(paths) == math.ceil(FILES / drive.page_cap) + 3
    # Twice the files: twice the listing's pages, and still nothing per file.
    for n in range(FILES, 2 * FILES):
        drive.put(doc(n))
    sync(kb, drive)
    bigger = sync(kb, drive)
    assert bigger.permissions == 2 * FILES and file_permission_calls(drive) == []
    assert len(drive.calls) == math.ceil(2 * FILES / drive.page_cap) + 3


def test_a_sharing_change_is_read_for_that_file_alone_and_takes_effect_in_one_sync(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    sync(kb, drive)
    assert "note03" in readers_of(kb, "reader3@example.com")

    drive.files["note03"].permissions = [Permission("user", email="eve@example.com")]
    report = sync(kb, drive)

    assert file_permission_calls(drive) == ["note03"]  # once, for the step and the poll
    assert report.changed == []  # the bytes did not change: nothing indexed again
    assert "note03" not in readers_of(kb, "reader3@example.com")
    assert readers_of(kb, "eve@example.com") == {"note03"}


def test_a_change_of_the_drives_members_reads_every_files_permissions_in_that_sync(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    sync(kb, drive)
    assert len(readers_of(kb, OWNER)) == FILES

    # No file changes: only the drive's own members say it.
    drive.drive_members = [Permission("user", "organizer", email="new-owner@example.com")]
    sync(kb, drive)

    assert len(file_permission_calls(drive)) == FILES
    assert readers_of(kb, OWNER) == set()
    assert len(readers_of(kb, "new-owner@example.com")) == FILES
    # And the run after is back to no call per file.
    sync(kb, drive)
    assert file_permission_calls(drive) == []


def test_members_drive_will_not_show_or_a_changed_folder_read_every_file_again(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    drive.put(File("plans", "Plans", FOLDER, permissions=[]))
    sync(kb, drive)

    # A folder's sharing reaches what is under it without a change of each file.
    drive.files["plans"].permissions = [Permission("user", email="eve@example.com")]
    sync(kb, drive)
    assert len(file_permission_calls(drive)) == FILES

    drive.hidden_drive_members = True
    sync(kb, drive)
    assert len(file_permission_calls(drive)) == FILES
    assert len(readers_of(kb, OWNER)) == FILES


def test_a_folder_source_reads_every_files_permissions_each_run(
    kb: KnowledgeBase, drive: MockDrive
) -> None:
    """A folder named without its drive may sit in a shared drive whose members change
    with no file in the changes log: its files' permissions are read every run."""
    drive.put(File("fold", "Handbook", FOLDER))
    for n in range(3):
        drive.put(File(f"f{n}", f"f{n}.txt", "text/plain", f"Note {n}.".encode(), parents=["fold"]))
    settings = GDriveSettings(folder="fold", api_url=drive.base)
    kb.store.sources.add(SOURCE, "gdrive", settings.as_dict())
    sync(kb, drive)

    sync(kb, drive)  # nothing changed in Drive's changes log

    assert file_permission_calls(drive) == ["f0", "f1", "f2"]
