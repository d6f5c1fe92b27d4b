"""The knowledge base of one data dir: documents, their states, and the search snapshot.

This is what the CLI and the bot drive. A document moves
``pending -> indexing -> indexed | failed(reason)``; its chunks become visible
in the same transaction that marks it indexed, and a new version of a document
replaces the old one in that transaction too, so nobody ever sees half of one.

Who added a document decides how it gets there (``Publish``, kept on its row):
a document that needs approval ends ``awaiting_approval`` instead of
``indexed`` and is searchable only once an admin approves it; a replaced
version is kept as ``replaced`` (up to ``IndexConfig.keep_versions`` per name
and scope) and can be restored. Every change is written to the audit log in
the transaction that makes it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from dataclasses import replace as with_changes
from pathlib import Path
from typing import TYPE_CHECKING, Any

from index.config import IndexConfig
from index.embed import (
    Embedder,
    EmbeddingModelUnavailable,
    StoreModelUnavailable,
    load_embedder,
    model_name,
    passage_budget,
)
from index.errors import (
    DocumentNotFound,
    ExtractionError,
    KBError,
    NotAwaitingApproval,
    NotRestorable,
    ReindexInProgress,
    StorageError,
    TooLarge,
)
from index.files import check_free_space, size_text
from index.ingest import (
    EXTRACTOR_VERSION,
    FOLDER_SUFFIXES,
    PIPELINE_VERSION,
    SUPPORTED_SUFFIXES,
    Prepared,
    over_reading_limit,
    prepare_document,
    readers_status,
)
from index.kept_model import KeptModel, kept_model
from index.language_fit import LanguageFit, language_fit
from index.models import (
    EVERYONE,
    AuditAction,
    Chunking,
    DocState,
    Extracted,
    Publish,
    is_source_uploader,
)
from index.names import display_name, document_name
from index.near_copies import Stored, size_range
from index.normal_form import same_text
from index.records import AuditEntry, ChunkRow, DocumentFacts, DocumentRow, Stamp
from index.search import (
    BackgroundFits,
    DerivedIndexes,
    LocalSearchIndex,
    QueryAdapters,
    SearchIndex,
    Snapshot,
    open_search_index,
)
from index.storage import INTERRUPTED, INTERRUPTED_KIND, NewDocument, Store

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

Progress = Callable[[str, dict[str, Any]], None]
"""Progress callback: ``(event, details)``; events are documented where emitted."""


@dataclass(frozen=True)
class Added:
    """The result of adding bytes: the document, and whether they were already there."""

    document: DocumentRow
    duplicate: bool


@dataclass(frozen=True)
class Repeats:
    """The documents already there whose text a document repeats.

    Attributes:
        same: its copies (``KnowledgeBase.copies``), newest first: answers quote one of them.
        near: its near-copies that are not copies (``KnowledgeBase.near_copies``), most
            alike first: the same document in another format, or another version of it,
            which answers cite as often as it.
    """

    same: list[DocumentRow]
    near: list[DocumentRow]


@dataclass(frozen=True)
class Published:
    """A document made searchable by an approval or a restore, and the versions it replaced."""

    document: DocumentRow
    replaced: list[DocumentRow]


@dataclass(frozen=True)
class Placement:
    """Where a document stands among the documents of its name and scope.

    Attributes:
        replaced: the versions it replaced, newest first.
        beside: the other searchable documents of its name and scope: left
            alone (someone else's), or, while it awaits approval, those an
            approval would replace.
    """

    document: DocumentRow
    replaced: list[DocumentRow]
    beside: list[DocumentRow]


@dataclass
class IngestSummary:
    """What ``ingest_paths`` did."""

    indexed: list[DocumentRow] = field(default_factory=list)
    failed: list[DocumentRow] = field(default_factory=list)
    unchanged: list[DocumentRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # Files not stored at all ("path: reason"): too large, or no room on the disk.
    refused: list[str] = field(default_factory=list)

    @property
    def chunks(self) -> int:
        """Chunks written by this run."""
        return sum(d.chunk_count for d in self.indexed)


@dataclass(frozen=True)
class FailedDocument:
    """A document a reindex could not rebuild, and why (its row keeps its last state)."""

    document: DocumentRow
    reason: str


@dataclass
class ReindexReport:
    """What a reindex did."""

    documents: int = 0
    chunks: int = 0
    failed: list[FailedDocument] = field(default_factory=list)
    # Failed documents not read again: their bytes went over a reading limit
    # (KB_EXTRACT_MEMORY_MB, KB_EXTRACT_TIMEOUT) that has not been raised since.
    skipped: list[FailedDocument] = field(default_factory=list)
    stale_before: int = 0
    stale_after: int = 0


class KnowledgeBase:
    """Documents, chunks and search indexes of one data dir.

    Args:
        config: data dir, embedding model, limits.
        embedder: an already-loaded embedder to share (tests, the bot); one is
            loaded from ``config.embedding_model`` otherwise.
        chunker: replaces the product's chunker (the evaluation compares
            chunking strategies through this same ingestion code).
        keep_earlier_model: open a knowledge base built on the earlier default
            model on that model (``index.kept_model``); ``False`` (``kb reindex``):
            on the configured one, so that a reindex moves it.
        fit_in_background: fit a due query map on a thread of its own (the
            server: ``kb serve``), so that a write returns once its passages are
            searchable; ``stop_fitting`` at shutdown. ``False`` (the offline
            tools, tests): in the writer's thread, before the write returns.
            A reindex's fit on the model it ran on is the writer's; a move's, to
            another model, is asked of that thread (the searches held for the
            move do not wait for it).
    """

    def __init__(
        self,
        config: IndexConfig,
        *,
        embedder: Embedder | None = None,
        chunker: Callable[[Extracted], Chunking] | None = None,
        keep_earlier_model: bool = True,
        fit_in_background: bool = False,
    ) -> None:
        self.chunker = chunker
        # Where due query maps are fitted: None, in the writer's thread.
        self.fits = BackgroundFits() if fit_in_background else None
        self.store = Store(config.data_dir, database_url=config.database_url)
        # The earlier default this knowledge base was built on and keeps running, if any.
        self.kept_model: KeptModel | None = None
        # The model the operator configured; with ``follows_store``, the one to run
        # is chosen from it and the store's stamps, at open and whenever they change.
        self.configured_model = config.embedding_model
        self.follows_store = embedder is None and keep_earlier_model
        # Why questions are refused: the store moved to a model that could not be loaded here.
        self.unfollowed: str | None = None
        if self.follows_store:
            self.kept_model = kept_model(config.embedding_model, self.store.stamped_models())
        if self.kept_model is not None:
            config = with_changes(config, embedding_model=self.kept_model.spec)
            log.warning("%s", self.kept_model.note)
        # The store's parts, as the surfaces use them: what is asked and answered,
        # thumbs, Slack deliveries, the audit log, hand-offs to people, the messages
        # posted for documents, the viewer's used sign-in states.
        self.queries = self.store.queries
        self.feedback = self.store.feedback
        self.deliveries = self.store.deliveries
        self.audit_log = self.store.audit_log
        self.escalations = self.store.escalations
        self.messages = self.store.messages
        self.used_states = self.store.used_states
        self.uploads = self.store.uploads
        # The running model and its configuration, replaced together in one assignment
        # (``_run_on``): a writer on another thread reads both of one model (``running``).
        self._running = (config, embedder or load_embedder(config))
        self._fit: tuple[int, LanguageFit] | None = None
        # Models loaded beside the running one: the one the store moved to, for a document
        # embedded by the running model as the move went on (``_index_on_store_model``).
        self._loaded: dict[str, tuple[IndexConfig, Embedder]] = {}
        self._loading = threading.Lock()
        self.query_adapters, self.search_index = self._search_of(config, self.embedder)
        self._recover()
        self._purge_failed()

    def _search_of(
        self, config: IndexConfig, embedder: Embedder
    ) -> tuple[QueryAdapters, SearchIndex]:
        """The query map and the search index of ``embedder``'s vectors (the index not opened)."""
        stamped = self.store.stamped_dimensions(embedder.name)
        if stamped is not None:
            embedder.expect_dimensions(stamped)
        adapters = QueryAdapters(
            self.store,
            embedding_model=embedder.name,
            dimensions=embedder.dim,
            enabled=config.query_adapter,
            embedder=embedder,
            fits=self.fits,
        )
        index = open_search_index(
            self.store,
            embedding_model=embedder.name,
            dimensions=embedder.dim,
            engine=config.search_engine,
            qdrant_url=config.qdrant_url,
            qdrant_api_key=config.qdrant_api_key,
            adapters=adapters,
        )
        return adapters, index

    def question_vector(self, question: str) -> np.ndarray:
        """``question``'s embedding by the running model, the one its searches use.

        Raises:
            StoreModelUnavailable: the store's documents moved to a model this
                server could not load; the running one's vectors are not theirs.
        """
        if self.unfollowed is not None:
            raise StoreModelUnavailable(self.unfollowed)
        return self.embedder.encode_query(question)

    def refresh_search(self) -> None:
        """Bring the search index up to the store, then refit the query map if it is due.

        With ``fit_in_background`` the fit is only asked for: it runs after this returns.
        """
        self.search_index.sync()
        self.query_adapters.refit_if_due()

    def stop_fitting(self) -> None:
        """Stop fitting query maps in the background (the server stops), without waiting.

        A fit under way writes nothing (the next start finds it due again), even
        one whose write waits for the store; none is waited for here (the server
        calls this on its event loop). Nothing with ``fit_in_background`` off.
        """
        if self.fits is not None:
            self.fits.close()

    def _recover(self) -> None:
        """Fail the documents whose indexing was interrupted; on a full disk, say so and go on."""
        try:
            recovered = self.store.recover_interrupted()
        except StorageError as exc:
            log.warning("interrupted documents cannot be marked failed yet: %s", exc)
            return
        if recovered:
            log.info("documents whose indexing was interrupted, now failed: %s", recovered)

    def _purge_failed(self) -> None:
        try:
            self.purge_failed()
        except StorageError as exc:
            log.warning("expired failed documents cannot be deleted yet: %s", exc)

    def purge_failed(self) -> list[DocumentRow]:
        """Delete the documents failed for longer than ``failed_retention_days``, with their originals.

        Younger ones stay so that a Retry still works. Cheap when there is
        nothing to delete (one read); each deletion is audited.

        Returns:
            The documents deleted.
        """
        cutoff = time.time() - self.config.failed_retention_days * 86400
        if not self.store.failed_before(cutoff):
            return []
        with self.store.transaction():
            # Again inside the write lock: one may have been retried meanwhile.
            expired = self.store.failed_before(cutoff)
            for doc in expired:
                self.store.delete_rows(doc.id)
                self.store.audit_log.add(_expiry_entry(doc, self.config.failed_retention_days))
        self.store.drop_originals_if_unused([d.sha256 for d in expired])
        log.info(
            "deleted %d documents failed for more than %s days: %s",
            len(expired),
            self.config.failed_retention_days,
            [d.id for d in expired],
        )
        return expired

    # ------------------------------------------------------------------ facts

    @property
    def stamp(self) -> Stamp:
        """What documents indexed now are stamped with."""
        return _stamp_of(self.embedder)

    @property
    def indexes(self) -> DerivedIndexes:
        """The local engine's FAISS + BM25 files: for what measures that engine's internals."""
        if not isinstance(self.search_index, LocalSearchIndex):
            raise TypeError("this knowledge base does not search with the local engine")
        return self.search_index.indexes

    @property
    def snapshot(self) -> Snapshot:
        """The local engine's current search snapshot."""
        return self.indexes.snapshot

    def document_count(self) -> int:
        """How many documents there are, in any state."""
        return self.store.document_count()

    def documents(self, state: DocState | None = None) -> list[DocumentRow]:
        """Every document (only those in ``state`` when given), oldest first."""
        return self.store.documents(state)

    def document(self, doc_id: int) -> DocumentRow:
        """The document ``doc_id``; ``DocumentNotFound`` if there is none."""
        return self.store.document(doc_id)

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        """The given chunks with their documents' facts, by id; missing ids are left out."""
        return self.store.chunks_by_id(ids)

    def original_file(self, sha256: str) -> Path | None:
        """A file holding the original with this sha256, for serving it (``None`` if it is gone)."""
        return self.store.original_file(sha256)

    @property
    def read_only(self) -> str | None:
        """Why the database can be read but not written (a full disk), or ``None``."""
        return self.store.read_only

    @property
    def database_kind(self) -> str:
        """The database under the knowledge base: ``sqlite`` or ``postgresql``."""
        return self.store.database.dialect

    def find(self, ref: str) -> DocumentRow:
        """A document by id, exact name or sha256 prefix; ``DocumentNotFound`` otherwise."""
        return self.store.find_document(ref)

    def chunks(self, doc_id: int) -> list[dict[str, Any]]:
        """A document's chunks (without vectors), in order."""
        return self.store.chunk_rows(doc_id)

    def copies(self, doc_id: int) -> list[DocumentRow]:
        """The other searchable documents whose text is ``doc_id``'s, newest first.

        Two documents are copies when their passages are the same, one for one and
        in order, in ``index.normal_form.same_text``: the form answers tell copies of
        a passage in (``core.selection.distinct``), so of copies an answer quotes one.
        """
        return self.copies_of([doc_id]).get(doc_id, [])

    def copies_of(self, doc_ids: Collection[int]) -> dict[int, list[DocumentRow]]:
        """``copies`` of each of ``doc_ids`` that has any, in one reading of the store.

        Only documents of as many passages as one of ``doc_ids`` are read, once, each
        kept as a digest of its passages' normal forms: a folder of many documents
        costs one pass, not one per document.
        """
        wanted = {d: self.store.document(d) for d in doc_ids}
        counts = {doc.chunk_count for doc in wanted.values() if doc.chunk_count}
        digests: dict[int, bytes] = {}
        current: int | None = None
        digest = hashlib.blake2b(digest_size=16)
        for document_id, content in self.store.passages_of_lengths(counts):
            if document_id != current:
                if current is not None:
                    digests[current] = digest.digest()
                current, digest = document_id, hashlib.blake2b(digest_size=16)
            digest.update(same_text(content).encode())
            digest.update(b"\x00")
        if current is not None:
            digests[current] = digest.digest()
        by_digest: dict[bytes, list[int]] = {}
        for document_id, d in digests.items():
            by_digest.setdefault(d, []).append(document_id)
        found: dict[int, list[DocumentRow]] = {}
        for doc_id in wanted:
            same = [i for i in by_digest.get(digests.get(doc_id, b""), []) if i != doc_id]
            if same:
                found[doc_id] = [self.store.document(i) for i in sorted(same, reverse=True)]
        return found

    def near_copies(self, doc_id: int) -> list[DocumentRow]:
        """The other searchable documents whose text is nearly ``doc_id``'s, most alike first.

        Nearly: their MinHash signatures (``index.near_copies``) estimate a Jaccard
        similarity of their runs of words of ``NEAR_COPY_THRESHOLD`` or more. Copies
        (``copies``) are among them.
        """
        return self.near_copies_of([doc_id]).get(doc_id, [])

    def near_copies_of(self, doc_ids: Collection[int]) -> dict[int, list[DocumentRow]]:
        """``near_copies`` of each of ``doc_ids`` that has any.

        The signatures of the documents of a size one of them can be a near-copy of
        (``size_range``, by an index) are read once, 512 bytes each, and each document
        is compared with those of its own size range at once: a look-up among 100,000
        documents takes 0.2-0.4 s (bench/near_copies.py).
        """
        mine = {d: s for d in doc_ids if (s := self.store.near_signature(d)) is not None}
        if not mine:
            return {}
        ranges = [size_range(s.shingles) for s in mine.values()]
        stored = Stored.of(
            self.store.near_signatures(min(r[0] for r in ranges), max(r[1] for r in ranges))
        )
        found: dict[int, list[DocumentRow]] = {}
        for doc_id, signed in mine.items():
            if alike := stored.near(doc_id, signed):
                found[doc_id] = [self.store.document(other) for other in alike]
        return found

    def repeats_of(self, doc_ids: Collection[int]) -> dict[int, Repeats]:
        """What each of ``doc_ids`` that repeats any document repeats: its copies, and its
        near-copies that are not copies."""
        same = self.copies_of(doc_ids)
        near = self.near_copies_of(doc_ids)
        found: dict[int, Repeats] = {}
        for doc_id in doc_ids:
            copies = same.get(doc_id, [])
            copied = {c.id for c in copies}
            close = [d for d in near.get(doc_id, []) if d.id not in copied]
            if copies or close:
                found[doc_id] = Repeats(copies, close)
        return found

    def canonical_text(self, doc_id: int) -> str:
        """The text a document's ``#char`` offsets refer to."""
        return self.store.canonical_text(doc_id)

    def stale_documents(self) -> list[DocumentRow]:
        """Indexed documents stamped with another model, pipeline or extractor version."""
        return self.store.stale_documents(self.stamp)

    def status(self) -> dict[str, Any]:
        """Counts by state, stale documents and index consistency."""
        docs = self.store.documents()
        by_state = {s.value: 0 for s in DocState}
        for d in docs:
            by_state[d.state.value] += 1
        return {
            "data_dir": str(self.config.data_dir),
            "database": self.store.database.location,
            "documents": len(docs),
            "by_state": by_state,
            "chunks": self.store.chunk_count(),
            "stale": len(self.stale_documents()),
            "embedding_model": self.embedder.name,
            # The earlier default kept until `kb reindex`, and the note that says so.
            "kept_model": self.kept_model.to_dict() if self.kept_model else None,
            "dimensions": self.embedder.dim,
            "pipeline_version": PIPELINE_VERSION,
            "extractor_version": EXTRACTOR_VERSION,
            "index": self.search_index.check(),
            "query_map": self.query_adapters.status(),
            "read_only": self.store.read_only,
            "languages": self.language_fit().to_dict(),
            # What a parser exploit in a reader could reach; None: read in this process.
            "reader_sandbox": (
                readers_status(self.config.extract.sandbox) if self.config.extract else None
            ),
        }

    def language_fit(self) -> LanguageFit:
        """The languages of the searchable passages against the running model (``index.language_fit``).

        Counted once per store generation: ``/readyz`` asks every few seconds.
        """
        generation = self.store.generation
        if self._fit is None or self._fit[0] != generation:
            self._fit = (generation, language_fit(self.store.language_counts(), self.embedder.name))
        return self._fit[1]

    # ------------------------------------------------------------------ adding

    def add_bytes(
        self,
        data: bytes,
        filename: str,
        *,
        uploader: str = "",
        scope: str = EVERYONE,
        title: str | None = None,
        publish: Publish = Publish.DIRECT,
    ) -> Added:
        """Store an original and create its ``pending`` document row.

        The same bytes in the same scope give the same document (``duplicate``),
        which keeps the publishing rule it was added with. A ``failed`` one its own
        uploader sends again under its name gives way to a new document instead: its
        bytes are then the latest upload of that name (versions are in upload order),
        published as sent now. Anyone else's copy leaves the failure, and its
        uploader's Retry, as they are.

        Args:
            publish: how it may become searchable; the operator's default is
                that of a publisher.
        """
        name = document_name(Path(filename).name) or "document"
        self._refuse_before_storing(data, name)
        digest = self.store.save_original(data)
        try:
            new = NewDocument(
                name=name,
                title=display_name(title or ""),
                sha256=digest,
                size=len(data),
                uploader=uploader,
                scope=scope,
                publish=publish,
            )
            with self.store.transaction():
                failed = self._forget_failed_copy(new)
                row, existed = self.store.add_document(new)
                if failed is not None:
                    entry = _entry(AuditAction.REMOVE, failed, uploader, old=failed)
                    detail = f"failed; sent again as #{row.id}"
                    self.store.audit_log.add(with_changes(entry, detail=detail))
        except StorageError:
            self.store.drop_originals_if_unused([digest])  # no row names it: give the room back
            raise
        return Added(row, duplicate=existed)

    def _forget_failed_copy(self, new: NewDocument) -> DocumentRow | None:
        """Inside the adding transaction: delete the ``failed`` document holding ``new``'s bytes
        in its scope, if its uploader sends them again under its name (never searchable; its
        original stays for the new one)."""
        failed = self.store.document_by_sha(new.sha256, new.scope)
        if failed is None or failed.state != DocState.FAILED:
            return None
        if (failed.name, failed.uploader) != (new.name, new.uploader):
            return None
        log.info("document %s failed and is sent again: a new upload replaces it", failed.id)
        self.store.delete_rows(failed.id)
        return failed

    def _refuse_before_storing(self, data: bytes, name: str) -> None:
        """Refuse bytes that must not take disk space: over the size limit, or under the floor.

        Raises:
            TooLarge: over ``IndexConfig.max_upload_bytes``.
            DiskSpaceLow: storing them would leave less than ``IndexConfig.min_free_bytes``.
        """
        limit = self.config.max_upload_bytes
        if len(data) > limit:
            raise TooLarge(
                f"{name} is {size_text(len(data))}, over the {size_text(limit)} upload limit. "
                "Split it into smaller files, or ask an admin to raise KB_MAX_UPLOAD_BYTES.",
                filename=name,
                limit=limit,
            )
        if not self.store.has_original(data):
            check_free_space(self.config.data_dir, self.config.min_free_bytes, len(data))

    def index_document(
        self, doc_id: int, *, progress: Progress | None = None, refresh: bool = True
    ) -> DocumentRow:
        """Index a ``pending`` or ``failed`` document; it ends ``indexed``, ``failed``
        or, when it needs approval, ``awaiting_approval``.

        Never raises for a bad document: the reason is recorded on the row.
        ``DocumentNotFound`` when it was removed meanwhile (before or while it was indexed).

        Args:
            doc_id: the document.
            progress: receives ``("embedding", {"document", "done", "total"})`` once the
                document is chunked (``done`` 0) and after each batch of passages embedded.
            refresh: swap in a new search snapshot afterwards (a batch refreshes once at the end).
        """
        # Earlier documents of this process whose failure the disk could not take.
        self._recover()
        doc = self.store.document(doc_id)
        failure: str | None = None
        with self.store.worker.working(doc_id) as holder:
            try:
                self.store.mark_indexing(doc_id, holder)
                self._index_on_store_model(doc, progress)
            except KBError as exc:
                failure = self._fail(doc_id, *_failure(exc))
            except Exception as exc:  # one broken document must never stop a batch
                log.exception("unexpected failure indexing document %s", doc_id)
                failure = self._fail(
                    doc_id,
                    f"Unexpected error while indexing ({type(exc).__name__}: {exc}).",
                    "unexpected",
                )
        self._purge_failed()
        if refresh:
            self.refresh_search()
        row = self.store.document(doc_id)
        if failure is not None and row.state != DocState.FAILED:
            # The failure could not be written (a full disk): say what happened,
            # and let the next recovery record it once the disk allows.
            return with_changes(row, state=DocState.FAILED, failure_reason=failure)
        return row

    def _prepare(
        self,
        doc: DocumentRow,
        progress: Progress | None,
        *,
        owner: str | None = None,
        model: tuple[IndexConfig, Embedder] | None = None,
    ) -> Prepared:
        """``doc`` read, chunked and embedded by the running model (or ``model``), stamped with it."""
        config, embedder = model or self.running
        data = self.store.read_original(doc.sha256)
        done = total = 0

        def tell() -> None:
            if progress:
                progress("embedding", {"document": doc.name, "done": done, "total": total})

        def on_chunked(n: int) -> None:
            nonlocal total
            total = n
            tell()

        def on_batch(n: int) -> None:
            nonlocal done
            done += n
            tell()

        prepared = prepare_document(
            data,
            doc.name,
            embedder=embedder,
            max_bytes=config.max_upload_bytes,
            budget=passage_budget(config, embedder),
            max_pages=config.max_pages,
            max_chunks=config.max_chunks,
            max_text_chars=config.max_text_chars,
            title=doc.title or None,
            on_batch=on_batch,
            on_chunked=on_chunked,
            chunker=self.chunker,
            ocr=config.ocr,
            limits=config.extract,
            owner=doc.uploader if owner is None else owner,
            latent_terms=config.latent_terms,
        )
        return with_changes(prepared, stamp=_stamp_of(embedder))

    def _index_on_store_model(self, doc: DocumentRow, progress: Progress | None) -> None:
        """Prepare and place ``doc`` on the model the store's documents call for.

        It is embedded by the running model; when the store moved off that
        model meanwhile (another process's reindex: ``store_model``), the commit
        writes nothing and ``doc`` is embedded again by the model it moved to,
        loaded here beside the running one: a document is never stamped with a
        model the store has left, where the servers that moved would not find it.

        Raises:
            EmbeddingModelUnavailable: the model the store moved to cannot be
                loaded here; ``doc`` is left for a retry or ``kb reindex``.
        """
        model = self.running
        for _ in range(_MOVES_FOLLOWED + 1):
            prepared = self._prepare(doc, progress, model=model)
            moved_to = self._place(doc, prepared, written_on=model[0].embedding_model)
            if moved_to is None:
                return
            model = self._model_moved_to(moved_to, doc)
        raise _kept_moving()

    def _model_moved_to(self, spec: str, doc: DocumentRow) -> tuple[IndexConfig, Embedder]:
        """The model ``spec`` the store moved to while ``doc`` was embedded, to embed it again.

        Raises:
            EmbeddingModelUnavailable: it cannot be loaded here (the reason, and the way on).
        """
        log.info(
            "the store moved to %s while document %s was embedded: embedding it again on it",
            spec,
            doc.id,
        )
        try:
            return self._model_for(spec)
        except EmbeddingModelUnavailable as exc:
            raise EmbeddingModelUnavailable(
                f"The knowledge base moved to model {model_name(spec)} while this "
                f"document was being indexed, and this process cannot load that model: "
                f"{exc} Nothing is lost: retry it on a server that runs "
                f"{model_name(spec)}, or run `kb reindex`."
            ) from exc

    def _model_for(self, spec: str) -> tuple[IndexConfig, Embedder]:
        """The model ``spec`` names, loaded and warmed up; loaded once while it is not the running one.

        Raises:
            EmbeddingModelUnavailable: it cannot be loaded here.
        """
        running = self.running
        if spec == running[0].embedding_model:
            return running
        with self._loading:
            if spec not in self._loaded:
                config = with_changes(self.config, embedding_model=spec)
                embedder = load_embedder(config)
                embedder.encode_query("warm up")  # loaded now, or refused now
                self._loaded[spec] = (config, embedder)
            return self._loaded[spec]

    def _place(
        self, doc: DocumentRow, prepared: Prepared, *, written_on: str | None = None
    ) -> str | None:
        """Commit a prepared document where its publishing rule puts it, audited, in one transaction.

        Args:
            written_on: the model (``KB_EMBEDDING_MODEL`` value) ``prepared`` was
                embedded by: nothing is written when the store's documents, as
                they are at the commit, call for another (``store_model``).

        Returns:
            ``None`` once committed, or the model the store moved to (nothing written).
        """
        if doc.publish == Publish.APPROVAL:
            with self.store.transaction():
                if moved_to := self._moved_off(written_on):
                    return moved_to
                self._commit(doc, prepared, state=DocState.AWAITING_APPROVAL)
                self.store.audit_log.add(_entry(AuditAction.SUBMIT, doc, doc.uploader, new=doc))
            return None
        with self.store.transaction():
            if moved_to := self._moved_off(written_on):
                return moved_to
            versions = self._versions_replaced(doc, only_own=doc.publish == Publish.OWN)
            later = [i for i in versions if i > doc.id]
            self._commit(doc, prepared)
            if later:
                # Uploaded before a version indexed meanwhile (a longer read, a Retry of an
                # old failure, a takeover): the upload made last stays the one that answers.
                self._kept_as_earlier(doc, self.store.document(later[-1]))
                return None
            replaced = self.store.supersede(versions, by=doc.id)
            for entry in _publishing_entries(doc, replaced):
                self.store.audit_log.add(entry)
            pruned = self._prune(doc, doc.uploader)
        self.store.drop_originals_if_unused(pruned)
        return None

    def _kept_as_earlier(self, doc: DocumentRow, later: DocumentRow) -> None:
        """Inside the commit's transaction: ``doc``, just committed, kept as an earlier
        version of ``later`` (``replaced`` by it, restorable), audited."""
        self.store.supersede([doc.id], by=later.id)
        entry = _entry(AuditAction.ADD, doc, doc.uploader, new=doc)
        self.store.audit_log.add(
            with_changes(entry, detail=f"kept as an earlier version of #{later.id}, added since")
        )

    def _moved_off(self, written_on: str | None) -> str | None:
        """Inside the commit's transaction: the model the store moved to, if not ``written_on``.

        The stamps are read and held until the commit (``Store.stamped_models_held``):
        a document another process's move committed before is seen here; one it
        commits after waits for this commit, and that move then finds this
        document's stamp and rebuilds it (``_swap_in_late``).
        """
        if written_on is None or not self.follows_store:
            return None
        wanted = self._model_called_for(self.store.stamped_models_held())
        return None if wanted == written_on else wanted

    def _versions_replaced(self, doc: DocumentRow, *, only_own: bool = False) -> list[int]:
        """The searchable documents ``doc`` takes the place of: its name and scope.

        A synced source's documents (``index.models.source_uploader``) and uploads
        never replace each other, whatever their names: a source's document is
        replaced only by that source's next version of it. ``only_own``: only
        ``doc``'s uploader's (a member's upload to a channel).
        """
        synced = is_source_uploader(doc.uploader)
        return self.store.indexed_by_name(
            doc.name,
            doc.scope,
            exclude=doc.id,
            uploader=doc.uploader if only_own or synced else None,
            from_sources=synced,
        )

    def _prune(self, doc: DocumentRow, actor: str = "system") -> list[str]:
        """Drop the oldest replaced versions of ``doc``'s name and scope beyond the limit, audited."""
        keep = max(self.config.keep_versions - 1, 0)
        detail = f"beyond KB_KEEP_VERSIONS={self.config.keep_versions}, after #{doc.id}"
        return self.store.prune_versions(doc.name, doc.scope, keep=keep, actor=actor, detail=detail)

    def _commit(
        self, doc: DocumentRow, prepared: Prepared, *, state: DocState = DocState.INDEXED
    ) -> None:
        """Write a prepared document's chunks, text and facts and mark it ``state``."""
        ex = prepared.extracted
        self.store.commit_indexed(
            doc.id,
            prepared.chunking.chunks,
            prepared.vectors,
            prepared.token_counts,
            canonical_text=ex.text,
            stamp=prepared.stamp or self.stamp,
            window_splits=prepared.chunking.window_splits,
            state=state,
            sentence_vectors=prepared.sentence_vectors,
            latent_terms=prepared.latent_terms,
            near=prepared.near,
            facts=DocumentFacts(
                title=doc.title or display_name(ex.title),
                kind=ex.kind,
                text_length=len(ex.text),
                page_starts=",".join(map(str, ex.page_starts)) if ex.page_starts else None,
                language=prepared.language,
            ),
        )

    def _fail(
        self, doc_id: int, reason: str, kind: str | None = None, limit: float | None = None
    ) -> str:
        """Record that ``doc_id`` failed (if the disk lets us) and return the reason.

        ``kind`` and ``limit`` are what failed, as data (``ExtractionError.kind``, ``limit``).
        """
        log.info("document %s failed (%s): %s", doc_id, kind, reason)
        try:
            self.store.update_document(
                doc_id,
                state=DocState.FAILED.value,
                failure_reason=reason,
                failure_kind=kind,
                failure_limit=limit,
                worker=None,
                worker_pid=None,
            )
        except StorageError as exc:
            log.warning("document %s failed and that could not be recorded: %s", doc_id, exc)
        return reason

    def ingest_bytes(self, data: bytes, filename: str, **kwargs: Any) -> Added:
        """Add and index one document (a duplicate is returned as it is)."""
        added = self.add_bytes(data, filename, **kwargs)
        if added.duplicate and added.document.state == DocState.INDEXED:
            return added
        return Added(self.index_document(added.document.id), duplicate=added.duplicate)

    def ingest_paths(
        self,
        paths: Iterable[Path],
        *,
        uploader: str = "cli",
        scope: str = EVERYONE,
        progress: Progress | None = None,
    ) -> IngestSummary:
        """Ingest files and folders (recursively); one bad file never stops the rest.

        ``progress`` receives ``("file", {"path", "index", "total"})`` before each file.

        Raises:
            EmbeddingModelUnavailable: a library the model needs is not installed (said
                before any file is stored, not once per file).
        """
        summary = IngestSummary()
        files = list(_expand(paths, summary.skipped))
        if files:
            self.embedder.check_runnable()
        for i, path in enumerate(files):
            if progress:
                progress("file", {"path": str(path), "index": i, "total": len(files)})
            try:
                data = path.read_bytes()
            except OSError as exc:
                summary.skipped.append(f"{path}: {exc.strerror or exc}")
                continue
            try:
                added = self.add_bytes(data, path.name, uploader=uploader, scope=scope)
            except KBError as exc:
                summary.refused.append(f"{path}: {getattr(exc, 'reason', str(exc))}")
                continue
            if added.duplicate and added.document.state == DocState.INDEXED:
                summary.unchanged.append(added.document)
                continue
            row = self.index_document(added.document.id, progress=progress, refresh=False)
            (summary.indexed if row.state == DocState.INDEXED else summary.failed).append(row)
        self.refresh_search()
        return summary

    def retry(self, doc_id: int, *, progress: Progress | None = None) -> DocumentRow:
        """Index a failed (or pending) document again from its stored original.

        A document in any other state is returned as it is: a retry never
        brings back a replaced version nor publishes one awaiting approval.
        """
        doc = self.store.document(doc_id)
        if doc.state not in (DocState.FAILED, DocState.PENDING):
            return doc
        return self.index_document(doc_id, progress=progress)

    def narrow_publishing(self, doc_id: int, publish: Publish) -> DocumentRow:
        """``doc_id`` to become searchable by ``publish`` from now on, while it is not
        searchable yet (``failed``, ``pending``): its uploader lost the right it was added
        with, and indexing it again must not use that right. Any other document as it is."""
        with self.store.transaction():
            doc = self.store.document(doc_id)
            if doc.state in (DocState.FAILED, DocState.PENDING) and doc.publish != publish:
                log.info("document %s becomes searchable by %s from now on", doc_id, publish)
                self.store.update_document(doc_id, publish=publish.value)
        return self.store.document(doc_id)

    def resume(self, doc_id: int, *, again: bool = True) -> DocumentRow:
        """Finish a document whose indexing never ended: ``pending``, or interrupted (the
        process indexing it died); one that ended is returned as it is.

        Interrupted work is first recorded as such (``failed``, retryable), then
        indexed from the stored original, unless ``again`` is false (a document
        whose indexing keeps killing the processes that take it up). ``indexing``
        by a live process (a Retry elsewhere) is indexed here too: each commit is
        whole, so the document ends in one state, never between two.
        """
        self._recover()
        doc = self.store.document(doc_id)
        if not again and doc.state == DocState.PENDING:
            self._fail(doc_id, INTERRUPTED, INTERRUPTED_KIND)
            return self.store.document(doc_id)
        interrupted = doc.state == DocState.FAILED and doc.failure_kind == INTERRUPTED_KIND
        if not again or not (interrupted or doc.state in (DocState.PENDING, DocState.INDEXING)):
            return doc
        return self.index_document(doc_id)

    def remove(self, doc_id: int, *, actor: str = "cli", refresh: bool = True) -> DocumentRow:
        """Delete a document and its chunks from SQLite and both indexes.

        ``refresh=False`` leaves the search snapshot to the caller (a batch
        refreshes once at the end, as ``index_document``'s callers do).
        """
        doc = self.store.document(doc_id)
        with self.store.transaction():
            self.store.delete_rows(doc_id)
            self.store.audit_log.add(_entry(AuditAction.REMOVE, doc, actor, old=doc))
        self.store.drop_originals_if_unused([doc.sha256])
        if refresh:
            self.refresh_search()
        return doc

    # ------------------------------------------------------------------ versions

    def placement(self, doc_id: int) -> Placement:
        """What ``doc_id`` replaced, and which searchable documents share its name and scope."""
        doc = self.store.document(doc_id)
        beside = self.store.indexed_by_name(doc.name, doc.scope, exclude=doc.id)
        return Placement(
            document=doc,
            replaced=self.store.versions_replaced_by(doc.id),
            beside=[self.store.document(i) for i in beside],
        )

    def approve(self, doc_id: int, *, actor: str) -> Published:
        """Make a document awaiting approval searchable, replacing the versions of its name and scope.

        Raises:
            NotAwaitingApproval: it was decided already, or removed.
        """
        with self.store.transaction():
            doc = self._awaiting(doc_id)
            older = self._versions_replaced(doc)
            self.store.make_searchable(doc.id)
            replaced = self.store.supersede(older, by=doc.id)
            self.store.audit_log.add(
                _entry(AuditAction.APPROVE, doc, actor, new=doc, replaced=replaced)
            )
            pruned = self._prune(doc, actor)
        self.store.drop_originals_if_unused(pruned)
        self.refresh_search()
        return Published(self.store.document(doc.id), replaced)

    def reject(self, doc_id: int, *, actor: str) -> DocumentRow:
        """Delete a document awaiting approval; it never was searchable.

        Raises:
            NotAwaitingApproval: it was decided already, or removed.
        """
        with self.store.transaction():
            doc = self._awaiting(doc_id)
            self.store.delete_rows(doc.id)
            self.store.audit_log.add(_entry(AuditAction.REJECT, doc, actor, new=doc))
        self.store.drop_originals_if_unused([doc.sha256])
        return doc

    def _awaiting(self, doc_id: int) -> DocumentRow:
        try:
            doc = self.store.document(doc_id)
        except DocumentNotFound as exc:
            raise NotAwaitingApproval(
                f"Document {doc_id} is no longer awaiting approval: it was rejected or removed."
            ) from exc
        if doc.state != DocState.AWAITING_APPROVAL:
            raise NotAwaitingApproval(
                f"{doc.name} (#{doc.id}) is no longer awaiting approval: it is {doc.state}."
            )
        return doc

    def restore(
        self, doc_id: int, *, actor: str = "cli", progress: Progress | None = None
    ) -> Published:
        """Bring a replaced version back; the version now searchable in its place becomes replaced.

        ``doc_id`` is the replaced version, or a searchable document, whose
        newest replaced version is then restored. The version is indexed again
        from its stored original with the running configuration.

        The version is embedded again on the model the store moved to when
        another process moves it meanwhile, as ``index_document`` does, whose
        ``"embedding"`` events ``progress`` receives.

        Raises:
            NotRestorable: there is no replaced version to bring back.
            ExtractionError, OriginalMissing: the version cannot be indexed again.
            EmbeddingModelUnavailable: the store moved to a model this process
                cannot load; nothing changed.
        """
        doc = self._restorable(self.store.document(doc_id))
        model = self.running
        for _ in range(_MOVES_FOLLOWED + 1):
            prepared = self._prepare(doc, progress, model=model)
            done = self._restore_place(doc, prepared, model[0].embedding_model, actor)
            if isinstance(done, Published):
                self.refresh_search()
                return done
            model = self._model_moved_to(done, doc)
        raise _kept_moving()

    def _restore_place(
        self, doc: DocumentRow, prepared: Prepared, written_on: str, actor: str
    ) -> Published | str:
        """Commit a restored version in place of its current one, audited, in one transaction;
        or, when the store moved off ``written_on`` meanwhile (``_moved_off``), the model it
        moved to, nothing written."""
        with self.store.transaction():
            if moved_to := self._moved_off(written_on):
                return moved_to
            doc = self.store.document(doc.id)
            if doc.state != DocState.REPLACED:
                raise NotRestorable(
                    f"{doc.name} (#{doc.id}) was changed meanwhile: it is {doc.state}."
                )
            current = self._current_version(doc)
            self._refuse_second_live_copy(doc, current)
            # Retire the current version first: it may hold the same bytes, and
            # only one live document may (``index.storage.schema``).
            replaced = self.store.supersede([current.id] if current else [], by=doc.id)
            self._commit(doc, prepared)
            self.store.audit_log.add(
                _entry(AuditAction.RESTORE, doc, actor, new=doc, replaced=replaced)
            )
            pruned = self._prune(doc, actor)
        self.store.drop_originals_if_unused(pruned)
        return Published(self.store.document(doc.id), replaced)

    def _refuse_second_live_copy(self, doc: DocumentRow, current: DocumentRow | None) -> None:
        same = self.store.document_by_sha(doc.sha256, doc.scope)
        if same is not None and (current is None or same.id != current.id):
            raise NotRestorable(
                f"{doc.name} (#{doc.id}) cannot be restored: the same content is already in the "
                f"knowledge base as {same.name} (#{same.id}, {same.state})."
            )

    def _restorable(self, doc: DocumentRow) -> DocumentRow:
        if doc.state == DocState.REPLACED:
            return doc
        if doc.state == DocState.INDEXED:
            earlier = self.store.versions_replaced_by(doc.id)
            if earlier:
                return earlier[0]
            raise NotRestorable(f"{doc.name} (#{doc.id}) replaced no earlier version.")
        raise NotRestorable(
            f"{doc.name} (#{doc.id}) is {doc.state}: only a replaced version, "
            "or a document that replaced one, can be restored."
        )

    def _current_version(self, doc: DocumentRow) -> DocumentRow | None:
        """The searchable document that (through later versions) took ``doc``'s place, if any."""
        seen: set[int] = set()
        ref = doc.replaced_by
        while ref is not None and ref not in seen:
            seen.add(ref)
            try:
                row = self.store.document(ref)
            except DocumentNotFound:
                return None  # removed since: nothing to retire
            if row.state == DocState.INDEXED:
                return row
            ref = row.replaced_by
        return None

    # ------------------------------------------------------------------ reindex

    def reindex(
        self,
        *,
        progress: Progress | None = None,
        actor: str = "cli",
        switch: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> ReindexReport:
        """Rebuild every document from its stored original with the running configuration.

        New chunks and vectors are computed beside the live ones; each
        document's swap is one transaction and the search snapshot is swapped
        once at the end, so questions keep being answered throughout. A
        document keeps its state (one awaiting approval stays out of searches);
        replaced versions have no chunks to rebuild and are left alone. A failed
        document whose bytes went over a reading limit that has not been raised
        since is not read again (``ReindexReport.skipped``, with the reason).

        Args:
            progress: receives ``("reindex", {"document", "index", "total"})`` before
                each document, then its ``"embedding"`` events (``index_document``).
            switch: on a knowledge base kept on the earlier default model
                (``kept_model``), rebuild on the configured model and run on it
                from then on: every document is embedded by it beside the live
                index, then, inside ``switch()`` (where the caller holds its
                searches), the documents are swapped, the configured model's
                index is built, and this knowledge base moves to it. When a
                searchable document cannot be rebuilt on the configured model,
                nothing is changed (the report lists why) and the knowledge
                base stays on the earlier one. Not used when no earlier model
                is kept.

        Raises:
            ReindexInProgress: another reindex (in any process) is running.
        """
        with self._reindex_lock():
            report = ReindexReport(stale_before=len(self.stale_documents()))
            target = self._configured_model() if switch is not None else None
            skipped = (DocState.INDEXING, DocState.REPLACED)
            docs = [d for d in self.store.documents() if d.state not in skipped]
            docs = [d for d in docs if not self._known_over_limit(d, report)]
            prepared: list[tuple[DocumentRow, Prepared | KBError]] = []
            for i, doc in enumerate(docs):
                if progress:
                    progress("reindex", {"document": doc.name, "index": i, "total": len(docs)})
                try:
                    prepared.append(
                        (doc, self._prepare(doc, progress, owner="reindex", model=target))
                    )
                except KBError as exc:
                    prepared.append((doc, exc))
            # Those written on another model while these were embedded (an upload, a sync),
            # embedded now too: not inside ``switch()``, where the searches wait.
            prepared += self._prepared_late(target, {doc.id for doc, _ in prepared})
            if target is not None and _lost_on_move(prepared):
                # Moving now would leave those documents unsearchable: nothing is changed.
                report.failed = [_failed(doc, r) for doc, r in prepared if isinstance(r, KBError)]
                report.stale_after = report.stale_before
                return report
            with switch() if switch is not None and target is not None else nullcontext():
                self._swap_in(prepared, report)
                self._swap_in_late(target, prepared, report)
                if target is None:
                    self.search_index.rebuild()
                    self.query_adapters.refit_if_due(force=True)
                else:
                    self._run_on(*target, refit=True)  # every chunk was rebuilt on it
            report.stale_after = len(self.stale_documents())
            self.store.audit_log.add(_reindex_entry(report, actor))
            return report

    def _swap_in(
        self, prepared: Sequence[tuple[DocumentRow, Prepared | KBError]], report: ReindexReport
    ) -> None:
        """Commit each rebuilt document in place of its live chunks (``report`` counts them)."""
        for doc, result in prepared:
            if isinstance(result, KBError):
                # A document that was searchable stays searchable with its
                # old chunks; the failure is reported, not applied.
                if doc.state not in _HAS_CHUNKS:
                    self._fail(doc.id, *_failure(result))
                report.failed.append(_failed(self.store.document(doc.id), result))
                continue
            if self._recommit(doc.id, result):
                report.documents += 1
                report.chunks += len(result.chunking.chunks)

    def _swap_in_late(
        self,
        target: tuple[IndexConfig, Embedder] | None,
        prepared: Sequence[tuple[DocumentRow, Prepared | KBError]],
        report: ReindexReport,
    ) -> None:
        """Rebuild too the documents committed on another model while this reindex swapped.

        An upload or a sync embedded by the model a move leaves, committed before
        the move's first document (``_place`` saw no move yet), or a document the
        reindex found mid-indexing: each is rebuilt on this reindex's model, so
        that no searchable document is left on the model the store moved off.
        One failed already is not tried again (it is in ``report.failed``).
        """
        tried = {doc.id for doc, result in prepared if isinstance(result, KBError)}
        for _ in range(_LATE_ROUNDS):
            rebuilt = self._prepared_late(target, tried)
            if not rebuilt:
                return
            tried.update(doc.id for doc, _ in rebuilt)
            self._swap_in(rebuilt, report)

    def _prepared_late(
        self, target: tuple[IndexConfig, Embedder] | None, leave_out: set[int]
    ) -> list[tuple[DocumentRow, Prepared | KBError]]:
        """The documents with chunks not stamped with the reindex's model (but ``leave_out``),
        each embedded on it, or the reason it could not be."""
        name = (target[1] if target is not None else self.embedder).name
        late = [
            d
            for d in self.store.documents()
            if d.state in _HAS_CHUNKS and d.embedding_model != name and d.id not in leave_out
        ]
        if late:
            log.info(
                "documents committed on another model during the reindex, rebuilt too: %s",
                [d.id for d in late],
            )
        rebuilt: list[tuple[DocumentRow, Prepared | KBError]] = []
        for doc in late:
            try:
                rebuilt.append((doc, self._prepare(doc, None, owner="reindex", model=target)))
            except KBError as exc:
                rebuilt.append((doc, exc))
        return rebuilt

    def _configured_model(self) -> tuple[IndexConfig, Embedder] | None:
        """The configured model a knowledge base kept on the earlier default moves to, loaded."""
        if self.kept_model is None:
            return None
        # The one copy a write during the move embeds on too (``_model_for``).
        return self._model_for(self.configured_model)

    @property
    def running(self) -> tuple[IndexConfig, Embedder]:
        """The running model's configuration and embedder, both of the same model."""
        return self._running

    @property
    def config(self) -> IndexConfig:
        """The running configuration (its ``embedding_model`` is the model running)."""
        return self._running[0]

    @property
    def embedder(self) -> Embedder:
        """The running model."""
        return self._running[1]

    def store_model(self) -> str | None:
        """The model the store's documents now call for, when it is not the one running.

        The same rule as at open (``index.kept_model``), over the stamps as they
        are now: another process moved the documents (``kb reindex``, another
        replica's ``/kb-reindex``), and a restart would run that model. ``None``
        when this knowledge base runs what the store calls for, or was given its
        embedder (it never follows then).

        Returns:
            The ``KB_EMBEDDING_MODEL`` value to run.
        """
        if not self.follows_store:
            return None
        wanted = self._model_called_for(self.store.stamped_models())
        return None if wanted == self.config.embedding_model else wanted

    def _model_called_for(self, stamped: dict[str, int]) -> str:
        """The model the stamps (``Store.stamped_models``) call for, as at open (``index.kept_model``)."""
        kept = kept_model(self.configured_model, stamped)
        return kept.spec if kept is not None else self.configured_model

    def moving_off(self) -> bool:
        """Whether a reindex is still writing documents off the model this knowledge base runs.

        What a server the store moved away from waits for before it follows
        (``store_model``): the documents of a move are written one by one.
        """
        return self.reindex_running() and self.stamp.embedding_model in self.store.stamped_models()

    def follow_store_model(self, spec: str) -> None:
        """Run ``spec``, the model the store moved to (``store_model``), from now on.

        Loads it first (the search index is left as it was when it cannot be),
        then builds its search index from the store. The caller holds the
        searches (``core.switch``).

        Raises:
            EmbeddingModelUnavailable: ``spec`` cannot be loaded here.
        """
        try:
            # Loaded now, or refused now: not at a question.
            config, embedder = self._model_for(spec)
        except EmbeddingModelUnavailable as exc:
            self.unfollowed = (
                f"The store moved to model {model_name(spec)} ({spec}), which this server "
                f"cannot load: {exc}"
            )
            raise StoreModelUnavailable(self.unfollowed) from exc
        self.unfollowed = None
        kept = kept_model(self.configured_model, self.store.stamped_models())
        # The process that moved the documents fitted their map: fitted here only if due.
        self._run_on(
            config, embedder, kept=kept if kept is not None and kept.spec == spec else None
        )

    def _run_on(
        self,
        config: IndexConfig,
        embedder: Embedder,
        *,
        kept: KeptModel | None = None,
        refit: bool = False,
    ) -> None:
        """Build ``embedder``'s search index from the store and answer on it from now on.

        Its query map is fitted if due (``refit``: in any case, its chunks were just
        rebuilt) in the background with ``fit_in_background``: the caller holds the
        searches, which do not wait for it; they search in the model's order, or
        on the map the store keeps for this model, until it is written. Without
        it (the offline tools), here, before this returns.
        """
        adapters, index = self._search_of(config, embedder)
        index.rebuild()
        # Before the swap: a fit here (offline) ends before this runs the new model.
        adapters.refit_if_due(force=refit, wait=False)
        left = self.query_adapters
        # Together: what /readyz and the Home tab read of the model run never mixes two.
        self._running, self.kept_model = (config, embedder), kept
        self.query_adapters, self.search_index = adapters, index
        left.retire()  # a fit of the model left, under way or queued, writes nothing
        self._fit = None
        with self._loading:
            self._loaded.clear()  # the running one is held as such; any other loaded is not needed
        log.info("the knowledge base now answers on %s", embedder.name)
        if kept is not None:
            log.warning("%s", kept.note)

    def _known_over_limit(self, doc: DocumentRow, report: ReindexReport) -> bool:
        """Whether ``doc`` failed a reading limit not raised since (added to ``report.skipped``)."""
        limits = self.config.extract
        if doc.state != DocState.FAILED or limits is None:
            return False
        if not over_reading_limit(doc.failure_kind, doc.failure_limit, limits, self.config.ocr):
            return False
        reason = f"not read again, it went over a reading limit before: {doc.failure_reason}"
        report.skipped.append(FailedDocument(doc, reason))
        return True

    def _recommit(self, doc_id: int, prepared: Prepared) -> bool:
        """Swap in a document's rebuilt chunks, in the state it has now; ``False`` if it is gone."""
        with self.store.transaction():
            # Held before the read (``Store.hold_generation``): a new version retiring this
            # document as it is swapped commits first and is read here, or waits for this swap.
            self.store.hold_generation()
            try:
                # Read again: an approval, a rejection or a new version may have come meanwhile.
                doc = self.store.document(doc_id)
            except DocumentNotFound:
                return False
            if doc.state in _HAS_CHUNKS:
                self._commit(doc, prepared, state=doc.state)
                return True
        if doc.state in (DocState.FAILED, DocState.PENDING):
            self._place(doc, prepared)  # its own transaction: it may delete pruned originals
            return True
        return False

    @contextmanager
    def _reindex_lock(self) -> Iterator[None]:
        # Held across processes (`kb reindex` in a shell, /kb-reindex in the
        # running bot) and, on Postgres, across replicas.
        with self.store.exclusive("reindex") as acquired:
            if not acquired:
                raise ReindexInProgress("A reindex is already running; wait for it to finish.")
            yield

    def reindex_running(self) -> bool:
        """Whether a reindex holds the lock right now."""
        return self.store.locked("reindex")


def _expand(paths: Iterable[Path], skipped: list[str]) -> Iterator[Path]:
    """Files to ingest: named files as they are, folders recursively.

    Inside folders, hidden files are passed over and files of other types are
    listed in ``skipped`` (a folder often holds images or archives beside
    the documents; saying so beats failing them or ignoring them silently).
    Legacy Office files (``.doc``, ``.xls``, ``.ppt``) are taken: they fail
    with the advice to save them as ``.docx``, ``.xlsx``, ``.pptx``, as one
    named on its own does, since they are documents someone meant to share.
    """
    for p in paths:
        p = Path(p)
        if not p.is_dir():
            yield p
            continue
        for child in sorted(p.rglob("*")):
            if not child.is_file() or any(
                part.startswith(".") for part in child.relative_to(p).parts
            ):
                continue
            if child.suffix.lower() in FOLDER_SUFFIXES:
                yield child
            else:
                skipped.append(f"{child}: not a supported type ({', '.join(SUPPORTED_SUFFIXES)})")


# How many times a document being indexed follows the store to another model before it fails.
_MOVES_FOLLOWED = 2
# How many times a reindex looks for documents committed on another model while it ran.
_LATE_ROUNDS = 3

# States whose chunks a reindex rebuilds in place.
_HAS_CHUNKS = (DocState.INDEXED, DocState.AWAITING_APPROVAL)


def _entry(
    action: AuditAction,
    doc: DocumentRow,
    actor: str,
    *,
    new: DocumentRow | None = None,
    old: DocumentRow | None = None,
    replaced: Sequence[DocumentRow] = (),
) -> AuditEntry:
    """An audit entry about ``doc``; ``replaced`` fills the old content and the detail."""
    old = old or (replaced[0] if replaced else None)
    detail = ", ".join(f"replaced #{r.id}" for r in replaced)
    return AuditEntry(
        actor=actor or "unknown",
        action=action,
        document_id=doc.id,
        name=doc.name,
        scope=doc.scope,
        old_sha256=old.sha256 if old else None,
        new_sha256=new.sha256 if new else None,
        detail=detail,
    )


def _expiry_entry(doc: DocumentRow, days: float) -> AuditEntry:
    return AuditEntry(
        actor="kb",
        action=AuditAction.REMOVE,
        document_id=doc.id,
        name=doc.name,
        scope=doc.scope,
        old_sha256=doc.sha256,
        detail=f"failed for more than {days:g} days: {doc.failure_reason or ''}"[:500],
    )


def _publishing_entries(doc: DocumentRow, replaced: Sequence[DocumentRow]) -> list[AuditEntry]:
    """A document made searchable on upload: one ``add``, or one ``replace`` per older version."""
    if not replaced:
        return [_entry(AuditAction.ADD, doc, doc.uploader, new=doc)]
    return [_entry(AuditAction.REPLACE, doc, doc.uploader, new=doc, replaced=[r]) for r in replaced]


def _reindex_entry(report: ReindexReport, actor: str) -> AuditEntry:
    return AuditEntry(
        actor=actor,
        action=AuditAction.REINDEX,
        detail=(
            f"{report.documents} documents, {report.chunks} chunks, {len(report.failed)} failed"
        ),
    )


def _failed(doc: DocumentRow, exc: KBError) -> FailedDocument:
    """``doc`` in a reindex's report of failures, with why it could not be rebuilt."""
    return FailedDocument(doc, _failure(exc)[0])


def _lost_on_move(prepared: Sequence[tuple[DocumentRow, Prepared | KBError]]) -> bool:
    """Whether a searchable document could not be rebuilt: moved, it would not be searched."""
    return any(isinstance(r, KBError) and d.state in _HAS_CHUNKS for d, r in prepared)


def _stamp_of(embedder: Embedder) -> Stamp:
    """What a document embedded by ``embedder`` now is stamped with."""
    return Stamp(
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        pipeline_version=PIPELINE_VERSION,
        extractor_version=EXTRACTOR_VERSION,
    )


def _kept_moving() -> EmbeddingModelUnavailable:
    """Why a document was not written: the store moved model again and again as it was embedded."""
    return EmbeddingModelUnavailable(
        "The knowledge base kept changing embedding model while this document was being "
        "indexed; retry it once the move is over."
    )


def _failure(exc: KBError) -> tuple[str, str, float | None]:
    """A failure's reason (for a person), kind and limit (data, ``failure_kind``)."""
    if isinstance(exc, ExtractionError):
        return exc.reason, exc.kind, exc.limit
    return str(exc), "error", None
