"""Qdrant as the search engine: the ``SearchIndex`` contract over one Qdrant collection.

One collection per knowledge base and embedding model: its name holds the
knowledge base's id (kept in the store, so every replica sharing the store
finds the same collection), the model and its dimensions, so vectors of two
models never mix. Each point is one searchable chunk (point id = chunk id)
with two vectors and a payload:

* ``dense``: the chunk's embedding, cosine distance. The gate's distance is
  ``1 - cosine``, for BM25-only hits too (their vectors are fetched by id).
* ``bm25``: a sparse vector over the product's own terms (``index.search.tokens``),
  with the engine's IDF modifier. Qdrant multiplies the stored value by
  ``log(1 + (N - n + 0.5) / (n + 0.5))`` (the IDF ``index.search.bm25`` uses), so the
  stored value is Okapi's term-frequency saturation with length normalisation,
  ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))``, k1 = 1.2, b = 0.75.
  ``avgdl`` is the one the values were written with (in the sync marker): the
  values are written again when the real average drifts more than
  ``AVGDL_TOLERANCE`` from it, so BM25 scores are the local engine's within
  that drift. Terms become indices by a 32-bit hash (Qdrant's indices are
  u32): two terms that collide count as one.
* payload ``chunk_id``, ``document_id``, ``scope`` (indexed on a server),
  ``version`` and ``length`` (what sync needs).

Each leg is its own query with the scope filter inside it, and the two lists
are fused here with the product's ``FUSION``, the function the local engine
uses, so rankings are the local engine's (``tests/test_qdrant_engine.py``).

Sync follows the store's generation and chunk versions: the chunks that came
or changed are upserted, the ones gone are deleted (both idempotent), then the
marker (the generation, in the collection's metadata) is written. A crash
before the marker leaves the old generation there, and the next sync diffs
the store against what the collection really holds, so it resumes.
``rebuild`` fills a new collection and moves the alias to it at the end,
then drops the other builds. Only one process sharing the store rebuilds at a
time (a lock of the store's: a file beside SQLite, an advisory lock on
Postgres); another that wants to rebuild meanwhile waits, then syncs to the
collection the first one built. The knowledge base's id is set once, by the
first process to write it, so replicas starting together share one collection.

Where the engine runs (``QDRANT_URL``): a server URL; empty, an embedded
engine (qdrant-client's local mode) in ``<data dir>/qdrant``, for tests and
small setups, one process at a time; ``:memory:`` for tests.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from index.errors import KBError
from index.models import EVERYONE
from index.search.bm25 import DEFAULT_B, DEFAULT_K1
from index.search.contract import Candidate, Mode
from index.search.derived import OnlyScopes
from index.search.fusion import (
    DEFAULT_DEPTH,
    FEEDBACK,
    FUSION,
    Feedback,
    Fusion,
    by_language,
    fused_candidates,
)
from index.search.qdrant.engine import (
    QdrantEngine,
    QdrantPoint,
    SearchEngineUnavailable,
    public_location,
)
from index.search.qdrant.engines import open_engine, release_embedded
from index.search.qdrant.sparse import bm25_values, query_sparse
from index.search.query_map import QueryAdapters
from index.search.tokens import ANALYZER, query_languages, question_language
from index.storage import Store

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)

# Stored BM25 values are written again when the chunks' average length moves
# more than this from the one they were written with (2 % moves a score by
# at most ~1.5 %; writing every value at every upload costs a full pass).
AVGDL_TOLERANCE = 0.02
# Points per upsert request.
BATCH = 256
# Bump when what a point holds changes: a collection of another format is rebuilt.
FORMAT_VERSION = 1
# How long a rebuild waits for another process's rebuild of the same collection
# (replicas starting together, `kb reindex` beside a replica), and how often it looks.
REBUILD_WAIT_SECONDS = 900.0
REBUILD_POLL_SECONDS = 0.5
# Health asks the engine whether it answers (within ``engines.PROBE_TIMEOUT_SECONDS``
# on a server) at most once per PROBE_CACHE_SECONDS (/readyz is probed often).
PROBE_CACHE_SECONDS = 5.0
# How much deeper the sparse leg looks when the question's language is clear, to
# find the hits in the knowledge base's other languages (see ``_sparse``).
FOREIGN_DEPTH = 4
# The meta key of the knowledge base's id in the store.
KB_ID_KEY = "search_collection_id"

T = TypeVar("T")
P = ParamSpec("P")


def collection_name(kb_id: str, embedding_model: str, dimensions: int) -> str:
    """The collection of a knowledge base and model: ``kb-<id>-<model>-<dims>``."""
    model = "".join(c if c.isalnum() else "-" for c in embedding_model.lower()).strip("-")
    return f"kb-{kb_id}-{model[:48]}-{dimensions}"


@dataclass
class _Contents:
    """What the collection holds: chunk id -> (version, length)."""

    versions: dict[int, float]
    lengths: dict[int, int]

    @property
    def avgdl(self) -> float:
        total = sum(self.lengths.values())
        return total / len(self.lengths) if total else 1.0


def _engine_call(
    fn: Callable[Concatenate[QdrantSearchIndex, P], T],
) -> Callable[Concatenate[QdrantSearchIndex, P], T]:
    """The one place the engine's failures (HTTP, gRPC, local mode) become ``SearchEngineUnavailable``."""

    @functools.wraps(fn)
    def call(self: QdrantSearchIndex, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(self, *args, **kwargs)
        except KBError:
            raise
        except Exception as exc:
            raise SearchEngineUnavailable(
                f"The Qdrant engine at {public_location(self.url)} failed: {self._scrubbed(exc)}. "
                "Check that it runs and QDRANT_URL / QDRANT_API_KEY are right; the knowledge "
                "base itself is intact (`kb reindex` rebuilds the collection from it)."
            ) from exc

    return call


class QdrantSearchIndex:
    """The ``SearchIndex`` contract on Qdrant (see the module docstring).

    Args:
        store: the source of truth.
        embedding_model: stamp of the running model; only its chunks are indexed.
        dimensions: its vector size.
        url: ``QDRANT_URL`` (empty: embedded in the data dir; ``edge``; ``:memory:``).
        api_key: ``QDRANT_API_KEY`` for a server; never logged.
        depth: how many candidates each leg contributes before fusion.
        fusion: how the two legs are fused.
        engine: an engine already open (``bench/``); ``url`` names it otherwise.
        adapters: the knowledge base's query map, applied to the hybrid fusion's dense leg.
        feedback: how the hybrid fusion's dense leg is searched again from its
            first passages (``None``: once).
    """

    def __init__(
        self,
        store: Store,
        *,
        embedding_model: str,
        dimensions: int,
        url: str = "",
        api_key: str = "",
        depth: int = DEFAULT_DEPTH,
        fusion: Fusion = FUSION,
        engine: QdrantEngine | None = None,
        adapters: QueryAdapters | None = None,
        feedback: Feedback | None = FEEDBACK,
    ) -> None:
        self.store = store
        self.adapters = adapters
        self.feedback = feedback
        self.embedding_model = embedding_model
        self.dimensions = dimensions
        self.url = url
        self._api_key = api_key
        self.depth = depth
        self.fusion = fusion
        self._lock = threading.Lock()
        self._engine = engine
        self._alias: str | None = None
        self._generation: int | None = None
        self._contents: _Contents | None = None
        # The build ``_contents`` describes (the alias moves to a new one on a rebuild).
        self._contents_build: str | None = None
        self._current_at: float | None = None
        self.refresh_error: str | None = None
        # (when, answered, why not) of the last time health asked the engine.
        self._probe: tuple[float, bool, str | None] | None = None

    def __repr__(self) -> str:
        return f"QdrantSearchIndex({public_location(self.url)!r}, {self._alias!r})"

    @property
    def engine(self) -> QdrantEngine:
        """The engine, opened on first use."""
        if self._engine is None:
            self._engine = open_engine(self.url, self._api_key, self.store.data_dir)
        return self._engine

    @property
    def alias(self) -> str:
        """The name queries read: this knowledge base's and model's collection alias."""
        if self._alias is None:
            kb_id = self.store.get_meta(KB_ID_KEY)
            if kb_id is None:
                # Replicas starting together on a new store: the first id written wins.
                kb_id = self.store.setdefault_meta(KB_ID_KEY, uuid.uuid4().hex[:12])
            self._alias = collection_name(kb_id, self.embedding_model, self.dimensions)
        return self._alias

    def _scrubbed(self, exc: Exception) -> str:
        """``exc`` in a sentence without the API key or the URL's credentials."""
        # Redacted before it is cut: a key crossing the cut would leave its start.
        text = str(exc)
        if self._api_key:
            text = text.replace(self._api_key, "***")
        if self.url:
            text = text.replace(self.url, public_location(self.url))
        return f"{type(exc).__name__}: {text[:300]}"

    # ------------------------------------------------------------ maintenance

    def open(self) -> int:
        """See ``SearchIndex.open``: the collection is built when missing, then synced."""
        return self.sync()

    def sync(self) -> int:
        """See ``SearchIndex.sync``."""
        return self._maintain(self._sync_locked)

    def rebuild(self) -> int:
        """See ``SearchIndex.rebuild``: a new collection is filled, then the alias moves to it."""
        return self._maintain(self._rebuild_locked)

    def _maintain(self, step: Callable[[], int]) -> int:
        with self._lock:
            started = time.monotonic()
            try:
                generation = step()
            except Exception as exc:
                self.refresh_error = str(exc)[:300] or type(exc).__name__
                raise
            self._current_at, self.refresh_error = started, None
            return generation

    @property
    def generation(self) -> int | None:
        """See ``SearchIndex.generation``."""
        return self._generation

    def health(self) -> dict[str, object]:
        """See ``SearchIndex.health``: what the last sync recorded, against the store, and
        whether the engine answers.

        An engine that does not answer cannot search: the index is then neither
        in sync nor a known time behind (``behind_s`` ``None``), so ``/readyz``
        reports it not ready; ``engine_error`` says why.
        """
        generation = self.store.generation
        reachable, engine_error = self._answers()
        mine, current_at = self._generation, self._current_at
        in_sync = reachable and mine is not None and mine == generation
        behind: float | None = None
        if reachable and mine is not None and current_at is not None:
            behind = 0.0 if in_sync else round(time.monotonic() - current_at, 3)
        return {
            "engine": "qdrant",
            "location": public_location(self.url),
            "collection": self._alias,
            "generation": generation,
            "snapshot_generation": mine,
            "lag": None if mine is None else generation - mine,
            "behind_s": behind,
            "chunks": 0 if self._contents is None else len(self._contents.versions),
            "in_sync": in_sync,
            "degraded": None,
            "refresh_error": self.refresh_error,
            "reachable": reachable,
            "engine_error": engine_error,
        }

    def _answers(self) -> tuple[bool, str | None]:
        """Whether the engine answers, and why not: asked at most every ``PROBE_CACHE_SECONDS``."""
        now, last = time.monotonic(), self._probe
        if last is not None and now - last[0] < PROBE_CACHE_SECONDS:
            return last[1], last[2]
        try:
            self.engine.ping()
        except Exception as exc:
            error = (
                f"The Qdrant engine at {public_location(self.url)} does not answer: "
                f"{self._scrubbed(exc)}."
            )
            if last is None or last[1]:
                log.warning("%s", error)
            self._probe = (now, False, error)
        else:
            if last is not None and not last[1]:
                log.info("the Qdrant engine at %s answers again", public_location(self.url))
            self._probe = (now, True, None)
        return self._probe[1], self._probe[2]

    @_engine_call
    def check(self) -> dict[str, object]:
        """See ``SearchIndex.check``: the collection's points against the store's chunks."""
        with self._lock:
            expected, versions = self._store_versions()
            target = self._target()
            held = self._scan(target)
            marker = self.engine.marker(target)
        wanted = dict(zip(expected.tolist(), versions.tolist(), strict=True))
        return {
            "engine": "qdrant",
            "location": public_location(self.url),
            "collection": self.alias,
            "generation": self.store.generation,
            "snapshot_generation": marker.get("generation"),
            "points": len(held.versions),
            "searchable_chunks": int(expected.size),
            "in_sync": bool(
                marker.get("generation") == self.store.generation and held.versions == wanted
            ),
            "degraded": None,
        }

    @_engine_call
    def drop_collections(self) -> None:
        """Delete this knowledge base's collections of the model from the engine: the alias
        and every build. For a throw-away knowledge base (``kb eval``), never the product's."""
        with self._lock:
            engine, alias = self.engine, self.alias
            engine.delete_alias(alias)
            builds = engine.builds(alias)
            for name in builds:
                engine.drop(name)
            self._generation = self._contents = self._current_at = None
            self._contents_build = None
        log.info("qdrant collections of %s dropped: %s", alias, builds)

    def close(self) -> None:
        """Close an embedded engine this index opened (its folder is free again).

        Only when nothing else in this process searches the same data dir: the
        knowledge bases of one data dir share its embedded engine.
        """
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            release_embedded(engine)

    # ------------------------------------------------------------------ queries

    @_engine_call
    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
        cutoff: float | None = None,
    ) -> list[Candidate]:
        """See ``SearchIndex.search``; ``cutoff`` is not applied.

        The dense leg may be approximate (HNSW), so a chunk only BM25 finds can
        be closer than the dense leg's first: both legs always run.
        """
        visible = _visible(scopes)
        depth = max(k, self.depth)
        dense: list[tuple[int, float]] = []
        sparse: list[tuple[int, float]] = []
        foreign: list[tuple[int, float]] = []
        if mode != Mode.BM25:
            dense = self._dense(query_vector, visible, depth)
        if mode != Mode.DENSE:
            sparse, foreign = self._sparse(query_text, visible, depth)
        return fused_candidates(
            dense,
            sparse,
            self.fusion,
            k,
            mode,
            adapters=self.adapters,
            query_vector=query_vector,
            distances_for=self.distances_for,
            foreign=foreign,
            feedback=self.feedback,
            nearest=lambda vector, n: self._dense(vector, visible, n),
            vectors_of=self._vectors_of,
        )

    def _dense(
        self, vector: np.ndarray, visible: list[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """The dense leg: the ``limit`` nearest points ``visible`` may see, ``(id, distance)``."""
        hits = self.engine.dense(self.alias, _floats(vector), visible, limit)
        return _ranked([(cid, _distance(cos)) for cid, cos in hits], ascending=True)

    def _vectors_of(self, chunk_ids: list[int]) -> dict[int, np.ndarray]:
        """The stored vectors of the points among ``chunk_ids``."""
        found = self.engine.vectors(self.alias, [int(c) for c in chunk_ids])
        return {cid: np.asarray(v, dtype=np.float32) for cid, v in found.items()}

    def _sparse(
        self, query_text: str, visible: list[str] | None, depth: int
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """BM25's hits in the question's language, and in the others (``by_language``).

        The points carry no language, so both lists are cut from the first
        ``FOREIGN_DEPTH`` times ``depth`` hits (the local engine searches each
        among its own passages: the lists differ only when one language's hits
        fill all of those places).
        """
        corpus = self.store.chunk_languages()
        indices, values = query_sparse(query_text, query_languages(query_text, corpus))
        if not indices:
            return [], []
        question = question_language(query_text, corpus)
        wide = depth if question is None or not corpus - {question} else FOREIGN_DEPTH * depth
        hits = self.engine.sparse(self.alias, indices, values, visible, wide)
        found = _ranked([(cid, score) for cid, score in hits if score > 0])
        own, other = by_language(found, question, self.store.languages_of_chunks)
        return own[:depth], other[:depth]

    @_engine_call
    def distances_for(self, query_vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        """See ``SearchIndex.distances_for``: the vectors are fetched by id."""
        if not chunk_ids:
            return {}
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        found = self._vectors_of(list(chunk_ids))
        return {cid: _distance(float(vector @ query)) for cid, vector in found.items()}

    # ------------------------------------------------------------------ internals

    @_engine_call
    def _sync_locked(self) -> int:
        target = self._target()
        marker = self.engine.marker(target)
        if not _marker_fits(marker):
            return self._rebuild_locked()
        return self._sync_fitting(marker, target)

    def _target(self) -> str:
        """The build the alias names now.

        A sync reads and writes that build, never through the alias: another
        process's rebuild may move the alias meanwhile, and this sync's marker
        must not land on a build that never got its changes (that build keeps
        its own older marker, so the next sync rescans it and catches up).
        """
        return self.engine.alias_target(self.alias) or self.alias

    def _sync_fitting(self, marker: dict[str, Any], target: str) -> int:
        generation = self.store.generation
        known = self._contents is not None and self._contents_build == target
        if marker.get("generation") == generation and known:
            self._generation = generation
            return generation
        if not known or self._contents is None or marker.get("generation") != self._generation:
            # Another process (or a crash, or a rebuild) may have changed the collection.
            self._contents, self._contents_build = self._scan(target), target
        contents = self._contents
        avgdl = float(marker.get("avgdl") or 1.0)
        ids, versions = self._store_versions()
        wanted = dict(zip(ids.tolist(), versions.tolist(), strict=True))
        removed = [cid for cid, v in contents.versions.items() if wanted.get(cid) != v]
        added = [cid for cid, v in wanted.items() if contents.versions.get(cid) != v]
        self._delete(target, removed, contents)
        if added:
            self._upsert(target, self._rows(added), avgdl, contents)
        if contents.versions and abs(contents.avgdl - avgdl) > AVGDL_TOLERANCE * avgdl:
            # Re-weight every chunk against the current average length.
            avgdl = contents.avgdl
            self._upsert(target, self._rows(None), avgdl, _Contents({}, {}))
        self.engine.set_marker(target, _marker(generation, avgdl))
        self._generation = generation
        if removed or added:
            log.info(
                "qdrant collection %s synced: -%d +%d chunks, %d at generation %d",
                self.alias,
                len(removed),
                len(added),
                len(contents.versions),
                generation,
            )
        return generation

    @_engine_call
    def _rebuild_locked(self) -> int:
        """One process at a time among those sharing the store: a rebuild drops every other
        build of the alias, so two at once would drop each other's. One that finds another's
        under way waits for it to end, then syncs to what it built."""
        deadline = time.monotonic() + REBUILD_WAIT_SECONDS
        waited = False
        while True:
            with self.store.exclusive(f"qdrant-rebuild-{self.alias}") as acquired:
                if acquired:
                    target = self._target()
                    marker = self.engine.marker(target) if waited else {}
                    if _marker_fits(marker):
                        return self._sync_fitting(marker, target)
                    return self._build()
            if time.monotonic() >= deadline:
                raise SearchEngineUnavailable(
                    f"Another process has been rebuilding the Qdrant collection {self.alias} "
                    f"for more than {REBUILD_WAIT_SECONDS:.0f} s; let it finish (or stop it), "
                    "then run `kb reindex`."
                )
            waited = True
            time.sleep(REBUILD_POLL_SECONDS)

    def _build(self) -> int:
        engine, alias = self.engine, self.alias
        # Read the generation first: a write landing while the rows are read
        # makes the collection newer than its marker, and the next sync redoes it.
        generation = self.store.generation
        build = f"{alias}-{uuid.uuid4().hex[:8]}"
        engine.create(build, self.dimensions)
        rows = list(self._rows(None))
        lengths = [len(ANALYZER.document_terms(r["text"], r.get("language"))) for r in rows]
        avgdl = sum(lengths) / len(lengths) if sum(lengths) else 1.0
        contents = _Contents({}, {})
        self._upsert(build, rows, avgdl, contents)
        engine.set_marker(build, _marker(generation, avgdl))
        engine.move_alias(alias, build)
        for name in engine.builds(alias):
            if name != build:
                engine.drop(name)
        self._generation, self._contents, self._contents_build = generation, contents, build
        log.info("qdrant collection %s built: %d chunks", build, len(contents.versions))
        return generation

    def _store_versions(self) -> tuple[np.ndarray, np.ndarray]:
        return self.store.searchable_chunk_versions(self.embedding_model, self.dimensions)

    def _rows(self, ids: Sequence[int] | None) -> Iterator[dict[str, Any]]:
        rows = self.store.searchable_chunks(self.embedding_model, self.dimensions, ids)
        for batch in _batched(rows, BATCH):
            owners = self.store.chunks_by_id([int(r["id"]) for r in batch])
            for row in batch:
                owner = owners.get(int(row["id"]))
                row["document_id"] = None if owner is None else owner.document_id
                yield row

    def _upsert(
        self, name: str, rows: Iterable[dict[str, Any]], avgdl: float, contents: _Contents
    ) -> None:
        for batch in _batched(rows, BATCH):
            points = [_point(row, avgdl) for row in batch]
            self.engine.upsert(name, points)
            for p in points:
                contents.versions[p.id] = float(p.payload["version"])
                contents.lengths[p.id] = p.payload["length"]

    def _delete(self, name: str, ids: list[int], contents: _Contents) -> None:
        for at in range(0, len(ids), BATCH):
            batch = ids[at : at + BATCH]
            self.engine.delete(name, batch)
            for cid in batch:
                contents.versions.pop(cid, None)
                contents.lengths.pop(cid, None)

    def _scan(self, name: str) -> _Contents:
        contents = _Contents({}, {})
        for cid, payload in self.engine.scan(name):
            contents.versions[cid] = float(payload.get("version", -1.0))
            contents.lengths[cid] = int(payload.get("length", 0))
        return contents


def _marker(generation: int, avgdl: float) -> dict[str, Any]:
    return {
        "generation": generation,
        "avgdl": avgdl,
        "format": FORMAT_VERSION,
        "tokenizer": ANALYZER.signature,
        "k1": DEFAULT_K1,
        "b": DEFAULT_B,
    }


def _marker_fits(marker: dict[str, Any]) -> bool:
    """Whether the collection can be synced: built to the end, in this format and analysis.

    No marker: a collection never built (or whose build was interrupted).
    """
    return bool(
        "generation" in marker
        and marker.get("format") == FORMAT_VERSION
        and marker.get("tokenizer") == ANALYZER.signature
        and marker.get("k1") == DEFAULT_K1
        and marker.get("b") == DEFAULT_B
    )


def _point(row: dict[str, Any], avgdl: float) -> QdrantPoint:
    terms = ANALYZER.document_terms(row["text"], row.get("language"))
    indices, values = bm25_values(terms, avgdl)
    cid = int(row["id"])
    return QdrantPoint(
        id=cid,
        dense=_floats(np.frombuffer(row["vector"], dtype=np.float32)),
        indices=indices,
        values=values,
        payload={
            "chunk_id": cid,
            "document_id": row["document_id"],
            "scope": row["scope"],
            # As text: a float's JSON round trip through the engine may move its last
            # bit (Edge's parser does), and sync compares versions exactly.
            "version": repr(float(row["version"])),
            "length": len(terms),
        },
    )


def _visible(scopes: frozenset[str] | None) -> list[str] | None:
    if scopes is None:
        return None
    return sorted(scopes if isinstance(scopes, OnlyScopes) else scopes | {EVERYONE})


def _distance(similarity: float) -> float:
    """Cosine distance ``1 - cos`` clamped to [0, 2], as the local engine reports it."""
    return float(min(2.0, max(0.0, 1.0 - similarity)))


def _ranked(pairs: list[tuple[int, float]], *, ascending: bool = False) -> list[tuple[int, float]]:
    """Best first, ties to the lower chunk id (the local engine's order)."""
    sign = 1.0 if ascending else -1.0
    return sorted(pairs, key=lambda p: (sign * p[1], p[0]))


def _floats(vector: np.ndarray) -> list[float]:
    return [float(x) for x in np.asarray(vector, dtype=np.float32).reshape(-1)]


def _batched(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
