"""Hybrid retrieval: dense (FAISS) + sparse (BM25), fused on normalised scores.

Each leg's scores are min-max normalised over its own list and summed with
weights dense 1.0, BM25 0.5. Measured against reciprocal rank fusion (RRF,
equal or weighted legs, several k) on both bundled evaluation sets with
``bench/levers.py``: RRF throws away how far ahead a leg's first chunk is,
which is what decides most questions here
(studies/2026-12-01-bm25-fusion.md). RRF stays available as ``Fusion(method="rrf")``.

Every search goes through ``index.search.local.SearchIndex`` (here also
``RetrievalBackend``), so that the local FAISS + BM25 pair and a distributed
engine are two implementations of one contract; the fusion is defined there.

Once the gate has passed a question, ``answer_order`` orders its candidates
for the answer with more legs of the candidates alone: their best
sentences, their term proximity (``core.proximity``) and, with a model that
has a sparse head, their latent terms (``index.embed.latent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from core.proximity import term_proximity
from index.embed import LatentEncoder, latent_encoder
from index.search import (
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

if TYPE_CHECKING:
    from core.config import EngineConfig
    from index.storage import Store

# The search interface and its local engine live in ``index.search.local``;
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
    "answer_order",
    "configured_order",
    "latent_order_leg",
    "fuse",
    "reorders_answers",
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
    best = _best_sentences(candidates, query_vector, sentence_vectors)
    return _reordered(candidates, [(_min_max(best), weight)])


def answer_order(
    candidates: Sequence[Candidate],
    query_vector: np.ndarray,
    query: str,
    store: Store,
    *,
    sentence_weight: float,
    proximity_weight: float,
    latent_weight: float = 0.0,
    latent: LatentEncoder | None = None,
) -> list[Candidate]:
    """The candidates in the order an answer keeps its passages from, once the gate has passed.

    Beside the fused score, up to three legs of the candidates alone, each
    weighted: their best sentences (``sentence_order``), the share of the
    question's terms each holds together (``core.proximity``, already on a 0 to
    1 scale, so a difference in words all candidates share stays small) and,
    with a model that has a sparse head (``latent``), their latent terms'
    similarity to the question's (``latent_order_leg``). A weight of 0 leaves
    its leg out and reads nothing for it. As with ``sentence_order``, only the
    order changes.
    """
    if len(candidates) < 2:
        return list(candidates)
    legs: list[tuple[list[float], float]] = []
    ids = [c.chunk_id for c in candidates]
    if sentence_weight > 0:
        found = store.sentence_vectors(ids)
        best = _best_sentences(candidates, query_vector, found)
        legs.append((_min_max(best), sentence_weight))
    if proximity_weight > 0:
        rows = store.chunks_by_id(ids)
        texts = [rows[cid].text if cid in rows else "" for cid in ids]
        languages = [rows[cid].language if cid in rows else None for cid in ids]
        legs.append((term_proximity(query, texts, languages=languages), proximity_weight))
    if latent_weight > 0 and latent is not None:
        values = latent_order_leg(ids, query, store, latent)
        if values is not None:
            legs.append((values, latent_weight))
    return _reordered(candidates, legs)


def reorders_answers(config: EngineConfig, embedder: object) -> bool:
    """Whether ``configured_order`` has a leg to weigh with ``config`` and ``embedder``.

    The latent leg counts only with an embedder that has a sparse head.
    """
    latent = config.latent_weight > 0 and latent_encoder(embedder) is not None
    return config.sentence_weight > 0 or config.proximity_weight > 0 or latent


def configured_order(
    candidates: Sequence[Candidate],
    query_vector: np.ndarray,
    query: str,
    store: Store,
    config: EngineConfig,
    embedder: object,
) -> list[Candidate]:
    """``answer_order`` with ``config``'s weights and ``embedder``'s sparse head, if it has one."""
    return answer_order(
        candidates,
        query_vector,
        query,
        store,
        sentence_weight=config.sentence_weight,
        proximity_weight=config.proximity_weight,
        latent_weight=config.latent_weight,
        latent=latent_encoder(embedder),
    )


def latent_order_leg(
    ids: Sequence[int], query: str, store: Store, latent: LatentEncoder
) -> list[float] | None:
    """Each candidate's latent terms' similarity to the question's, min-max normalised.

    ``None`` (the leg is left out) unless every candidate has latent terms:
    a passage indexed before they were stored, or by a model without a sparse
    head, would otherwise lose to its neighbours for want of them. The
    question's are computed only here, once its candidates have them.
    """
    stored = store.latent_terms(list(ids))
    if len(stored) < len(ids):
        return None
    found = latent.encode_latent([query], role="query")
    if not found:
        return None
    question = found[0]
    return _min_max([stored[cid].similarity(question) for cid in ids])


def _best_sentences(
    candidates: Sequence[Candidate],
    query_vector: np.ndarray,
    sentence_vectors: dict[int, np.ndarray],
) -> list[float]:
    """Each candidate's best sentence similarity to the query (its own without sentence vectors)."""
    return [
        float((m @ query_vector).max())
        if (m := sentence_vectors.get(c.chunk_id)) is not None
        else 1.0 - c.distance
        for c in candidates
    ]


def _min_max(values: Sequence[float]) -> list[float]:
    """``values`` on a 0 to 1 scale over their own range (all 1 when they are equal)."""
    low, span = min(values), max(values) - min(values)
    return [(v - low) / span if span > 0 else 1.0 for v in values]


def _reordered(
    candidates: Sequence[Candidate], legs: Sequence[tuple[Sequence[float], float]]
) -> list[Candidate]:
    """The candidates by fused score plus each leg's weight times its value (on a 0 to 1 scale)."""
    used = [(values, weight) for values, weight in legs if weight > 0]
    if not used or len(candidates) < 2:
        return list(candidates)
    scores = [c.score for c in candidates]
    for values, weight in used:
        scores = [s + weight * v for s, v in zip(scores, values, strict=True)]
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])
    return [candidates[i] for i in order]
