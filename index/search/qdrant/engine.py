"""What the Qdrant search index needs of an engine (a server, local mode, Edge), and its failure.

``QdrantEngine`` is the narrow set of operations; ``QdrantPoint`` one chunk as
an engine holds it, with its ``DENSE`` and ``SPARSE`` vectors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from index.errors import KBError

if TYPE_CHECKING:
    pass


DENSE = "dense"
SPARSE = "bm25"
# QDRANT_URL naming Qdrant's in-process engine (qdrant-edge-py) in the data dir.
EDGE = "edge"


class SearchEngineUnavailable(KBError):
    """The search engine cannot be loaded, reached or opened; the message says what to do."""


def public_location(url: str) -> str:
    """Where the engine is, without credentials a URL may carry."""
    if url in ("", ":memory:", EDGE):
        return url or "embedded"
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


@dataclass(frozen=True)
class QdrantPoint:
    """One chunk as the engine holds it (point id = chunk id)."""

    id: int
    dense: list[float]
    indices: list[int]
    values: list[float]
    payload: dict[str, Any]


class QdrantEngine(Protocol):
    """The operations the search index needs of a Qdrant engine (a server, local mode, Edge).

    ``name`` is an alias or a collection; an alias names the build queries read.
    """

    def ping(self) -> None:
        """Return if the engine answers a cheap request within a short timeout; raise otherwise."""
        ...

    def builds(self, alias: str) -> list[str]:
        """The collections built for ``alias`` (``<alias>-<suffix>``)."""
        ...

    def alias_target(self, alias: str) -> str | None:
        """The collection ``alias`` names, ``None`` when there is none."""
        ...

    def move_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection`` in one step."""
        ...

    def delete_alias(self, alias: str) -> None:
        """Remove ``alias`` (its collection stays); nothing when there is none."""
        ...

    def create(self, name: str, dimensions: int) -> None:
        """A new empty collection: dense cosine vector, sparse vector with IDF, scope index."""
        ...

    def drop(self, name: str) -> None:
        """Delete a collection."""
        ...

    def marker(self, name: str) -> dict[str, Any]:
        """The sync marker ({} when none was written)."""
        ...

    def set_marker(self, name: str, marker: dict[str, Any]) -> None:
        """Write the sync marker."""
        ...

    def upsert(self, name: str, points: Sequence[QdrantPoint]) -> None:
        """Insert or replace points (idempotent)."""
        ...

    def delete(self, name: str, ids: Sequence[int]) -> None:
        """Delete points; missing ones are ignored."""
        ...

    def dense(
        self, name: str, vector: list[float], scopes: list[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """``(id, cosine)``, best first, only points whose scope is in ``scopes``."""
        ...

    def sparse(
        self,
        name: str,
        indices: list[int],
        values: list[float],
        scopes: list[str] | None,
        limit: int,
    ) -> list[tuple[int, float]]:
        """``(id, score)`` by the sparse vector with IDF, best first, filtered likewise."""
        ...

    def vectors(self, name: str, ids: Sequence[int]) -> dict[int, list[float]]:
        """The dense vectors of the points among ``ids`` that exist."""
        ...

    def scan(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every point's id and payload (``version``, ``length``)."""
        ...
