"""The query map learnt from the knowledge base: fitted from its own sentences, stored in the
store stamped with its model, refitted as the corpus changes, applied only to the hybrid order."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from bot.settings import Settings
from index.config import IndexConfig
from index.embed import Embedder, EmbeddingModelUnavailable
from index.ingest import sentence_texts
from index.knowledge_base import KnowledgeBase
from index.search import query_map
from index.search.contract import Mode
from index.search.query_map import (
    QueryAdapter,
    QueryAdapterError,
    QueryAdapters,
    fit_matrix,
)
from tests.evalmini import EVALMINI

CORPUS = EVALMINI / "corpus"
QUESTIONS = [
    "my laptop can't reach the office network from home",
    "who signs off a taxi receipt?",
    "the build farm queue is stuck",
    "How do I reset the VPN token?",
]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_the_fit_learns_a_distortion_between_anchors_and_their_chunks() -> None:
    rng = np.random.default_rng(1)
    dim, n = 16, 300
    chunks = _unit(rng.normal(size=(n, dim))).astype(np.float32)
    distortion = np.eye(dim) + 0.6 * rng.normal(size=(dim, dim)) / np.sqrt(dim)

    def anchors(m: int) -> tuple[np.ndarray, np.ndarray]:
        owners = rng.integers(0, n, m)
        noisy = chunks[owners] @ distortion.T + 0.25 * rng.normal(size=(m, dim))
        return _unit(noisy).astype(np.float32), owners

    train, owners = anchors(4000)
    held_out, held_owners = anchors(1000)

    def top1(matrix: np.ndarray) -> float:
        found = (_unit(held_out @ matrix.T) @ chunks.T).argmax(axis=1)
        return float((found == held_owners).mean())

    matrix = fit_matrix(train, owners, chunks)
    assert top1(matrix) >= top1(np.eye(dim)) + 0.08  # 0.42 -> 0.55 here
    assert np.array_equal(matrix, fit_matrix(train, owners, chunks))  # seeded: the same map


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_the_fit_runs_on_one_blas_thread_and_gives_the_process_its_threads_back() -> None:
    # The library's threads are made at import at normal priority: more than one would
    # escape the server's lowered fit thread. Asked before each batch, as the server asks.
    rng = np.random.default_rng(2)
    chunks = _unit(rng.normal(size=(50, 8))).astype(np.float32)
    owners = rng.integers(0, 50, 200)
    seen: list[list[int]] = []

    def stopped() -> bool:
        seen.append(_blas_threads())
        return False

    with threadpool_limits(limits=2, user_api="blas"):
        assert _blas_threads() and set(_blas_threads()) == {2}
        fit_matrix(chunks[owners], owners, chunks, stopped=stopped)
        assert seen and all(set(threads) == {1} for threads in seen)
        assert set(_blas_threads()) == {2}


def test_a_stored_map_reads_back_and_a_damaged_one_is_refused() -> None:
    matrix = np.arange(9, dtype=np.float32).reshape(3, 3)
    adapter = QueryAdapter(matrix, "model-a", chunks=10, anchors=70, fitted_at=5.0)
    back = QueryAdapter.from_meta(adapter.to_meta())
    assert np.array_equal(back.matrix, matrix)
    assert (back.embedding_model, back.chunks, back.anchors) == ("model-a", 10, 70)
    vector = back.apply(np.array([1.0, 0.0, 0.0]))
    assert np.linalg.norm(vector) == pytest.approx(1.0)
    overflowing = adapter.to_meta().replace('"chunks": 10', '"chunks": 1e999')
    for damaged in (
        overflowing,
        "not json",
        '{"dimensions": 3}',
        adapter.to_meta().replace('"matrix": "', '"matrix": "!'),
    ):
        with pytest.raises(QueryAdapterError, match="cannot be read"):
            QueryAdapter.from_meta(damaged)
    nan = QueryAdapter(np.full((3, 3), np.nan, dtype=np.float32), "model-a", 1, 1, 1.0)
    with pytest.raises(QueryAdapterError, match="not numbers"):
        QueryAdapter.from_meta(nan.to_meta())


@pytest.fixture
def kb(evalmini_kb: KnowledgeBase) -> KnowledgeBase:
    """The corpus ingested (a copy of the session's ingest: the map it fitted included)."""
    return evalmini_kb


def _sentences_stored(kb: KnowledgeBase) -> int:
    ids = [int(r[0]) for r in kb.store.db.execute("SELECT id FROM chunks").fetchall()]
    return sum(len(m) for m in kb.store.sentence_vectors(ids).values())


def test_ingesting_fits_a_map_stamped_with_the_model_and_shown_in_status(
    kb: KnowledgeBase, embedder: Embedder
) -> None:
    adapter = kb.query_adapters.current()
    assert adapter is not None
    assert adapter.embedding_model == embedder.name and adapter.dimensions == embedder.dim
    assert adapter.chunks == kb.store.chunk_count()
    assert adapter.anchors == _sentences_stored(kb)
    assert not np.allclose(adapter.matrix, np.eye(embedder.dim), atol=1e-3)
    assert kb.status()["query_map"] == adapter.describe()


def test_the_map_reorders_hybrid_search_and_leaves_every_distance_to_the_model(
    kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    plain = KnowledgeBase(IndexConfig(data_dir=index_dir, query_adapter=False), embedder=embedder)
    assert plain.query_adapters.current() is None
    reordered = 0
    for question in QUESTIONS:
        vector = embedder.encode_query(question)
        mapped = kb.search_index.search(vector, question, None, 20, Mode.HYBRID)
        model = plain.search_index.search(vector, question, None, 20, Mode.HYBRID)
        reordered += [c.chunk_id for c in mapped] != [c.chunk_id for c in model]
        truth = plain.search_index.distances_for(vector, [c.chunk_id for c in mapped])
        assert [c.distance for c in mapped] == pytest.approx([truth[c.chunk_id] for c in mapped])
        for mode in (Mode.DENSE, Mode.BM25):
            assert kb.search_index.search(vector, question, None, 20, mode) == (
                plain.search_index.search(vector, question, None, 20, mode)
            )
    assert reordered  # the map is applied: some question's fused order moves


def test_the_map_is_refitted_when_the_corpus_changes_by_a_tenth_and_forgotten_when_empty(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    first = kb.query_adapters.current()
    assert first is not None
    more = tmp_path / "more"
    more.mkdir()
    text = (CORPUS / "kestrel-vpn.md").read_text()
    (more / "kestrel-vpn-2027.md").write_text(text.replace("Kestrel", "Osprey"))
    kb.ingest_paths([more])  # a third more chunks
    refitted = kb.query_adapters.current()
    assert refitted is not None and refitted.stamp() != first.stamp()
    assert refitted.chunks == kb.store.chunk_count() > first.chunks
    note = tmp_path / "note"
    note.mkdir()
    (note / "canteen.md").write_text("# Canteen\n\nThe canteen opens at eight.\n")
    kb.ingest_paths([note])  # one chunk more: under a tenth, the map stays
    kept = kb.query_adapters.current()
    assert kept is not None and kept.stamp() == refitted.stamp()
    for doc in kb.documents():
        kb.remove(doc.id)
    assert kb.query_adapters.current() is None
    assert (
        kb.store.get_meta(kb.query_adapters.map_key) is None
        and kb.status()["query_map"] == "none yet"
    )


def test_a_map_of_another_model_or_a_damaged_map_is_never_applied(
    kb: KnowledgeBase, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    other = QueryAdapter(np.eye(embedder.dim, dtype=np.float32), "another-model", 19, 71, 9.0)
    kb.store.set_meta(kb.query_adapters.map_key, other.to_meta())
    kb.store.set_meta(kb.query_adapters.stamp_key, other.stamp())
    reader = QueryAdapters(
        kb.store, embedding_model=embedder.name, dimensions=embedder.dim, reload_seconds=0
    )
    assert reader.current() is None
    kb.store.set_meta(kb.query_adapters.map_key, "{damaged")
    kb.store.set_meta(kb.query_adapters.stamp_key, "damaged")
    with caplog.at_level(logging.WARNING, logger="index.search.query_map"):
        assert reader.current() is None
    assert "cannot be read" in caplog.text
    # A search through a knowledge base holding the damaged map still answers, in the model's order.
    kb.query_adapters.reload_seconds = 0
    vector = embedder.encode_query(QUESTIONS[0])
    assert kb.search_index.search(vector, QUESTIONS[0], None, 4, Mode.HYBRID)
    # The next write that is due fits a good map again.
    assert kb.query_adapters.refit_if_due(force=True) is not None


def test_a_fit_that_fails_never_fails_the_write_and_keeps_the_previous_map(
    kb: KnowledgeBase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = kb.query_adapters.current()
    assert first is not None
    # One damaged sentence-vector blob (not a whole number of floats): reading it fails.
    kb.store.db.execute(
        "UPDATE chunks SET sentence_vectors = x'00' WHERE id = (SELECT MIN(id) FROM chunks)"
    )
    kb.store.db.conn.commit()
    more = tmp_path / "more"
    more.mkdir()
    text = (CORPUS / "kestrel-vpn.md").read_text()
    (more / "kestrel-vpn-2027.md").write_text(text.replace("Kestrel", "Osprey"))
    with caplog.at_level(logging.WARNING, logger="index.search.query_map"):
        summary = kb.ingest_paths([more])  # a third more chunks: a refit is due, and fails
    assert [d.name for d in summary.indexed] == ["kestrel-vpn-2027.md"]
    assert "query map not fitted" in caplog.text
    kept = kb.query_adapters.current()
    assert kept is not None and kept.stamp() == first.stamp()


def test_another_process_sees_a_new_map_once_it_looks_again(
    index_dir: Path, embedder: Embedder
) -> None:
    reader = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    # Not looked again until the test says so, however long the ingest below takes.
    reader.query_adapters.reload_seconds = float("inf")
    assert reader.query_adapters.current() is None  # cached: nothing fitted yet
    writer = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    writer.ingest_paths([CORPUS])
    assert reader.query_adapters.current() is None  # not looked again yet
    reader.query_adapters.reload_seconds = 0
    seen, fitted = reader.query_adapters.current(), writer.query_adapters.current()
    assert seen is not None and fitted is not None and seen.stamp() == fitted.stamp()


def test_the_setting_turns_it_off(
    index_dir: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_QUERY_ADAPTER", "false")
    config = Settings().index_config()
    assert config.query_adapter is False
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, query_adapter=False), embedder=embedder)
    kb.ingest_paths([CORPUS])
    assert kb.store.get_meta(kb.query_adapters.map_key) is None
    assert kb.status()["query_map"] == "off"


def test_too_few_sentences_fit_no_map(index_dir: Path, embedder: Embedder, tmp_path: Path) -> None:
    few = tmp_path / "few"
    few.mkdir()
    shutil.copy(CORPUS / "kestrel-vpn.md", few)
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    kb.ingest_paths([few])
    assert 0 < _sentences_stored(kb) < 64
    assert (
        kb.query_adapters.current() is None and kb.store.get_meta(kb.query_adapters.map_key) is None
    )


class _Counted:
    """The real model, each ``encode`` call's texts and role noted (or refused, if ``fails``)."""

    def __init__(self, embedder: Embedder, *, fails: bool = False) -> None:
        self.embedder, self.fails = embedder, fails
        self.calls: list[tuple[list[str], str]] = []
        self.dim = embedder.dim

    def encode(
        self,
        texts: list[str],
        *,
        role: str = "document",
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        self.calls.append((list(texts), role))
        if self.fails:
            raise EmbeddingModelUnavailable("The model's files went away while encoding.")
        return self.embedder.encode(texts, role=role, on_batch=on_batch)  # type: ignore[arg-type]


def test_a_model_that_pools_sentences_fits_on_at_most_alone_sentences_encoded_alone(
    kb: KnowledgeBase, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = _sentences_stored(kb)
    monkeypatch.setattr(query_map, "ALONE", 70)
    assert query_map.MIN_ANCHORS <= 70 < stored
    counted = _Counted(embedder)
    ids, _ = kb.store.searchable_chunk_versions(embedder.name, embedder.dim)
    adapter = query_map.fit(kb.store, embedder.name, embedder.dim, ids, encoder=counted)  # type: ignore[arg-type]
    assert adapter is not None and adapter.anchors == 70
    ((texts, role),) = counted.calls  # one call, the sample only
    assert role == "document" and len(texts) == 70
    rows = kb.store.chunks_by_id([int(i) for i in ids])
    every = {s for r in rows.values() for s in sentence_texts(r.text, r.content)}
    assert set(texts) <= every  # as the sentence leg embeds them without one pass
    from_stored = query_map.fit(kb.store, embedder.name, embedder.dim, ids)
    assert from_stored is not None and from_stored.anchors == stored
    assert not np.allclose(adapter.matrix, from_stored.matrix, atol=1e-3)


def test_a_model_that_fails_while_encoding_for_the_fit_keeps_the_previous_map_and_logs(
    kb: KnowledgeBase, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    first = kb.query_adapters.current()
    assert first is not None
    failing = _Counted(embedder, fails=True)
    kb.query_adapters.encoder = failing  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="index.search.query_map"):
        kept = kb.query_adapters.refit_if_due(force=True)
    assert failing.calls  # the fit did ask the model
    assert "query map not fitted (EmbeddingModelUnavailable" in caplog.text
    assert kept is not None and kept.stamp() == first.stamp()
    assert kb.store.get_meta(kb.query_adapters.stamp_key) == first.stamp()
