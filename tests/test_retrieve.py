"""Hybrid retrieval: the two legs and how they are fused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.retrieve import FUSION, Fusion, LocalBackend, Mode, fuse, rrf, score_fusion
from index.models import Chunk
from index.records import Stamp
from index.search.derived import DerivedIndexes
from index.storage.store import NewDocument, Store

DIM = 4
STAMP = Stamp("test/model", DIM, "pipeline-1", "extractor-1")


def test_rrf_sums_weighted_reciprocal_ranks() -> None:
    fused = dict(rrf([[1, 2], [2, 3]], k=10, weights=[1.0, 0.5]))
    assert fused == pytest.approx({1: 1 / 11, 2: 1 / 12 + 0.5 / 11, 3: 0.5 / 12})
    assert rrf([[1, 2], [2, 1]], k=60) == rrf([[1, 2], [2, 1]], k=60, weights=[1.0, 1.0])
    assert [i for i, _ in rrf([[1, 2], [2, 1]])] == [1, 2]  # a tie keeps first-seen order


def test_score_fusion_normalises_each_list() -> None:
    fused = score_fusion([[(1, 9.0), (2, 6.0), (3, 3.0)], [(3, 0.2), (4, 0.1)]], [1.0, 0.5])
    assert dict(fused) == pytest.approx({1: 1.0, 2: 0.5, 3: 0.5, 4: 0.0})
    assert [i for i, _ in fused] == [1, 2, 3, 4]
    # A list of equal scores gives each item full weight; an empty list adds nothing.
    assert score_fusion([[(7, 2.0), (8, 2.0)], []], [0.5, 1.0]) == [(7, 0.5), (8, 0.5)]


def test_fusing_turns_distances_into_scores() -> None:
    dense = [(1, 0.1), (2, 0.3), (3, 0.5)]
    sparse = [(3, 10.0), (4, 5.0)]
    by_score = fuse(dense, sparse, Fusion(method="score", sparse=0.5))
    assert dict(by_score) == pytest.approx({1: 1.0, 2: 0.5, 3: 0.5, 4: 0.0})
    by_rank = fuse(dense, sparse, Fusion(k=60, sparse=0.5))
    assert dict(by_rank) == pytest.approx(dict(rrf([[1, 2, 3], [3, 4]], 60, [1.0, 0.5])))
    # One leg alone keeps its own order, whatever the method.
    for fusion in (Fusion(), Fusion(method="score")):
        assert [i for i, _ in fuse(dense, [], fusion)] == [1, 2, 3]
        assert [i for i, _ in fuse([], sparse, fusion)] == [3, 4]


def test_the_product_lifts_a_clear_bm25_winner_among_dense_near_ties() -> None:
    dense = [(1, 0.30), (2, 0.31), (3, 0.32), (4, 0.60)]
    sparse = [(3, 12.0), (1, 1.0), (2, 0.9)]  # an identifier only chunk 3 holds
    assert fuse(dense, sparse, FUSION)[0][0] == 3
    assert fuse(dense, sparse, Fusion())[0][0] == 1  # ranks alone: RRF keeps the dense first


def test_the_product_keeps_a_clear_dense_winner_over_bm25() -> None:
    dense = [(1, 0.10), (2, 0.50), (3, 0.52)]
    sparse = [(2, 10.0), (1, 1.0)]  # half weight: BM25 alone cannot overturn a wide gap
    assert [i for i, _ in fuse(dense, sparse, FUSION)][:2] == [1, 2]


# ---------------------------------------------------------------- the local backend

TEXTS = [
    "Guide > VPN\nReset the VPN password in the self-service portal.",
    "Guide > Errors\nERR_42 means the access token expired.",
    "Guide > Badges\nReception replaces lost badges.",
    "Guide > Leave\nAnnual leave is 25 days a year.",
]
# Unit vectors: chunk i points mostly along axis i.
VECTORS = np.eye(DIM, dtype=np.float32) * 0.9 + 0.1
VECTORS /= np.linalg.norm(VECTORS, axis=1, keepdims=True)


@pytest.fixture
def backend(index_dir: Path) -> LocalBackend:
    store = Store(index_dir)
    doc_id = store.insert_document(NewDocument(name="guide", sha256="guide", size=1, scope="*"))
    chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(TEXTS)]
    store.commit_indexed(
        doc_id, chunks, VECTORS, [8] * len(TEXTS), canonical_text="", stamp=STAMP, window_splits=0
    )
    return LocalBackend(
        DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
    )


def test_hybrid_search_is_the_product_fusion_of_both_legs(backend: LocalBackend) -> None:
    query = VECTORS[3]  # the dense leg points at the leave chunk
    snap = backend.indexes.snapshot
    got = backend.search(query, "ERR_42 token", None, 4, Mode.HYBRID)
    dense = snap.vectors.search(query, backend.depth)
    sparse = snap.bm25.search("ERR_42 token", backend.depth)
    assert [(c.chunk_id, c.score) for c in got] == fuse(dense, sparse, FUSION)[:4]
    assert {got[0].chunk_id, got[1].chunk_id} == {dense[0][0], sparse[0][0]}
    # Every candidate carries its dense distance, found by BM25 or not.
    distances = snap.vectors.distances_for(query, [c.chunk_id for c in got])
    assert all(c.distance == pytest.approx(distances[c.chunk_id]) for c in got)
    errors = next(c for c in got if c.chunk_id == sparse[0][0])
    assert errors.sparse_rank == 1 and errors.dense_rank is not None


def test_another_word_form_reaches_the_chunk_through_bm25(backend: LocalBackend) -> None:
    query = VECTORS[0]  # dense says VPN; BM25 must still bring the badge chunk
    got = backend.search(query, "who replaced my badge", None, 4, Mode.BM25)
    snap = backend.indexes.snapshot
    badge = int(snap.chunk_ids[2])
    assert [c.chunk_id for c in got] == [badge]
    assert got[0].distance == pytest.approx(snap.vectors.distances_for(query, [badge])[badge])
