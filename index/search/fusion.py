"""The fusion of the dense and BM25 legs, applied by every engine at the end of its search.

Both engines rank alike because both end in ``fused_candidates``;
``core.retrieve`` re-exports the fusion as the engine names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from index.search.contract import Candidate, Mode
from index.search.query_map import QueryAdapters

# Cormack, Clarke & Buettcher (2009), "Reciprocal rank fusion outperforms
# Condorcet and individual rank learning methods": k = 60.
RRF_K = 60
# How deep each leg looks before fusion. Wider than top_k so that a chunk
# ranked modestly by both legs can still win the fusion.
DEFAULT_DEPTH = 25


@dataclass(frozen=True)
class Fusion:
    """How the dense and BM25 lists become one (``bench/languages.py`` measures the choices).

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
    dense: Sequence[tuple[int, float]],
    sparse: Sequence[tuple[int, float]],
    fusion: Fusion,
    foreign: Sequence[tuple[int, float]] = (),
) -> list[tuple[int, float]]:
    """One list from the dense ``(id, distance)`` and BM25 ``(id, score)`` lists, best first.

    ``foreign`` holds BM25's hits in other languages than the question's
    (``by_language``): a list of its own, weighed as BM25 is, so that a
    passage another language's words match cannot crowd out the question's
    own language, and one a shared name or command matches still counts.
    """
    if fusion.method == "score":
        similarity = [(cid, -d) for cid, d in dense]  # any decreasing map: it is normalised
        return score_fusion(
            [similarity, sparse, foreign], [fusion.dense, fusion.sparse, fusion.sparse]
        )
    legs = ((dense, fusion.dense), (sparse, fusion.sparse), (foreign, fusion.sparse))
    pairs = [(lst, w) for lst, w in legs if lst]
    return rrf([[cid for cid, _ in lst] for lst, _ in pairs], fusion.k, [w for _, w in pairs])


DistancesFor = Callable[[np.ndarray, list[int]], dict[int, float]]
LanguagesOf = Callable[[list[int]], dict[int, str | None]]


def by_language(
    sparse: Sequence[tuple[int, float]], question: str | None, languages_of: LanguagesOf
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """BM25's hits split into those in the question's language and those in another.

    Shared words across languages are names, commands, options and loanwords,
    beside a few short words two languages happen to spell alike: among the
    question's own language's hits a Danish passage matched by them would
    outrank French passages matched by the question's words, so it goes to the
    other list (``fuse``'s ``foreign``). Everything is the question's when its
    language is unclear (``None``), and so is a passage whose language is unknown.
    """
    if question is None or not sparse:
        return list(sparse), []
    of = languages_of([cid for cid, _ in sparse])
    own = [(cid, score) for cid, score in sparse if of.get(cid) in (None, question)]
    other = [(cid, score) for cid, score in sparse if of.get(cid) not in (None, question)]
    return own, other


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
    foreign: Sequence[tuple[int, float]] = (),
) -> list[Candidate]:
    """The best ``k`` of the legs' fusion as candidates, each with its distance and leg ranks.

    Every engine's search ends here once its two legs have run: ``dense`` holds
    the dense leg's ``(chunk id, distance)``, nearest first, ``sparse`` BM25's
    ``(chunk id, score)``, best first, in the question's language, ``foreign``
    BM25's in the others (``by_language``); ``distances_for`` gives the
    distance of a chunk only BM25 found.
    """
    adapter = adapters.current() if adapters is not None and mode == Mode.HYBRID else None
    if adapter is None or not dense or k <= 0:
        fused = fuse(dense, sparse, fusion, foreign)[:k]
    else:
        mapped = adapter.apply(query_vector)
        fused = _mapped_fusion(dense, sparse, foreign, fusion, k, mapped, distances_for)
    distances = dict(dense)
    missing = [cid for cid, _ in fused if cid not in distances]
    if missing:
        distances.update(distances_for(query_vector, missing))
    dense_rank = {cid: i for i, (cid, _) in enumerate(dense, start=1)}
    sparse_rank = {cid: i for i, (cid, _) in enumerate(foreign, start=1)}
    sparse_rank |= {cid: i for i, (cid, _) in enumerate(sparse, start=1)}
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
    foreign: Sequence[tuple[int, float]],
    fusion: Fusion,
    k: int,
    mapped_query: np.ndarray,
    distances_for: DistancesFor,
) -> list[tuple[int, float]]:
    """The best ``k`` of the legs' fusion, the dense leg ordered by the mapped query.

    With the knowledge base's query map (``index.search.query_map``), the dense leg
    the fusion uses is both legs' candidates ordered by their distance to the
    mapped query. Only the order changes: the caller keeps ``dense`` for every
    candidate's distance and rank, and the model's nearest chunk always stays
    among the ``k`` (in the last place if the map would drop it), so the gate
    refuses exactly what the model's distances refuse.
    """
    lexical = [cid for cid, _ in sparse] + [cid for cid, _ in foreign]
    pool = list(dict.fromkeys([cid for cid, _ in dense] + lexical))
    found = distances_for(mapped_query, pool)
    leg = sorted(found.items(), key=lambda kv: kv[1])[: len(dense)]
    fused = fuse(leg, sparse, fusion, foreign)
    top = fused[:k]
    nearest = dense[0][0]
    if all(cid != nearest for cid, _ in top):
        top = [*top[: k - 1], (nearest, dict(fused).get(nearest, 0.0))]
    return top
