"""Passages found outside the knowledge base, searched as the asker: their own group, never stored.

A surface may search a place of its own as the person asking, beside the
knowledge base (Slack's Real-time Search finds the messages that person can
read: ``bot.slack.search``). What it finds keeps these rules:

* it is **its own group** of the answer (:class:`Outside`, ``Answer.outside``),
  never mixed with the knowledge base's candidates, scores or log;
* it is **judged close by the knowledge base's measure**: each text embedded as
  a passage by the knowledge base's own model, its cosine distance to the
  question, judged by the gate itself (``core.gate.gate``, with the answer
  threshold and ``top_k``): the one rule for whether anything is close; the
  source's own ranking only orders what passes. When neither the knowledge
  base nor this group has a passage that close, no model is called;
* it is **quoted to the model only when the answer is read by the asker
  alone** (``quote``: the surface knows who reads its answers). Then its
  passages are numbered sources after the knowledge base's, quoted as every
  passage is (``core.prompt``, ``core.quoting``: a message's text is hostile),
  and cited like them. Otherwise the model never reads it, and the surface
  shows the group to the asker alone, beside an answer written without it;
* it is **never stored**: not in the store, not in the query log; an answer
  written from it is logged without its text (the text may quote it).

A search that fails (refused, rate-limited, out of reach) costs this group
only: :attr:`Found.failure` says why, and the rest of the answer is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from core.gate import gate
from core.retrieve import Candidate
from index.embed import Embedder

__all__ = [
    "Found",
    "Outside",
    "OutsidePassage",
    "OutsideRef",
    "OutsideSearch",
    "close_passages",
]


@dataclass(frozen=True)
class OutsidePassage:
    """One text a search outside the knowledge base found.

    Attributes:
        text: what it says (written by anyone: hostile).
        author: who wrote it, as the surface names people (a Slack user id).
        posted: when, in Unix seconds.
        url: where the asker opens it (a Slack permalink).
        place: where it was written, as the surface names places (a channel id).
    """

    text: str
    author: str
    posted: float
    url: str
    place: str


@dataclass(frozen=True)
class Found:
    """What one search outside the knowledge base returned.

    Attributes:
        passages: what it found, in its own order (best first).
        reach: how far it searched, in the surface's words (Slack: as the asker,
            or public channels only); shown beside the group.
        failure: why nothing was searched (Slack's error code); ``None``: it was.
    """

    passages: list[OutsidePassage] = field(default_factory=list)
    reach: str = ""
    failure: str | None = None


class OutsideSearch(Protocol):
    """A search, as the person asking, of a place outside the knowledge base."""

    async def search(self, query: str) -> Found:
        """What ``query`` finds; never raises for the place's own failures (see ``Found.failure``)."""
        ...


@dataclass(frozen=True)
class OutsideRef:
    """A passage of the outside group, as shown.

    Attributes:
        passage: the passage.
        distance: its cosine distance to the question (the gate's measure).
        n: its citation number in the answer; 0 when the answer does not cite it.
    """

    passage: OutsidePassage
    distance: float
    n: int = 0

    @property
    def url(self) -> str:
        """The link a citation of it opens."""
        return self.passage.url

    @property
    def quote(self) -> str:
        """Its text, as a source's quote."""
        return self.passage.text


@dataclass(frozen=True)
class Outside:
    """The outside group of one answer.

    Attributes:
        shown: the passages close enough to show, in their source's order.
        reach: how far the search reached (:attr:`Found.reach`).
        failure: why there was no search (:attr:`Found.failure`).
        quoted: whether the model read them (only for an answer the asker alone reads).
    """

    shown: list[OutsideRef] = field(default_factory=list)
    reach: str = ""
    failure: str | None = None
    quoted: bool = False


def close_passages(
    embedder: Embedder,
    question: np.ndarray,
    passages: Sequence[OutsidePassage],
    *,
    threshold: float,
    limit: int,
) -> list[OutsideRef]:
    """The ``passages`` close enough to ``question`` (its vector) to answer from, at most ``limit``.

    Each text is embedded as a passage by the knowledge base's model, and its
    cosine distance (``1 - ip``, clamped to [0, 2]) is judged by the gate
    (``core.gate.gate``) as a candidate of the knowledge base would be, in the
    order found.
    """
    if not passages:
        return []
    vectors = embedder.encode([p.text for p in passages], role="document")
    distances = np.clip(1.0 - vectors @ question, 0.0, 2.0)
    # Numbered by position: the gate judges them as it judges the knowledge base's chunks.
    found = [Candidate(i, float(d), 0.0) for i, d in enumerate(distances)]
    kept = gate(found, threshold=threshold, top_k=limit)
    return [OutsideRef(passages[c.chunk_id], round(c.distance, 4)) for c in kept]
