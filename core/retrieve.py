"""Hybrid retrieval: dense (FAISS) + sparse (BM25), fused on normalised scores.

Each leg's scores are min-max normalised over its own list and summed with
weights dense 1.0, BM25 0.5. Measured against reciprocal rank fusion (RRF,
equal or weighted legs, several k) on both bundled evaluation sets with
``bench/levers.py``: RRF throws away how far ahead a leg's first chunk is,
which is what decides most questions here (docs/evaluation.md, "What was
tried"). RRF stays available as ``Fusion(method="rrf")``.

Every search goes through ``index.search_index.SearchIndex`` (here also
``RetrievalBackend``), so that the local FAISS + BM25 pair and a distributed
engine are two implementations of one contract; the fusion is defined there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from index.search_index import (
    DEFAULT_DEPTH,
    FUSION,
    RRF_K,
    Candidate,
    Fusion,
    LocalSearchIndex,
    Mode,
    SearchIndex,
    fuse,
    rrf,
    score_fusion,
)

# The search interface and its local engine live in ``index.search_index``;
# these names keep the engine's callers reading as before.
RetrievalBackend = SearchIndex
LocalBackend = LocalSearchIndex

__all__ = [
    "DEFAULT_DEPTH",
    "FUSION",
    "RRF_K",
    "Candidate",
    "Fusion",
    "LocalBackend",
    "Mode",
    "RetrievalBackend",
    "fuse",
    "rrf",
    "score_fusion",
    "sentence_order",
]


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
