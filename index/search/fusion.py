"""The fusion of the dense and BM25 legs, applied by every engine at the end of its search.

Both engines rank alike because both end in ``fused_candidates``;
``core.retrieve`` re-exports the fusion as the engine names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


@dataclass(frozen=True)
class Feedback:
    """The hybrid order's dense leg searched a second time, from the passage the first fusion ranked first.

    Pseudo-relevance feedback (Rocchio): the question's vector (the query map's
    when the knowledge base has one) moved toward the stored vectors of the
    fused order's first ``passages``, ``normalise(q + weight * their mean)``,
    searches the dense leg again (one more scan, no model call) and is fused
    with the same BM25 lists. A question phrased as a ticket lies far from the
    passage that answers it; the passage both legs agree on lies nearer, and
    its neighbours are the question's. Only the order changes: every
    candidate's distance stays the question's own, and the first search's
    nearest passage stays among the candidates, so the gate decides on what
    it did without. Measured in ``studies/2026-12-07-dense-feedback.md``.

    Attributes:
        weight: how far the question moves toward the passages (0: no second search).
        passages: how many of the first fusion's passages it moves toward.
    """

    weight: float = 0.7
    passages: int = 1


# The product's feedback: q + 0.7 x the fused order's first passage, normalised (chosen on
# the English sets, confirmed on the multilingual ones).
FEEDBACK = Feedback()


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
# The dense leg's ``k`` nearest ``(chunk id, distance)`` to a vector, within the asker's scopes.
Nearest = Callable[[np.ndarray, int], list[tuple[int, float]]]
# The stored vectors of the chunks among the ids that have one.
VectorsOf = Callable[[list[int]], Mapping[int, np.ndarray]]
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
    feedback: Feedback | None = None,
    nearest: Nearest | None = None,
    vectors_of: VectorsOf | None = None,
) -> list[Candidate]:
    """The best ``k`` of the legs' fusion as candidates, each with its distance and leg ranks.

    Every engine's search ends here once its two legs have run: ``dense`` holds
    the dense leg's ``(chunk id, distance)``, nearest first, ``sparse`` BM25's
    ``(chunk id, score)``, best first, in the question's language, ``foreign``
    BM25's in the others (``by_language``); ``distances_for`` gives the
    distance of a chunk only BM25 found. With ``feedback`` (and the engine's
    ``nearest`` and ``vectors_of``), the hybrid fusion's dense leg is searched
    again from its first passages (``Feedback``).
    """
    hybrid = mode == Mode.HYBRID and bool(dense) and k > 0
    adapter = adapters.current() if adapters is not None and hybrid else None
    mapped = adapter.apply(query_vector) if adapter is not None else query_vector
    if adapter is None:
        fused = fuse(dense, sparse, fusion, foreign)[:k]
    else:
        fused = _mapped_fusion(dense, sparse, foreign, fusion, k, mapped, distances_for)
    if hybrid and feedback is not None and nearest is not None and vectors_of is not None:
        moved = _moved(mapped, [cid for cid, _ in fused[: feedback.passages]], feedback, vectors_of)
        if moved is not None:
            second = fuse(nearest(moved, len(dense)), sparse, fusion, foreign)
            fused = _keeping(second, k, dense[0][0])
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
    return _keeping(fuse(leg, sparse, fusion, foreign), k, dense[0][0])


def _keeping(fused: list[tuple[int, float]], k: int, nearest: int) -> list[tuple[int, float]]:
    """The first ``k`` of ``fused``, the model's ``nearest`` chunk in the last place if it is not among them.

    The gate refuses on the best distance among the candidates: with the
    nearest chunk always there, an order that searched another vector
    refuses exactly what the model's distances refuse.
    """
    top = fused[:k]
    if all(cid != nearest for cid, _ in top):
        top = [*top[: k - 1], (nearest, dict(fused).get(nearest, 0.0))]
    return top


def _moved(
    query: np.ndarray, ids: list[int], feedback: Feedback, vectors_of: VectorsOf
) -> np.ndarray | None:
    """``query`` moved toward the mean of the stored vectors of ``ids`` (``None``: nothing to move toward)."""
    if feedback.weight <= 0 or not ids:
        return None
    found = vectors_of(ids)
    if not found:
        return None
    target = np.mean([np.asarray(v, dtype=np.float32) for v in found.values()], axis=0)
    moved = np.asarray(query, dtype=np.float32) + feedback.weight * target
    norm = float(np.linalg.norm(moved))
    return moved / norm if norm > 0 else None
