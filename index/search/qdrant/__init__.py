"""Qdrant as the search engine (``KB_SEARCH_ENGINE=qdrant``): the ``SearchIndex`` contract on a collection.

``index`` is the search index; ``engine`` the operations it needs of an engine,
``client`` a server or local mode through qdrant-client, ``edge`` the in-process
engine, ``engines`` the one ``QDRANT_URL`` names; ``sparse`` BM25 as sparse vectors.
"""

from __future__ import annotations

from index.search.qdrant.engine import SearchEngineUnavailable
from index.search.qdrant.index import QdrantSearchIndex

__all__ = ["QdrantSearchIndex", "SearchEngineUnavailable"]
