"""The search index contract: what any engine behind the knowledge base offers.

``SearchIndex`` is what the knowledge base, the answer engine, ``/readyz``,
``kb status`` and ``kb eval`` need of a search engine: open, follow the
store's generation, rebuild, health, hybrid search with scopes filtered inside
each leg, and dense distances for given chunks. ``Candidate`` is one chunk it
returns; ``Mode`` which legs a search uses. ``tests/test_search_index_contract.py``
runs the same cases against every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np


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
        sparse_rank: 1-based rank in the BM25 list it was in (the question's
            language's or the others', ``index.search.fusion.by_language``), if any.
    """

    chunk_id: int
    distance: float
    score: float
    dense_rank: int | None = None
    sparse_rank: int | None = None


class SearchIndex(Protocol):
    """What any search engine behind the knowledge base offers: queries and their maintenance.

    The store (SQLite) is the truth; an index follows its ``generation``
    counter. Only chunks embedded with the running model are searchable.
    """

    def open(self) -> int:
        """Load the persisted index or build it from the store; the generation it is at."""
        ...

    def sync(self) -> int:
        """Follow the store's changes (a no-op when current); the generation it is at."""
        ...

    def rebuild(self) -> int:
        """Build the index again from the store; the generation it is at."""
        ...

    @property
    def generation(self) -> int | None:
        """The generation the index reflects (``None`` before it is opened); no store query."""
        ...

    def health(self) -> dict[str, object]:
        """Cheap readiness facts (``generation``, ``in_sync``, ``lag``, ...): ``/readyz``."""
        ...

    def check(self) -> dict[str, object]:
        """The index compared chunk by chunk with the store (``in_sync``, ...): ``kb status``."""
        ...

    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
        cutoff: float | None = None,
    ) -> list[Candidate]:
        """Best ``k`` chunks visible to ``scopes`` (``None``: all), each with its dense distance.

        Scopes filter inside each leg, so a small scope still gets its full
        ``k``; a chunk only BM25 found still carries its dense cosine distance.
        With ``cutoff``, a hybrid search whose dense leg finds nothing within that
        distance may return the dense leg alone: an exact dense leg has the
        nearest chunk first, so nothing BM25 adds could be within it, and a
        question no passage can answer skips the BM25 leg and the fusion.
        """
        ...

    def distances_for(self, query_vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        """Dense cosine distances ``1 - ip`` of the given searchable chunks to the query."""
        ...
