"""The dense index: exact inner-product search over unit vectors, keyed by chunk id.

FAISS ``IndexIDMap2(IndexFlatIP)``: the FAISS id of a vector *is* its chunk id,
so results need no translation table, and ``IndexIDMap2`` can look a vector
up by id (``distances_for``). Scope filtering is part of the search, so a
scope holding few chunks still gets its full ``k`` instead of whatever survived
a post-filter: inside FAISS with an ``IDSelectorBatch`` over chunk ids for
narrow scopes, and by an over-fetch that is provably exact (or else falls back
to the selector) for scopes holding most chunks, where the selector is slower
than a plain scan.

File format (one file, so the generation can never disagree with the vectors
after a crash)::

    KBVECTORS 1\\n
    {"generation": 7, "dim": 384, "ntotal": 1234}\\n
    <faiss.write_index bytes>
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, ParamSpec, TypeVar

import faiss
import numpy as np

from index.errors import IndexOutOfSync, KBError
from index.files import write_atomic

MAGIC = b"KBVECTORS 1\n"
# Embedder vectors are normalised in float32; a norm further than this from 1
# means the caller passed something else (raw model output, a zero vector).
UNIT_TOLERANCE = 1e-3
# A scope holding at least this share of the chunks is searched without a
# selector and filtered afterwards (see ``VectorIndex._search_broad``).
BROAD_SCOPE = 0.2

_P = ParamSpec("_P")
_T = TypeVar("_T")


class VectorIndexError(KBError):
    """FAISS failed on an operation that should have worked; the index should be rebuilt."""


class VectorIndex:
    """Unit vectors keyed by chunk id; search returns cosine distances.

    Searches may run in several threads at once; ``add`` and ``remove`` must
    not run alongside them (build a new index and swap it instead).

    Args:
        dim: number of dimensions of every vector (384 for all-MiniLM-L6-v2).
    """

    def __init__(self, dim: int) -> None:
        if dim <= 0:
            raise ValueError(f"dimension must be positive, got {dim}.")
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    @property
    def dim(self) -> int:
        """Number of dimensions of the vectors."""
        return int(self._index.d)

    @property
    def ntotal(self) -> int:
        """Number of vectors in the index."""
        return int(self._index.ntotal)

    def __len__(self) -> int:
        return self.ntotal

    def ids(self) -> np.ndarray:
        """The chunk ids in the index, in insertion order (int64 copy)."""
        return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)

    def add(self, ids: np.ndarray | Iterable[int], vectors: np.ndarray) -> None:
        """Add one vector per chunk id.

        Args:
            ids: chunk ids, none of them already in the index.
            vectors: ``(len(ids), dim)`` unit vectors (converted to contiguous float32).

        Raises:
            IndexOutOfSync: an id is already present or repeated, or the vectors
                have another dimension (the embedding model changed).
            ValueError: shapes disagree, or a vector is not finite or not unit length.
        """
        id_arr = _as_ids(ids)
        vecs = self._as_vectors(vectors)
        if vecs.shape[0] != id_arr.size:
            raise ValueError(f"{id_arr.size} ids but {vecs.shape[0]} vectors.")
        if id_arr.size == 0:
            return
        # IndexIDMap2 would accept a duplicate id silently and keep two vectors
        # under it, one of them unreachable by id: refuse instead.
        if np.unique(id_arr).size != id_arr.size:
            raise IndexOutOfSync("The same chunk id was given twice to the vector index.")
        present = id_arr[np.isin(id_arr, self.ids())]
        if present.size:
            raise IndexOutOfSync(
                f"Chunk ids {present[:10].tolist()} are already in the vector index; "
                "it is out of step with the store and should be rebuilt."
            )
        _call("add vectors", self._index.add_with_ids, vecs, id_arr)

    def remove(self, ids: np.ndarray | Iterable[int]) -> int:
        """Remove the vectors of these chunk ids; ids not in the index are ignored.

        Returns:
            How many vectors were removed.
        """
        id_arr = _as_ids(ids)
        if id_arr.size == 0:
            return 0
        removed = _call("remove vectors", self._index.remove_ids, faiss.IDSelectorBatch(id_arr))
        return int(removed)

    def updated(
        self,
        remove_ids: np.ndarray | Iterable[int],
        add_ids: np.ndarray | Iterable[int],
        add_vectors: np.ndarray,
    ) -> VectorIndex:
        """A copy of this index with some vectors removed and others added.

        This index is left unchanged, so searches in other threads may go on
        using it while the copy is changed and until it is swapped in.

        Args:
            remove_ids: chunk ids to drop; ids not in the index are ignored.
            add_ids: chunk ids to add, none of them left in the index.
            add_vectors: their ``(len(add_ids), dim)`` unit vectors.

        Returns:
            The new index.

        Raises:
            IndexOutOfSync: as ``add``.
            ValueError: as ``add``.
            VectorIndexError: FAISS failed to copy or change the index.
        """
        # clone_index hands back the concrete type, owning its copy of the vectors.
        cloned = _call("copy the index", faiss.clone_index, self._index)
        if not isinstance(cloned, faiss.IndexIDMap2):
            raise VectorIndexError(f"FAISS copied the index as {type(cloned).__name__}.")
        copy = VectorIndex.__new__(VectorIndex)
        copy._index = cloned
        copy.remove(remove_ids)
        copy.add(add_ids, add_vectors)
        return copy

    def search(
        self, vector: np.ndarray, k: int, allowed_ids: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest chunks to ``vector``, nearest first.

        Args:
            vector: the ``(dim,)`` unit query vector.
            k: how many results at most.
            allowed_ids: if given, only these chunk ids are ranked, so the
                result is the ``k`` nearest of this set however many better
                matches lie outside it. Narrow scopes are filtered inside FAISS
                with an id selector; broad ones by an exact over-fetch.

        Returns:
            ``(chunk_id, cosine_distance)`` pairs; distance = ``1 - inner product``,
            clamped to [0, 2].
        """
        query = self._as_vectors(np.asarray(vector).reshape(1, -1))
        if k <= 0 or self.ntotal == 0:
            return []
        k = min(k, self.ntotal)
        if allowed_ids is None:
            return self._search(query, k)
        allowed = _as_ids(allowed_ids)
        if allowed.size == 0:
            return []
        if allowed.size >= BROAD_SCOPE * self.ntotal:
            hits = self._search_broad(query, k, allowed)
            if hits is not None:
                return hits
        # IndexIDMap2 translates the selector to its external ids, so the
        # batch holds chunk ids (tests/test_vectors.py proves it).
        # (faiss's type stubs omit the constructor's keyword arguments.)
        params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed))  # type: ignore[call-arg]
        return self._search(query, k, params)

    def _search(
        self, query: np.ndarray, k: int, params: faiss.SearchParameters | None = None
    ) -> list[tuple[int, float]]:
        with _one_thread():
            sims, found = _call("search", self._index.search, query, k, params=params)
        return [(int(i), _distance(s)) for s, i in zip(sims[0], found[0], strict=True) if i >= 0]

    def _search_broad(
        self, query: np.ndarray, k: int, allowed: np.ndarray
    ) -> list[tuple[int, float]] | None:
        # With a selector FAISS checks every row one by one and loses its
        # vectorised scan: for a scope holding most chunks that is 2-3x slower
        # than searching everything. So search everything for enough extra
        # results to expect k allowed ones, and keep the allowed. The answer is
        # exact whenever k allowed results come back (anything allowed and
        # nearer would have been among them); otherwise None, and the caller
        # falls back to the selector.
        wanted = min(self.ntotal, 2 * k * self.ntotal // allowed.size + k)
        hits = self._search(query, wanted)
        keep = np.isin(np.fromiter((c for c, _ in hits), np.int64, len(hits)), allowed)
        kept = [hit for hit, ok in zip(hits, keep, strict=True) if ok][:k]
        return kept if len(kept) == k or wanted == self.ntotal else None

    def distances_for(
        self, vector: np.ndarray, ids: np.ndarray | Iterable[int]
    ) -> dict[int, float]:
        """Cosine distances between ``vector`` and the vectors of specific chunks.

        For candidates found only by BM25, which must still face the gate.

        Args:
            vector: the ``(dim,)`` unit query vector.
            ids: chunk ids.

        Returns:
            ``{chunk_id: cosine_distance}``; ids not in the index are left out
            (the caller decides whether that means the index is out of sync).
        """
        query = self._as_vectors(np.asarray(vector).reshape(1, -1))[0]
        return {
            chunk_id: _distance(float(np.dot(stored, query)))
            for chunk_id, stored in self.vectors_for(ids).items()
        }

    def vectors_for(self, ids: np.ndarray | Iterable[int]) -> dict[int, np.ndarray]:
        """The stored vectors of these chunk ids; ids not in the index are left out."""
        out: dict[int, np.ndarray] = {}
        for chunk_id in _as_ids(ids).tolist():
            try:
                out[chunk_id] = np.asarray(self._index.reconstruct(chunk_id), dtype=np.float32)
            except RuntimeError:  # "key not found": no vector under this id
                continue
        return out

    # ------------------------------------------------------------- persistence

    def save(self, path: Path, generation: int) -> None:
        """Write the index and its generation to ``path`` atomically.

        Args:
            path: the file to create or replace.
            generation: the store generation the index was built from.

        Raises:
            AtomicWriteError: the file could not be written; the old one is intact.
            VectorIndexError: FAISS failed to serialise the index.
        """
        header = {"generation": int(generation), "dim": self.dim, "ntotal": self.ntotal}

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(MAGIC)
                f.write(json.dumps(header).encode("ascii") + b"\n")
                # Streams straight into the file: no second in-memory copy.
                writer = faiss.PyCallbackIOWriter(f.write)  # type: ignore[attr-defined]
                _call("save the index", faiss.write_index, self._index, writer)

        write_atomic(Path(path), write)

    @classmethod
    def load(cls, path: Path, *, dim: int | None = None) -> tuple[VectorIndex, int]:
        """Read an index written by ``save``.

        Args:
            path: the file.
            dim: if given, the dimension the caller expects (its embedding model's).

        Returns:
            The index and the generation it was saved with.

        Raises:
            IndexOutOfSync: the file is missing, damaged or not ours, or holds
                vectors of another dimension; rebuild it from the store.
        """
        try:
            with open(path, "rb") as f:
                header = _read_header(f)
                # read_index hands back the concrete, owning type (IndexIDMap2);
                # wrapping it again with downcast_index would free it twice.
                loaded = faiss.read_index(faiss.PyCallbackIOReader(f.read))  # type: ignore[attr-defined]
        except (OSError, ValueError, RuntimeError) as exc:
            raise IndexOutOfSync(
                f"The vector index {path} cannot be read ({exc}); rebuild it."
            ) from exc
        if not isinstance(loaded, faiss.IndexIDMap2) or loaded.ntotal != header["ntotal"]:
            raise IndexOutOfSync(f"The vector index {path} is not what was saved; rebuild it.")
        if dim is not None and loaded.d != dim:
            raise IndexOutOfSync(
                f"The vector index {path} holds {loaded.d}-dimensional vectors but the embedding "
                f"model makes {dim}-dimensional ones; rebuild it."
            )
        index = cls.__new__(cls)
        index._index = loaded
        return index, int(header["generation"])

    # ----------------------------------------------------------------- helpers

    def _as_vectors(self, vectors: np.ndarray) -> np.ndarray:
        vecs = np.ascontiguousarray(vectors, dtype=np.float32)
        if vecs.ndim != 2:
            raise ValueError(f"expected a 2-d array of vectors, got shape {vecs.shape}.")
        if vecs.shape[1] != self.dim:
            raise IndexOutOfSync(
                f"Got {vecs.shape[1]}-dimensional vectors for an index of {self.dim} dimensions; "
                "the embedding model changed, so the index must be rebuilt."
            )
        norms = np.linalg.norm(vecs, axis=1)
        if not np.all(np.abs(norms - 1.0) <= UNIT_TOLERANCE):
            raise ValueError("vectors must be finite and of unit length (normalise embeddings).")
        return vecs


@contextmanager
def _one_thread() -> Iterator[None]:
    # One query is one matrix-vector product: an OpenMP thread team costs more
    # than it saves (measured on 2 cores at 10k chunks: 0.3-0.6 ms with one
    # thread, 25-50 ms with two), and its spinning workers steal CPU from the
    # embedding model. OpenSearch's k-NN plugin does the same for its FAISS
    # queries (opensearch-project/k-NN#965). The setting belongs to the calling
    # thread, so it is made here, where the search runs, and then restored.
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _call(action: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    # The one place FAISS errors (C++ exceptions surfaced as RuntimeError)
    # become ours.
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:
        raise VectorIndexError(
            f"FAISS could not {action} ({exc}); rebuild the vector index from the store."
        ) from exc


def _as_ids(ids: np.ndarray | Iterable[int]) -> np.ndarray:
    arr = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, dtype=np.int64)
    return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)


def _distance(similarity: float) -> float:
    return float(min(2.0, max(0.0, 1.0 - float(similarity))))


def _read_header(f: BinaryIO) -> dict[str, int]:
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a knowledge-base vector index file")
    header: dict[str, int] = json.loads(f.readline())
    if not all(isinstance(header.get(k), int) for k in ("generation", "dim", "ntotal")):
        raise ValueError(f"bad header {header!r}")
    return header
