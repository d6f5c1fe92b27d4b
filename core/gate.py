"""The refusal gate: the one part of the pipeline that can say no.

A retriever always returns something; only a distance threshold, measured
against questions the knowledge base should refuse (``kb eval``), decides
whether any of it is close enough to answer from. When nothing passes, the
engine answers "not in the knowledge base" without calling the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.retrieve import Candidate

# How many fused candidates are fetched per passage kept: the gate walks them in
# fused order, so a chunk that BM25 ranks first but is too far can be skipped
# without starving the answer.
CANDIDATES_PER_KEPT = 5


def gate(candidates: Sequence[Candidate], *, threshold: float, top_k: int) -> list[Candidate]:
    """Keep at most ``top_k`` candidates, in fused order, whose distance is at most ``threshold``."""
    return [c for c in candidates if c.distance <= threshold][:top_k]
