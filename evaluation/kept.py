"""The passages an answer is written from, as every surface keeps them, reranker included.

They are chosen by ``core.selection.PassageSelector``, the stage Slack, the
MCP tools and ``kb ask`` call.

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
needle's rank in that order of all the candidates is the ``ordered`` retrieval
mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.config import EngineConfig
from core.rerank import Reranker, rerank
from core.retrieve import Candidate, Mode
from core.selection import PassageSelector, Selection
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
    """Keep passages for every query as every surface does and check for the needle.

    Args:
        kb: the indexed corpus.
        texts: the in-domain queries (in their normal form, ``core.selection.retrieval_query``).
        vectors: their embeddings.
        correct: per query, the chunk ids holding its needle.
        engine: the gate's settings (``top_k``, ``max_kept``, ``keep_margin``).
        threshold: the threshold evaluated.
        reranker: the reranker, or ``None``.
    """
    selector = PassageSelector(kb, engine, reranker=reranker)
    answerable: list[bool] = []
    first: list[bool] = []
    reranked: list[int | None] = []
    ordered: list[int | None] = []
    times: list[float] = []
    reorders = selector.reorders()
    for text, vector, ids in zip(texts, vectors, correct, strict=True):
        selection = kept_selection(selector, text, vector, threshold=threshold)
        kept = selection.kept
        if reorders:
            # Every candidate in the answer order, a refused question's too.
            ordered.append(_rank(selector.ordered(text, vector, selection.searched), ids))
        if "rerank" in selection.timings:
            times.append(selection.timings["rerank"])
        answerable.append(any(c.chunk_id in ids for c in kept))
        first.append(bool(kept) and kept[0].chunk_id in ids)
        if reranker is not None:
            deep = kb.search_index.search(vector, selection.query, None, DEPTH, Mode.HYBRID)
            rows = kb.store.chunks_by_id([c.chunk_id for c in deep])
            order = rerank(
                reranker, selection.query, deep, rows, threshold=float("inf"), keep=len(deep)
            )
            reranked.append(_rank(order, ids))
    return KeptResult(
        reranker=reranker.name if reranker else None,
        threshold=threshold,
        answerable=answerable,
        first=first,
        reranked=ModeResult("reranked", reranked) if reranker is not None else None,
        rerank_ms=times if reranker is not None else None,
        ordered=ModeResult("ordered", ordered) if reorders else None,
    )


def kept_selection(
    selector: PassageSelector, query: str, vector: np.ndarray, *, threshold: float
) -> Selection:
    """A query's passages as every surface chooses them (``PassageSelector``), at ``threshold``.

    Every leg is searched, so that a refused question's candidates can be
    ordered too (the ``ordered`` mode); what is kept and shown is the same.
    """
    candidates = selector.search(query, vector, None, every_leg=True)
    return selector.choose(query, vector, candidates, threshold=threshold)


def _rank(candidates: Sequence[Candidate], ids: set[int]) -> int | None:
    return next((i for i, c in enumerate(candidates, 1) if c.chunk_id in ids), None)


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
