"""Hybrid retrieval: dense (FAISS) + sparse (BM25), fused on normalised scores.

Each leg's scores are min-max normalised over its own list and summed with
weights dense 1.0, BM25 0.5. Measured against reciprocal rank fusion (RRF,
equal or weighted legs, several k) on both bundled evaluation sets with
``bench/levers.py``: RRF throws away how far ahead a leg's first chunk is,
which is what decides most questions here (docs/evaluation.md, "What was
tried"). RRF stays available as ``Fusion(method="rrf")``.

Every search goes through ``RetrievalBackend.search`` so that the local
FAISS + BM25 pair and a distributed engine (the planned Qdrant backend) are two
implementations of one narrow contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol

import numpy as np

from index.derived import DerivedIndexes

# Cormack, Clarke & Buettcher (2009), "Reciprocal rank fusion outperforms
# Condorcet and individual rank learning methods": k = 60.
RRF_K = 60
# How deep each leg looks before fusion. Wider than top_k so that a chunk
# ranked modestly by both legs can still win the fusion.
DEFAULT_DEPTH = 25


@dataclass(frozen=True)
class Fusion:
    """How the dense and BM25 lists become one (``bench/levers.py`` measures the choices).

    Attributes:
        method: ``rrf`` sums ``weight / (k + rank)``; ``score`` sums each leg's
            scores min-max normalised over its own list (0 when absent).
        k: the RRF constant.
        dense: the dense leg's weight.
        sparse: the BM25 leg's weight.
    """

    method: Literal["rrf", "score"] = "rrf"
    k: int = RRF_K
    dense: float = 1.0
    sparse: float = 1.0


# The product's fusion. BM25 weighs half: its list is noisier (any shared
# word scores), but a clear BM25 winner (an identifier, a rare term) still
# moves up past dense near-ties.
FUSION = Fusion(method="score", sparse=0.5)


class Mode(StrEnum):
    """Which legs a search uses (the evaluation compares all three)."""

    DENSE = "dense"
    BM25 = "bm25"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class Candidate:
    """One retrieved chunk.

    Attributes:
        chunk_id: the chunk.
        distance: dense cosine distance ``1 - ip`` in [0, 2], also for chunks
            only BM25 found, so the gate can judge every candidate alike.
        score: fused score (higher is better; its scale depends on ``Fusion``).
        dense_rank: 1-based rank in the dense list, if it was there.
        sparse_rank: 1-based rank in the BM25 list, if it was there.
    """

    chunk_id: int
    distance: float
    score: float
    dense_rank: int | None = None
    sparse_rank: int | None = None


class RetrievalBackend(Protocol):
    """What any search engine behind the bot must offer."""

    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
    ) -> list[Candidate]:
        """Best ``k`` chunks visible to ``scopes`` (``None``: all), each with its dense distance."""
        ...


def rrf(
    lists: Sequence[Sequence[int]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: ``score = sum weight / (k + rank)`` over the lists, best first.

    Ties keep the order in which ids were first seen, so results are stable.
    """
    scores: dict[int, float] = {}
    for i, ranked in enumerate(lists):
        weight = 1.0 if weights is None else weights[i]
        for rank, item in enumerate(ranked, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def score_fusion(
    lists: Sequence[Sequence[tuple[int, float]]], weights: Sequence[float]
) -> list[tuple[int, float]]:
    """Weighted sum of each list's scores (higher is better), min-max normalised per list.

    A list's best item scores 1 and its last 0 (a list of equal scores: all 1);
    an item absent from a list gets 0 from it. Ties keep first-seen order.
    """
    scores: dict[int, float] = {}
    for ranked, weight in zip(lists, weights, strict=True):
        if not ranked:
            continue
        values = [v for _, v in ranked]
        low, span = min(values), max(values) - min(values)
        for item, value in ranked:
            norm = (value - low) / span if span > 0 else 1.0
            scores[item] = scores.get(item, 0.0) + weight * norm
    return sorted(scores.items(), key=lambda kv: -kv[1])


def fuse(
    dense: Sequence[tuple[int, float]], sparse: Sequence[tuple[int, float]], fusion: Fusion
) -> list[tuple[int, float]]:
    """One list from the dense ``(id, distance)`` and BM25 ``(id, score)`` lists, best first."""
    if fusion.method == "score":
        similarity = [(cid, -d) for cid, d in dense]  # any decreasing map: it is normalised
        return score_fusion([similarity, sparse], [fusion.dense, fusion.sparse])
    pairs = [(lst, w) for lst, w in ((dense, fusion.dense), (sparse, fusion.sparse)) if lst]
    return rrf([[cid for cid, _ in lst] for lst, _ in pairs], fusion.k, [w for _, w in pairs])


def sentence_order(
    candidates: Sequence[Candidate],
    query_vector: np.ndarray,
    sentence_vectors: dict[int, np.ndarray],
    weight: float,
) -> list[Candidate]:
    """The same candidates, re-ordered with each one's best sentence as a third fused leg.

    Each candidate's fused score gains ``weight`` times its best sentence's
    cosine similarity to the query, min-max normalised over the candidates (as
    ``score_fusion`` normalises a leg); a chunk without sentence vectors (one
    sentence, or indexed before they existed) counts its own similarity. Only
    the order changes: distances stay the chunk's, so the gate and everything
    shown or logged judge as before. Meant for score fusion (``FUSION``),
    whose scores share the leg's scale. Ties keep the fused order.
    """
    if weight <= 0 or len(candidates) < 2:
        return list(candidates)
    best = [
        float((m @ query_vector).max())
        if (m := sentence_vectors.get(c.chunk_id)) is not None
        else 1.0 - c.distance
        for c in candidates
    ]
    low, span = min(best), max(best) - min(best)
    scores = [
        c.score + weight * ((b - low) / span if span > 0 else 1.0)
        for c, b in zip(candidates, best, strict=True)
    ]
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])
    return [candidates[i] for i in order]


class LocalBackend:
    """FAISS + BM25 over the data dir's current snapshot; scope filters run inside each leg.

    Args:
        indexes: the derived indexes of a knowledge base.
        depth: how many candidates each leg contributes before fusion.
        fusion: how the two legs are fused.
    """

    def __init__(
        self, indexes: DerivedIndexes, *, depth: int = DEFAULT_DEPTH, fusion: Fusion = FUSION
    ) -> None:
        self.indexes = indexes
        self.depth = depth
        self.fusion = fusion

    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
    ) -> list[Candidate]:
        """See ``RetrievalBackend.search``."""
        snap = self.indexes.snapshot
        if len(snap) == 0:
            return []
        allowed = snap.allowed_ids(scopes)
        if allowed is not None and allowed.size == 0:
            return []
        depth = max(k, self.depth)
        dense = snap.vectors.search(query_vector, depth, allowed) if mode != Mode.BM25 else []
        sparse = snap.bm25.search(query_text, depth, allowed) if mode != Mode.DENSE else []
        dense_ids = [cid for cid, _ in dense]
        sparse_ids = [cid for cid, _ in sparse]
        fused = fuse(dense, sparse, self.fusion)[:k]
        distances = dict(dense)
        missing = [cid for cid, _ in fused if cid not in distances]
        if missing:
            distances.update(snap.vectors.distances_for(query_vector, missing))
        dense_rank = {cid: i for i, cid in enumerate(dense_ids, start=1)}
        sparse_rank = {cid: i for i, cid in enumerate(sparse_ids, start=1)}
        return [
            Candidate(
                chunk_id=cid,
                distance=float(distances[cid]),
                score=score,
                dense_rank=dense_rank.get(cid),
                sparse_rank=sparse_rank.get(cid),
            )
            for cid, score in fused
        ]
