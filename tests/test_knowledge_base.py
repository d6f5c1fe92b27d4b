"""The knowledge base end to end: states, idempotence, versions, removal, stale stamps, sync."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.errors import ReindexInProgress, TooLarge
from index.knowledge_base import KnowledgeBase
from tests.docs_factory import bad_inputs, text_pdf

HANDBOOK = b"""# Handbook

Intro paragraph before any section: the office opens at 08:00 and closes at 19:00.

## Expenses

Submit expense claims within 30 days with a photo of every receipt.

Conference tickets need the manager's approval email attached.

## VPN

Set the DNS server to 10.20.0.53 when internal sites do not load over the VPN.
"""


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder, database_url: str) -> KnowledgeBase:
    # On SQLite and on Postgres (tests.postgres).
    config = IndexConfig(data_dir=index_dir, database_url=database_url)
    return KnowledgeBase(config, embedder=embedder)


def _search_ids(kb: KnowledgeBase, query: str) -> set[int]:
    snap = kb.snapshot
    vec = kb.embedder.encode_query(query)
    dense = {cid for cid, _ in snap.vectors.search(vec, 50)}
    sparse = {cid for cid, _ in snap.bm25.search(query, 50)}
    return dense | sparse


def _doc_chunk_ids(kb: KnowledgeBase, doc_id: int) -> set[int]:
    return {int(c["id"]) for c in kb.store.chunk_rows(doc_id)}


def test_ingest_indexes_with_exact_offsets_and_server_chunk_count(kb: KnowledgeBase) -> None:
    added = kb.ingest_bytes(HANDBOOK, "handbook.md", uploader="U1")
    doc = added.document
    assert doc.state == "indexed"
    rows = kb.store.chunk_rows(doc.id)
    assert doc.chunk_count == len(rows) > 0
    text = kb.canonical_text(doc.id)
    for r in rows:
        assert text[r["start"] : r["end"]] == r["content"]
    # text before the first heading is not lost
    assert any("office opens at 08:00" in r["content"] for r in rows)
    assert doc.embedding_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert doc.dimensions == 384
    assert doc.pipeline_version and doc.extractor_version
    assert kb.indexes.check()["in_sync"] is True


def test_same_bytes_twice_is_one_document(kb: KnowledgeBase) -> None:
    first = kb.ingest_bytes(HANDBOOK, "handbook.md")
    second = kb.ingest_bytes(HANDBOOK, "copy-of-handbook.md")
    assert second.duplicate is True
    assert second.document.id == first.document.id
    assert len(kb.store.documents()) == 1


def test_new_version_replaces_old_only_once_indexed(kb: KnowledgeBase) -> None:
    old = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    old_chunks = _doc_chunk_ids(kb, old.id)
    new_bytes = HANDBOOK.replace(b"30 days", b"45 days")
    added = kb.add_bytes(new_bytes, "handbook.md")
    # pending new version: the old one is still there and searchable
    assert kb.store.document(old.id).state == "indexed"
    assert old_chunks <= set(kb.snapshot.vectors.ids().tolist())
    new = kb.index_document(added.document.id)
    assert new.state == "indexed"
    # The old version is kept, out of every search, so it can be restored.
    versions = [(d.id, d.state, d.replaced_by) for d in kb.store.documents()]
    assert versions == [(old.id, "replaced", new.id), (new.id, "indexed", None)]
    assert kb.store.originals.has(old.sha256)
    live = set(kb.snapshot.vectors.ids().tolist())
    assert not (old_chunks & live)
    assert not (old_chunks & set(np.asarray(kb.snapshot.bm25.chunk_ids).tolist()))
    assert "45 days" in kb.canonical_text(new.id)


def test_failed_new_version_keeps_old_one(kb: KnowledgeBase) -> None:
    old = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    broken = kb.ingest_bytes(b"\x00\x01\x02" * 100, "handbook.md").document
    assert broken.state == "failed"
    assert kb.store.document(old.id).state == "indexed"
    assert _doc_chunk_ids(kb, old.id) <= set(kb.snapshot.vectors.ids().tolist())


def test_remove_drops_chunks_from_both_indexes(kb: KnowledgeBase) -> None:
    doc = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    other = kb.ingest_bytes(
        b"# Other\n\nThe canteen serves lunch from noon.\n", "other.md"
    ).document
    ids = _doc_chunk_ids(kb, doc.id)
    kb.remove(doc.id)
    assert not (ids & set(kb.snapshot.vectors.ids().tolist()))
    assert not (ids & set(np.asarray(kb.snapshot.bm25.chunk_ids).tolist()))
    assert not (ids & _search_ids(kb, "expense claims receipt"))
    assert kb.store.document(other.id).state == "indexed"
    assert not kb.store.originals.has(doc.sha256)


@pytest.mark.parametrize("case", sorted(bad_inputs()))
def test_bad_input_fails_with_reason_and_loses_nothing(kb: KnowledgeBase, case: str) -> None:
    good = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    good_ids = _doc_chunk_ids(kb, good.id)
    filename, data = bad_inputs()[case]
    row = kb.ingest_bytes(data, filename).document
    assert row.state == "failed"
    reason = row.failure_reason
    assert reason and len(reason) > 20 and "Traceback" not in reason
    assert row.chunk_count == 0
    assert kb.store.chunk_rows(row.id) == []
    assert good_ids & _search_ids(kb, "expense claims within 30 days")
    assert kb.indexes.check()["in_sync"] is True


def test_over_size_limit_is_refused_before_anything_is_stored(
    index_dir: Path, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, max_upload_bytes=1000), embedder=embedder)
    with pytest.raises(TooLarge, match="big.txt is 2000 bytes, over the 1000 bytes upload limit"):
        kb.ingest_bytes(b"word " * 400, "big.txt")
    assert kb.documents() == []
    assert not kb.store.originals_dir.exists()


def test_pdf_chunks_carry_pages(kb: KnowledgeBase) -> None:
    data = text_pdf(
        ["The first page talks about apples. " * 10, "The second page talks about pears. " * 10]
    )
    doc = kb.ingest_bytes(data, "fruit.pdf").document
    assert doc.state == "indexed" and doc.kind == "pdf"
    rows = kb.store.chunk_rows(doc.id)
    pages = {r["page"] for r in rows}
    assert pages == {1, 2}
    text = kb.canonical_text(doc.id)
    for r in rows:
        assert text[r["start"] : r["end"]] == r["content"]
        assert ("pears" in r["content"]) == (r["page"] == 2)


def test_retry_after_failure_and_interrupted_recovery(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    settings = IndexConfig(data_dir=index_dir, database_url=database_url)
    kb = KnowledgeBase(settings, embedder=embedder)
    added = kb.add_bytes(HANDBOOK, "handbook.md")
    # a process that died mid-indexing left the row 'indexing' under a lock nobody holds
    kb.store.mark_indexing(added.document.id, "deadbeefdeadbeef")
    reopened = KnowledgeBase(settings, embedder=embedder)
    row = reopened.store.document(added.document.id)
    assert row.state == "failed" and "interrupted" in row.failure_reason
    assert reopened.retry(row.id).state == "indexed"


def test_stale_documents_are_listed_and_reindex_clears_them(kb: KnowledgeBase) -> None:
    doc = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    kb.store.update_document(doc.id, pipeline_version="chunker-old")
    assert [d.id for d in kb.stale_documents()] == [doc.id]
    report = kb.reindex()
    assert report.stale_before == 1 and report.stale_after == 0
    assert report.documents == 1 and report.chunks == kb.store.document(doc.id).chunk_count
    assert kb.indexes.check()["in_sync"] is True


def test_other_model_vectors_are_never_searched(kb: KnowledgeBase) -> None:
    doc = kb.ingest_bytes(HANDBOOK, "handbook.md").document
    kb.store.update_document(doc.id, embedding_model="some/other-model")
    kb.store.set_meta("generation", str(kb.store.generation + 1))
    snap = kb.indexes.refresh()
    assert len(snap) == 0
    assert [d.id for d in kb.stale_documents()] == [doc.id]


def test_second_reindex_is_refused_while_one_runs(kb: KnowledgeBase) -> None:
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    with kb._reindex_lock():
        assert kb.reindex_running() is True
        with pytest.raises(ReindexInProgress):
            kb.reindex()
    assert kb.reindex_running() is False


def test_derived_indexes_rebuilt_when_they_disagree(index_dir: Path, embedder: Embedder) -> None:
    settings = IndexConfig(data_dir=index_dir)
    kb = KnowledgeBase(settings, embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    expected = sorted(kb.snapshot.vectors.ids().tolist())
    # corrupt one derived file and make the other stale
    kb.indexes.vectors_path.write_bytes(b"garbage")
    kb.store.set_meta("generation", str(kb.store.generation + 5))
    reopened = KnowledgeBase(settings, embedder=embedder)
    assert sorted(reopened.snapshot.vectors.ids().tolist()) == expected
    assert reopened.indexes.check()["in_sync"] is True


def test_persisted_indexes_are_reused_when_current(index_dir: Path, embedder: Embedder) -> None:
    settings = IndexConfig(data_dir=index_dir)
    kb = KnowledgeBase(settings, embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    mtime = kb.indexes.vectors_path.stat().st_mtime_ns
    reopened = KnowledgeBase(settings, embedder=embedder)
    assert reopened.indexes.check()["in_sync"] is True
    assert reopened.indexes.vectors_path.stat().st_mtime_ns == mtime


def test_folder_ingest_reports_other_file_types_as_skipped(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    folder = tmp_path / "share"
    (folder / "sub").mkdir(parents=True)
    (folder / "handbook.md").write_bytes(HANDBOOK)
    (folder / "sub" / "budget.numbers").write_bytes(b"PK\x03\x04 not really")
    (folder / ".hidden.md").write_text("# secret\n\nnot for the knowledge base\n")
    summary = kb.ingest_paths([folder])
    assert [d.name for d in summary.indexed] == ["handbook.md"]
    assert len(summary.skipped) == 1 and "budget.numbers" in summary.skipped[0]
    assert "not a supported type" in summary.skipped[0]
    assert [d.name for d in kb.store.documents()] == ["handbook.md"]


def test_failed_documents_are_deleted_after_the_retention_and_kept_before(
    index_dir: Path, embedder: Embedder
) -> None:
    config = IndexConfig(data_dir=index_dir, failed_retention_days=7)
    kb = KnowledgeBase(config, embedder=embedder)
    old = kb.ingest_bytes(b"\x00\x01 not a document", "old.bin").document
    young = kb.ingest_bytes(b"\x00\x02 not a document", "young.bin").document
    assert old.state == young.state == "failed"
    eight_days_ago = time.time() - 8 * 86400
    with kb.store.transaction() as db:
        db.execute("UPDATE documents SET updated_at = ? WHERE id = ?", [eight_days_ago, old.id])

    # At start-up: the expired one goes with its original, audited; the young one stays.
    reopened = KnowledgeBase(config, embedder=embedder)
    assert [d.id for d in reopened.documents()] == [young.id]
    assert not reopened.store.originals.has(old.sha256)
    assert reopened.store.originals.has(young.sha256)
    [entry] = [e for e in reopened.audit_log.entries() if e.document_id == old.id]
    assert entry.action == "remove" and entry.actor == "kb"
    assert entry.detail.startswith("failed for more than 7 days")

    # After an ingest, too.
    with reopened.store.transaction() as db:
        db.execute("UPDATE documents SET updated_at = ? WHERE id = ?", [eight_days_ago, young.id])
    reopened.ingest_bytes(HANDBOOK, "handbook.md")
    assert [d.name for d in reopened.documents()] == ["handbook.md"]
    assert reopened.purge_failed() == []
