"""The derived search indexes (FAISS + BM25), kept in step with SQLite.

A ``Snapshot`` is immutable once built: queries use whatever snapshot is
current, and every change builds a new one beside it and swaps the reference,
so a reindex or an upload never leaves a query looking at half an index.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from index.errors import IndexOutOfSync, KBError
from index.files import private_dir
from index.models import EVERYONE, OnlyScopes
from index.search.bm25 import BM25Index
from index.search.vectors import VectorIndex
from index.storage import Store

log = logging.getLogger(__name__)

# A refresh changing more than this share of the chunks rebuilds from scratch:
# merging then costs about as much as building, and a rebuild is simpler.
MAX_UPDATE_SHARE = 0.5


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the searchable chunks.

    Attributes:
        vectors: FAISS index keyed by chunk id.
        bm25: sparse index over the same chunk ids.
        chunk_ids: sorted chunk ids in both indexes.
        scopes: scope of each chunk, aligned with ``chunk_ids``.
        generation: the store generation this snapshot reflects.
        languages: language of each chunk (``None`` where unknown), aligned with
            ``chunk_ids``; ``None``: not read (every chunk unknown).
        versions: version of each chunk (``Store.searchable_chunk_versions``),
            aligned with ``chunk_ids``; ``None`` when unknown, and then the
            next refresh rebuilds instead of updating.
    """

    vectors: VectorIndex
    bm25: BM25Index
    chunk_ids: np.ndarray
    scopes: np.ndarray
    generation: int
    versions: np.ndarray | None = None
    languages: np.ndarray | None = None

    @cached_property
    def corpus_languages(self) -> frozenset[str]:
        """The languages the snapshot's chunks are written in (those told)."""
        if self.languages is None:
            return frozenset()
        return frozenset(c for c in set(self.languages.tolist()) if c)

    def languages_of(self, chunk_ids: Sequence[int]) -> dict[int, str | None]:
        """The language of each of ``chunk_ids`` that is in the snapshot."""
        if self.languages is None or not len(chunk_ids):
            return {}
        wanted = np.asarray(chunk_ids, dtype=np.int64)
        at = np.searchsorted(self.chunk_ids, wanted).clip(0, max(len(self) - 1, 0))
        found = self.chunk_ids[at] == wanted
        return {int(c): self.languages[i] for c, i, f in zip(wanted, at, found, strict=True) if f}

    def ids_by_language(
        self, language: str, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ids among ``allowed`` (``None``: all) in ``language`` or none told, and in another.

        Each leg of a search in two lists looks only at its own ids, so neither
        list can crowd the other out of its first hits.
        """
        if self.languages is None or not len(self):
            return (self.chunk_ids if allowed is None else np.asarray(allowed)), self.chunk_ids[:0]
        other = self._other_language_mask(language)
        if allowed is None:
            return self.chunk_ids[~other], self.chunk_ids[other]
        # A mask over the sorted ids: np.intersect1d costs ~10 ms at 100k chunks.
        at = np.searchsorted(self.chunk_ids, allowed).clip(0, len(self) - 1)
        visible = np.zeros(len(self), dtype=bool)
        visible[at[self.chunk_ids[at] == allowed]] = True
        return self.chunk_ids[visible & ~other], self.chunk_ids[visible & other]

    def _other_language_mask(self, language: str) -> np.ndarray:
        masks = self._masks_by_language
        if language not in masks:  # a race only computes one twice
            found = self.languages.tolist() if self.languages is not None else []
            masks[language] = np.array([c is not None and c != language for c in found], bool)
        return masks[language]

    @cached_property
    def _masks_by_language(self) -> dict[str, np.ndarray]:
        return {}

    def allowed_ids(self, scopes: frozenset[str] | None) -> np.ndarray | None:
        """Chunk ids visible to ``scopes``; ``None`` when every chunk is visible.

        The everyone-scoped documents are visible too, unless ``scopes`` is an
        :class:`OnlyScopes`.
        """
        if scopes is None:
            return None
        visible = scopes if isinstance(scopes, OnlyScopes) else scopes | {EVERYONE}
        mask = np.isin(self.scopes, list(visible))
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
        clock: the seconds how long the snapshot was behind is measured in
            (``time.monotonic``); an attribute, so that a test can set its own.
    """

    def __init__(
        self,
        store: Store,
        *,
        embedding_model: str,
        dimensions: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.embedding_model = embedding_model
        self.dimensions = dimensions
        self.clock = clock
        self.dir = private_dir(store.data_dir / "index")
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        # Why the snapshot in memory is not on disk, or None when it is.
        self.degraded: str | None = None
        # When (by the clock) the snapshot was last known to reflect the store:
        # how long it may have been behind, for readiness.
        self._current_at: float | None = None
        # Why the last refresh failed, or None when it succeeded.
        self.refresh_error: str | None = None

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

    @property
    def snapshot_generation(self) -> int | None:
        """The generation of the snapshot in memory (``None`` before one is loaded); no SQL."""
        snap = self._snapshot
        return None if snap is None else snap.generation

    def open(self) -> Snapshot:
        """Load the persisted indexes, or rebuild them if they disagree with SQLite."""
        with self._lock:
            started = self.clock()
            snap = self._load_if_current()
            if snap is None:
                snap = self._rebuild_locked()
            self._swap(snap, started)
            return snap

    def refresh(self) -> Snapshot:
        """Bring the snapshot up to the store's generation (no-op when current).

        The current snapshot is updated with only the chunks that came and went
        (see ``_update_locked``); without one, or after a large change, both
        indexes are rebuilt. Another process's changes arrive this way too: the
        generation counter is in SQLite, so one ``SELECT`` tells whether anything moved.
        """
        with self._lock:
            started = self.clock()
            try:
                current = self._snapshot
                if current is not None and current.generation == self.store.generation:
                    self._current_at = started
                    return current
                snap = None if current is None else self._update_locked(current)
                if snap is None:
                    snap = self._rebuild_locked()
            except Exception as exc:
                self.refresh_error = str(exc) or type(exc).__name__
                raise
            self._swap(snap, started)
            return snap

    def rebuild(self) -> Snapshot:
        """Rebuild both indexes from SQLite, persist them and swap them in."""
        with self._lock:
            started = self.clock()
            snap = self._rebuild_locked()
            self._swap(snap, started)
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
            "degraded": self.degraded,
        }

    def sync_state(self) -> dict[str, object]:
        """What the last sync recorded, against the store's generation: cheap enough for a probe.

        Unlike :meth:`check`, reads no chunk ids: the snapshot is in sync when
        it reflects the store's current generation. ``lag`` counts the store's
        changes the snapshot does not have yet; ``behind_s`` is how long it may
        have been behind (0 when in sync, else the time since it was last known
        current); ``refresh_error`` says why the last refresh failed.
        """
        snap, current_at = self._snapshot, self._current_at
        generation = self.store.generation
        in_sync = snap is not None and snap.generation == generation
        behind: float | None = None
        if snap is not None and current_at is not None:
            behind = 0.0 if in_sync else round(self.clock() - current_at, 3)
        return {
            "generation": generation,
            "snapshot_generation": None if snap is None else snap.generation,
            "lag": None if snap is None else generation - snap.generation,
            "behind_s": behind,
            "chunks": 0 if snap is None else len(snap),
            "in_sync": in_sync,
            "degraded": self.degraded,
            "refresh_error": self.refresh_error,
        }

    def _swap(self, snap: Snapshot, started: float) -> None:
        # The snapshot reflects the store as read after `started`.
        self._snapshot = snap
        self._current_at = started
        self.refresh_error = None

    # ------------------------------------------------------------------ internals

    def _searchable_ids(self) -> np.ndarray:
        return self._searchable_versions()[0]

    def _searchable_versions(self) -> tuple[np.ndarray, np.ndarray]:
        return self.store.searchable_chunk_versions(self.embedding_model, self.dimensions)

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
        expected, versions, scopes, languages = self.store.searchable_chunk_facts(
            self.embedding_model, self.dimensions
        )
        ids = np.sort(vectors.ids())
        if not (
            np.array_equal(ids, expected)
            and np.array_equal(np.sort(np.asarray(bm25.chunk_ids)), expected)
        ):
            log.warning("derived indexes disagree with SQLite: rebuilding")
            return None
        return Snapshot(vectors, bm25, expected, scopes, generation, versions, languages)

    def _rebuild_locked(self) -> Snapshot:
        # Read the generation first: if a write lands while we read rows, the
        # snapshot is labelled older than it is and the next refresh redoes it.
        generation = self.store.generation
        rows = _Rows.read(
            self.store.searchable_chunks(self.embedding_model, self.dimensions), self.dimensions
        )
        vectors = VectorIndex(self.dimensions)
        if rows.ids.size:
            vectors.add(rows.ids, rows.vectors)
        bm25 = BM25Index(rows.ids, rows.texts, languages=rows.languages.tolist())
        snap = Snapshot(
            vectors, bm25, rows.ids, rows.scopes, generation, rows.versions, rows.languages
        )
        self._persist(snap)
        log.info("derived indexes rebuilt: %d chunks at generation %d", len(snap), generation)
        return snap

    def _update_locked(self, current: Snapshot) -> Snapshot | None:
        """``current`` with the chunks removed and added since it was built.

        Reads only the ids of the searchable chunks and the rows of the new
        ones, and builds the new indexes beside the current ones, which stay
        untouched for the queries still using them.

        Returns:
            The new snapshot (persisted), or ``None`` when a rebuild is due: the
            current snapshot's chunk versions are unknown, the change is large,
            or the store changed while it was being read.
        """
        if current.versions is None:
            return None
        generation = self.store.generation
        ids, versions = self._searchable_versions()
        removed, added = _diff(current.chunk_ids, current.versions, ids, versions)
        if removed.size + added.size > MAX_UPDATE_SHARE * len(current):
            return None
        if removed.size == added.size == 0:
            snap = replace(current, generation=generation)
            self._persist(snap)
            return snap
        wanted = self.store.searchable_chunks(self.embedding_model, self.dimensions, added.tolist())
        rows = _Rows.read(wanted, self.dimensions)
        # The rows are read after the ids: a write in between shows as a
        # missing row or another version, and then the rows cannot be trusted.
        if not (
            np.array_equal(rows.ids, added)
            and np.array_equal(rows.versions, versions[np.isin(ids, added)])
        ):
            log.info("store changed during an incremental refresh: rebuilding")
            return None
        snap = _apply(current, current.versions, removed, rows, generation)
        self._persist(snap)
        log.info(
            "derived indexes updated: -%d +%d chunks, %d at generation %d",
            removed.size,
            added.size,
            len(snap),
            generation,
        )
        return snap

    def _persist(self, snap: Snapshot) -> None:
        """Save ``snap`` to disk; when that fails, keep serving it from memory, degraded.

        The files are only a cache of SQLite: a full disk must not make a
        consistent snapshot unusable. The next successful save ends the
        degraded state; until then a restart rebuilds from SQLite.
        """
        try:
            snap.vectors.save(self.vectors_path, snap.generation)
            snap.bm25.save(self.bm25_path, snap.generation)
        except KBError as exc:
            if self.degraded is None:
                log.warning(
                    "search index files could not be saved; answering from memory until they "
                    "can be (free disk space in %s): %s",
                    self.dir,
                    exc,
                )
            self.degraded = f"The search index files could not be saved: {exc}"
            return
        if self.degraded is not None:
            log.info("search index files saved again; no longer degraded")
        self.degraded = None


@dataclass(frozen=True)
class _Rows:
    """Searchable chunk rows as aligned arrays (ids ascending when read so)."""

    ids: np.ndarray
    scopes: np.ndarray
    texts: list[str]
    languages: np.ndarray
    vectors: np.ndarray
    versions: np.ndarray

    @classmethod
    def read(cls, rows: Iterable[dict[str, Any]], dim: int) -> _Rows:
        ids: list[int] = []
        scopes: list[str] = []
        texts: list[str] = []
        languages: list[str | None] = []
        # One growing buffer: each row's blob is freed once copied, so reading
        # holds the vectors once (views of every blob, then a stacked copy,
        # held them twice: 300 MB at 100k chunks before FAISS's own copy).
        vectors = bytearray()
        versions: list[float] = []
        width = dim * np.dtype(np.float32).itemsize
        for row in rows:
            if len(row["vector"]) != width:
                # One wrong blob would shift every later vector in the buffer.
                raise IndexOutOfSync(
                    f"Chunk {row['id']} has a vector of {len(row['vector'])} bytes where "
                    f"{width} were expected; run `kb reindex` to embed it again."
                )
            ids.append(int(row["id"]))
            scopes.append(row["scope"])
            texts.append(row["text"])
            languages.append(row.get("language"))
            vectors += row["vector"]
            versions.append(float(row["version"]))
        return cls(
            ids=np.array(ids, dtype=np.int64),
            scopes=np.array(scopes, dtype=object),
            texts=texts,
            languages=np.array(languages, dtype=object),
            vectors=np.frombuffer(vectors, dtype=np.float32).reshape(len(ids), dim),
            versions=np.array(versions, dtype=np.float64),
        )


def _apply(
    current: Snapshot, versions: np.ndarray, removed: np.ndarray, rows: _Rows, generation: int
) -> Snapshot:
    """``current`` (whose chunk versions are ``versions``) without ``removed`` and with ``rows``.

    A new snapshot: ``current`` is left unchanged.
    """
    keep = ~np.isin(current.chunk_ids, removed)
    order = np.argsort(np.concatenate([current.chunk_ids[keep], rows.ids]), kind="stable")

    def merged(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        return np.concatenate([old[keep], new])[order]

    return Snapshot(
        vectors=current.vectors.updated(removed, rows.ids, rows.vectors),
        bm25=current.bm25.updated(removed, rows.ids, rows.texts, rows.languages.tolist()),
        chunk_ids=merged(current.chunk_ids, rows.ids),
        scopes=merged(current.scopes, rows.scopes),
        generation=generation,
        versions=merged(versions, rows.versions),
        languages=merged(_languages(current), rows.languages),
    )


def _languages(snap: Snapshot) -> np.ndarray:
    """``snap``'s chunk languages, ``None`` for each when they were not read."""
    if snap.languages is not None:
        return snap.languages
    return np.full(len(snap), None, dtype=object)


def _diff(
    old_ids: np.ndarray, old_versions: np.ndarray, ids: np.ndarray, versions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(removed, added)`` chunk ids between two sorted (id, version) sets.

    A chunk whose version changed is in both: its old content goes, the new comes.
    """
    same = np.zeros(ids.size, dtype=bool)
    at = np.searchsorted(old_ids, ids)
    if old_ids.size:
        at = np.minimum(at, old_ids.size - 1)
        same = (old_ids[at] == ids) & (old_versions[at] == versions)
    matched = np.zeros(old_ids.size, dtype=bool)
    matched[at[same]] = True
    return old_ids[~matched], ids[~same]
