"""A Qdrant server, or qdrant-client's local mode, as a ``QdrantEngine`` through qdrant-client."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from index.search.qdrant.engine import DENSE, SPARSE, QdrantPoint

if TYPE_CHECKING:
    from qdrant_client import QdrantClient


log = logging.getLogger(__name__)


class ClientEngine:
    """A Qdrant server, or qdrant-client's local mode, through qdrant-client.

    Args:
        client: the client.
        indexed: create payload indexes (a server; local mode has none and warns).
        probe: a client of the same server with a short timeout, for ``ping``;
            ``None``: ``client`` (in-process, it answers at once).
    """

    def __init__(
        self, client: QdrantClient, *, indexed: bool, probe: QdrantClient | None = None
    ) -> None:
        self.client = client
        self.indexed = indexed
        self.probe = probe

    def ping(self) -> None:
        """See ``QdrantEngine.ping``: the list of collections (names only)."""
        (self.probe or self.client).get_collections()

    def builds(self, alias: str) -> list[str]:
        """See ``QdrantEngine.builds``."""
        names = [c.name for c in self.client.get_collections().collections]
        return sorted(n for n in names if n.startswith(alias + "-"))

    def alias_target(self, alias: str) -> str | None:
        """See ``QdrantEngine.alias_target``."""
        for a in self.client.get_aliases().aliases:
            if a.alias_name == alias:
                return str(a.collection_name)
        return None

    def move_alias(self, alias: str, collection: str) -> None:
        """See ``QdrantEngine.move_alias``: one request, atomic on a server."""
        from qdrant_client import models

        changes: list[Any] = []
        if self.alias_target(alias) is not None:
            delete = models.DeleteAlias(alias_name=alias)
            changes.append(models.DeleteAliasOperation(delete_alias=delete))
        create = models.CreateAlias(collection_name=collection, alias_name=alias)
        changes.append(models.CreateAliasOperation(create_alias=create))
        self.client.update_collection_aliases(change_aliases_operations=changes)

    def delete_alias(self, alias: str) -> None:
        """See ``QdrantEngine.delete_alias``."""
        from qdrant_client import models

        if self.alias_target(alias) is None:
            return
        delete = models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
        self.client.update_collection_aliases(change_aliases_operations=[delete])

    def create(self, name: str, dimensions: int) -> None:
        """See ``QdrantEngine.create``."""
        from qdrant_client import models

        self.client.create_collection(
            name,
            vectors_config={
                DENSE: models.VectorParams(size=dimensions, distance=models.Distance.COSINE)
            },
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
        )
        if self.indexed:
            for field, schema in (
                ("scope", models.PayloadSchemaType.KEYWORD),
                ("document_id", models.PayloadSchemaType.INTEGER),
                ("chunk_id", models.PayloadSchemaType.INTEGER),
            ):
                self.client.create_payload_index(name, field, schema)

    def drop(self, name: str) -> None:
        """See ``QdrantEngine.drop``."""
        self.client.delete_collection(name)

    def marker(self, name: str) -> dict[str, Any]:
        """See ``QdrantEngine.marker``: the collection's metadata."""
        if not self.client.collection_exists(name):
            return {}
        return dict(self.client.get_collection(name).config.metadata or {})

    def set_marker(self, name: str, marker: dict[str, Any]) -> None:
        """See ``QdrantEngine.set_marker``."""
        self.client.update_collection(name, metadata=marker)

    def upsert(self, name: str, points: Sequence[QdrantPoint]) -> None:
        """See ``QdrantEngine.upsert``."""
        from qdrant_client import models

        structs = [
            models.PointStruct(
                id=p.id,
                vector={
                    DENSE: p.dense,
                    SPARSE: models.SparseVector(indices=p.indices, values=p.values),
                },
                payload=p.payload,
            )
            for p in points
        ]
        self.client.upsert(name, points=structs)

    def delete(self, name: str, ids: Sequence[int]) -> None:
        """See ``QdrantEngine.delete``."""
        from qdrant_client import models

        self.client.delete(name, points_selector=models.PointIdsList(points=list(ids)))

    def dense(
        self, name: str, vector: list[float], scopes: list[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """See ``QdrantEngine.dense``."""
        hits = self.client.query_points(
            name,
            query=vector,
            using=DENSE,
            query_filter=_client_filter(scopes),
            limit=limit,
            with_payload=False,
        )
        return [(int(p.id), float(p.score)) for p in hits.points]

    def sparse(
        self,
        name: str,
        indices: list[int],
        values: list[float],
        scopes: list[str] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        """See ``QdrantEngine.sparse``."""
        from qdrant_client import models

        hits = self.client.query_points(
            name,
            query=models.SparseVector(indices=indices, values=values),
            using=SPARSE,
            query_filter=_client_filter(scopes),
            limit=limit,
            with_payload=False,
        )
        return [(int(p.id), float(p.score)) for p in hits.points]

    def vectors(self, name: str, ids: Sequence[int]) -> dict[int, list[float]]:
        """See ``QdrantEngine.vectors``."""
        records = self.client.retrieve(name, list(ids), with_payload=False, with_vectors=[DENSE])
        out: dict[int, list[float]] = {}
        for r in records:
            if isinstance(r.vector, dict) and DENSE in r.vector:
                out[int(r.id)] = list(r.vector[DENSE])  # type: ignore[arg-type]
        return out

    def scan(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """See ``QdrantEngine.scan``."""
        offset: Any = None
        while True:
            records, offset = self.client.scroll(
                name, limit=1024, offset=offset, with_payload=["version", "length"]
            )
            for r in records:
                yield int(r.id), dict(r.payload or {})
            if offset is None:
                return


def _client_filter(scopes: list[str] | None) -> Any:
    if scopes is None:
        return None
    from qdrant_client import models

    return models.Filter(
        must=[models.FieldCondition(key="scope", match=models.MatchAny(any=scopes))]
    )
