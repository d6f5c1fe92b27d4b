"""``kb migrate-store``: a SQLite knowledge base moved into Postgres, checked, and answering the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from bot.cli import main
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.records import QueryRecord
from tests.postgres import create_database, require_password

HANDBOOK = b"""# Handbook

## Expenses

Submit expense claims within 30 days with a photo of every receipt.

## VPN

Set the DNS server to 10.20.0.53 when internal sites do not load over the VPN.
"""
ONBOARDING = b"""# Onboarding

New starters get a laptop on their first day; the badge is collected at reception.
"""
QUESTIONS = ["how long do I have to file an expense claim", "VPN DNS server", "laptop badge"]


def _sqlite_kb(data_dir: Path, embedder: Embedder) -> KnowledgeBase:
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md", uploader="U1")
    kb.ingest_bytes(ONBOARDING, "onboarding.md", uploader="U2", scope="C1")
    kb.ingest_bytes(HANDBOOK.replace(b"30 days", b"45 days"), "handbook.md", uploader="U1")
    asked = kb.queries.log(
        QueryRecord(
            question=QUESTIONS[0],
            scopes=("C1",),
            outcome="answered",
            model_called=True,
            kept=((1, 0.25),),
            cited=(1,),
            invalid_citations=(),
            latency_ms=12.5,
            timings={"total": 12.5},
            user="U3",
            answer="45 days [1].",
        )
    )
    kb.feedback.add(asked, -1, "U3")
    kb.deliveries.claim(["Ev1", "C1:1700000000.1"], lease_seconds=60.0)
    kb.store.set_meta("calibration", '{"threshold": 0.6}')
    return kb


def _top(kb: KnowledgeBase, question: str) -> list[tuple[int, str]]:
    found = kb.search_index.search(kb.embedder.encode_query(question), question, None, 4)
    rows = kb.store.chunks_by_id([c.chunk_id for c in found])
    return [(c.chunk_id, rows[c.chunk_id].content) for c in found]


def _migrate(data_dir: Path, url: str, *extra: str) -> Any:
    return CliRunner().invoke(
        main, ["--data-dir", str(data_dir), "migrate-store", "--to", url, *extra]
    )


def _counts(url: str) -> dict[str, int]:
    tables = ["documents", "chunks", "texts", "query_log", "feedback", "deliveries", "meta"]
    with psycopg.connect(url) as conn:
        counted = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone() for t in tables}
        counted["originals"] = conn.execute("SELECT COUNT(*) FROM originals").fetchone()
    return {t: int(row[0]) if row else 0 for t, row in counted.items()}


@pytest.fixture
def empty_url(postgres_server: Any) -> str:
    return create_database(postgres_server, template="template0")


def test_a_sqlite_knowledge_base_moves_into_postgres_checked_and_answers_the_same(
    tmp_path: Path, embedder: Embedder, empty_url: str
) -> None:
    source = _sqlite_kb(tmp_path / "kb", embedder)
    before = {q: _top(source, q) for q in QUESTIONS}
    documents = source.documents()
    source.store.close()

    result = _migrate(tmp_path / "kb", empty_url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    tables = {t["table"]: t for t in report["tables"]}
    assert all(t["matches"] for t in tables.values())
    # Three uploads, one a new version of another: 3 documents, 2 stored originals.
    assert (tables["documents"]["rows"], tables["originals"]["rows"]) == (3, 3)
    assert tables["feedback"]["target_rows"] == 1 and tables["deliveries"]["target_rows"] == 2
    assert tables["chunks"]["checksum"] == tables["chunks"]["target_checksum"]
    assert _counts(empty_url)["chunks"] == tables["chunks"]["rows"] > 0

    # A replica on Postgres, with a data dir of its own: same documents, same answers.
    moved = KnowledgeBase(
        IndexConfig(data_dir=tmp_path / "replica", database_url=empty_url), embedder=embedder
    )
    assert moved.documents() == documents
    assert {q: _top(moved, q) for q in QUESTIONS} == before
    assert moved.store.read_original(documents[0].sha256) == HANDBOOK
    assert moved.store.feedback.disliked_count() == 1 and moved.store.get_meta("calibration")
    # Ids go on past the copied ones: a new document never takes an old one's id.
    added = moved.ingest_bytes(b"# Travel\n\nBook trains through the portal.\n", "travel.md")
    assert added.document.id > max(d.id for d in documents)


def test_a_database_that_is_not_empty_is_refused(
    tmp_path: Path, embedder: Embedder, empty_url: str
) -> None:
    _sqlite_kb(tmp_path / "kb", embedder).store.close()
    assert _migrate(tmp_path / "kb", empty_url).exit_code == 0
    counts = _counts(empty_url)
    again = _migrate(tmp_path / "kb", empty_url)
    assert again.exit_code == 1
    assert "is not empty" in again.output and "new database" in again.output
    assert _counts(empty_url) == counts  # nothing copied twice


def test_a_failed_copy_commits_nothing_and_can_be_run_again(
    tmp_path: Path, embedder: Embedder, empty_url: str
) -> None:
    kb = _sqlite_kb(tmp_path / "kb", embedder)
    original = kb.store.original_path(kb.documents()[1].sha256)
    kb.store.close()
    good = original.read_bytes()
    original.write_bytes(b"bit rot")
    failed = _migrate(tmp_path / "kb", empty_url)
    assert failed.exit_code == 1
    assert "does not hash to its name" in failed.output and "Nothing was committed" in failed.output
    assert set(_counts(empty_url).values()) == {0}
    original.write_bytes(good)
    assert _migrate(tmp_path / "kb", empty_url).exit_code == 0
    assert _counts(empty_url)["documents"] == 3


def test_a_data_dir_without_a_knowledge_base_is_refused(tmp_path: Path, empty_url: str) -> None:
    result = _migrate(tmp_path / "nothing", empty_url)
    assert result.exit_code == 1 and "There is no knowledge base" in result.output


def test_kb_status_shows_the_database_with_its_password_masked(
    tmp_path: Path, postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = require_password(postgres_server, "kb_status_user", "canary-status-password-5c8d")
    monkeypatch.setenv("KB_DATABASE_URL", url)
    monkeypatch.setenv("KB_EMBEDDING_MODEL", "bundled:all-MiniLM-L6-v2")
    result = CliRunner().invoke(main, ["--data-dir", str(tmp_path / "kb"), "status"])
    assert result.exit_code == 0, result.output
    assert "kb_status_user:***@" in result.output
    assert "canary-status-password-5c8d" not in result.output
