"""A full disk degrades the knowledge base; it never makes it unreadable.

The data dir lives on a tiny tmpfs the test mounts (root only; skipped with the
reason otherwise), filled up to the last byte the way a busy server's disk is.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner, Result

from bot.cli import main
from bot.server import routes
from core.answer import Answer, Engine, build_engine
from core.config import EngineConfig
from core.links import SECRET_FILENAME, load_or_create_secret
from index.config import IndexConfig
from index.embed import Embedder
from index.errors import DiskFull, DiskSpaceLow
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.storage.sqlite import _REOPEN_SECONDS, SQLiteDatabase
from tests.clocks import FakeTime
from tests.environment import cannot_run_here

HANDBOOK = b"# Handbook\n\nExpense claims are due within 30 days of purchase.\n"


def _mountable() -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    reason = _mountable()
    if reason:
        cannot_run_here(reason)
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        cannot_run_here(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path, *, leave: int = 0) -> None:
    """Take every free byte of ``disk``, then give back ``leave`` bytes."""
    fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
        if leave:
            os.ftruncate(fd, max(os.fstat(fd).st_size - leave, 0))
    finally:
        os.close(fd)


def _config(data_dir: Path, **overrides: Any) -> IndexConfig:
    # The free-space floor is tested on its own: here the disk fills for real.
    return IndexConfig(data_dir=data_dir, **{"min_free_bytes": 0, **overrides})


def _cli(data_dir: Path, *args: str) -> Result:
    env = {"KB_MIN_FREE_BYTES": "0"}
    return CliRunner().invoke(main, ["--data-dir", str(data_dir), *args], env=env)


def _no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_index_files_that_cannot_be_saved_leave_the_answers_in_memory(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    # The index files go missing and the disk fills up: they cannot be written again.
    for path in (kb.indexes.vectors_path, kb.indexes.bm25_path):
        path.unlink()
    _fill(small_disk)
    reopened = KnowledgeBase(_config(data_dir), embedder=embedder)
    snapshot = reopened.indexes.open()
    assert len(snapshot) == 1
    status = reopened.status()
    assert status["index"]["in_sync"] is True
    assert "could not be saved" in str(status["index"]["degraded"])
    # Freeing space ends the degraded state at the next save.
    (small_disk / "ballast").unlink()
    reopened.indexes.rebuild()
    assert reopened.status()["index"]["degraded"] is None
    assert reopened.indexes.vectors_path.exists()


def test_an_ingest_on_a_full_disk_says_so_and_changes_nothing(
    small_disk: Path, embedder: Embedder, tmp_path: Path
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    _fill(small_disk)
    new = tmp_path / "travel.md"
    new.write_bytes(b"# Travel\n\nTrains are booked through the portal.\n")

    summary = kb.ingest_paths([new])
    assert summary.indexed == summary.failed == []
    assert len(summary.refused) == 1 and "The server's disk is full" in summary.refused[0]
    assert [d.name for d in kb.documents()] == ["handbook.md"]

    result = _cli(data_dir, "ingest", str(new))
    _no_traceback(result)
    assert result.exit_code == 1
    assert "refused" in result.output and "The server's disk is full" in result.output
    assert "Free space there" in result.output and str(data_dir) in result.output


def test_an_ingest_whose_commit_the_disk_refuses_reports_it_failed_and_retry_works(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    # Room for the original, none for its chunks and vectors.
    long = b"# Policy\n\n" + b"".join(
        f"Rule {i}: receipts for item {i} are kept for {i % 9 + 1} years.\n\n".encode()
        for i in range(120)
    )
    _fill(small_disk, leave=len(long) + 96 * 1024)
    row = kb.ingest_bytes(long, "policy.md").document
    assert row.state == DocState.FAILED
    assert row.failure_reason and "The server's disk is full" in row.failure_reason
    stored = kb.store.document(row.id)
    assert stored.state == DocState.FAILED  # the mark fits in the room the original left
    assert kb.store.chunk_rows(row.id) == []
    assert [d.name for d in kb.documents() if d.state == DocState.INDEXED] == ["handbook.md"]

    (small_disk / "ballast").unlink()
    retried = kb.retry(row.id)
    assert retried.state == DocState.INDEXED and retried.chunk_count > 0


def test_kb_rm_on_a_full_disk_says_so_without_a_traceback(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    _fill(small_disk)
    with pytest.raises(DiskFull, match="The server's disk is full"):
        kb.remove(kb.find("handbook.md").id)

    result = _cli(data_dir, "rm", "handbook.md")
    _no_traceback(result)
    assert result.exit_code == 1
    assert "Error: The server's disk is full" in result.output
    assert "nothing was changed" in result.output
    assert kb.find("handbook.md").state == DocState.INDEXED


def test_the_knowledge_base_starts_read_only_on_a_full_disk_and_answers(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    load_or_create_secret(data_dir, "")
    # The last connection closing deletes SQLite's -wal and -shm files: a
    # restart must create them again, and a full disk has no room for them.
    kb.store.db.conn.close()
    del kb
    assert not (data_dir / "kb.sqlite-wal").exists()
    _fill(small_disk)

    reopened = KnowledgeBase(_config(data_dir), embedder=embedder)
    database = reopened.store.database
    assert isinstance(database, SQLiteDatabase)
    fake = FakeTime(time.monotonic())  # the reopen timer's, moved by this test alone
    database.clock = fake.clock
    status = reopened.status()
    assert status["by_state"]["indexed"] == 1
    assert "The server's disk is full" in str(status["read_only"])
    assert len(reopened.snapshot) == 1

    shown = _cli(data_dir, "status")
    _no_traceback(shown)
    assert shown.exit_code == 0 and "READ-ONLY" in shown.output
    asked = _cli(data_dir, "ask", "When are expense claims due?", "--json")
    _no_traceback(asked)
    assert asked.exit_code == 0, asked.output
    answer = json.loads(asked.stdout)
    assert answer["outcome"] == "model_unavailable"
    assert "30 days" in json.dumps(answer["sources"])

    # Room again: a writable connection is tried again once the interval has passed,
    # and the next write reopens the database writable.
    (small_disk / "ballast").unlink()
    assert reopened.store.db is not None and reopened.store.read_only is not None
    fake.now += _REOPEN_SECONDS
    reopened.remove(reopened.find("handbook.md").id)
    assert reopened.store.read_only is None and reopened.documents() == []


def test_a_new_document_under_the_free_space_floor_is_refused_before_it_is_stored(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir, min_free_bytes=7 << 20), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")  # under 1 MB of 8 MB used: above the floor
    _fill(small_disk, leave=6 << 20)
    with pytest.raises(DiskSpaceLow, match=r"disk is nearly full: 6 MB free .* under the 7 MB"):
        kb.add_bytes(b"# Travel\n\nTrains are booked through the portal.\n", "travel.md")
    assert [d.name for d in kb.documents()] == ["handbook.md"]
    assert len(list(kb.store.originals_dir.rglob("*.*"))) == 0
    assert len([p for p in kb.store.originals_dir.rglob("*") if p.is_file()]) == 1
    # The same bytes again take no room: a duplicate is not refused.
    assert kb.add_bytes(HANDBOOK, "handbook.md").duplicate


def test_the_first_start_on_a_full_disk_answers_with_unsigned_sources_until_there_is_room(
    small_disk: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KB_LINK_SECRET", raising=False)
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(_config(data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    assert not (data_dir / SECRET_FILENAME).exists()
    _fill(small_disk)

    asked = _cli(data_dir, "ask", "When are expense claims due?", "--json")
    _no_traceback(asked)
    assert asked.exit_code == 0, asked.output
    answer = json.loads(asked.stdout)
    assert "30 days" in json.dumps(answer["sources"])
    assert answer["sources"] and all(s["url"] == "" for s in answer["sources"])
    assert "listed without links" in answer["links_note"]
    shown = _cli(data_dir, "ask", "When are expense claims due?")
    assert shown.exit_code == 0, shown.output
    assert "30 days" in shown.output and "listed without links" in shown.output
    assert "/d/" not in shown.output
    # Nothing half-written is left on the disk for the next start to trip on.
    assert [p.name for p in data_dir.iterdir() if "link-secret" in p.name] == []

    engine = build_engine(EngineConfig(), kb)
    signed = asyncio.run(_readyz_until_there_is_room(small_disk, engine))
    assert (data_dir / SECRET_FILENAME).exists()
    assert signed.links_note is None and signed.sources
    url = signed.sources[0].url
    token = url.split("t=", 1)[1].split("#", 1)[0]
    assert engine.signer.verify(token, signed.sources[0].document_id) == "*"
    later = _cli(data_dir, "ask", "When are expense claims due?", "--json")
    assert all("/d/" in s["url"] for s in json.loads(later.stdout)["sources"])


async def _readyz_until_there_is_room(disk: Path, engine: Engine) -> Answer:
    """``/readyz`` on the full disk, then with room again; the answer given then."""
    app = web.Application(middlewares=routes.MIDDLEWARES)
    app[routes.KB] = engine.kb
    app[routes.ENGINE] = engine
    routes.setup(app)
    async with TestClient(TestServer(app)) as http:
        ready = await (await http.get("/readyz")).json()
        assert "Cannot read or create the link secret" in str(ready["links_degraded"])
        assert "No space left" in str(ready["links_degraded"])

        # Room again: the next use creates the secret, and links are signed with it.
        (disk / "ballast").unlink()
        ready = await (await http.get("/readyz")).json()
        assert ready["links_degraded"] is None
    try:
        return await engine.ask("When are expense claims due?")
    finally:
        await engine.aclose()
