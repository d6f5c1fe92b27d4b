"""The derived search indexes (FAISS + BM25), kept in step with SQLite.

A ``Snapshot`` is immutable once built: queries use whatever snapshot is
current, and every change builds a new one beside it and swaps the reference,
so a reindex or an upload never leaves a query looking at half an index.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from index.bm25 import BM25Index
from index.errors import KBError
from index.store import EVERYONE, Store
from index.vectors import VectorIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the searchable chunks.

    Attributes:
        vectors: FAISS index keyed by chunk id.
        bm25: sparse index over the same chunk ids.
        chunk_ids: sorted chunk ids in both indexes.
        scopes: scope of each chunk, aligned with ``chunk_ids``.
        generation: the store generation this snapshot reflects.
    """

    vectors: VectorIndex
    bm25: BM25Index
    chunk_ids: np.ndarray
    scopes: np.ndarray
    generation: int

    def allowed_ids(self, scopes: frozenset[str] | None) -> np.ndarray | None:
        """Chunk ids visible to ``scopes``; ``None`` when every chunk is visible."""
        if scopes is None:
            return None
        mask = np.isin(self.scopes, list(scopes | {EVERYONE}))
        if mask.all():
            return None
        return self.chunk_ids[mask]

    def __len__(self) -> int:
        return int(self.chunk_ids.size)


class DerivedIndexes:
    """Builds, persists, checks and swaps the search snapshot of one data dir.

    Args:
        store: the source of truth.
        embedding_model: stamp of the running embedding model; only chunks
            embedded with it are searchable.
        dimensions: its vector size.
    """

    def __init__(self, store: Store, *, embedding_model: str, dimensions: int) -> None:
        self.store = store
        self.embedding_model = embedding_model
        self.dimensions = dimensions
        self.dir = store.data_dir / "index"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    @property
    def vectors_path(self) -> Path:
        """The FAISS file."""
        return self.dir / "vectors.faiss"

    @property
    def bm25_path(self) -> Path:
        """The BM25 file."""
        return self.dir / "bm25.npz"

    @property
    def snapshot(self) -> Snapshot:
        """The current snapshot, loaded (or rebuilt) on first use."""
        snap = self._snapshot
        if snap is None:
            snap = self.open()
        return snap

    def open(self) -> Snapshot:
        """Load the persisted indexes, or rebuild them if they disagree with SQLite."""
        with self._lock:
            snap = self._load_if_current()
            if snap is None:
                snap = self._rebuild_locked()
            self._snapshot = snap
            return snap

    def refresh(self) -> Snapshot:
        """Bring the snapshot up to the store's generation (no-op when current)."""
        with self._lock:
            current = self._snapshot
            if current is not None and current.generation == self.store.generation:
                return current
            snap = self._rebuild_locked()
            self._snapshot = snap
            return snap

    def rebuild(self) -> Snapshot:
        """Rebuild both indexes from SQLite, persist them and swap them in."""
        with self._lock:
            snap = self._rebuild_locked()
            self._snapshot = snap
            return snap

    def check(self) -> dict[str, object]:
        """Compare the persisted and live indexes with SQLite (for ``kb status``)."""
        snap = self.snapshot
        expected = self._searchable_ids()
        return {
            "generation": self.store.generation,
            "snapshot_generation": snap.generation,
            "faiss_vectors": snap.vectors.ntotal,
            "bm25_chunks": len(snap.bm25),
            "searchable_chunks": int(expected.size),
            "in_sync": bool(
                snap.generation == self.store.generation
                and np.array_equal(np.sort(snap.vectors.ids()), expected)
                and np.array_equal(np.sort(np.asarray(snap.bm25.chunk_ids)), expected)
            ),
        }

    # ------------------------------------------------------------------ internals

    def _searchable_ids(self) -> np.ndarray:
        rows = self.store.db.execute(
            """SELECT c.id FROM chunks c JOIN documents d ON d.id = c.document_id
               WHERE d.state = 'indexed' AND d.embedding_model = ? AND d.dimensions = ?
               ORDER BY c.id""",
            [self.embedding_model, self.dimensions],
        ).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

    def _load_if_current(self) -> Snapshot | None:
        if not (self.vectors_path.exists() and self.bm25_path.exists()):
            return None
        generation = self.store.generation
        try:
            vectors, v_gen = VectorIndex.load(self.vectors_path)
            bm25, b_gen = BM25Index.load(self.bm25_path)
        except KBError as exc:
            log.warning("derived index unreadable, rebuilding: %s", exc)
            return None
        if v_gen != generation or b_gen != generation:
            log.info(
                "derived indexes at generation %s/%s, store at %s: rebuilding",
                v_gen,
                b_gen,
                generation,
            )
            return None
        expected = self._searchable_ids()
        ids = np.sort(vectors.ids())
        if not (
            np.array_equal(ids, expected)
            and np.array_equal(np.sort(np.asarray(bm25.chunk_ids)), expected)
        ):
            log.warning("derived indexes disagree with SQLite: rebuilding")
            return None
        return Snapshot(vectors, bm25, expected, self._scopes_for(expected), generation)

    def _scopes_for(self, ids: np.ndarray) -> np.ndarray:
        rows = dict(
            self.store.db.execute(
                "SELECT c.id, d.scope FROM chunks c JOIN documents d ON d.id = c.document_id"
            ).fetchall()
        )
        return np.array([rows[int(i)] for i in ids], dtype=object)

    def _rebuild_locked(self) -> Snapshot:
        # Read the generation first: if a write lands while we read rows, the
        # snapshot is labelled older than it is and the next refresh redoes it.
        generation = self.store.generation
        ids: list[int] = []
        scopes: list[str] = []
        texts: list[str] = []
        vecs: list[np.ndarray] = []
        for row in self.store.searchable_chunks(self.embedding_model, self.dimensions):
            ids.append(int(row["id"]))
            scopes.append(row["scope"])
            texts.append(row["text"])
            vecs.append(np.frombuffer(row["vector"], dtype=np.float32))
        id_arr = np.array(ids, dtype=np.int64)
        vectors = VectorIndex(self.dimensions)
        if ids:
            vectors.add(id_arr, np.vstack(vecs))
        bm25 = BM25Index(ids, texts)
        vectors.save(self.vectors_path, generation)
        bm25.save(self.bm25_path, generation)
        log.info("derived indexes rebuilt: %d chunks at generation %d", len(ids), generation)
        return Snapshot(vectors, bm25, id_arr, np.array(scopes, dtype=object), generation)
