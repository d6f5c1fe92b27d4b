"""The refusal gate: the one part of the pipeline that can say no.

A retriever always returns something; only a distance threshold, measured
against questions the knowledge base should refuse (``kb eval``), decides
whether any of it is close enough to answer from. When nothing passes, the
engine does not call the model: the candidates within a second, looser
threshold are shown as possibly related passages (``related``), and when none
is within that either, the answer is "not in the knowledge base".

Deciding and choosing are apart. The decision is the best candidate's cosine
distance against the answer threshold, nothing learned: other cheap signals
(the margin to the next passage, the agreement of the dense and BM25 legs, the
latent terms' overlap, the best sentence's distance, a logistic score of them)
separated in-domain from out-of-domain questions no better on a set they were
not fitted on (docs/evaluation.md, studies/2026-12-06-gate.md,
studies/2026-12-06-gate-signals-latent-and-sentences.md). Once the decision is made, the answer is written
from the first ``top_k`` candidates, in the order given (the answer order),
within the looser related threshold: the passage that answers is often ranked
among the best but a little farther than the strict threshold, and a question
the best passage already passed for is no bluff whatever else is read beside
it. The candidates among the answer's first ranks it was not written from, and
too far to pass on their own, are shown beside the answer (``beside_answer``),
never given to the model.

Passages found outside the knowledge base (``core.outside``: Slack's messages)
are judged by this same ``gate``, by their distance as the knowledge base's
model measures it: one rule for whether anything is close enough to call the
model for.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.retrieve import Candidate

# How many fused candidates are fetched per passage kept: the gate walks them in
# fused order, so a chunk that BM25 ranks first but is too far can be skipped
# without starving the answer.
CANDIDATES_PER_KEPT = 5
# A pointer, not a reading list: as many passages as an answer is written from
# by default (``core.config.DEFAULT_TOP_K``), the four that recall@4 measures.
# Three left out the needle ranked fourth for 4-6 % of the multilingual sets'
# questions, nearly all refused by the stricter multilingual threshold
# (docs/evaluation.md); more would bury the one that might help.
MAX_RELATED = 4


def gate(
    candidates: Sequence[Candidate],
    *,
    threshold: float,
    top_k: int,
    max_kept: int = 0,
    margin: float = 0.0,
    related_threshold: float = 0.0,
) -> list[Candidate]:
    """The candidates an answer is written from, in the order given; empty: refuse.

    Empty unless some candidate's distance is at most ``threshold`` (the
    decision). Then the first ``top_k`` within ``related_threshold`` (within
    ``threshold`` when that is the looser), then, up to ``max_kept`` in all,
    the further ones passing ``threshold`` within ``margin`` of the best: when
    several passages are about equally close, the right one is often ranked
    just past ``top_k``.
    """
    passed = [c for c in candidates if c.distance <= threshold]
    if not passed:
        return []
    within = max(threshold, related_threshold)
    head = [c for c in candidates if c.distance <= within][:top_k]
    room = max_kept - len(head)
    if room <= 0:
        return head
    near = min(c.distance for c in passed) + margin
    chosen = {c.chunk_id for c in head}
    return head + [c for c in passed if c.chunk_id not in chosen and c.distance <= near][:room]


def related(
    candidates: Sequence[Candidate], *, related_threshold: float, limit: int = MAX_RELATED
) -> list[Candidate]:
    """Up to ``limit`` candidates within ``related_threshold``, in the order given.

    Meant for a question nothing passed the gate for: these are shown as
    possibly related, never given to the model.
    """
    return [c for c in candidates if c.distance <= related_threshold][:limit]


def beside_answer(
    candidates: Sequence[Candidate],
    kept: Sequence[Candidate],
    *,
    threshold: float,
    related_threshold: float,
    within: int,
    limit: int = MAX_RELATED,
) -> list[Candidate]:
    """The possibly related passages shown beside an answer written from ``kept``.

    The candidates among the first ``within`` (in the order the answer's
    passages are chosen from) that the answer was not written from, too far to
    pass ``threshold`` but within ``related_threshold``: ranked as well as the
    answer's own passages, so often the passage the asker needed. Without a
    reranker ``gate`` keeps every such one, so there are none; a reranker's
    choice leaves some out. Passing ones it left out are not shown (a choice,
    not a distance).
    """
    chosen = {c.chunk_id for c in kept}
    return [
        c
        for c in candidates[:within]
        if c.chunk_id not in chosen and threshold < c.distance <= related_threshold
    ][:limit]
