"""Hybrid retrieval: the two legs and how they are fused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.retrieve import FUSION, Fusion, LocalBackend, Mode, fuse, rrf, score_fusion
from index.models import Chunk
from index.records import Stamp
from index.search.derived import DerivedIndexes
from index.search.fusion import Feedback, fused_candidates
from index.search.vectors import VectorIndex
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


# ---------------------------------------------------------------- the dense leg searched again

# The question points along x. Chunk 1 is its nearest; chunk 3 the second
# nearest; chunk 2 lies beyond 3 from the question but next to chunk 1; chunk 4
# is far from all of them and from the question.
FEEDBACK_VECTORS = {
    1: (0.9, 0.436, 0.0),
    2: (0.6, 0.8, 0.0),
    3: (0.7, -0.714, 0.0),
    4: (0.0, -0.6, 0.8),
}
QUESTION_VECTOR = np.array([1.0, 0.0, 0.0], dtype=np.float32)


def _feedback_index() -> VectorIndex:
    index = VectorIndex(3)
    vectors = np.array(list(FEEDBACK_VECTORS.values()), dtype=np.float32)
    index.add(list(FEEDBACK_VECTORS), vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    return index


def _searched(
    index: VectorIndex,
    feedback: Feedback | None,
    *,
    sparse: list[tuple[int, float]] | None = None,
    fusion: Fusion = FUSION,
    mode: Mode = Mode.HYBRID,
) -> list[tuple[int, float, int | None]]:
    """The fused candidates of the question, dense leg two deep: ``(chunk, distance, dense rank)``."""
    found = fused_candidates(
        index.search(QUESTION_VECTOR, 2) if mode != Mode.BM25 else [],
        sparse or [],
        fusion,
        2,
        mode,
        adapters=None,
        query_vector=QUESTION_VECTOR,
        distances_for=index.distances_for,
        feedback=feedback,
        nearest=lambda vector, n: index.search(vector, n),
        vectors_of=index.vectors_for,
    )
    return [(c.chunk_id, round(c.distance, 4), c.dense_rank) for c in found]


def test_the_dense_leg_searched_again_from_the_first_passage_reaches_its_neighbour() -> None:
    index = _feedback_index()
    once = _searched(index, None)
    assert [cid for cid, _, _ in once] == [1, 3]
    again = _searched(index, Feedback(weight=0.7, passages=1))
    # Moved toward chunk 1, the question finds chunk 2 before chunk 3.
    assert [cid for cid, _, _ in again] == [1, 2]
    # Every distance is still the question's own; chunk 2 was not in its dense leg.
    assert again[0] == once[0]
    assert again[1] == (2, round(1.0 - 0.6, 4), None)


def test_the_second_search_never_drops_the_questions_nearest_passage() -> None:
    index = _feedback_index()
    # BM25 alone puts chunk 4 first (weighed 2); moved far toward it, the second
    # dense leg (chunks 4 and 3) no longer holds chunk 1, the question's nearest.
    strong = Fusion(method="score", sparse=2.0)
    once = _searched(index, None, sparse=[(4, 9.0)], fusion=strong)
    assert [cid for cid, _, _ in once] == [4, 1]
    again = _searched(index, Feedback(weight=5.0), sparse=[(4, 9.0)], fusion=strong)
    assert [cid for cid, _, _ in again] == [4, 1]
    assert min(d for _, d, _ in again) == min(d for _, d, _ in once) == round(1.0 - 0.9, 4)
    # Without the feedback's guard, the second leg's fusion alone would drop it.
    moved = QUESTION_VECTOR + 5.0 * index.vectors_for([4])[4]
    leg = index.search(moved / np.linalg.norm(moved), 2)
    assert 1 not in [cid for cid, _ in fuse(leg, [(4, 9.0)], strong)[:2]]


def test_only_the_hybrid_order_is_searched_again() -> None:
    index = _feedback_index()
    feedback = Feedback(weight=0.7)
    for mode in (Mode.DENSE, Mode.BM25):
        sparse = [(2, 3.0), (3, 1.0)]
        assert _searched(index, feedback, sparse=sparse, mode=mode) == _searched(
            index, None, sparse=sparse, mode=mode
        )
    assert _searched(index, Feedback(weight=0.0)) == _searched(index, None)
