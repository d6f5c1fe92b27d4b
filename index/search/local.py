"""The local search engine: the FAISS + BM25 pair of one data dir (``index.search.derived``),
behind the ``SearchIndex`` contract.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from index.search.contract import Candidate, Mode
from index.search.derived import DerivedIndexes, Snapshot
from index.search.fusion import DEFAULT_DEPTH, FEEDBACK, FUSION, Feedback, Fusion, fused_candidates
from index.search.query_map import QueryAdapters
from index.search.tokens import query_languages, question_language


class LocalSearchIndex:
    """FAISS + BM25 over the data dir's snapshot (``DerivedIndexes``); scope filters run inside each leg.

    Args:
        indexes: the derived indexes of a knowledge base.
        depth: how many candidates each leg contributes before fusion.
        fusion: how the two legs are fused.
        adapters: the knowledge base's query map, applied to the hybrid fusion's dense leg.
        feedback: how the hybrid fusion's dense leg is searched again from its
            first passages (``None``: once).
    """

    def __init__(
        self,
        indexes: DerivedIndexes,
        *,
        depth: int = DEFAULT_DEPTH,
        fusion: Fusion = FUSION,
        adapters: QueryAdapters | None = None,
        feedback: Feedback | None = FEEDBACK,
    ) -> None:
        self.indexes = indexes
        self.depth = depth
        self.fusion = fusion
        self.adapters = adapters
        self.feedback = feedback

    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
        cutoff: float | None = None,
    ) -> list[Candidate]:
        """See ``SearchIndex.search`` (the flat index is exact: ``cutoff`` skips BM25)."""
        snap = self.indexes.snapshot
        if len(snap) == 0:
            return []
        allowed = snap.allowed_ids(scopes)
        if allowed is not None and allowed.size == 0:
            return []
        depth = max(k, self.depth)
        dense = snap.vectors.search(query_vector, depth, allowed) if mode != Mode.BM25 else []
        if cutoff is not None and mode == Mode.HYBRID and not _within(dense, cutoff):
            mode = Mode.DENSE
        sparse, foreign = (
            self._sparse(snap, query_text, depth, allowed) if mode != Mode.DENSE else ([], [])
        )
        return fused_candidates(
            dense,
            sparse,
            self.fusion,
            k,
            mode,
            adapters=self.adapters,
            query_vector=query_vector,
            distances_for=snap.vectors.distances_for,
            foreign=foreign,
            feedback=self.feedback,
            nearest=lambda vector, n: snap.vectors.search(vector, n, allowed),
            vectors_of=snap.vectors.vectors_for,
        )

    def _sparse(
        self, snap: Snapshot, query_text: str, depth: int, allowed: np.ndarray | None
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """BM25's best ``depth`` in the question's language, and in the others (``by_language``).

        Each list is searched among its own passages: in one search either
        language's hits can fill all ``depth`` places.
        """
        corpus = snap.corpus_languages
        languages = query_languages(query_text, corpus)
        question = question_language(query_text, corpus)
        if question is None:
            return snap.bm25.search(query_text, depth, allowed, languages), []
        own, others = snap.ids_by_language(question, allowed)
        if not others.size:  # one language: the plain search, no id list to match
            return snap.bm25.search(query_text, depth, allowed, languages), []
        return (
            snap.bm25.search(query_text, depth, own, languages) if own.size else [],
            snap.bm25.search(query_text, depth, others, languages) if others.size else [],
        )

    def open(self) -> int:
        """See ``SearchIndex.open``."""
        return self.indexes.open().generation

    def sync(self) -> int:
        """See ``SearchIndex.sync``."""
        return self.indexes.refresh().generation

    def rebuild(self) -> int:
        """See ``SearchIndex.rebuild``."""
        return self.indexes.rebuild().generation

    @property
    def generation(self) -> int | None:
        """See ``SearchIndex.generation``."""
        return self.indexes.snapshot_generation

    def health(self) -> dict[str, object]:
        """See ``SearchIndex.health``."""
        return self.indexes.sync_state()

    def check(self) -> dict[str, object]:
        """See ``SearchIndex.check``."""
        return self.indexes.check()

    def distances_for(self, query_vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        """See ``SearchIndex.distances_for``."""
        return self.indexes.snapshot.vectors.distances_for(query_vector, list(chunk_ids))


def _within(dense: Sequence[tuple[int, float]], cutoff: float) -> bool:
    return any(distance <= cutoff for _, distance in dense)
