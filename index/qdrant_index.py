"""Qdrant as the search engine: the ``SearchIndex`` contract over one Qdrant collection.

One collection per knowledge base and embedding model: its name holds the
knowledge base's id (kept in the store, so every replica sharing the store
finds the same collection), the model and its dimensions, so vectors of two
models never mix. Each point is one searchable chunk (point id = chunk id)
with two vectors and a payload:

* ``dense``: the chunk's embedding, cosine distance. The gate's distance is
  ``1 - cosine``, for BM25-only hits too (their vectors are fetched by id).
* ``bm25``: a sparse vector over the product's own terms (``index.tokens``),
  with the engine's IDF modifier. Qdrant multiplies the stored value by
  ``log(1 + (N - n + 0.5) / (n + 0.5))`` (the IDF ``index.bm25`` uses), so the
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
``rebuild`` fills a new collection and moves the alias to it at the end.

Where the engine runs (``QDRANT_URL``): a server URL; empty, an embedded
engine (qdrant-client's local mode) in ``<data dir>/qdrant``, for tests and
small setups, one process at a time; ``:memory:`` for tests.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

import numpy as np

from index.bm25 import DEFAULT_B, DEFAULT_K1
from index.derived import OnlyScopes
from index.errors import KBError
from index.search_index import DEFAULT_DEPTH, FUSION, Candidate, Fusion, Mode, fuse
from index.store import EVERYONE, Store
from index.tokens import ANALYZER

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

log = logging.getLogger(__name__)

DENSE = "dense"
SPARSE = "bm25"
# Stored BM25 values are written again when the chunks' average length moves
# more than this from the one they were written with (2 % moves a score by
# at most ~1.5 %; writing every value at every upload costs a full pass).
AVGDL_TOLERANCE = 0.02
# Points per upsert request.
BATCH = 256
# Bump when what a point holds changes: a collection of another format is rebuilt.
FORMAT_VERSION = 1
# The meta key of the knowledge base's id in the store.
KB_ID_KEY = "search_collection_id"
INSTALL_HINT = "pip install -e '.[scale]'"


class SearchEngineUnavailable(KBError):
    """The search engine cannot be loaded, reached or opened; the message says what to do."""


def term_index(term: str) -> int:
    """A term's sparse-vector index: the first 32 bits of its BLAKE2b hash."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "big")


def query_sparse(text: str) -> tuple[list[int], list[float]]:
    """A question's sparse vector: each term's count (rank-bm25 counts a repeated term each time)."""
    counts = Counter(term_index(t) for t in ANALYZER.query_terms(text))
    return list(counts), [float(c) for c in counts.values()]


def bm25_values(
    terms: Sequence[str], avgdl: float, *, k1: float = DEFAULT_K1, b: float = DEFAULT_B
) -> tuple[list[int], list[float]]:
    """A chunk's sparse vector: Okapi's saturated, length-normalised term frequencies."""
    counts = Counter(term_index(t) for t in terms)
    norm = k1 * (1.0 - b + b * len(terms) / avgdl)
    return list(counts), [tf * (k1 + 1.0) / (tf + norm) for tf in counts.values()]


def collection_name(kb_id: str, embedding_model: str, dimensions: int) -> str:
    """The collection of a knowledge base and model: ``kb-<id>-<model>-<dims>``."""
    model = "".join(c if c.isalnum() else "-" for c in embedding_model.lower()).strip("-")
    return f"kb-{kb_id}-{model[:48]}-{dimensions}"


def public_location(url: str) -> str:
    """Where the engine is, without credentials a URL may carry."""
    if not url or url == ":memory:":
        return url or "embedded"
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"


@dataclass(frozen=True)
class _Point:
    id: int
    dense: np.ndarray
    indices: list[int]
    values: list[float]
    payload: dict[str, Any]


@dataclass
class _Contents:
    """What the collection holds: chunk id -> (version, length)."""

    versions: dict[int, float]
    lengths: dict[int, int]

    @property
    def avgdl(self) -> float:
        total = sum(self.lengths.values())
        return total / len(self.lengths) if total else 1.0


# The embedded engines of this process by folder: qdrant-client's local mode
# locks its folder, so every knowledge base opened on one data dir shares one.
_EMBEDDED: dict[str, QdrantClient] = {}
_EMBEDDED_LOCK = threading.Lock()
T = TypeVar("T")
P = ParamSpec("P")


@atexit.register
def _close_embedded() -> None:
    # Closed here, not left to the client's __del__, which fails at interpreter exit.
    with _EMBEDDED_LOCK:
        for client in _EMBEDDED.values():
            client.close()
        _EMBEDDED.clear()


def _client(url: str, api_key: str, data_dir: Path) -> QdrantClient:
    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise SearchEngineUnavailable(
            f"KB_SEARCH_ENGINE=qdrant needs the qdrant-client package: {INSTALL_HINT}."
        ) from exc
    where = public_location(url) if url else str(data_dir / "qdrant")
    try:
        if url == ":memory:":
            return QdrantClient(location=":memory:")
        if url:
            # No version probe at construction: the first real call reports an
            # unreachable server, as SearchEngineUnavailable.
            return QdrantClient(
                url=url, api_key=api_key or None, timeout=30, check_compatibility=False
            )
        folder = str((data_dir / "qdrant").resolve())
        with _EMBEDDED_LOCK:
            if folder not in _EMBEDDED:
                _EMBEDDED[folder] = QdrantClient(path=folder)
            return _EMBEDDED[folder]
    except Exception as exc:  # its message names the folder or host, never the key
        raise SearchEngineUnavailable(
            f"The Qdrant engine at {where} cannot be opened "
            f"({type(exc).__name__}: {str(exc)[:200]}). An embedded engine (QDRANT_URL empty) "
            "serves one process at a time: stop the other one, or run a Qdrant server and set "
            "QDRANT_URL."
        ) from exc


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
        url: ``QDRANT_URL`` (empty: embedded in the data dir; ``:memory:``).
        api_key: ``QDRANT_API_KEY`` for a server; never logged.
        depth: how many candidates each leg contributes before fusion.
        fusion: how the two legs are fused.
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
    ) -> None:
        self.store = store
        self.embedding_model = embedding_model
        self.dimensions = dimensions
        self.url = url
        self._api_key = api_key
        self.depth = depth
        self.fusion = fusion
        self._lock = threading.Lock()
        self._db: QdrantClient | None = None
        self._name: str | None = None
        self._generation: int | None = None
        self._contents: _Contents | None = None
        self._avgdl = 1.0
        self._current_at: float | None = None
        self.refresh_error: str | None = None

    def _scrubbed(self, exc: Exception) -> str:
        """``exc`` in a sentence without the API key or the URL's credentials."""
        text = f"{type(exc).__name__}: {str(exc)[:300]}"
        for secret in (self._api_key, self.url):
            if secret:
                text = text.replace(
                    secret, public_location(secret) if secret == self.url else "***"
                )
        return text

    def __repr__(self) -> str:
        return f"QdrantSearchIndex({public_location(self.url)!r}, {self._name!r})"

    # ------------------------------------------------------------ maintenance

    def open(self) -> int:
        """See ``SearchIndex.open``: the collection is created when missing, then synced."""
        return self.sync()

    def sync(self) -> int:
        """See ``SearchIndex.sync``."""
        with self._lock:
            started = time.monotonic()
            try:
                generation = self._sync_locked()
            except Exception as exc:
                self.refresh_error = str(exc)[:300] or type(exc).__name__
                raise
            self._current_at, self.refresh_error = started, None
            return generation

    def rebuild(self) -> int:
        """See ``SearchIndex.rebuild``: a new collection is filled, then the alias moves to it."""
        with self._lock:
            started = time.monotonic()
            generation = self._rebuild_locked()
            self._current_at, self.refresh_error = started, None
            return generation

    @property
    def generation(self) -> int | None:
        """See ``SearchIndex.generation``."""
        return self._generation

    def health(self) -> dict[str, object]:
        """See ``SearchIndex.health``: what the last sync recorded, against the store."""
        generation = self.store.generation
        mine, current_at = self._generation, self._current_at
        in_sync = mine is not None and mine == generation
        behind: float | None = None
        if mine is not None and current_at is not None:
            behind = 0.0 if in_sync else round(time.monotonic() - current_at, 3)
        return {
            "engine": "qdrant",
            "location": public_location(self.url),
            "collection": self._name,
            "generation": generation,
            "snapshot_generation": mine,
            "lag": None if mine is None else generation - mine,
            "behind_s": behind,
            "chunks": 0 if self._contents is None else len(self._contents.versions),
            "in_sync": in_sync,
            "degraded": None,
            "refresh_error": self.refresh_error,
        }

    @_engine_call
    def check(self) -> dict[str, object]:
        """See ``SearchIndex.check``: the collection's points against the store's chunks."""
        with self._lock:
            _, alias = self._connect()
            expected, versions = self._store_versions()
            held = self._scan(alias)
            marker = self._marker(alias)
        wanted = dict(zip(expected.tolist(), versions.tolist(), strict=True))
        return {
            "engine": "qdrant",
            "location": public_location(self.url),
            "collection": alias,
            "generation": self.store.generation,
            "snapshot_generation": marker.get("generation"),
            "points": len(held.versions),
            "searchable_chunks": int(expected.size),
            "in_sync": bool(
                marker.get("generation") == self.store.generation and held.versions == wanted
            ),
            "degraded": None,
        }

    # ------------------------------------------------------------------ queries

    @_engine_call
    def search(
        self,
        query_vector: np.ndarray,
        query_text: str,
        scopes: frozenset[str] | None,
        k: int,
        mode: Mode = Mode.HYBRID,
    ) -> list[Candidate]:
        """See ``SearchIndex.search``."""
        db, alias = self._connect()
        where = _scope_filter(scopes)
        depth = max(k, self.depth)
        dense: list[tuple[int, float]] = []
        sparse: list[tuple[int, float]] = []
        if mode != Mode.BM25:
            hits = db.query_points(
                alias,
                query=_floats(query_vector),
                using=DENSE,
                query_filter=where,
                limit=depth,
                with_payload=False,
            ).points
            dense = _ranked([(int(p.id), _distance(p.score)) for p in hits], ascending=True)
        if mode != Mode.DENSE:
            sparse = self._bm25(db, alias, query_text, where, depth)
        fused = fuse(dense, sparse, self.fusion)[:k]
        distances = dict(dense)
        missing = [cid for cid, _ in fused if cid not in distances]
        if missing:
            distances.update(self.distances_for(query_vector, missing))
        dense_rank = {cid: i for i, (cid, _) in enumerate(dense, start=1)}
        sparse_rank = {cid: i for i, (cid, _) in enumerate(sparse, start=1)}
        return [
            Candidate(cid, distances[cid], score, dense_rank.get(cid), sparse_rank.get(cid))
            for cid, score in fused
        ]

    @_engine_call
    def distances_for(self, query_vector: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        """See ``SearchIndex.distances_for``: the vectors are fetched by id."""
        if not chunk_ids:
            return {}
        db, alias = self._connect()
        records = db.retrieve(
            alias, [int(c) for c in chunk_ids], with_payload=False, with_vectors=[DENSE]
        )
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        out: dict[int, float] = {}
        for record in records:
            vector = record.vector[DENSE] if isinstance(record.vector, dict) else None
            if vector is not None:
                ip = float(np.asarray(vector, dtype=np.float32) @ query)
                out[int(record.id)] = _distance(ip)
        return out

    def _bm25(
        self, db: QdrantClient, alias: str, text: str, where: Any, depth: int
    ) -> list[tuple[int, float]]:
        from qdrant_client import models

        indices, values = query_sparse(text)
        if not indices:
            return []
        query = models.SparseVector(indices=indices, values=values)
        hits = db.query_points(
            alias, query=query, using=SPARSE, query_filter=where, limit=depth, with_payload=False
        )
        return _ranked([(int(p.id), float(p.score)) for p in hits.points if p.score > 0])

    # ------------------------------------------------------------------ internals

    def _connect(self) -> tuple[QdrantClient, str]:
        if self._db is None or self._name is None:
            db = _client(self.url, self._api_key, self.store.data_dir)
            name = collection_name(self._kb_id(), self.embedding_model, self.dimensions)
            self._db, self._name = db, name
        return self._db, self._name

    def _kb_id(self) -> str:
        kb_id = self.store.get_meta(KB_ID_KEY)
        if kb_id is None:
            kb_id = uuid.uuid4().hex[:12]
            self.store.set_meta(KB_ID_KEY, kb_id)
        return kb_id

    @_engine_call
    def _sync_locked(self) -> int:
        db, alias = self._connect()
        marker = self._marker(alias) if db.collection_exists(alias) else {}
        if not _marker_fits(marker):
            return self._rebuild_locked()
        generation = self.store.generation
        if marker.get("generation") == generation and self._contents is not None:
            self._generation = generation
            return generation
        if self._contents is None or marker.get("generation") != self._generation:
            # Another process (or a crash) may have changed the collection.
            self._contents = self._scan(alias)
        contents = self._contents
        avgdl = float(marker.get("avgdl") or 1.0)
        ids, versions = self._store_versions()
        wanted = dict(zip(ids.tolist(), versions.tolist(), strict=True))
        removed = [cid for cid, v in contents.versions.items() if wanted.get(cid) != v]
        added = [cid for cid, v in wanted.items() if contents.versions.get(cid) != v]
        if removed:
            self._delete(alias, removed, contents)
        if added:
            self._upsert(alias, self._rows(added), avgdl, contents)
        if contents.versions and abs(contents.avgdl - avgdl) > AVGDL_TOLERANCE * avgdl:
            # Re-weight every chunk against the current average length.
            avgdl = contents.avgdl
            self._upsert(alias, self._rows(None), avgdl, _Contents({}, {}))
        self._write_marker(alias, generation, avgdl)
        self._generation, self._avgdl = generation, avgdl
        if removed or added:
            log.info(
                "qdrant collection %s synced: -%d +%d chunks, %d at generation %d",
                alias,
                len(removed),
                len(added),
                len(contents.versions),
                generation,
            )
        return generation

    @_engine_call
    def _rebuild_locked(self) -> int:
        db, alias = self._connect()
        # Read the generation first: a write landing while the rows are read
        # makes the collection newer than its marker, and the next sync redoes it.
        generation = self.store.generation
        physical = f"{alias}-{uuid.uuid4().hex[:8]}"
        self._create(physical)
        rows = list(self._rows(None))
        lengths = [len(ANALYZER.document_terms(r["text"])) for r in rows]
        avgdl = sum(lengths) / len(lengths) if sum(lengths) else 1.0
        contents = _Contents({}, {})
        self._upsert(physical, rows, avgdl, contents)
        self._write_marker(physical, generation, avgdl)
        self._point_alias(alias, physical, self._physical(alias))
        for name in self._builds(alias):
            if name != physical:
                db.delete_collection(name)
        self._generation, self._contents, self._avgdl = generation, contents, avgdl
        log.info("qdrant collection %s built: %d chunks", physical, len(contents.versions))
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
        from qdrant_client import models

        db, _ = self._connect()
        for batch in _batched(rows, BATCH):
            points = [_point(row, avgdl) for row in batch]
            db.upsert(
                name,
                points=[
                    models.PointStruct(
                        id=p.id,
                        vector={
                            DENSE: _floats(p.dense),
                            SPARSE: models.SparseVector(indices=p.indices, values=p.values),
                        },
                        payload=p.payload,
                    )
                    for p in points
                ],
            )
            for p in points:
                contents.versions[p.id] = p.payload["version"]
                contents.lengths[p.id] = p.payload["length"]

    def _delete(self, name: str, ids: list[int], contents: _Contents) -> None:
        from qdrant_client import models

        db, _ = self._connect()
        for at in range(0, len(ids), BATCH):
            batch = ids[at : at + BATCH]
            db.delete(name, points_selector=models.PointIdsList(points=list(batch)))
            for cid in batch:
                contents.versions.pop(cid, None)
                contents.lengths.pop(cid, None)

    def _scan(self, name: str) -> _Contents:
        db, _ = self._connect()
        contents = _Contents({}, {})
        offset: Any = None
        while True:
            records, offset = db.scroll(
                name, limit=1024, offset=offset, with_payload=["version", "length"]
            )
            for r in records:
                payload = r.payload or {}
                contents.versions[int(r.id)] = float(payload.get("version", -1.0))
                contents.lengths[int(r.id)] = int(payload.get("length", 0))
            if offset is None:
                return contents

    def _create(self, name: str) -> None:
        from qdrant_client import models

        db, _ = self._connect()
        db.create_collection(
            name,
            vectors_config={
                DENSE: models.VectorParams(size=self.dimensions, distance=models.Distance.COSINE)
            },
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
        )
        if self.url and self.url != ":memory:":  # payload indexes are a server's (local mode warns)
            for field, schema in (
                ("scope", models.PayloadSchemaType.KEYWORD),
                ("document_id", models.PayloadSchemaType.INTEGER),
                ("chunk_id", models.PayloadSchemaType.INTEGER),
            ):
                db.create_payload_index(name, field, schema)

    def _physical(self, alias: str) -> str | None:
        db, _ = self._connect()
        for a in db.get_aliases().aliases:
            if a.alias_name == alias:
                return str(a.collection_name)
        return None

    def _builds(self, alias: str) -> list[str]:
        db, _ = self._connect()
        return [c.name for c in db.get_collections().collections if c.name.startswith(alias + "-")]

    def _point_alias(self, alias: str, physical: str, old: str | None) -> None:
        from qdrant_client import models

        db, _ = self._connect()
        changes: list[Any] = []
        if old is not None:
            changes.append(
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
            )
        changes.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=physical, alias_name=alias)
            )
        )
        db.update_collection_aliases(change_aliases_operations=changes)

    def _marker(self, name: str) -> dict[str, Any]:
        db, _ = self._connect()
        return dict(db.get_collection(name).config.metadata or {})

    def _write_marker(self, name: str, generation: int, avgdl: float) -> None:
        db, _ = self._connect()
        db.update_collection(
            name,
            metadata={
                "generation": generation,
                "avgdl": avgdl,
                "format": FORMAT_VERSION,
                "tokenizer": ANALYZER.signature,
                "k1": DEFAULT_K1,
                "b": DEFAULT_B,
            },
        )


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


def _point(row: dict[str, Any], avgdl: float) -> _Point:
    terms = ANALYZER.document_terms(row["text"])
    indices, values = bm25_values(terms, avgdl)
    cid = int(row["id"])
    return _Point(
        id=cid,
        dense=np.frombuffer(row["vector"], dtype=np.float32),
        indices=indices,
        values=values,
        payload={
            "chunk_id": cid,
            "document_id": row["document_id"],
            "scope": row["scope"],
            "version": float(row["version"]),
            "length": len(terms),
        },
    )


def _scope_filter(scopes: frozenset[str] | None) -> Any:
    if scopes is None:
        return None
    from qdrant_client import models

    visible = scopes if isinstance(scopes, OnlyScopes) else scopes | {EVERYONE}
    return models.Filter(
        must=[models.FieldCondition(key="scope", match=models.MatchAny(any=sorted(visible)))]
    )


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
