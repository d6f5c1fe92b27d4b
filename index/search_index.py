"""The search index: one interface for queries and index maintenance, and its local engine.

``SearchIndex`` is what the knowledge base, the answer engine, ``/readyz``,
``kb status`` and ``kb eval`` need of a search engine: open, follow the
store's generation, rebuild, health, hybrid search with scopes filtered inside
each leg, and dense distances for given chunks. ``LocalSearchIndex`` is the
FAISS + BM25 pair of one data dir (``index.derived``). The fusion of the two
legs lives here because an engine applies it; ``core.retrieve`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, Protocol

import numpy as np

from index.derived import DerivedIndexes
from index.query_adapter import QueryAdapters
from index.store import Store

# The engines a knowledge base can search with (``open_search_index``).
SEARCH_ENGINES = ("local", "qdrant")

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


DistancesFor = Callable[[np.ndarray, list[int]], dict[int, float]]


def fused_candidates(
    dense: Sequence[tuple[int, float]],
    sparse: Sequence[tuple[int, float]],
    fusion: Fusion,
    k: int,
    mode: Mode,
    *,
    adapters: QueryAdapters | None,
    query_vector: np.ndarray,
    distances_for: DistancesFor,
) -> list[Candidate]:
    """The best ``k`` of the legs' fusion as candidates, each with its distance and leg ranks.

    Every engine's search ends here once its two legs have run: ``dense`` holds
    the dense leg's ``(chunk id, distance)``, nearest first, ``sparse`` BM25's
    ``(chunk id, score)``, best first; ``distances_for`` gives the distance of a
    chunk only BM25 found.
    """
    adapter = adapters.current() if adapters is not None and mode == Mode.HYBRID else None
    if adapter is None or not dense or k <= 0:
        fused = fuse(dense, sparse, fusion)[:k]
    else:
        fused = _mapped_fusion(dense, sparse, fusion, k, adapter.apply(query_vector), distances_for)
    distances = dict(dense)
    missing = [cid for cid, _ in fused if cid not in distances]
    if missing:
        distances.update(distances_for(query_vector, missing))
    dense_rank = {cid: i for i, (cid, _) in enumerate(dense, start=1)}
    sparse_rank = {cid: i for i, (cid, _) in enumerate(sparse, start=1)}
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


def _mapped_fusion(
    dense: Sequence[tuple[int, float]],
    sparse: Sequence[tuple[int, float]],
    fusion: Fusion,
    k: int,
    mapped_query: np.ndarray,
    distances_for: DistancesFor,
) -> list[tuple[int, float]]:
    """The best ``k`` of the legs' fusion, the dense leg ordered by the mapped query.

    With the knowledge base's query map (``index.query_adapter``), the dense leg
    the fusion uses is both legs' candidates ordered by their distance to the
    mapped query. Only the order changes: the caller keeps ``dense`` for every
    candidate's distance and rank, and the model's nearest chunk always stays
    among the ``k`` (in the last place if the map would drop it), so the gate
    refuses exactly what the model's distances refuse.
    """
    pool = list(dict.fromkeys([cid for cid, _ in dense] + [cid for cid, _ in sparse]))
    found = distances_for(mapped_query, pool)
    leg = sorted(found.items(), key=lambda kv: kv[1])[: len(dense)]
    fused = fuse(leg, sparse, fusion)
    top = fused[:k]
    nearest = dense[0][0]
    if all(cid != nearest for cid, _ in top):
        top = [*top[: k - 1], (nearest, dict(fused).get(nearest, 0.0))]
    return top


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


class LocalSearchIndex:
    """FAISS + BM25 over the data dir's snapshot (``DerivedIndexes``); scope filters run inside each leg.

    Args:
        indexes: the derived indexes of a knowledge base.
        depth: how many candidates each leg contributes before fusion.
        fusion: how the two legs are fused.
        adapters: the knowledge base's query map, applied to the hybrid fusion's dense leg.
    """

    def __init__(
        self,
        indexes: DerivedIndexes,
        *,
        depth: int = DEFAULT_DEPTH,
        fusion: Fusion = FUSION,
        adapters: QueryAdapters | None = None,
    ) -> None:
        self.indexes = indexes
        self.depth = depth
        self.fusion = fusion
        self.adapters = adapters

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
        sparse = snap.bm25.search(query_text, depth, allowed) if mode != Mode.DENSE else []
        return fused_candidates(
            dense,
            sparse,
            self.fusion,
            k,
            mode,
            adapters=self.adapters,
            query_vector=query_vector,
            distances_for=snap.vectors.distances_for,
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
        engine: ``local`` (FAISS + BM25 files) or ``qdrant`` (``index.qdrant_index``).
        qdrant_url: the Qdrant engine's location (empty: embedded in the data dir).
        qdrant_api_key: its API key.
        adapters: the knowledge base's query map (``index.query_adapter``); None: none.

    Raises:
        ValueError: an engine this product does not have.
    """
    if engine == "local":
        indexes = DerivedIndexes(store, embedding_model=embedding_model, dimensions=dimensions)
        return LocalSearchIndex(indexes, adapters=adapters)
    if engine == "qdrant":
        from index.qdrant_index import QdrantSearchIndex  # it imports this module

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
