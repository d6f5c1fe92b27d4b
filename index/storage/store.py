"""The store: the source of truth, on SQLite (the default) or Postgres.

Tables: ``documents``, ``chunks`` (with their vectors), ``texts``, ``query_log``,
``feedback``, ``deliveries`` (event de-duplication), ``meta``, ``audit`` and
``escalations``; the schema and its migrations are in ``index.storage.schema``.
The store keeps documents, chunks, originals and ``meta``; the other tables
are its parts' (``Store.queries``, ``feedback``, ``deliveries``,
``audit_log``, ``escalations``), over the same database. Originals are kept beside the database, content-addressed by
sha256, so a reindex never needs anyone to upload again; an original stays as
long as any document row (a ``replaced`` version included) names it.

The ``generation`` counter in ``meta`` goes up in the same transaction as any
change to the set of searchable chunks; the derived FAISS and BM25 files record
the generation they were built from, which is how a restart knows whether they
can be trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index.embed import LatentTerms
from index.errors import DatabaseUnavailable, DocumentNotFound
from index.files import private_dir, private_file, tighten
from index.ingest import from_blob, to_blob
from index.models import EVERYONE, SOURCE_UPLOADER_PREFIX, AuditAction, Chunk, DocState, Publish
from index.near_copies import Signature
from index.records import (
    DOCUMENT_COLUMNS,
    AuditEntry,
    ChunkRow,
    DocumentFacts,
    DocumentRow,
    Stamp,
)
from index.storage.audit import AuditLog
from index.storage.connect import open_database
from index.storage.database import Connection, Database
from index.storage.deliveries import DeliveryLog
from index.storage.escalations import Escalations
from index.storage.feedback import Feedback
from index.storage.mcp_tokens import McpTokens
from index.storage.messages import PostedMessages
from index.storage.originals import OriginalFiles, open_originals
from index.storage.part import Clock
from index.storage.people_heard import PeopleHeard
from index.storage.postgres import PostgresDatabase
from index.storage.query_log import QueryLog
from index.storage.schema import BUMP_GENERATION, HOLD_GENERATION, MIGRATIONS
from index.storage.sources import SourceRecords
from index.storage.sqlite import SQLiteDatabase
from index.storage.uploads import Uploads
from index.storage.used_states import UsedStates
from index.storage.workers import AdvisoryWorkerLock, FileWorkerLock, WorkerLock

log = logging.getLogger(__name__)

# Which chunks are searchable by the running model (parameters: model, dimensions).
_SEARCHABLE = "d.state = 'indexed' AND d.embedding_model = ? AND d.dimensions = ?"
_CHUNK_VERSION = "COALESCE(d.indexed_at, -1.0)"
_ID_BATCH = 500
INTERRUPTED = "Indexing was interrupted before it finished; retry it."
# The ``failure_kind`` of an interrupted document.
INTERRUPTED_KIND = "interrupted"


@dataclass(frozen=True)
class NewDocument:
    """A document about to be added: what is known of it before it is indexed."""

    name: str
    sha256: str
    size: int
    scope: str = EVERYONE
    uploader: str = ""
    title: str = ""
    publish: Publish = Publish.DIRECT


_SELECT_DOCUMENTS = f"SELECT {', '.join(DOCUMENT_COLUMNS)} FROM documents"
# What update_document may change: id and created_at are fixed, the store sets updated_at.
_UPDATABLE = frozenset(DOCUMENT_COLUMNS) - {"id", "created_at", "updated_at"}

__all__ = ["INTERRUPTED", "INTERRUPTED_KIND", "NewDocument", "Store"]


class Store:
    """The database and the stored originals of one knowledge base.

    SQLite in the data dir by default; the Postgres database at
    ``database_url`` when one is given, shared by every replica (``index.storage.database``).
    Each thread gets its own connection (the bot reaches the store from a
    thread pool). Documents, chunks, originals and ``meta`` are its own; its
    parts share its database: ``queries`` (``index.storage.query_log``),
    ``feedback`` (``index.storage.feedback``), ``deliveries`` (Slack events seen
    and claimed, ``index.storage.deliveries``), ``audit_log``
    (``index.storage.audit``), ``escalations`` (hand-offs to people,
    ``index.storage.escalations``), ``messages`` (the bot's messages about a
    document, ``index.storage.messages``), ``used_states`` (values accepted
    once: sign-in states, MCP requests' Slack signatures;
    ``index.storage.used_states``), ``mcp_tokens`` (the MCP clients'
    bearer tokens, ``index.storage.mcp_tokens``) and ``uploads`` (uploads in
    progress, until each file is done: ``index.storage.uploads``) and ``sources`` (the
    synced sources, their items and permissions: ``index.storage.sources``) and
    ``people_heard`` (what Slack said of a person or a channel, for the other
    replicas: ``index.storage.people_heard``).

    Args:
        data_dir: the data directory (derived files; with SQLite also the
            database and the originals); created if missing.
        database_url: a ``postgresql://`` URL; empty: SQLite in ``data_dir``.
        clock: the time the parts stamp their rows with (``time.time``; tests pass their own).

    Raises:
        DatabaseUnavailable: the database cannot be opened or reached.
    """

    def __init__(self, data_dir: Path, *, database_url: str = "", clock: Clock = time.time) -> None:
        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        self.data_dir = private_dir(Path(data_dir))
        self.path = self.data_dir / "kb.sqlite"
        self.originals_dir = self.data_dir / "originals"
        if not database_url:
            self._private_sqlite_files()
        self.database: Database = open_database(self.data_dir, database_url)
        self.worker: WorkerLock = (
            AdvisoryWorkerLock(self.database)
            if isinstance(self.database, PostgresDatabase)
            else FileWorkerLock(self.data_dir)
        )
        db = self.db
        if isinstance(self.database, SQLiteDatabase) and self.read_only is None:
            db.execute("PRAGMA journal_mode=WAL")
        self.database.migrate(MIGRATIONS)
        self.originals = open_originals(self.database, self.data_dir)
        self.queries = QueryLog(self.database, clock)
        self.feedback = Feedback(self.database, self.queries, clock)
        self.deliveries = DeliveryLog(self.database, clock)
        self.audit_log = AuditLog(self.database, clock)
        self.escalations = Escalations(self.database, clock)
        self.messages = PostedMessages(self.database, clock)
        self.used_states = UsedStates(self.database, clock)
        self.mcp_tokens = McpTokens(self.database, clock)
        self.uploads = Uploads(self.database, clock)
        self.sources = SourceRecords(self.database, clock)
        self.people_heard = PeopleHeard(self.database, clock)

    def _private_sqlite_files(self) -> None:
        # SQLite gives its -wal and -shm files the database file's permissions.
        try:
            private_file(self.path)
        except OSError as exc:
            raise DatabaseUnavailable(
                f"Cannot open the database {self.path}: {exc.strerror or exc}."
            ) from exc
        for suffix in ("-wal", "-shm"):
            tighten(self.path.with_name(self.path.name + suffix))

    @property
    def read_only(self) -> str | None:
        """Why this process reads the database without being able to write it, or ``None``."""
        return self.database.read_only

    @property
    def db(self) -> Connection:
        """This thread's connection; ``DatabaseUnavailable`` if it cannot be opened.

        With SQLite on a full disk it is read-only (``index.storage.database.SQLiteDatabase``).
        """
        return self.database.connection()

    def transaction(self, *, wait: float | None = None) -> AbstractContextManager[Connection]:
        """One atomic write: everything inside commits together or not at all.

        ``wait``: the longest it waits for another process's write lock
        (``Database.transaction``).

        Raises:
            StorageError: the disk refused the write (``DiskFull`` when it is
                full), or another process held the lock past ``wait``
                (``DatabaseBusy``); nothing was committed.
        """
        return self.database.transaction(wait=wait)

    def exclusive(self, name: str) -> AbstractContextManager[bool]:
        """Hold the lock ``name`` across processes and replicas; yields ``False`` when it is taken."""
        return self.database.exclusive(name)

    def locked(self, name: str) -> bool:
        """Whether a process holds the lock ``name`` (``exclusive``) right now."""
        return self.database.locked(name)

    def close(self) -> None:
        """Close this thread's connection."""
        self.database.close()

    # ----------------------------------------------------------------- originals

    def save_original(self, data: bytes) -> str:
        """Store ``data`` content-addressed and return its sha256."""
        return self.originals.save(data)

    def has_original(self, data: bytes) -> bool:
        """Whether these bytes are stored already (storing them again takes no space)."""
        return self.originals.has(hashlib.sha256(data).hexdigest())

    def original_path(self, sha256: str) -> Path:
        """Where the original with this sha256 is kept as a file (beside SQLite)."""
        return OriginalFiles(self.data_dir).path(sha256)

    def original_file(self, sha256: str) -> Path | None:
        """A file holding the original with this sha256 (``None`` if it is gone), for serving it.

        Beside SQLite the stored file itself; on Postgres a copy this replica
        keeps in ``originals/`` of its data dir, written the first time it is asked for.
        """
        path = self.original_path(sha256)
        if isinstance(self.originals, OriginalFiles):
            return path if path.exists() else None
        if not self.originals.has(sha256):
            # Deleted by some replica: this one's copy goes too.
            path.unlink(missing_ok=True)
            return None
        if not path.exists():
            OriginalFiles(self.data_dir).save(self.originals.read(sha256))
        return path

    def read_original(self, sha256: str) -> bytes:
        """The original bytes of a document; ``OriginalMissing`` if they are gone."""
        return self.originals.read(sha256)

    # ----------------------------------------------------------------- documents

    def insert_document(self, new: NewDocument) -> int:
        """Insert a ``pending`` document and return its id."""
        now = time.time()
        with self.transaction() as db:
            cur = db.execute(
                """INSERT INTO documents (name, title, sha256, size, uploader, scope, state,
                                          publish, created_at, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
                [
                    new.name,
                    new.title,
                    new.sha256,
                    new.size,
                    new.uploader,
                    new.scope,
                    DocState.PENDING.value,
                    new.publish.value,
                    now,
                    now,
                ],
            )
            return int(cur.fetchone()[0])

    def add_document(self, new: NewDocument) -> tuple[DocumentRow, bool]:
        """The live document with these bytes in this scope, or a new ``pending`` one.

        Looked up and inserted in one write transaction, so processes adding
        the same bytes at the same instant all get the same row; the unique
        index on live ``(sha256, scope)`` (``index.storage.schema``) backs this up.

        Returns:
            ``(document, existed)``.
        """
        try:
            with self.transaction():
                existing = self.document_by_sha(new.sha256, new.scope)
                if existing is not None:
                    return existing, True
                doc_id = self.insert_document(new)
        except self.database.integrity_errors:
            # Another connection inserted it first: on Postgres, whose
            # transactions do not exclude each other, or in a database written
            # by code that looked up outside the transaction.
            existing = self.document_by_sha(new.sha256, new.scope)
            if existing is None:
                raise
            return existing, True
        return self.document(doc_id), False

    def update_document(self, doc_id: int, **changes: object) -> None:
        """Change some columns of a document (``updated_at`` follows).

        Raises:
            TypeError: a name is not a column ``update_document`` may change.
        """
        unknown = sorted(set(changes) - _UPDATABLE)
        if unknown:
            raise TypeError(f"update_document() got columns documents cannot change: {unknown}")
        with self.transaction() as db:
            _update_document(db, doc_id, {**changes, "updated_at": time.time()})

    def _documents(self, where: str = "", params: Sequence[object] = ()) -> list[DocumentRow]:
        rows = self.db.query(f"{_SELECT_DOCUMENTS} {where}", list(params))
        return [DocumentRow.from_row(r) for r in rows]

    def document(self, doc_id: int) -> DocumentRow:
        """One document, or ``DocumentNotFound``."""
        rows = self._documents("WHERE id = ?", [doc_id])
        if not rows:
            raise DocumentNotFound(str(doc_id))
        return rows[0]

    def find_document(self, ref: str) -> DocumentRow:
        """A document by id, exact name, or sha256 prefix (at least 6 characters).

        Of several with that name or prefix, the newest that is not a replaced version.
        """
        if ref.isdigit():
            return self.document(int(ref))
        newest_live = "ORDER BY state = 'replaced', id DESC"
        rows = self._documents(f"WHERE name = ? {newest_live}", [ref])
        if not rows and len(ref) >= 6:
            rows = self._documents(f"WHERE sha256 LIKE ? {newest_live}", [ref + "%"])
        if not rows:
            raise DocumentNotFound(ref)
        return rows[0]

    def documents(self, state: DocState | None = None) -> list[DocumentRow]:
        """All documents, oldest first, optionally of one state."""
        if state is None:
            return self._documents("ORDER BY id")
        return self._documents("WHERE state = ? ORDER BY id", [state.value])

    def document_by_sha(self, sha256: str, scope: str) -> DocumentRow | None:
        """The live document with these bytes in this scope, if any.

        A replaced version is not live: the same bytes uploaded again are a new
        version, and go through the publishing rules like any other.
        """
        rows = self._documents(
            "WHERE sha256 = ? AND scope = ? AND state != ? ORDER BY id DESC",
            [sha256, scope, DocState.REPLACED.value],
        )
        return rows[0] if rows else None

    def failed_before(self, cutoff: float) -> list[DocumentRow]:
        """Documents ``failed`` since before ``cutoff`` (a Unix time), oldest first."""
        return self._documents(
            "WHERE state = ? AND updated_at < ? ORDER BY id", [DocState.FAILED.value, cutoff]
        )

    def indexed_by_name(
        self,
        name: str,
        scope: str,
        *,
        exclude: int,
        uploader: str | None = None,
        from_sources: bool | None = None,
    ) -> list[int]:
        """Ids of other indexed documents with this name and scope (older versions).

        Args:
            uploader: only those this person (or synced source) added.
            from_sources: only those a synced source added (``True``), or only
                those it did not (``False``); ``None``: either.
        """
        where = "name = ? AND scope = ? AND id != ? AND state = ?"
        params: list[object] = [name, scope, exclude, DocState.INDEXED.value]
        if uploader is not None:
            where += " AND uploader = ?"
            params.append(uploader)
        if from_sources is not None:
            where += f" AND {'' if from_sources else 'NOT '}uploader LIKE ?"
            params.append(f"{SOURCE_UPLOADER_PREFIX}%")
        rows = self.db.query(f"SELECT id FROM documents WHERE {where} ORDER BY id", params)
        return [int(r["id"]) for r in rows]

    def versions_replaced_by(self, doc_id: int) -> list[DocumentRow]:
        """The versions ``doc_id`` replaced, newest first."""
        return self._documents(
            "WHERE replaced_by = ? AND state = ? ORDER BY id DESC",
            [doc_id, DocState.REPLACED.value],
        )

    def stamped_dimensions(self, embedding_model: str) -> int | None:
        """The vector size most indexed documents of ``embedding_model`` carry, if any."""
        row = next(
            self.db.query(
                """SELECT dimensions, COUNT(*) AS n FROM documents
                   WHERE state = ? AND embedding_model = ? AND dimensions IS NOT NULL
                   GROUP BY dimensions ORDER BY n DESC LIMIT 1""",
                [DocState.INDEXED.value, embedding_model],
            ),
            None,
        )
        return int(row["dimensions"]) if row else None

    def stamped_models(self) -> dict[str, int]:
        """How many indexed documents each embedding model's stamp is on, most first."""
        rows = self.db.query(
            """SELECT embedding_model, COUNT(*) AS n FROM documents
               WHERE state = ? AND embedding_model IS NOT NULL
               GROUP BY embedding_model ORDER BY n DESC""",
            [DocState.INDEXED.value],
        )
        return {str(row["embedding_model"]): int(row["n"]) for row in rows}

    def stamped_models_held(self) -> dict[str, int]:
        """Inside a transaction: ``stamped_models``, held until it ends.

        Every commit that makes a document searchable changes the generation
        counter's row; this takes that row first, so such a commit by another
        process waits for this transaction, or this read waits for it and sees
        its stamp (Postgres; SQLite's write transaction holds the whole database).
        """
        self.hold_generation()
        return self.stamped_models()

    def hold_generation(self) -> None:
        """Inside a transaction: take the generation counter's row now, held until it ends.

        Every transaction that changes the searchable chunks takes it before
        any chunk or document row (``commit_indexed``, ``supersede``,
        ``make_searchable``, ``delete_rows``), as a writer checking the stamps
        does (``stamped_models_held``): on Postgres they take their locks in one
        order, so none is aborted as a deadlock when one retires or removes the
        chunks another rewrites (a new version committed as a reindex swaps the old).
        """
        self.db.execute(HOLD_GENERATION)

    def stale_documents(self, stamp: Stamp) -> list[DocumentRow]:
        """Indexed documents stamped differently from ``stamp``."""
        return self._documents(
            """WHERE state = ? AND (
                   embedding_model IS DISTINCT FROM ? OR dimensions IS DISTINCT FROM ?
                   OR pipeline_version IS DISTINCT FROM ?
                   OR extractor_version IS DISTINCT FROM ?)
               ORDER BY id""",
            [
                DocState.INDEXED.value,
                stamp.embedding_model,
                stamp.dimensions,
                stamp.pipeline_version,
                stamp.extractor_version,
            ],
        )

    # ----------------------------------------------------------------- chunks

    def commit_indexed(
        self,
        doc_id: int,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        token_counts: Sequence[int],
        *,
        canonical_text: str,
        stamp: Stamp,
        window_splits: int,
        facts: DocumentFacts | None = None,
        state: DocState = DocState.INDEXED,
        sentence_vectors: Sequence[np.ndarray | None] | None = None,
        latent_terms: Sequence[LatentTerms | None] | None = None,
        near: Signature | None = None,
    ) -> list[int]:
        """Write a document's canonical text and chunks and mark it ``state``, in one transaction.

        ``state`` is ``indexed`` (searchable) or ``awaiting_approval`` (kept
        out of every search until ``publish``).

        ``facts`` are further document columns learnt while indexing (title,
        kind, page map): written in the same transaction, because a link's
        form (``#char`` or ``#page``) depends on them.

        ``near`` is the text's near-copy signature (``index.near_copies``), kept
        beside it in ``texts``; ``None``: the text has no word, nothing is a near-copy of it.

        The canonical text is kept because every chunk offset refers to it:
        the viewer must show exactly the text the offsets were found in, even
        after the extractor changes.

        Older versions it replaces are retired with ``supersede`` in the same
        transaction (the caller's), so readers see either the old version or the new one.

        Returns:
            The new chunk ids, in chunk order.

        Raises:
            DocumentNotFound: the document was removed while it was being indexed.
        """
        with self.transaction() as db:
            if state == DocState.INDEXED:
                self.hold_generation()  # before the chunks: one order of locks
            if db.execute("SELECT 1 FROM documents WHERE id = ?", [doc_id]).fetchone() is None:
                raise DocumentNotFound(str(doc_id))
            db.execute("DELETE FROM chunks WHERE document_id = ?", [doc_id])
            db.execute(
                "INSERT INTO texts (document_id, text, near_shingles, near_minhash) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (document_id) DO UPDATE SET text = excluded.text, "
                "near_shingles = excluded.near_shingles, near_minhash = excluded.near_minhash",
                [
                    doc_id,
                    canonical_text,
                    *((near.shingles, near.minhash) if near else (None, None)),
                ],
            )
            sentences = sentence_vectors or [None] * len(chunks)
            latents = latent_terms or [None] * len(chunks)
            ids = [
                self._insert_chunk(db, doc_id, c, v, n, s, t)
                for c, v, n, s, t in zip(
                    chunks, vectors, token_counts, sentences, latents, strict=True
                )
            ]
            _update_document(
                db,
                doc_id,
                {
                    "state": state.value,
                    "failure_reason": None,
                    "failure_kind": None,
                    "failure_limit": None,
                    "replaced_by": None,
                    "chunk_count": len(ids),
                    "window_splits": window_splits,
                    "embedding_model": stamp.embedding_model,
                    "dimensions": stamp.dimensions,
                    "pipeline_version": stamp.pipeline_version,
                    "extractor_version": stamp.extractor_version,
                    "worker_pid": None,
                    "worker": None,
                    "indexed_at": time.time(),
                    "updated_at": time.time(),
                    **(asdict(facts) if facts else {}),
                },
            )
            if state == DocState.INDEXED:
                self._bump_generation(db)
        return ids

    @staticmethod
    def _insert_chunk(
        db: Connection,
        doc_id: int,
        c: Chunk,
        vector: np.ndarray,
        tokens: int,
        sentences: np.ndarray | None,
        latent: LatentTerms | None,
    ) -> int:
        cur = db.execute(
            """INSERT INTO chunks (document_id, ordinal, section, start, "end", page,
                                   content, text, token_count, vector, sentence_vectors,
                                   latent_terms, language)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
            [
                doc_id,
                c.ordinal,
                c.section,
                c.start,
                c.end,
                c.page,
                c.content,
                c.text,
                int(tokens),
                np.asarray(vector, dtype=np.float32).tobytes(),
                to_blob(sentences),
                latent.to_blob() if latent is not None else None,
                c.language,
            ],
        )
        return int(cur.fetchone()[0])

    def make_searchable(self, doc_id: int) -> None:
        """Make an ``awaiting_approval`` document's chunks searchable (in the caller's transaction)."""
        with self.transaction() as db:
            self._bump_generation(db)  # before the row: one order of locks (hold_generation)
            _update_document(
                db, doc_id, {"state": DocState.INDEXED.value, "updated_at": time.time()}
            )

    def supersede(self, old_ids: Sequence[int], *, by: int) -> list[DocumentRow]:
        """Retire older versions: ``replaced`` by ``by``, out of every search, restorable.

        Their chunks (and vectors) go; their row, canonical text and original
        stay, so an old citation link still opens the text it quoted and
        ``KnowledgeBase.restore`` can index the version again.

        Returns:
            The versions as they were before.
        """
        before = [self.document(i) for i in old_ids]
        with self.transaction() as db:
            if before:
                self.hold_generation()  # before the chunks: one order of locks
            for old in before:
                db.execute("DELETE FROM chunks WHERE document_id = ?", [old.id])
                _update_document(
                    db,
                    old.id,
                    {
                        "state": DocState.REPLACED.value,
                        "replaced_by": by,
                        "updated_at": time.time(),
                    },
                )
            if before:
                self._bump_generation(db)
        return before

    def prune_versions(
        self, name: str, scope: str, *, keep: int, actor: str = "system", detail: str = ""
    ) -> list[str]:
        """Delete the oldest replaced versions of ``name`` in ``scope`` beyond ``keep``.

        Each deleted version gets a ``prune`` audit entry by ``actor``, in the
        same transaction as its deletion.

        Returns:
            The sha256 of each deleted version, for ``drop_originals_if_unused``
            once the caller's transaction has committed.
        """
        with self.transaction():
            rows = self._documents(
                "WHERE name = ? AND scope = ? AND state = ? ORDER BY id DESC",
                [name, scope, DocState.REPLACED.value],
            )[max(keep, 0) :]
            for row in rows:
                self.delete_rows(row.id)
                self.audit_log.add(
                    AuditEntry(
                        actor=actor or "system",
                        action=AuditAction.PRUNE,
                        document_id=row.id,
                        name=row.name,
                        scope=row.scope,
                        old_sha256=row.sha256,
                        detail=detail or f"kept the {max(keep, 0)} newest replaced versions",
                    )
                )
        return [row.sha256 for row in rows]

    def delete_document(self, doc_id: int) -> None:
        """Remove a document, its chunks and its stored original if unused."""
        row = self.document(doc_id)
        self.delete_rows(doc_id)
        self.drop_originals_if_unused([row.sha256])

    def delete_rows(self, doc_id: int) -> None:
        """Delete a document's row, chunks and text; its original stays (see ``delete_document``)."""
        with self.transaction() as db:
            searchable = db.execute(
                """SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id
                   WHERE c.document_id = ? AND d.state = ?""",
                [doc_id, DocState.INDEXED.value],
            ).fetchone()[0]
            if searchable:
                self.hold_generation()  # before the chunks: one order of locks
            db.execute("DELETE FROM chunks WHERE document_id = ?", [doc_id])
            db.execute("DELETE FROM texts WHERE document_id = ?", [doc_id])
            db.execute("DELETE FROM documents WHERE id = ?", [doc_id])
            if searchable:
                self._bump_generation(db)

    def drop_originals_if_unused(self, sha256s: Sequence[str]) -> None:
        """Delete the stored originals no document names any more.

        Call it after the transaction that deleted their rows has committed:
        a file is not part of a transaction, and a rollback cannot bring it back.
        """
        for sha256 in sha256s:
            used = self.db.execute(
                "SELECT COUNT(*) FROM documents WHERE sha256 = ?", [sha256]
            ).fetchone()[0]
            if not used:
                self.originals.delete(sha256)
                self.original_path(sha256).unlink(missing_ok=True)  # a served copy (Postgres)

    def canonical_text(self, doc_id: int) -> str:
        """The text a document's chunk offsets refer to (empty until it is indexed)."""
        self.document(doc_id)
        row = self.db.execute("SELECT text FROM texts WHERE document_id = ?", [doc_id]).fetchone()
        return row[0] if row else ""

    def chunk_rows(self, doc_id: int) -> list[dict[str, Any]]:
        """A document's chunks (without vectors), in order."""
        return list(
            self.db.query(
                """SELECT id, ordinal, section, start, "end", page, content, text, token_count,
                          language
                   FROM chunks WHERE document_id = ? ORDER BY ordinal""",
                [doc_id],
            )
        )

    def passages_of_lengths(self, counts: Collection[int]) -> Iterator[tuple[int, str]]:
        """``(document_id, content)`` of every passage of the indexed documents of one of
        ``counts`` chunks, each document's in order: those whose text can be another's
        passage for passage. Yielded one by one: the caller keeps a digest of each document,
        not its text."""
        if not counts:
            return
        marks = ", ".join("?" for _ in counts)
        rows = self.db.query(
            f"""SELECT c.document_id, c.content FROM chunks c JOIN documents d ON d.id = c.document_id
               WHERE d.state = ? AND d.chunk_count IN ({marks})
               ORDER BY c.document_id, c.ordinal""",
            [DocState.INDEXED.value, *sorted(counts)],
        )
        for r in rows:
            yield int(r["document_id"]), r["content"]

    def near_signature(self, doc_id: int) -> Signature | None:
        """``doc_id``'s near-copy signature (``index.near_copies``); ``None`` if it has none."""
        row = self.db.execute(
            "SELECT near_shingles, near_minhash FROM texts WHERE document_id = ?", [doc_id]
        ).fetchone()
        if row is None or row[1] is None:
            return None
        return Signature(int(row[0]), bytes(row[1]))

    def near_signatures(self, fewest: int, most: int) -> list[tuple[int, int, bytes]]:
        """``(id, runs, minhash)`` of each indexed document whose text has between ``fewest``
        and ``most`` runs of words (``index.near_copies.size_range``), by the index on them."""
        rows = self.db.execute(
            """SELECT t.document_id, t.near_shingles, t.near_minhash FROM texts t
               JOIN documents d ON d.id = t.document_id
               WHERE t.near_shingles BETWEEN ? AND ? AND d.state = ?""",
            [fewest, most, DocState.INDEXED.value],
        ).fetchall()
        return [(int(r[0]), int(r[1]), bytes(r[2])) for r in rows]

    def chunk_languages(self) -> frozenset[str]:
        """The languages the searchable documents' passages are written in (those told)."""
        rows = self.db.execute(
            """SELECT DISTINCT c.language FROM chunks c JOIN documents d ON d.id = c.document_id
               WHERE d.state = 'indexed' AND c.language IS NOT NULL"""
        ).fetchall()
        return frozenset(r[0] for r in rows)

    def languages_of_chunks(self, ids: Sequence[int]) -> dict[int, str | None]:
        """The language of each of the given chunks that exists."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"SELECT id, language FROM chunks WHERE id IN ({marks})", list(ids)
        ).fetchall()
        return {int(cid): language for cid, language in rows}

    def language_counts(self) -> dict[str | None, int]:
        """How many searchable passages each language has (``None``: not told), most first."""
        rows = self.db.execute(
            """SELECT c.language, COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id
               WHERE d.state = 'indexed' GROUP BY c.language ORDER BY COUNT(*) DESC"""
        ).fetchall()
        return {language: int(n) for language, n in rows}

    def sentence_vectors(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        """The sentence vectors of the given chunks that have them (``index.ingest.sentences``)."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"""SELECT id, sentence_vectors, length(vector) FROM chunks
                WHERE id IN ({marks}) AND sentence_vectors IS NOT NULL""",
            list(ids),
        ).fetchall()
        return {int(cid): from_blob(blob, int(size) // 4) for cid, blob, size in rows}

    def latent_terms(self, ids: Sequence[int]) -> dict[int, LatentTerms]:
        """The latent terms of the given chunks that have them (``index.embed.latent``).

        A stored blob that is not whole (index, weight) pairs is left out, as if
        the chunk had none, and logged: the answer order then does without them.
        """
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"""SELECT id, latent_terms FROM chunks
                WHERE id IN ({marks}) AND latent_terms IS NOT NULL""",
            list(ids),
        ).fetchall()
        found: dict[int, LatentTerms] = {}
        for cid, blob in rows:
            try:
                found[int(cid)] = LatentTerms.from_blob(bytes(blob))
            except ValueError as exc:
                log.warning("chunk %s has damaged latent terms: %s", cid, exc)
        return found

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        """The given chunks with their documents' facts; missing ids are left out."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.query(
            f"""SELECT c.id, c.document_id, d.title, d.name, d.kind, d.scope, c.ordinal,
                       c.section, c.start, c."end", c.page, c.content, c.text, c.language
                FROM chunks c JOIN documents d ON d.id = c.document_id
                WHERE c.id IN ({marks}) AND d.state = 'indexed'""",
            list(ids),
        )
        return {
            int(r["id"]): ChunkRow(
                id=int(r["id"]),
                document_id=int(r["document_id"]),
                document=r["title"] or r["name"],
                kind=r["kind"],
                scope=r["scope"],
                ordinal=r["ordinal"],
                section=r["section"],
                start=r["start"],
                end=r["end"],
                page=r["page"],
                content=r["content"],
                text=r["text"],
                language=r["language"],
            )
            for r in rows
        }

    def searchable_chunks(
        self, embedding_model: str, dimensions: int, ids: Sequence[int] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Chunks that may be searched with vectors of this model: id, scope, text, language,
        vector, version.

        Chunks of documents stamped with another model are left out, so a query
        never mixes vectors from two models. ``version`` is as in
        ``searchable_chunk_versions``.

        Args:
            embedding_model: the running model's stamp.
            dimensions: its vector size.
            ids: if given, only these chunks (those not searchable are left out).
        """
        query = f"""SELECT c.id, d.scope, c.text, c.language, c.vector, {_CHUNK_VERSION} AS version
                    FROM chunks c JOIN documents d ON d.id = c.document_id
                    WHERE {_SEARCHABLE}"""
        if ids is None:
            yield from self.db.query(query + " ORDER BY c.id", [embedding_model, dimensions])
            return
        wanted = sorted(ids)
        # Batched: SQLite caps the number of parameters of one statement.
        for at in range(0, len(wanted), _ID_BATCH):
            batch = wanted[at : at + _ID_BATCH]
            yield from self.db.query(
                f"{query} AND c.id IN ({','.join('?' * len(batch))}) ORDER BY c.id",
                [embedding_model, dimensions, *batch],
            )

    def searchable_chunk_versions(
        self, embedding_model: str, dimensions: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids and versions of the searchable chunks (as ``searchable_chunks``), by id.

        Chunk ids alone cannot tell a chunk from its replacement: SQLite hands
        out a deleted row's id again when it was the highest. A chunk is only
        ever written with its document's ``indexed_at``, so the pair
        (id, ``indexed_at``) names one chunk's content.

        Returns:
            ``(ids, versions)``: int64 chunk ids, ascending, and the float64
            ``indexed_at`` of each chunk's document (-1 where it is missing).
        """
        _, _, ids, versions = self._searchable_rows(embedding_model, dimensions, "")
        return ids, versions

    def searchable_chunk_facts(
        self, embedding_model: str, dimensions: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``searchable_chunk_versions`` with each chunk's scope and language (``None``: not told).

        Returns:
            ``(ids, versions, scopes, languages)``, aligned, ids ascending; the
            scopes and languages as object arrays.
        """
        rows, order, ids, versions = self._searchable_rows(
            embedding_model, dimensions, ", d.scope, c.language"
        )
        scopes = np.array([r[2] for r in rows], dtype=object)
        languages = np.array([r[3] for r in rows], dtype=object)
        return ids, versions, scopes[order], languages[order]

    def _searchable_rows(
        self, embedding_model: str, dimensions: int, more: str
    ) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
        """The rows (id, version, ``more``...) in the database's order, the order that sorts
        them by id, and their ids and versions in it."""
        # Read from the index on (document_id, language, id), never the chunks' rows:
        # sorted here, as an ORDER BY c.id would make SQLite scan the table.
        rows = self.db.execute(
            f"""SELECT c.id, {_CHUNK_VERSION}{more} FROM chunks c
                JOIN documents d ON d.id = c.document_id
                WHERE {_SEARCHABLE}""",
            [embedding_model, dimensions],
        ).fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        versions = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
        order = np.argsort(ids)
        return rows, order, ids[order], versions[order]

    def searchable_chunk_count(self, embedding_model: str, dimensions: int) -> int:
        """How many chunks are searchable (as ``searchable_chunks``)."""
        row = self.db.execute(
            f"""SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id
                WHERE {_SEARCHABLE}""",
            [embedding_model, dimensions],
        ).fetchone()
        return int(row[0])

    def document_count(self) -> int:
        """How many documents there are, in any state."""
        return int(self.db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def chunk_count(self) -> int:
        """Number of stored chunks of indexed documents."""
        return int(
            self.db.execute(
                "SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id "
                "WHERE d.state = 'indexed'"
            ).fetchone()[0]
        )

    # ----------------------------------------------------------------- generation

    @property
    def generation(self) -> int:
        """Counter of changes to the searchable chunk set."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def _bump_generation(db: Connection) -> None:
        db.execute(BUMP_GENERATION)

    def get_meta(self, key: str) -> str | None:
        """A value of the meta table, or ``None`` when it was never set."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return str(row[0]) if row else None

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [key, value],
            )

    def delete_meta(self, key: str) -> None:
        """Remove a value of the meta table (nothing when it was never set)."""
        with self.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = ?", [key])

    def setdefault_meta(self, key: str, value: str) -> str:
        """The value of ``key``, set to ``value`` first if it has none (``dict.setdefault``).

        One statement sets it only when absent: of processes or replicas racing
        to set the same key, one wins and each of them reads the winner's value.
        """
        with self.transaction() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                [key, value],
            )
            row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return str(row[0])

    # ----------------------------------------------------------------- recovery

    def mark_indexing(self, doc_id: int, holder: str) -> None:
        """Mark a document ``indexing`` by the process holding the lock ``holder`` (``WorkerLock``)."""
        self.update_document(
            doc_id,
            state=DocState.INDEXING.value,
            worker=holder,
            worker_pid=os.getpid(),
            failure_reason=None,
            failure_kind=None,
            failure_limit=None,
        )

    def recover_interrupted(self) -> list[int]:
        """Mark documents whose indexing was interrupted as failed (retryable).

        Interrupted: the process that marked them ``indexing`` no longer holds
        its lock (``index.storage.workers``), or is this one and has stopped working
        on them. Lock files of processes that are gone are deleted.

        Returns:
            The ids of the documents that were recovered.
        """
        rows = list(
            self.db.query(
                "SELECT id, worker FROM documents WHERE state = ?", [DocState.INDEXING.value]
            )
        )
        dead = [int(r["id"]) for r in rows if self.worker.interrupted(int(r["id"]), r["worker"])]
        for doc_id in dead:
            self.update_document(
                doc_id,
                state=DocState.FAILED.value,
                failure_reason=INTERRUPTED,
                failure_kind=INTERRUPTED_KIND,
                failure_limit=None,
                worker=None,
                worker_pid=None,
            )
        self.worker.sweep(r["worker"] for r in rows if r["worker"] and int(r["id"]) not in dead)
        return dead


def _update_document(db: Connection, doc_id: int, changes: Mapping[str, object]) -> None:
    # Column names come from the code (``_UPDATABLE``), never from input.
    sets = ", ".join(f'"{column}" = ?' for column in changes)
    db.execute(f"UPDATE documents SET {sets} WHERE id = ?", [*changes.values(), doc_id])
