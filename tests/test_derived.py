"""Incremental refresh of the derived indexes: equal to a rebuild, old snapshot untouched."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from index.models import Chunk
from index.records import Stamp
from index.search.bm25 import BM25Index
from index.search.derived import DerivedIndexes, Snapshot
from index.search.query_map import QueryAdapters
from index.search.tokens import ANALYZER, PLAIN
from index.storage.store import NewDocument, Store

DIM = 16
STAMP = Stamp("test/model", DIM, "pipeline-1", "extractor-1")
WORDS = [
    "leave",
    "vpn",
    "badge",
    "laptop",
    "expense",
    "receipt",
    "coffee",
    "room",
    "python",
    "report",
    "token",
    "proxy",
]
QUERIES = ["vpn token", "leave leave", "expense receipt coffee", "zeppelin", "python report"]

_seed = itertools.count()


def _add_doc(store: Store, name: str, n_chunks: int, *, scope: str = "*", extra: str = "") -> int:
    rng = np.random.default_rng(next(_seed))
    texts = [" ".join(rng.choice(WORDS, size=8)) + extra for _ in range(n_chunks)]
    vecs = rng.standard_normal((n_chunks, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    doc_id = store.insert_document(NewDocument(name=name, sha256=name, size=1, scope=scope))
    chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(texts)]
    store.commit_indexed(
        doc_id,
        chunks,
        vecs,
        [8] * n_chunks,
        canonical_text="",
        stamp=STAMP,
        window_splits=0,
    )
    return doc_id


@pytest.fixture
def store(index_dir: Path) -> Store:
    s = Store(index_dir)
    for n in range(6):
        _add_doc(s, f"doc{n}", 5, scope="C1" if n % 2 else "*")
    return s


@pytest.fixture
def indexes(store: Store) -> DerivedIndexes:
    derived = DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
    derived.rebuild()
    return derived


def _assert_same(snap: Snapshot, fresh: Snapshot) -> None:
    assert snap.generation == fresh.generation
    assert np.array_equal(snap.chunk_ids, fresh.chunk_ids)
    assert list(snap.scopes) == list(fresh.scopes)
    assert np.array_equal(np.asarray(snap.bm25.chunk_ids), fresh.chunk_ids)
    assert np.array_equal(np.sort(snap.vectors.ids()), fresh.chunk_ids)
    for q in QUERIES:
        assert snap.bm25.search(q, 100) == fresh.bm25.search(q, 100)
    query = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    assert snap.vectors.search(query, 10) == fresh.vectors.search(query, 10)
    allowed = fresh.allowed_ids(frozenset({"C1"}))
    assert np.array_equal(np.asarray(snap.allowed_ids(frozenset({"C1"}))), np.asarray(allowed))


def _refresh_then_rebuild(indexes: DerivedIndexes) -> tuple[Snapshot, Snapshot]:
    """The incremental refresh (a rebuild inside it fails the test), then a rebuild."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DerivedIndexes, "_rebuild_locked", lambda _: pytest.fail("rebuilt"))
        updated = indexes.refresh()
    assert indexes.check()["in_sync"] is True
    return updated, indexes.rebuild()


def test_refresh_after_ingest_equals_rebuild(store: Store, indexes: DerivedIndexes) -> None:
    old = indexes.snapshot
    old_hits = old.bm25.search("vpn token", 100)
    _add_doc(store, "new", 4, scope="C1", extra=" zeppelin")
    updated, fresh = _refresh_then_rebuild(indexes)
    assert len(updated) == len(old) + 4
    assert updated.bm25.search("zeppelin", 10)  # a term new to the index
    _assert_same(updated, fresh)
    # The old snapshot is untouched and still answers.
    assert len(old) == old.vectors.ntotal == len(old.bm25) == 30
    assert old.bm25.search("vpn token", 100) == old_hits
    assert not old.bm25.search("zeppelin", 10)


def test_refresh_after_removal_equals_rebuild(store: Store, indexes: DerivedIndexes) -> None:
    store.delete_document(2)
    updated, fresh = _refresh_then_rebuild(indexes)
    assert len(updated) == 25
    _assert_same(updated, fresh)


def test_refresh_after_new_version_equals_rebuild(store: Store, indexes: DerivedIndexes) -> None:
    new = _add_doc(store, "doc3-v2", 6, extra=" zeppelin")
    store.delete_document(3)
    updated, fresh = _refresh_then_rebuild(indexes)
    assert new in {r.id for r in store.documents()}
    _assert_same(updated, fresh)


def test_deleted_ids_are_never_reused(store: Store, indexes: DerivedIndexes) -> None:
    # AUTOINCREMENT: the ids of deleted last rows are not handed out again, so
    # an old link or snapshot entry never names a newer document's chunk.
    last = max(d.id for d in store.documents())
    before = set(indexes.snapshot.chunk_ids.tolist())
    store.delete_document(last)
    new_doc = _add_doc(store, "after-delete", 5, extra=" zeppelin")
    assert new_doc > last
    now = set(store.searchable_chunk_versions(STAMP.embedding_model, DIM)[0].tolist())
    assert min(now - before) > max(before)
    updated, fresh = _refresh_then_rebuild(indexes)
    assert updated.bm25.search("zeppelin", 10)
    _assert_same(updated, fresh)


def test_refresh_without_change_only_moves_the_generation(
    store: Store, indexes: DerivedIndexes
) -> None:
    old = indexes.snapshot
    store.set_meta("generation", str(store.generation + 1))
    snap = indexes.refresh()
    assert snap.generation == store.generation and snap.bm25 is old.bm25
    reopened = DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
    assert reopened.open().generation == store.generation  # persisted: no rebuild needed
    assert reopened.check()["in_sync"] is True


def test_large_change_falls_back_to_a_rebuild(
    store: Store, indexes: DerivedIndexes, monkeypatch: pytest.MonkeyPatch
) -> None:
    _add_doc(store, "big", 40)
    calls: list[int] = []
    real = DerivedIndexes._rebuild_locked

    def counting(self: DerivedIndexes) -> Snapshot:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(DerivedIndexes, "_rebuild_locked", counting)
    snap = indexes.refresh()
    assert calls == [1] and len(snap) == 70


def test_a_saved_bm25_index_of_the_old_tokenizer_is_rebuilt(
    store: Store, indexes: DerivedIndexes
) -> None:
    snap = indexes.snapshot
    texts = [r["text"] for r in store.searchable_chunks(STAMP.embedding_model, DIM)]
    # The file version 1 of the tokeniser wrote: same chunks and generation, no stemming.
    BM25Index(snap.chunk_ids, texts, analyzer=PLAIN).save(indexes.bm25_path, snap.generation)
    with np.load(indexes.bm25_path) as data:
        arrays = dict(data)
    meta = json.loads(arrays["meta"].tobytes().decode())
    arrays["meta"] = np.frombuffer(json.dumps({**meta, "tokenizer": 1}).encode(), dtype=np.uint8)
    with open(indexes.bm25_path, "wb") as f:
        np.savez(f, **arrays)

    reopened = DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
    opened = reopened.open()
    assert opened.bm25.analyzer == ANALYZER
    assert opened.bm25.search("reports", 100) == snap.bm25.search("report", 100) != []
    # Rebuilt on disk too: the next process loads it as it is.
    loaded, generation = BM25Index.load(indexes.bm25_path)
    assert generation == store.generation and loaded.analyzer == ANALYZER


def test_reading_the_rows_holds_the_vectors_once(index_dir: Path) -> None:
    import tracemalloc

    from index.search.derived import _Rows

    dim, n = 512, 4000
    store = Store(index_dir)
    stamp = Stamp("test/wide", dim, "pipeline-1", "extractor-1")
    vecs = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    doc_id = store.insert_document(NewDocument(name="wide", sha256="wide", size=1))
    chunks = [Chunk(i, 0, 1, "x", "x", "") for i in range(n)]
    store.commit_indexed(
        doc_id, chunks, vecs, [1] * n, canonical_text="", stamp=stamp, window_splits=0
    )
    tracemalloc.start()
    try:
        rows = _Rows.read(store.searchable_chunks("test/wide", dim), dim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(rows.vectors, vecs)
    # The vectors' bytes once, plus the buffer's growth room and the small columns.
    assert peak < 1.4 * vecs.nbytes, (peak, vecs.nbytes)


def test_a_vector_of_the_wrong_size_is_refused_not_shifted_into_the_next(index_dir: Path) -> None:
    from index.errors import IndexOutOfSync
    from index.search.derived import _Rows

    good, bad = np.ones(DIM, dtype=np.float32).tobytes(), b"\0" * (DIM * 4 - 4)
    rows = [
        {"id": 1, "scope": "*", "text": "a", "vector": good, "version": 1.0},
        {"id": 2, "scope": "*", "text": "b", "vector": bad + good[:4], "version": 1.0},
        {"id": 3, "scope": "*", "text": "c", "vector": bad, "version": 1.0},
    ]
    assert _Rows.read(rows[:2], DIM).vectors.shape == (2, DIM)
    with pytest.raises(IndexOutOfSync, match="Chunk 3"):
        _Rows.read(rows, DIM)


def test_a_reopened_snapshot_reads_the_chunks_index_never_their_rows(
    store: Store, indexes: DerivedIndexes
) -> None:
    """What a start reads of every chunk (the saved snapshot's ids, versions, scopes and
    languages; the query map's count; the language counts) comes from the index on the
    chunks' document, language and id: their rows (texts and vectors, 400 MB at 100k chunks)
    are never scanned, and the snapshot is the one a rebuild makes."""
    built = indexes.snapshot
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    try:
        reopened = DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
        snap = reopened.open()
        adapters = QueryAdapters(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
        adapters.refit_if_due()
        counts = store.language_counts()
    finally:
        store.db.conn.set_trace_callback(None)
    _assert_same(snap, built)
    assert snap.versions is not None and built.versions is not None
    assert np.array_equal(snap.versions, built.versions)
    assert snap.languages is not None and built.languages is not None
    assert list(snap.languages) == list(built.languages)
    assert sum(counts.values()) == len(snap) == 30
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "chunks" in s]
    assert len(reads) >= 3
    plans = {s: [row[3] for row in store.db.conn.execute(f"EXPLAIN QUERY PLAN {s}")] for s in reads}
    # "SCAN c" alone reads the table; "SCAN c USING COVERING INDEX ..." only the index.
    scans = {s: p for s, p in plans.items() if any(_scans_the_rows(d) for d in p)}
    assert scans == {}


def _scans_the_rows(detail: str) -> bool:
    return detail.split()[:2] in (["SCAN", "c"], ["SCAN", "chunks"]) and "INDEX" not in detail
