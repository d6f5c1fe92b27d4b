"""The answer engine: select passages -> prompt -> model -> citations -> log.

The passages are chosen by ``core.selection.PassageSelector`` (search, gate,
answer order, reranker), the one stage every surface calls. The invariants
this module keeps:

* nothing passes the gate -> **no model call**: the closest passages within
  the looser related threshold, labelled as possibly related (``related``),
  or, when none is that close, the fixed refusal with no sources;
* the model writes numbers, the server resolves them: only sources the answer
  actually cites are returned, renumbered in order of first appearance;
* the model is unavailable -> the kept passages are returned as evidence,
  labelled ``grounded=False``, never an exception;
* the passages beside an answer (``Answer.beside``: ranked among its best, too
  far to pass alone, left out by the reranker) are shown as possibly related,
  never given to the model;
* every question is logged with its outcome, kept chunks and timings; a
  question whose answer is cancelled midway (the person pressed Stop) is logged
  as ``stopped``, with what had been written so far, and the cancellation goes on;
* the steps of the work are reported as they happen (``on_step``: searching,
  what was found, writing), as plain data a surface may show;
* a search outside the knowledge base as the asker (``outside``: Slack's
  messages) runs beside retrieval and is its own group (``Answer.outside``),
  gated by the same distance; the model reads it only when the surface says
  the asker alone reads the answer, and then the answer's text is not logged
  (``core.outside`` has the rules).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from core.citations import resolve_citations
from core.config import EngineConfig
from core.errors import LinkSecretUnavailable, LLMUnavailable
from core.gate import related
from core.lines import PersonLines
from core.links import LinkSigner, passage_url
from core.llm import LLM, OnDelta
from core.outside import Found, Outside, OutsideRef, OutsideSearch, close_passages
from core.prompt import HISTORY_TURNS, Source, ThreadMessage, as_thread, build_messages
from core.rerank import Reranker
from core.retrieve import Candidate, Mode, RetrievalBackend
from core.searches import SearchGate
from core.selection import PassageSelector, Selection, retrieval_query
from index.errors import DatabaseUnavailable, DocumentNotFound, StorageError
from index.ingest import SHEET_KINDS, sheet_columns
from index.knowledge_base import KnowledgeBase
from index.languages import ENGLISH, detect
from index.models import ALL_SCOPES
from index.normal_form import plain, well_formed
from index.records import ChunkRow, DocumentRow, QueryRecord
from index.search import question_language
from index.sources import is_source_scope

log = logging.getLogger(__name__)

# How sure the language detector must be of a question's language, in a
# knowledge base of English only, before the prompt names it.
QUESTION_CONFIDENCE = 0.9
# A question, not a document: about a page of text. Every surface refuses a longer one before
# anything reads it (the multilingual model reads a long text window by window: a Slack
# message of 40,000 characters is about 25 s of two cores); none cuts it.
MAX_QUESTION_CHARS = 4000

REFUSAL_TEXT = "The knowledge base has nothing on this, so I won't guess."
EVIDENCE_TEXT = "No answer was generated. Here is what the knowledge base says:"
UNSIGNED_LINKS_TEXT = (
    "The sources are listed without links: the server cannot sign links right now "
    "(its link secret cannot be created)."
)
RELATED_TEXT = (
    "The knowledge base has no clear answer to this. These passages might be related; "
    "they are not an answer:"
)


class Outcome(StrEnum):
    """How a question ended."""

    ANSWERED = "answered"  # the model answered and cited at least one source
    REFUSED = "refused"  # nothing passed either threshold; the model was not called
    RELATED = "related"  # nothing passed the gate; possibly related passages shown, no model
    MODEL_UNAVAILABLE = "model_unavailable"  # evidence shown instead of an answer
    UNSUPPORTED = "unsupported"  # the model answered but cited nothing valid
    STOPPED = "stopped"  # the asker stopped it before it was finished (what was written is logged)


class StepKind(StrEnum):
    """A step of the work on one question, in the order they happen."""

    SEARCHING = "searching"  # retrieval started
    FOUND = "found"  # passages passed the gate; the answer is written from them
    NOTHING_FOUND = "nothing_found"  # nothing passed the gate: no model call
    WRITING = "writing"  # the model is writing the answer
    DONE = "done"  # the reply is complete (nothing left to stop); it is logged next


@dataclass(frozen=True)
class StepSource:
    """A document the answer is written from: its name and the link to its first kept passage."""

    document: str
    url: str


@dataclass(frozen=True)
class Step:
    """What the engine is doing, for a surface to show while the answer is on its way.

    Attributes:
        kind: which step.
        passages: ``FOUND``: how many passages the answer is written from;
            ``NOTHING_FOUND``: how many possibly related passages are shown instead.
        documents: how many documents those passages come from.
        sources: ``FOUND``: each of those documents once, in the passages' order,
            with a signed link (documents whose link cannot be signed are left out).
    """

    kind: StepKind
    passages: int = 0
    documents: int = 0
    sources: tuple[StepSource, ...] = ()


OnStep = Callable[[Step], Awaitable[None]]
"""Called with each :class:`Step` as the work on a question reaches it."""
OnWait = Callable[[int], Awaitable[None]]
"""Called with the cap when a question waits for its asker's own earlier ones."""


@dataclass(frozen=True)
class SourceRef:
    """A passage shown to the user, with the link that opens it."""

    n: int
    chunk_id: int
    document_id: int
    document: str
    section: str
    page: int | None
    start: int
    end: int
    url: str
    quote: str
    distance: float
    columns: str = ""
    """A sheet passage below its header row: that row (the column names), for the model."""
    origin: str = ""
    """Where its document opens in the source it was synced from (a Confluence page); empty
    for a document added here."""


@dataclass
class Answer:
    """The engine's reply to one question (``kb ask --json`` prints this)."""

    question: str
    outcome: Outcome
    answer: str
    grounded: bool
    model_called: bool
    sources: list[SourceRef] = field(default_factory=list)
    kept: list[SourceRef] = field(default_factory=list)
    beside: list[SourceRef] = field(default_factory=list)
    """Possibly related passages shown beside an answer, never given to the model
    (``core.gate.beside_answer``); numbered on from ``kept``."""
    invalid_citations: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    query_id: int | None = None
    model_error: str | None = None
    links_note: str | None = None
    """Set when the passages' links could not be signed (``url`` is then empty): why."""
    outside: Outside | None = None
    """What a search outside the knowledge base as the asker found (``core.outside``), its own
    group; ``None``: there was no such search."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class _Kept:
    """What the selection kept for one question, as linked passages."""

    passages: list[SourceRef]  # given to the model
    selection: Selection  # the passages chosen, beside them, and every candidate in order
    missing: int  # kept chunks SQLite no longer has (the snapshot is behind)


@dataclass(frozen=True)
class Asker:
    """Who asked, and where (for the query log).

    ``surface`` is where: ``slack``, ``cli`` for ``kb ask``, or ``mcp`` for an
    agent's tool call, whose ``client`` is the name of the token it came with.
    """

    user: str | None = None
    channel: str | None = None
    thread_id: str | None = None
    surface: str = "slack"
    client: str | None = None


class Engine:
    """Answers questions from one knowledge base.

    Args:
        kb: the knowledge base.
        config: the gate, the model endpoint and the links.
        signer: signs passage links.
        llm: the model client (built from ``config.llm`` when omitted).
        backend: the retrieval backend (FAISS + BM25 over ``kb`` when omitted).
        reranker: orders the passages that passed the gate (built from
            ``config.reranker`` when omitted; none when that is empty).
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        config: EngineConfig,
        *,
        signer: LinkSigner,
        llm: LLM | None = None,
        backend: RetrievalBackend | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        self.kb = kb
        self.config = config
        self.signer = signer
        self.llm = llm or LLM(config.llm)
        self.backend = backend or kb.search_index
        self.reranker = reranker or (Reranker(config.reranker) if config.reranker else None)
        self.selector = PassageSelector(kb, config, backend=self.backend, reranker=self.reranker)
        # Held by every search, closed by a switch of the embedding model (core.searches).
        self.searches = SearchGate()
        # A server's move to the model the store's documents moved to (``ModelSwitch.follow``).
        self.follow_store: Callable[[], Awaitable[bool]] | None = None
        # The search snapshot's generation the store's model stamps were last read at.
        self._stamps_read_at: int | None = None
        # Follows a question started, held to their end even when it is stopped (``_followed``).
        self._follows: set[asyncio.Future[bool]] = set()
        self._own_backend = backend is None
        # Each asker's questions in flight, a few at a time (``core.lines``).
        self.askers = PersonLines(config.max_questions_per_asker)

    def follow_model(self, config: EngineConfig) -> None:
        """Search the index of the model ``kb`` now runs, at that model's thresholds (``config``).

        Called while :attr:`searches` is closed, after the knowledge base moved
        to another embedding model (``KnowledgeBase.reindex`` with a switch).
        """
        if self._own_backend:
            self.backend = self.kb.search_index
        self.config = config
        self.selector = PassageSelector(
            self.kb, config, backend=self.backend, reranker=self.reranker
        )

    def thread_history(self, channel: str, thread_id: str) -> list[ThreadMessage]:
        """A thread's earlier messages as the query log has them (its questions and answers)."""
        return as_thread(self.kb.queries.thread_turns(channel, thread_id, HISTORY_TURNS))

    async def aclose(self) -> None:
        """Release the model client's connections."""
        await self.llm.aclose()

    def retrieve(
        self, query: str, *, scopes: frozenset[str] | None, k: int, mode: Mode = Mode.HYBRID
    ) -> list[Candidate]:
        """Fused candidates for ``query`` (no gate), best first; searched in its normal form."""
        query = plain(query)
        vector = self.kb.question_vector(query)
        return self.backend.search(vector, query, scopes, k, mode)

    async def ask(
        self,
        question: str,
        *,
        scopes: frozenset[str] | None = None,
        history: Sequence[ThreadMessage] = (),
        asker: Asker = Asker(),
        on_delta: OnDelta | None = None,
        on_step: OnStep | None = None,
        outside: OutsideSearch | None = None,
        quote_outside: bool = False,
        on_wait: OnWait | None = None,
    ) -> Answer:
        """Answer ``question`` from the passages visible to ``scopes`` (``None``: all).

        Args:
            question: the user's question.
            scopes: channel scopes the asker may see; documents for everyone are always visible.
            history: earlier messages of the same thread, oldest first; the
                question the bot last answered is added to the retrieval query so
                follow-ups find context.
            asker: who asked, for the log.
            on_delta: receives the answer text while the model streams it.
            on_step: receives each :class:`Step` of the work as it is reached.
            outside: also searches there, as the asker (``core.outside``).
            quote_outside: the asker alone reads the answer: what ``outside``
                finds close may be given to the model as sources.
            on_wait: awaited with the cap once, when the question must wait.

        At most ``config.max_questions_per_asker`` questions of one asker
        (``asker.user``) are searched and answered at a time, on every surface
        together; a further one waits for them, in the order asked, and nobody
        else's question waits behind them (a question with no user does not wait).

        Cancelled (the asker stopped it), the question is logged as ``stopped``
        with what was written so far, and the cancellation goes on.

        The question and the history are taken well formed
        (``index.normal_form.well_formed``): a message cut in the middle of an
        emoji is answered and logged like the rest of its words.
        """
        question = well_formed(question)
        history = [replace(m, text=well_formed(m.text)) for m in history]
        trace = _Trace()
        search = _OutsideSearch(outside, question, quote=quote_outside)
        place = self.askers.take(asker.user) if asker.user else None
        try:
            if place is not None and place.waits and on_wait is not None:
                await on_wait(self.askers.per_person)
            async with place.hold() if place is not None else nullcontext():
                answer = await self._answer(
                    question, scopes, history, on_delta, on_step, trace, search
                )
        except asyncio.CancelledError:
            await asyncio.to_thread(self._log_stopped, question, trace, scopes, asker)
            raise
        finally:
            search.cancel()
            if place is not None:
                place.leave()  # cancelled before its turn came: the next may start
        answer.query_id = await asyncio.to_thread(
            self._log, answer, trace.candidates, scopes, asker
        )
        return answer

    async def stopped(
        self, question: str, *, scopes: frozenset[str] | None = None, asker: Asker = Asker()
    ) -> None:
        """Log ``question`` as ``stopped`` before :meth:`ask` began (the asker stopped it first)."""
        await asyncio.to_thread(self._log_stopped, well_formed(question), _Trace(), scopes, asker)

    async def _answer(
        self,
        question: str,
        scopes: frozenset[str] | None,
        history: Sequence[ThreadMessage],
        on_delta: OnDelta | None,
        on_step: OnStep | None,
        trace: _Trace,
        search: _OutsideSearch,
    ) -> Answer:
        """Everything :meth:`ask` does but the log; ``trace`` follows how far it got."""
        report = on_step or _no_step
        timings = trace.timings
        t0 = trace.started
        await report(Step(StepKind.SEARCHING))
        search.start()  # beside retrieval: the two wait on different machines
        # One model from the question's embedding to its passages' text (core.searches).
        leave = await self.searches.enter()
        try:
            if await self._store_moved():
                leave = await self._followed(leave)
            query = retrieval_query(question, history)
            vector = await asyncio.to_thread(self.selector.vector, query)
            timings["embed"] = _ms_since(t0)
            t = time.perf_counter()
            seen = self.kb.search_index.generation
            candidates = trace.candidates = await self._search(query, vector, scopes)
            timings["retrieve"] = _ms_since(t)
            t = time.perf_counter()
            kept = await self._keep(query, vector, candidates, timings)
            timings["gate"] = _ms_since(t)
            if kept.missing and await self._caught_up(seen):
                # The snapshot named chunks another process had just replaced or
                # removed (a reindex, a removal): ask the store as it is now.
                t = time.perf_counter()
                candidates = trace.candidates = await self._search(query, vector, scopes)
                kept = await self._keep(query, vector, candidates, timings)
                if await self._store_moved():
                    # What is left of this model's passages is the rest of a half-moved store.
                    leave = await self._followed(leave)
                    vector = await asyncio.to_thread(self.selector.vector, query)
                    candidates = trace.candidates = await self._search(query, vector, scopes)
                    kept = await self._keep(query, vector, candidates, timings)
                timings["refresh"] = _ms_since(t)
            trace.kept = kept.passages
            group = await self._outside(search, vector, timings)
            quoted = group.shown if group is not None and group.quoted else []
            trace.outside_quoted = bool(quoted)
            if not kept.passages and not quoted:
                answer = await self._not_answered(question, kept.selection)
                await report(_passages_step(StepKind.NOTHING_FOUND, answer.sources))
            else:
                found = _passages_step(StepKind.FOUND, kept.passages)
                # Each conversation the quoted messages come from counts as a document.
                places = {o.passage.place for o in quoted}
                await report(
                    replace(
                        found,
                        passages=found.passages + len(quoted),
                        documents=found.documents + len(places),
                    )
                )
                beside = await self._beside(kept)
                leave()  # the passages are read: the model writes from them, whatever runs next
                answer = await self._generate(
                    question, kept.passages, history, on_delta, on_step, trace, quoted
                )
                answer.beside = beside
            answer.outside = _cited_outside(group, answer)
            if any(not s.url for s in [*answer.sources, *answer.kept, *answer.beside]):
                answer.links_note = UNSIGNED_LINKS_TEXT
            timings["total"] = _ms_since(t0)
            answer.timings_ms = timings
            await report(Step(StepKind.DONE))
            return answer
        finally:
            leave()

    def _log_stopped(
        self, question: str, trace: _Trace, scopes: frozenset[str] | None, asker: Asker
    ) -> None:
        """Log a question stopped midway, with the passages kept and the text written so far.

        Written from passages found outside the knowledge base, the text is not
        kept: it may quote them, and they are never stored.
        """
        trace.timings["total"] = _ms_since(trace.started)
        stopped = Answer(
            question,
            Outcome.STOPPED,
            "" if trace.outside_quoted else trace.written,
            grounded=False,
            model_called=trace.model_called,
            kept=trace.kept,
            timings_ms=trace.timings,
        )
        log.info("question stopped after %.0f ms", trace.timings["total"])
        self._log(stopped, trace.candidates, scopes, asker)

    async def _outside(
        self, search: _OutsideSearch, vector: np.ndarray, timings: dict[str, float]
    ) -> Outside | None:
        """The outside group: what the search found that the gate finds close (``core.outside``)."""
        found = await search.result()
        if found is None:
            return None
        t = time.perf_counter()
        shown = await asyncio.to_thread(
            close_passages,
            self.kb.embedder,
            vector,
            found.passages,
            threshold=self.config.threshold,
            limit=self.config.top_k,
        )
        timings["outside"] = _ms_since(t)
        return Outside(shown, found.reach, found.failure, quoted=search.quote)

    async def _search(
        self, query: str, vector: np.ndarray, scopes: frozenset[str] | None
    ) -> list[Candidate]:
        return await asyncio.to_thread(self.selector.search, query, vector, scopes)

    async def _keep(
        self,
        query: str,
        vector: np.ndarray,
        candidates: list[Candidate],
        timings: dict[str, float],
    ) -> _Kept:
        """What the selection keeps, as linked passages, and how many of them SQLite lacks."""
        selection = await asyncio.to_thread(self.selector.choose, query, vector, candidates)
        timings.update(selection.timings)
        refs, missing = await self.source_refs(selection.kept)
        return _Kept(refs, selection, missing)

    async def _beside(self, kept: _Kept) -> list[SourceRef]:
        """The passages shown beside an answer written from ``kept``, numbered on from it."""
        if not kept.selection.near:
            return []
        shown, _ = await self.source_refs(kept.selection.near, first=len(kept.passages) + 1)
        return shown

    def _question_language(self, question: str) -> str | None:
        """The question's language when it is clear, for the prompt to name (``build_messages``).

        Told among the knowledge base's languages and English; in a knowledge
        base of English only, among all languages, since it has none to compare.
        """
        corpus = self.kb.store.chunk_languages()
        if corpus - {ENGLISH}:
            return question_language(question, corpus)
        found = detect(question)
        return found.code if found and found.confidence >= QUESTION_CONFIDENCE else None

    async def source_refs(
        self, passed: Sequence[Candidate], *, first: int = 1
    ) -> tuple[list[SourceRef], int]:
        """Linked passages for ``passed`` (in order, numbered from ``first``), and how many
        SQLite no longer has.

        The one way a passage becomes what a surface shows or a model reads: its
        signed link, a sheet passage's column names, a synced document's origin.
        Every surface (Slack, MCP, ``kb ask``) gets its passages from here.
        """
        rows = await asyncio.to_thread(self.kb.chunks_by_id, [c.chunk_id for c in passed])
        found = [c for c in passed if c.chunk_id in rows]
        columns: dict[int, str] = {}
        if any(rows[c.chunk_id].kind in SHEET_KINDS for c in found):
            columns = await asyncio.to_thread(
                self._sheet_columns, [rows[c.chunk_id] for c in found]
            )
        origins: dict[str, str] = {}
        synced = {rows[c.chunk_id].scope for c in found} & {
            r.scope for r in rows.values() if is_source_scope(r.scope)
        }
        if synced:
            origins = await asyncio.to_thread(self._origins, synced)
        kept = [
            replace(
                self._source_ref(i, c, rows[c.chunk_id], columns.get(c.chunk_id, "")),
                origin=origins.get(rows[c.chunk_id].scope, ""),
            )
            for i, c in enumerate(found, start=first)
        ]
        return kept, len(passed) - len(found)

    def _origins(self, scopes: set[str]) -> dict[str, str]:
        """Where each synced document of ``scopes`` opens in its source."""
        found = {s: self.kb.store.sources.item_of_scope(s) for s in scopes}
        return {s: item.url for s, item in found.items() if item is not None}

    def _sheet_columns(self, rows: Sequence[ChunkRow]) -> dict[int, str]:
        """For each sheet chunk below its header row, the column names its content lacks."""
        titles: dict[int, str] = {}
        columns: dict[int, str] = {}
        for row in rows:
            if row.kind not in SHEET_KINDS:
                continue
            if row.document_id not in titles:
                try:
                    titles[row.document_id] = self.kb.document(row.document_id).title
                except DocumentNotFound:
                    continue  # removed meanwhile: its passage goes without column names
            title = titles[row.document_id]
            named = sheet_columns(row.kind, title, row.section, row.text, row.content)
            if named:
                columns[row.id] = named
        return columns

    async def _not_answered(self, question: str, selection: Selection) -> Answer:
        """Nothing passed the gate: possibly related passages, or the plain refusal.

        The related passages are the selection's (``core.selection``), in the
        order an answer keeps its passages in: the passage that would have been
        cited first is shown first.
        """
        near = selection.near
        if selection.kept:
            # Every kept passage is gone from the store (removed meanwhile): what
            # is close of the rest is at most possibly related.
            near = related(selection.candidates, related_threshold=self.config.related_threshold)
        shown, _ = await self.source_refs(near)
        if shown:
            return Answer(
                question,
                Outcome.RELATED,
                RELATED_TEXT,
                grounded=False,
                model_called=False,
                sources=shown,
            )
        return Answer(question, Outcome.REFUSED, REFUSAL_TEXT, grounded=False, model_called=False)

    @asynccontextmanager
    async def searching(self) -> AsyncIterator[None]:
        """Hold the search gate for one search (``core.searches``), on the model the store calls
        for: followed first when another process moved it (as :meth:`ask` does)."""
        leave = await self.searches.enter()
        try:
            if await self._store_moved():
                leave = await self._followed(leave)
            yield
        finally:
            leave()

    async def _store_moved(self) -> bool:
        """Whether another process moved the store's documents to another model, unfollowed yet.

        The stamps are read once per generation of the search snapshot (no query
        while it stays the same): a server's look at the store follows a move
        within ``KB_SYNC_SECONDS``, and a search in between follows it at once.
        """
        generation = self.kb.search_index.generation
        if self.follow_store is None or generation == self._stamps_read_at:
            return False
        moved = await asyncio.to_thread(self.kb.store_model) is not None
        if not moved:
            self._stamps_read_at = generation
        return moved

    async def _followed(self, leave: Callable[[], None]) -> Callable[[], None]:
        """Leave the gate, follow the store's model (its switch waits for the searches under
        way to leave), and enter again, on the model it runs now; the way to leave."""
        leave()
        if self.follow_store is not None:
            # One under way here already: the gate waits for it. Shielded: a question
            # stopped meanwhile (Stop) leaves the switch to end whole; cancelled, its worker
            # thread would move the knowledge base on while the gate reopened, the engine
            # left on the earlier model's index.
            following = asyncio.ensure_future(self.follow_store())
            self._follows.add(following)
            following.add_done_callback(self._followed_off)
            await asyncio.shield(following)
        return await self.searches.enter()

    def _followed_off(self, following: asyncio.Future[bool]) -> None:
        """A follow a question started is over: dropped, and its failure logged (a stopped
        question no longer hears of it)."""
        self._follows.discard(following)
        if not following.cancelled() and following.exception() is not None:
            log.warning("following the store's model failed", exc_info=following.exception())

    async def _caught_up(self, seen: int | None) -> bool:
        """Bring the snapshot up to the store; whether it moved past generation ``seen``."""
        generation = await asyncio.to_thread(self.kb.search_index.sync)
        if generation == seen:
            return False
        log.info("search index behind the store (%s -> %s): searching again", seen, generation)
        return True

    async def _generate(
        self,
        question: str,
        kept: list[SourceRef],
        history: Sequence[ThreadMessage],
        on_delta: OnDelta | None,
        on_step: OnStep | None,
        trace: _Trace,
        outside: Sequence[OutsideRef] = (),
    ) -> Answer:
        """The model's answer from ``kept``, then ``outside`` (numbered after them)."""
        timings = trace.timings
        sources = [
            Source(n=s.n, document=s.document, locator=_locator(s), content=s.quote) for s in kept
        ]
        sources += [_outside_source(len(sources) + i, o) for i, o in enumerate(outside, start=1)]
        asked = plain(question)  # what was searched for: full-width letters folded, invisibles gone
        language = await asyncio.to_thread(self._question_language, asked)
        messages = build_messages(asked, sources, history=history, language=language)
        if self.llm.configured:
            await (on_step or _no_step)(Step(StepKind.WRITING))
            trace.model_called = True  # not before: a stop while the step is shown calls no model
        t = time.perf_counter()
        try:
            text = await self.llm.complete(messages, on_delta=_tracked(on_delta, trace))
        except LLMUnavailable as exc:
            timings["llm"] = _ms_since(t)
            # Not configured is a choice (evidence-only mode); a failing endpoint is a problem.
            level = logging.WARNING if self.llm.configured else logging.INFO
            log.log(level, "model unavailable, showing evidence: %s", exc.reason)
            return Answer(
                question,
                Outcome.MODEL_UNAVAILABLE,
                EVIDENCE_TEXT,
                grounded=False,
                model_called=self.llm.configured,
                sources=kept,
                kept=kept,
                model_error=exc.reason,
            )
        timings["llm"] = _ms_since(t)
        resolved = resolve_citations(text, len(sources))
        if resolved.invalid:
            log.info("citations pointing at no source (not linked): %s", resolved.invalid)
        cited = [
            _renumber(kept[orig - 1], new)
            for new, orig in enumerate(resolved.cited, start=1)
            if orig <= len(kept)
        ]
        outcome = Outcome.UNSUPPORTED if resolved.unsupported else Outcome.ANSWERED
        return Answer(
            question,
            outcome,
            resolved.text,
            grounded=not resolved.unsupported,
            model_called=True,
            sources=cited,
            kept=kept,
            invalid_citations=list(resolved.invalid),
            # The numbers only: _cited_outside puts them on the group.
            outside=Outside(_numbered(outside, resolved.cited, first=len(kept) + 1)),
        )

    def passage_link(self, row: ChunkRow) -> str:
        """The signed viewer link into ``row``'s passage, the one every surface shows.

        Raises ``LinkSecretUnavailable`` while the link secret cannot be read or made.
        """
        return passage_url(
            self.config.link_base_url,
            row.document_id,
            self.signer.token(row.document_id, row.scope),
            start=row.start,
            end=row.end,
            page=row.page,
            is_pdf=row.kind == "pdf",
        )

    def document_link(self, doc: DocumentRow) -> str:
        """The signed viewer link to the whole of ``doc``, from its beginning (a PDF's first page).

        Raises ``LinkSecretUnavailable`` while the link secret cannot be read or made.
        """
        token = self.signer.token(doc.id, doc.scope)
        base = self.config.link_base_url
        return passage_url(base, doc.id, token, start=0, end=0, page=1, is_pdf=doc.kind == "pdf")

    def _source_ref(self, n: int, cand: Candidate, row: ChunkRow, columns: str = "") -> SourceRef:
        try:
            url = self.passage_link(row)
        except LinkSecretUnavailable as exc:
            # The passage is still the evidence; only its link waits for the secret.
            log.warning("passage links cannot be signed, sources shown without them: %s", exc)
            url = ""
        return SourceRef(
            n=n,
            chunk_id=row.id,
            document_id=row.document_id,
            document=row.document,
            section=row.section,
            page=row.page,
            start=row.start,
            end=row.end,
            url=url,
            quote=row.content,
            distance=round(cand.distance, 4),
            columns=columns,
        )

    def _log(
        self,
        answer: Answer,
        candidates: Sequence[Candidate],
        scopes: frozenset[str] | None,
        asker: Asker,
    ) -> int | None:
        """Log the question; ``None`` when the disk refuses (the answer matters more than its log).

        Only the knowledge base's passages are logged; an answer the model wrote
        from passages found outside it is logged without its text (``core.outside``).
        """
        outside = answer.outside
        quoted_outside = outside is not None and outside.quoted and bool(outside.shown)
        record = QueryRecord(
            question=answer.question,
            scopes=sorted(scopes) if scopes is not None else [ALL_SCOPES],
            outcome=answer.outcome.value,
            model_called=answer.model_called,
            # Related passages were shown without passing the gate; the outcome says so.
            kept=[(s.chunk_id, s.distance) for s in answer.kept or answer.sources],
            cited=[s.chunk_id for s in answer.sources] if answer.grounded else [],
            invalid_citations=answer.invalid_citations,
            latency_ms=answer.timings_ms.get("total", 0.0),
            timings=answer.timings_ms,
            user=asker.user,
            channel=asker.channel,
            thread_id=asker.thread_id,
            answer="" if quoted_outside and answer.model_called else answer.answer,
            nearest=_nearest(candidates),
            beside=[(s.chunk_id, s.distance) for s in answer.beside],
            surface=asker.surface,
            client=asker.client,
        )
        try:
            return self.kb.queries.log(record)
        except (StorageError, DatabaseUnavailable) as exc:
            # A full disk, a lock held too long, a database server that went away while
            # the model wrote: the answer is the asker's all the same.
            log.warning("question answered but not logged: %s", exc)
            return None


@dataclass
class _Trace:
    """How far the work on one question got: what it is logged with if it is stopped."""

    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    kept: list[SourceRef] = field(default_factory=list)
    model_called: bool = False
    written: str = ""  # the answer as streamed so far
    outside_quoted: bool = False  # the model reads passages found outside the knowledge base


async def _no_step(step: Step) -> None:
    return None


def _tracked(on_delta: OnDelta | None, trace: _Trace) -> OnDelta | None:
    """``on_delta`` that also keeps the text so far in ``trace`` (``None`` stays ``None``:
    the model is then asked for its answer in one piece)."""
    if on_delta is None:
        return None
    show = on_delta

    async def tracked(text: str) -> None:
        trace.written = text
        await show(text)

    return tracked


def _passages_step(kind: StepKind, passages: Sequence[SourceRef]) -> Step:
    """A step naming ``passages``: how many, from how many documents, each document once."""
    sources: dict[int, StepSource] = {}
    documents = set()
    for p in passages:
        documents.add(p.document_id)
        if p.url and p.document_id not in sources:
            sources[p.document_id] = StepSource(p.document, p.url)
    return Step(kind, len(passages), len(documents), tuple(sources.values()))


def _nearest(candidates: Sequence[Candidate]) -> tuple[int, float] | None:
    """The closest candidate by distance (the gate's measure), whatever was kept."""
    best = min(candidates, key=lambda c: c.distance, default=None)
    return (best.chunk_id, round(best.distance, 4)) if best else None


def _locator(s: SourceRef) -> str:
    parts = [s.section] if s.section else []
    if s.page is not None:
        parts.append(f"page {s.page}")
    if s.columns:
        # The rows of a passage below its sheet's header row read only with their columns.
        parts.append(f"columns: {s.columns}")
    return ", ".join(parts) or "beginning"


class _OutsideSearch:
    """One question's search outside the knowledge base, run beside retrieval."""

    def __init__(self, search: OutsideSearch | None, question: str, *, quote: bool) -> None:
        self.search = search
        self.question = question
        self.quote = quote
        self._task: asyncio.Task[Found] | None = None

    def start(self) -> None:
        if self.search is not None and self._task is None:
            self._task = asyncio.create_task(self.search.search(plain(self.question)))

    async def result(self) -> Found | None:
        """What it found (``None``: no search asked for)."""
        if self._task is None:
            return None
        try:
            return await self._task
        except Exception:  # a surface's bug must cost its group only, never the answer
            log.exception("the search outside the knowledge base failed")
            return Found(failure="error")

    def cancel(self) -> None:
        """Stop it if it still runs (the question was stopped, or failed elsewhere)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _outside_source(n: int, ref: OutsideRef) -> Source:
    """A passage found outside the knowledge base as the model reads it: a numbered source."""
    p = ref.passage
    when = time.strftime("%Y-%m-%d", time.gmtime(p.posted))
    return Source(n=n, document=f"Message by {p.author} in {p.place}", locator=when, content=p.text)


def _numbered(
    outside: Sequence[OutsideRef], cited: Sequence[int], *, first: int
) -> list[OutsideRef]:
    """``outside`` (numbered from ``first`` in the prompt) with their numbers in the answer."""
    new = {orig: n for n, orig in enumerate(cited, start=1)}
    return [replace(o, n=new.get(first + i, 0)) for i, o in enumerate(outside)]


def _cited_outside(group: Outside | None, answer: Answer) -> Outside | None:
    """The outside group of ``answer``: its passages with the numbers the answer cites them by."""
    if group is None:
        return None
    if group.quoted and answer.outside is not None:
        return replace(group, shown=answer.outside.shown)
    return group


def _renumber(s: SourceRef, n: int) -> SourceRef:
    return SourceRef(**{**asdict(s), "n": n})


def _ms_since(t: float) -> float:
    return round((time.perf_counter() - t) * 1000, 2)


def build_engine(config: EngineConfig, kb: KnowledgeBase) -> Engine:
    """The engine over ``kb``: link signer (its secret kept in the data dir) and model client.

    A secret that cannot be created yet (a full disk at the first start) leaves
    the links unsigned until it can be; the answers do not wait for it.
    """
    signer = LinkSigner.kept(
        kb.config.data_dir, config.link_secret, ttl_seconds=config.link_ttl_days * 86400
    )
    return Engine(kb, config, signer=signer)
