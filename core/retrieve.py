"""Hybrid retrieval: dense (FAISS) + sparse (BM25), fused by reciprocal rank fusion.

Every search goes through ``RetrievalBackend.search`` so that the local
FAISS + BM25 pair and a distributed engine (the planned Qdrant backend) are two
implementations of one narrow contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from index.derived import DerivedIndexes

# Cormack, Clarke & Buettcher (2009), "Reciprocal rank fusion outperforms
# Condorcet and individual rank learning methods": k = 60; ranks only, so
# cosine distances and BM25 scores never need a common scale.
RRF_K = 60
# How deep each leg looks before fusion. Wider than top_k so that a chunk
# ranked modestly by both legs can still win the fusion.
DEFAULT_DEPTH = 25


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
        score: fused RRF score (higher is better).
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


def rrf(lists: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: ``score = sum 1 / (k + rank)`` over the lists, best first.

    Ties keep the order in which ids were first seen, so results are stable.
    """
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, item in enumerate(ranked, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


class LocalBackend:
    """FAISS + BM25 over the data dir's current snapshot; scope filters run inside each leg.

    Args:
        indexes: the derived indexes of a knowledge base.
        depth: how many candidates each leg contributes before fusion.
    """

    def __init__(self, indexes: DerivedIndexes, *, depth: int = DEFAULT_DEPTH) -> None:
        self.indexes = indexes
        self.depth = depth

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
        fused = rrf([lst for lst in (dense_ids, sparse_ids) if lst])[:k]
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
