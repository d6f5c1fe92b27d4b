"""Search engines: the ``SearchIndex`` contract, the fusion of its two legs, and two engines.

``LocalSearchIndex`` (``index.search.local``) is FAISS (``vectors``) and BM25
(``bm25``, over ``tokens``) kept in step with the store (``derived``);
``index.search.qdrant`` is the same contract on a Qdrant collection (its
packages, qdrant-client and qdrant-edge-py, are imported only when chosen). The query map (``query_map``) re-scores the hybrid fusion's
dense leg, never a distance the gate judges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from index.search.contract import Candidate, Mode, SearchIndex
from index.search.derived import DerivedIndexes, OnlyScopes, Snapshot
from index.search.fusion import DEFAULT_DEPTH, FUSION, RRF_K, Fusion, fuse, rrf, score_fusion
from index.search.local import LocalSearchIndex
from index.search.qdrant import QdrantSearchIndex
from index.search.query_map import BackgroundFits, QueryAdapters
from index.search.tokens import ANALYZER, query_languages, question_language

if TYPE_CHECKING:
    from index.storage import Store

__all__ = [
    "ANALYZER",
    "BackgroundFits",
    "Candidate",
    "DEFAULT_DEPTH",
    "DerivedIndexes",
    "FUSION",
    "Fusion",
    "LocalSearchIndex",
    "Mode",
    "OnlyScopes",
    "QdrantSearchIndex",
    "QueryAdapters",
    "RRF_K",
    "SEARCH_ENGINES",
    "SearchIndex",
    "Snapshot",
    "fuse",
    "open_search_index",
    "query_languages",
    "question_language",
    "rrf",
    "score_fusion",
]

# The engines a knowledge base can search with (``open_search_index``).
SEARCH_ENGINES = ("local", "qdrant")


def open_search_index(
    store: Store,
    *,
    embedding_model: str,
    dimensions: int,
    engine: str = "local",
    qdrant_url: str = "",
    qdrant_api_key: str = "",
    adapters: QueryAdapters | None = None,
) -> SearchIndex:
    """The search index of ``store`` on ``engine`` (one of ``SEARCH_ENGINES``), not yet opened.

    Args:
        store: the source of truth.
        embedding_model: stamp of the running model.
        dimensions: its vector size.
        engine: ``local`` (FAISS + BM25 files) or ``qdrant`` (``index.search.qdrant.index``).
        qdrant_url: the Qdrant engine's location (empty: embedded in the data dir).
        qdrant_api_key: its API key.
        adapters: the knowledge base's query map (``index.search.query_map``); None: none.

    Raises:
        ValueError: an engine this product does not have.
    """
    if engine == "local":
        indexes = DerivedIndexes(store, embedding_model=embedding_model, dimensions=dimensions)
        return LocalSearchIndex(indexes, adapters=adapters)
    if engine == "qdrant":
        return QdrantSearchIndex(
            store,
            embedding_model=embedding_model,
            dimensions=dimensions,
            url=qdrant_url,
            api_key=qdrant_api_key,
            adapters=adapters,
        )
    known = ", ".join(SEARCH_ENGINES)
    raise ValueError(f"Unknown search engine {engine!r}: use one of {known}.")
