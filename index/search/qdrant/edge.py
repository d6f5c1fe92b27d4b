"""Qdrant's in-process engine (``qdrant-edge-py``) as a ``QdrantEngine``: ``QDRANT_URL=edge``.

Edge is one Qdrant shard in a folder, run inside this process by the same
Rust engine as a server: dense cosine vectors, sparse vectors with the IDF
modifier, payload indexes and filters, HNSW. It has no collections, aliases or
collection metadata, so this adapter keeps them as files beside the shards,
under ``<data dir>/qdrant-edge/``:

* one folder per collection (``<name>/``), each an Edge shard;
* ``<alias>.alias``: the collection an alias names, replaced atomically;
* ``<name>.marker.json``: the sync marker, replaced atomically.

What it does not offer (``docs/scale-out.md``): sharding, replication and
snapshots shipped to a server are outside a single in-process shard; and its
IDF counts only points whose sparse vector has at least one term (qdrant-client's
local mode and ``index.search.bm25`` count every chunk), which changes scores only
in a knowledge base holding chunks without any term.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

from index.files import private_dir, write_atomic
from index.search.qdrant.engine import DENSE, SPARSE, QdrantPoint

# Points a segment may hold before Edge's optimizer builds its HNSW graph
# (Qdrant's default is 10,000 KB of vectors: about 6,500 of 384 dimensions).
DEFAULT_INDEXING_THRESHOLD = 10_000


class EdgeEngine:
    """Collections of Edge shards in one folder (see the module docstring).

    Args:
        folder: where the shards, aliases and markers live.
        exact: search the dense vectors exhaustively, never through HNSW.
        hnsw_m: edges per node of the HNSW graph (Qdrant's default 16).
    """

    def __init__(self, folder: str | Path, *, exact: bool = False, hnsw_m: int = 16) -> None:
        self.root = private_dir(Path(folder))
        self.exact = exact
        self.hnsw_m = hnsw_m
        self._shards: dict[str, qe.EdgeShard] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ collections

    def ping(self) -> None:
        """See ``QdrantEngine.ping``: in this process, it answers while its folder is there."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"the Edge folder {self.root} is gone")

    def builds(self, alias: str) -> list[str]:
        """See ``QdrantEngine.builds``."""
        return sorted(p.name for p in self.root.glob(f"{alias}-*") if p.is_dir())

    def alias_target(self, alias: str) -> str | None:
        """See ``QdrantEngine.alias_target``."""
        try:
            return (self.root / f"{alias}.alias").read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def move_alias(self, alias: str, collection: str) -> None:
        """See ``QdrantEngine.move_alias``: one atomic file replacement."""
        self._shard(collection).flush()
        write_atomic(self.root / f"{alias}.alias", lambda tmp: tmp.write_text(collection))

    def delete_alias(self, alias: str) -> None:
        """See ``QdrantEngine.delete_alias``."""
        (self.root / f"{alias}.alias").unlink(missing_ok=True)

    def create(self, name: str, dimensions: int) -> None:
        """See ``QdrantEngine.create``."""
        config = qe.EdgeConfig(
            vectors={DENSE: qe.EdgeVectorParams(size=dimensions, distance=qe.Distance.Cosine)},
            sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            hnsw_config=qe.HnswIndexConfig(
                m=self.hnsw_m, ef_construct=100, full_scan_threshold=10_000
            ),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=DEFAULT_INDEXING_THRESHOLD),
        )
        with self._lock:
            shard = qe.EdgeShard.create(str(self.root / name), config)
            shard.update(
                qe.UpdateOperation.create_field_index("scope", qe.PayloadSchemaType.Keyword)
            )
            self._shards[name] = shard

    def drop(self, name: str) -> None:
        """See ``QdrantEngine.drop``."""
        with self._lock:
            shard = self._shards.pop(name, None)
            if shard is not None:
                shard.close()
        shutil.rmtree(self.root / name, ignore_errors=True)
        (self.root / f"{name}.marker.json").unlink(missing_ok=True)

    def marker(self, name: str) -> dict[str, Any]:
        """See ``QdrantEngine.marker``."""
        target = self._resolve(name)
        if target is None:
            return {}
        try:
            data = json.loads((self.root / f"{target}.marker.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def set_marker(self, name: str, marker: dict[str, Any]) -> None:
        """See ``QdrantEngine.set_marker``: the shard is flushed first, so the marker never
        claims points the disk does not have."""
        target = self._resolve(name) or name
        self._shard(target).flush()
        text = json.dumps(marker)
        write_atomic(self.root / f"{target}.marker.json", lambda tmp: tmp.write_text(text))

    def optimize(self, name: str) -> bool:
        """Build the HNSW graphs and merge segments now (Edge runs no optimizer in the background)."""
        return bool(self._shard(self._resolve(name) or name).optimize())

    # ------------------------------------------------------------ points

    def upsert(self, name: str, points: Sequence[QdrantPoint]) -> None:
        """See ``QdrantEngine.upsert``."""
        edge_points = [
            qe.Point(
                p.id,
                {DENSE: p.dense, SPARSE: qe.SparseVector(p.indices, p.values)},
                p.payload,
            )
            for p in points
        ]
        self._named(name).update(qe.UpdateOperation.upsert_points(edge_points))

    def delete(self, name: str, ids: Sequence[int]) -> None:
        """See ``QdrantEngine.delete``."""
        self._named(name).update(qe.UpdateOperation.delete_points(list(ids)))

    def dense(
        self, name: str, vector: list[float], scopes: list[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """See ``QdrantEngine.dense``."""
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(vector, using=DENSE),
            filter=_filter(scopes),
            with_payload=False,
            params=qe.SearchParams(exact=self.exact),
        )
        return [(int(p.id), float(p.score)) for p in self._named(name).query(request)]

    def sparse(
        self,
        name: str,
        indices: list[int],
        values: list[float],
        scopes: list[str] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        """See ``QdrantEngine.sparse``."""
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(qe.SparseVector(indices, values), using=SPARSE),
            filter=_filter(scopes),
            with_payload=False,
        )
        return [(int(p.id), float(p.score)) for p in self._named(name).query(request)]

    def vectors(self, name: str, ids: Sequence[int]) -> dict[int, list[float]]:
        """See ``QdrantEngine.vectors``."""
        records = self._named(name).retrieve(list(ids), with_payload=False, with_vector=[DENSE])
        out: dict[int, list[float]] = {}
        for r in records:
            vector = r.vector.get(DENSE) if isinstance(r.vector, dict) else None
            if isinstance(vector, list):
                out[int(r.id)] = np.asarray(vector, dtype=np.float32).reshape(-1).tolist()
        return out

    def scan(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """See ``QdrantEngine.scan``."""
        shard = self._named(name)
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset, limit=1024, with_payload=["version", "length"], with_vector=False
            )
            records, offset = shard.scroll(request)
            for r in records:
                yield int(r.id), dict(r.payload or {})
            if offset is None:
                return

    def close(self) -> None:
        """Flush and close every open shard."""
        with self._lock:
            for shard in self._shards.values():
                shard.close()
            self._shards.clear()

    # ------------------------------------------------------------ internals

    def _resolve(self, name: str) -> str | None:
        target = self.alias_target(name)
        if target is not None:
            return target
        return name if (self.root / name).is_dir() else None

    def _named(self, name: str) -> qe.EdgeShard:
        target = self._resolve(name)
        if target is None:
            raise FileNotFoundError(f"no Edge collection {name!r} in {self.root}")
        return self._shard(target)

    def _shard(self, name: str) -> qe.EdgeShard:
        with self._lock:
            shard = self._shards.get(name)
            if shard is None:
                shard = self._shards[name] = qe.EdgeShard.load(str(self.root / name))
            return shard


def _filter(scopes: list[str] | None) -> qe.Filter | None:
    if scopes is None:
        return None
    return qe.Filter(must=[qe.FieldCondition(key="scope", match=qe.MatchAny(scopes))])
