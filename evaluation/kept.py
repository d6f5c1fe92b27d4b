"""The passages an answer is written from, as ``Engine.ask`` keeps them, reranker included.

Retrieval recall says whether the needle is among the fused candidates; what
the asker gets is the few passages the gate keeps and, with ``KB_RERANKER``,
the ones the reranker chooses among those that passed. Per in-domain query,
at the evaluated threshold:

* **kept_answerable**: the needle is in one of the kept passages;
* **kept_first**: it is in the first one (the answer's source [1]).

Both go into ``kb eval --json`` as rows of the gate's current threshold with
their per-query outcomes (``gate.per_query.in_domain``), so a comparison of two
runs (``evaluation.compare``) pairs them query by query. With a reranker, the
needle's rank when it reorders the whole top ``DEPTH`` of hybrid candidates
(no threshold) is reported as the ``reranked`` retrieval mode, with its time.
With ``KB_SENTENCE_WEIGHT`` or ``KB_PROXIMITY_WEIGHT``, the passing candidates
are chosen in the order their best sentences and term proximity give
(``core.retrieve.answer_order``, after the gate, as the engine does), and the
needle's rank in that order of the whole top ``DEPTH`` is the ``ordered``
retrieval mode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT, gate
from core.rerank import Reranker, rerank
from core.retrieve import Candidate, Mode, configured_order, reorders_answers
from evaluation.results import DEPTH, KeptResult, ModeResult
from evaluation.stats import Proportion
from index.knowledge_base import KnowledgeBase


def measure_kept(
    kb: KnowledgeBase,
    texts: Sequence[str],
    vectors: np.ndarray,
    correct: Sequence[set[int]],
    engine: EngineConfig,
    *,
    threshold: float,
    reranker: Reranker | None,
) -> KeptResult:
    """Keep passages for every query as ``Engine.ask`` does and check for the needle.

    Args:
        kb: the indexed corpus.
        texts: the in-domain queries.
        vectors: their embeddings.
        correct: per query, the chunk ids holding its needle.
        engine: the gate's settings (``top_k``, ``max_kept``, ``keep_margin``).
        threshold: the threshold evaluated.
        reranker: the reranker, or ``None``.
    """
    backend = kb.search_index
    answerable: list[bool] = []
    first: list[bool] = []
    reranked: list[int | None] = []
    ordered: list[int | None] = []
    times: list[float] = []
    reorders = reorders_answers(engine, kb.embedder)
    for text, vector, ids in zip(texts, vectors, correct, strict=True):
        cands = backend.search(vector, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID)
        kept = _gate(cands, engine, threshold)
        if reorders:
            cands = configured_order(cands, vector, text, kb.store, engine, kb.embedder)
            ordered.append(next((i for i, c in enumerate(cands, 1) if c.chunk_id in ids), None))
            kept = _gate(cands, engine, threshold) if kept else kept
        if reranker is not None and kept:
            started = time.perf_counter()
            kept = _reranked(kb, reranker, text, cands, threshold, len(kept))
            times.append(1000 * (time.perf_counter() - started))
        answerable.append(any(c.chunk_id in ids for c in kept))
        first.append(bool(kept) and kept[0].chunk_id in ids)
        if reranker is not None:
            deep = backend.search(vector, text, None, DEPTH, Mode.HYBRID)
            order = _reranked(kb, reranker, text, deep, float("inf"), len(deep))
            reranked.append(next((i for i, c in enumerate(order, 1) if c.chunk_id in ids), None))
    return KeptResult(
        reranker=reranker.name if reranker else None,
        threshold=threshold,
        answerable=answerable,
        first=first,
        reranked=ModeResult("reranked", reranked) if reranker is not None else None,
        rerank_ms=times if reranker is not None else None,
        ordered=ModeResult("ordered", ordered) if reorders else None,
    )


def _gate(cands: Sequence[Candidate], engine: EngineConfig, threshold: float) -> list[Candidate]:
    return gate(
        cands,
        threshold=threshold,
        top_k=engine.top_k,
        max_kept=engine.max_kept,
        margin=engine.keep_margin,
    )


def _reranked(
    kb: KnowledgeBase,
    reranker: Reranker,
    text: str,
    cands: Sequence[Candidate],
    threshold: float,
    keep: int,
) -> list[Candidate]:
    rows = kb.store.chunks_by_id([c.chunk_id for c in cands if c.distance <= threshold])
    return rerank(reranker, text, cands, rows, threshold=threshold, keep=keep)


def render_kept(kept: KeptResult | None) -> str:
    """One paragraph: what the asker is shown at the threshold, with and by which reranker."""
    if kept is None:
        return ""

    def share(values: list[bool]) -> str:
        p = Proportion(sum(values), len(values))
        low, high = p.interval
        return f"{p.successes}/{p.n} = {p.value:.3f} [{low:.2f}, {high:.2f}]"

    lines = [
        f"Kept passages at threshold {kept.threshold:.3f}, "
        f"{'reranked by ' + kept.reranker if kept.reranker else 'in fused order (no reranker)'}:",
        f"  needle among the kept passages: {share(kept.answerable)}",
        f"  needle in the first kept passage: {share(kept.first)}",
    ]
    if kept.ordered is not None:
        o = kept.ordered
        lines.append(
            f"  top {DEPTH} in answer order (sentences, term proximity): "
            f"R@1 {o.recall(1).value:.3f}, R@4 {o.recall(4).value:.3f}, MRR {o.mrr.mean:.3f}"
        )
    if kept.reranked is not None and kept.rerank_ms:
        r = kept.reranked
        lines.append(
            f"  reranked top {DEPTH}: R@1 {r.recall(1).value:.3f}, R@4 {r.recall(4).value:.3f}, "
            f"MRR {r.mrr.mean:.3f}; reranking the kept passages took "
            f"{np.median(kept.rerank_ms):.0f} ms (median), {np.percentile(kept.rerank_ms, 90):.0f} ms (p90)"
        )
    return "\n".join(lines) + "\n"
