"""Which passages a question gets: one stage, called by every surface.

Slack answers and ``kb ask`` (``core.answer.Engine.ask``), the MCP tools
(``search_knowledge_base`` and ``ask_knowledge_base``) and ``kb eval``'s kept
passages (``evaluation.kept``) all choose passages with
:class:`PassageSelector`, so one question asked by one person gets the same
passages in the same order wherever it is asked:

1. **the query**: the question in its normal form (``index.normal_form.plain``:
   full-width and other compatibility forms folded, invisible characters
   removed; one typed in capitals in sentence case, ``unshouted``), after the
   question a follow-up's thread last had answered;
2. **the candidates**: its vector and the fused candidates visible to the
   asker's scopes, ``top_k * CANDIDATES_PER_KEPT`` of them, one per text
   (:func:`distinct`): of passages with the same words (copies of one document
   uploaded twice, synced from two sources, a ``.docx`` and its PDF export) the
   best ranked stands for all, and the next different passage takes the others'
   places (the search goes deeper, up to ``DEEPEST_SEARCH`` times, to fill them);
3. **the gate** (``core.gate.gate``) decides whether an answer is written, on
   the best candidate's distance against the answer threshold, and from
   which passages: the first ``top_k`` within the related threshold;
4. **the answer order** (``core.retrieve.configured_order``: best sentences,
   term proximity, latent terms), once the gate has passed or more than one
   passage is possibly related, decides which and in what order (the gate
   applied again to that order);
5. **the reranker** (``KB_RERANKER``), when there is one, chooses among the
   candidates within the related threshold;
6. **the passages shown beside them**: beside an answer, the ones ranked with
   its best, too far to pass alone, that it was not written from
   (``core.gate.beside_answer``); when nothing passed, the possibly related
   ones (``core.gate.related``).

A refused question reads nothing past step 3; the rows of step 2 are read
only for candidates within either threshold (none, for a plain refusal).

Copies are told after the asker's scopes have filtered the search: a copy the
asker may read never hides behind one they may not, and what the asker gets
says nothing of copies they cannot see.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT, beside_answer, gate, related
from core.prompt import Role, ThreadMessage
from core.rerank import Reranker, RerankerUnavailable, rerank
from core.retrieve import Candidate, Mode, RetrievalBackend, configured_order, reorders_answers
from index.ingest import SHEET_KINDS, sheet_columns
from index.knowledge_base import KnowledgeBase
from index.normal_form import plain, same_text, unshouted
from index.records import ChunkRow

log = logging.getLogger(__name__)

__all__ = ["DEEPEST_SEARCH", "PassageSelector", "Selection", "distinct", "retrieval_query"]

# How many times deeper than its ``top_k * CANDIDATES_PER_KEPT`` candidates a search goes
# to fill the places of copies (doubling each time): with more copies of each passage
# than that, fewer distinct candidates are left.
DEEPEST_SEARCH = 4


@dataclass(frozen=True)
class Selection:
    """The passages one question gets, as chunk candidates (their rows are the caller's to read).

    Attributes:
        query: what was searched (the question's normal form, after a follow-up's topic).
        searched: the fused candidates, as the search returned them, one per text (``distinct``).
        candidates: the same, in the order passages are chosen from (the
            answer order when it was applied, else fused).
        kept: the passages an answer is written from, in order; empty: nothing
            passed the gate, and no model is asked.
        near: possibly related passages, never written from: beside the answer
            when ``kept`` has passages, instead of one when it has none.
        timings: milliseconds of the answer order (``order``) and the reranker
            (``rerank``), when they ran.
    """

    query: str
    searched: list[Candidate]
    candidates: list[Candidate]
    kept: list[Candidate]
    near: list[Candidate]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def shown(self) -> list[Candidate]:
        """Every passage a person is shown for the question, in order: ``kept``, then ``near``."""
        return [*self.kept, *self.near]


def retrieval_query(question: str, history: Sequence[ThreadMessage] = ()) -> str:
    """What is searched for ``question``: its normal form, after the topic of its thread.

    A follow-up ("and on Windows?") means little alone; the question the bot
    last answered carries the topic (people's chatter since may not: the
    model reads it in the prompt, retrieval is not steered by it).
    """
    topic = _last_answered(history)
    question = unshouted(plain(question))
    return f"{unshouted(plain(topic))}\n{question}" if topic else question


class PassageSelector:
    """Chooses the passages of a question from one knowledge base, the same for every surface.

    Args:
        kb: the knowledge base (its embedder and store).
        config: the gate, the answer order's weights.
        backend: the search index (``kb.search_index`` when omitted).
        reranker: chooses among the passing passages; ``None``: the answer order decides.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        config: EngineConfig,
        *,
        backend: RetrievalBackend | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        self.kb = kb
        self.config = config
        self.backend = backend or kb.search_index
        self.reranker = reranker

    def select(
        self,
        question: str,
        scopes: frozenset[str] | None,
        *,
        history: Sequence[ThreadMessage] = (),
    ) -> Selection:
        """The passages ``question`` gets from the documents ``scopes`` may see (``None``: all)."""
        query = retrieval_query(question, history)
        vector = self.vector(query)
        return self.choose(query, vector, self.search(query, vector, scopes))

    def vector(self, query: str) -> np.ndarray:
        """The query's embedding (a question's, for asymmetric models)."""
        return self.kb.question_vector(query)

    def search(
        self,
        query: str,
        vector: np.ndarray,
        scopes: frozenset[str] | None,
        *,
        every_leg: bool = False,
    ) -> list[Candidate]:
        """The fused candidates of ``query`` visible to ``scopes``, best first, one per text.

        Nothing beyond both thresholds is shown: a question with no passage
        that close is refused whatever BM25 finds, so the engine may skip that
        leg (``every_leg``: search it all the same, for a measurement of the
        order of candidates that are not shown). Copies are told among the
        candidates within both thresholds (``every_leg``: among all of them);
        when some were, a deeper search adds the next different passages after
        the first search's, whose order stays as it was.
        """
        cfg = self.config
        cutoff = None if every_leg else max(cfg.threshold, cfg.related_threshold)
        reach = math.inf if cutoff is None else cutoff
        k = cfg.top_k * CANDIDATES_PER_KEPT
        found = self.backend.search(vector, query, scopes, k, Mode.HYBRID, cutoff)
        rows = self._rows(found, reach, {})
        chosen = distinct(found, rows, reach=reach)
        seen = {c.chunk_id for c in found}
        depth = k
        while len(chosen) < k and len(found) == depth and depth < DEEPEST_SEARCH * k:
            depth *= 2
            found = self.backend.search(vector, query, scopes, depth, Mode.HYBRID, cutoff)
            more = [c for c in found if c.chunk_id not in seen]
            seen.update(c.chunk_id for c in more)
            rows = self._rows(more, reach, rows)
            had = {_text_of(rows[c.chunk_id]) for c in chosen if _compared(c, rows, reach)}
            chosen += [
                c
                for c in distinct(more, rows, reach=reach)
                if not _compared(c, rows, reach) or _text_of(rows[c.chunk_id]) not in had
            ]
        return chosen[:k]

    def _rows(
        self, candidates: Sequence[Candidate], reach: float, rows: dict[int, ChunkRow]
    ) -> dict[int, ChunkRow]:
        """``rows`` with those of ``candidates`` within ``reach`` (what ``distinct`` compares)."""
        rows.update(self.kb.chunks_by_id([c.chunk_id for c in candidates if c.distance <= reach]))
        return rows

    def reorders(self) -> bool:
        """Whether the answer order has a leg to weigh (else it is the fused order)."""
        return reorders_answers(self.config, self.kb.embedder)

    def ordered(
        self, query: str, vector: np.ndarray, candidates: Sequence[Candidate]
    ) -> list[Candidate]:
        """``candidates`` in the answer order (as they are when it has no leg to weigh)."""
        if not self.reorders():
            return list(candidates)
        return configured_order(
            candidates, vector, query, self.kb.store, self.config, self.kb.embedder
        )

    def choose(
        self,
        query: str,
        vector: np.ndarray,
        candidates: Sequence[Candidate],
        *,
        threshold: float | None = None,
    ) -> Selection:
        """The passages kept and shown from ``candidates`` (``threshold``: another than the config's).

        Only passages close enough to answer from or to show as related are
        ordered: a plain refusal reads no sentences or texts.
        """
        cfg = self.config
        limit = cfg.threshold if threshold is None else threshold
        timings: dict[str, float] = {}
        order = list(candidates)
        kept = self._gate(order, limit)
        near: list[Candidate]
        if kept:
            if self.reorders():
                with _timed(timings, "order"):
                    order = self.ordered(query, vector, order)
                kept = self._gate(order, limit)
            if self.reranker is not None:
                with _timed(timings, "rerank"):
                    kept = self._reranked(query, order, kept, self._within(limit))
            near = beside_answer(
                order,
                kept,
                threshold=limit,
                related_threshold=cfg.related_threshold,
                within=cfg.top_k,
            )
        else:
            near = related(order, related_threshold=cfg.related_threshold)
            if len(near) > 1 and self.reorders():
                with _timed(timings, "order"):
                    order = self.ordered(query, vector, order)
                near = related(order, related_threshold=cfg.related_threshold)
        return Selection(query, list(candidates), order, kept, near, timings)

    def _gate(self, candidates: Sequence[Candidate], threshold: float) -> list[Candidate]:
        cfg = self.config
        return gate(
            candidates,
            threshold=threshold,
            top_k=cfg.top_k,
            max_kept=cfg.max_kept,
            margin=cfg.keep_margin,
            related_threshold=cfg.related_threshold,
        )

    def _within(self, threshold: float) -> float:
        """How far a passage an answer is written from may be, once ``threshold`` has passed."""
        return max(threshold, self.config.related_threshold)

    def _reranked(
        self,
        query: str,
        candidates: list[Candidate],
        passed: list[Candidate],
        threshold: float,
    ) -> list[Candidate]:
        """As many candidates within ``threshold`` as ``passed``, chosen by the reranker; ``passed`` if it fails."""
        assert self.reranker is not None
        rows = self.kb.chunks_by_id([c.chunk_id for c in candidates if c.distance <= threshold])
        try:
            return rerank(
                self.reranker, query, candidates, rows, threshold=threshold, keep=len(passed)
            )
        except RerankerUnavailable as exc:
            # An answer in fused order beats no answer; the log says why.
            log.warning("reranker unavailable, passages kept in fused order: %s", exc)
            return passed


def distinct(
    candidates: Sequence[Candidate], rows: Mapping[int, ChunkRow], *, reach: float
) -> list[Candidate]:
    """``candidates`` with one passage of each text: the best ranked of its copies, in its place.

    Two passages are copies when their words are the same in
    ``index.normal_form.same_text`` (white space folded, compatibility forms and
    invisible characters gone, case kept) and, for a sheet's rows, under the
    same column names. Of copies ranked alike (one text under one title: the
    same vectors and terms) the one of the newest document stands for them: its
    id is the larger (ids are never reused), so which copy is cited does not
    hang on how an engine breaks ties. A better ranked copy is never passed
    over for a newer one: it is the one the gate judges, and the asker gets the
    answer they would without the other copies.

    Only candidates within ``reach`` whose row is in ``rows`` are compared;
    the others stay as they are (beyond it nothing is shown; a row gone
    meanwhile is the caller's to notice).
    """
    places: dict[tuple[str, str], int] = {}
    chosen: list[Candidate] = []
    for candidate in candidates:
        if not _compared(candidate, rows, reach):
            chosen.append(candidate)
            continue
        row = rows[candidate.chunk_id]
        key = _text_of(row)
        at = places.get(key)
        if at is None:
            places[key] = len(chosen)
            chosen.append(candidate)
            continue
        standing = chosen[at]
        if candidate.score == standing.score and (
            row.document_id > rows[standing.chunk_id].document_id
        ):
            chosen[at] = candidate
    return chosen


def _compared(candidate: Candidate, rows: Mapping[int, ChunkRow], reach: float) -> bool:
    """Whether ``distinct`` compares ``candidate``: within ``reach``, its row read."""
    return candidate.distance <= reach and candidate.chunk_id in rows


def _text_of(row: ChunkRow) -> tuple[str, str]:
    """What tells a passage's copies: its words, and a sheet row's column names."""
    columns = (
        sheet_columns(row.kind, row.document, row.section, row.text, row.content)
        if row.kind in SHEET_KINDS
        else ""
    )
    return same_text(row.content), same_text(columns)


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time the block into ``timings[name]``, in milliseconds."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round((time.perf_counter() - started) * 1000, 2)


def _last_answered(history: Sequence[ThreadMessage]) -> str:
    """The person's message the bot answered last; the last person's message if it never did."""
    answered = False
    for message in reversed(history):
        if message.role == Role.ASSISTANT:
            answered = True
        elif answered:
            return message.text
    return next((m.text for m in reversed(history) if m.role == Role.USER), "")
