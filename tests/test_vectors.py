"""The FAISS index: cosine distances, scope selectors on chunk ids, atomic persistence."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faiss
import numpy as np
import pytest

from index.errors import IndexOutOfSync, KBError
from index.files.atomic import AtomicWriteError, write_atomic
from index.search.vectors import VectorIndex, VectorIndexError

DIM = 64


def unit_vectors(n: int, *, seed: int = 0, dim: int = DIM) -> np.ndarray:
    vecs = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.fixture
def corpus() -> tuple[np.ndarray, np.ndarray]:
    # Chunk ids far from 0..n-1 and not in insertion order, so a selector that
    # worked on FAISS's internal row numbers could not pass by accident.
    ids = np.random.default_rng(1).permutation(np.arange(500, dtype=np.int64) * 7 + 10_000)
    return ids, unit_vectors(500)


@pytest.fixture
def index(corpus: tuple[np.ndarray, np.ndarray]) -> VectorIndex:
    vi = VectorIndex(DIM)
    vi.add(*corpus)
    return vi


def brute_force(ids: np.ndarray, vecs: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    sims = vecs @ query
    return ids[np.argsort(-sims, kind="stable")[:k]].tolist()


def test_search_returns_nearest_with_cosine_distance(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    query = unit_vectors(1, seed=9)[0]
    hits = index.search(query, k=10)
    assert [c for c, _ in hits] == brute_force(ids, vecs, query, 10)
    expected = {int(i): 1.0 - float(v @ query) for i, v in zip(ids, vecs, strict=True)}
    for chunk_id, distance in hits:
        assert distance == pytest.approx(expected[chunk_id], abs=1e-5)
    distances = [d for _, d in hits]
    assert distances == sorted(distances)


def test_distance_is_clamped_to_0_and_2() -> None:
    vi = VectorIndex(DIM)
    v = unit_vectors(1)[0]
    vi.add(np.array([1, 2]), np.vstack([v, -v]))
    hits = dict(vi.search(v, k=2))
    assert hits == {1: pytest.approx(0.0, abs=1e-6), 2: pytest.approx(2.0, abs=1e-6)}
    assert all(0.0 <= d <= 2.0 for d in hits.values())


def test_restricted_search_returns_full_k_from_the_allowed_ids(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    query = unit_vectors(1, seed=9)[0]
    # The allowed set is the 30 chunks *farthest* from the query, so every
    # better match lies outside it; a post-filter over the top k would return nothing.
    far = ids[np.argsort(vecs @ query)[:30]]
    unrestricted = {c for c, _ in index.search(query, k=10)}
    assert not unrestricted & set(far.tolist())

    hits = index.search(query, k=10, allowed_ids=far)
    assert len(hits) == 10
    mask = np.isin(ids, far)
    assert [c for c, _ in hits] == brute_force(ids[mask], vecs[mask], query, 10)


@pytest.mark.parametrize("share", [0.3, 0.6, 0.95])
def test_broad_scope_where_the_nearest_are_excluded(
    index: VectorIndex, corpus, share: float
) -> None:
    # Broad scopes are searched unrestricted and filtered afterwards. Here the
    # scope is the chunks *farthest* from the query, so that over-fetch finds
    # too few of them and the search must fall back to the selector.
    ids, vecs = corpus
    query = unit_vectors(1, seed=11)[0]
    far = ids[np.argsort(vecs @ query)[: int(share * len(ids))]]
    mask = np.isin(ids, far)
    hits = index.search(query, k=10, allowed_ids=far)
    assert [c for c, _ in hits] == brute_force(ids[mask], vecs[mask], query, 10)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9, 1.0])
def test_broad_random_scope_is_exact(index: VectorIndex, corpus, share: float) -> None:
    ids, vecs = corpus
    rng = np.random.default_rng(int(share * 100))
    scope = rng.choice(ids, int(share * len(ids)), replace=False)
    mask = np.isin(ids, scope)
    for seed in range(5):
        query = unit_vectors(1, seed=100 + seed)[0]
        hits = index.search(query, k=20, allowed_ids=scope)
        assert [c for c, _ in hits] == brute_force(ids[mask], vecs[mask], query, 20)


def test_selector_uses_chunk_ids_not_row_numbers(index: VectorIndex, corpus) -> None:
    ids, _ = corpus
    query = unit_vectors(1, seed=3)[0]
    # Row numbers 0..9 are not chunk ids here: selecting them selects nothing.
    assert index.search(query, k=5, allowed_ids=np.arange(10)) == []
    assert {c for c, _ in index.search(query, k=5, allowed_ids=ids[:3])} == set(ids[:3].tolist())


def test_restricted_search_ignores_unknown_ids_and_empty_scope(index: VectorIndex, corpus) -> None:
    ids, _ = corpus
    query = unit_vectors(1, seed=3)[0]
    hits = index.search(query, k=10, allowed_ids=np.array([ids[0], -5, 123_456_789]))
    assert [c for c, _ in hits] == [int(ids[0])]
    assert index.search(query, k=10, allowed_ids=np.array([], dtype=np.int64)) == []


def test_k_larger_than_the_index_and_empty_index(index: VectorIndex) -> None:
    query = unit_vectors(1, seed=3)[0]
    assert len(index.search(query, k=10_000)) == 500
    assert index.search(query, k=0) == []
    assert VectorIndex(DIM).search(query, k=5) == []


def test_search_refuses_a_query_of_another_model(index: VectorIndex) -> None:
    with pytest.raises(IndexOutOfSync, match="embedding model changed"):
        index.search(unit_vectors(1, dim=DIM * 2)[0], k=3)


def test_search_from_worker_threads_leaves_openmp_setting_alone(index: VectorIndex) -> None:
    # Searches pin FAISS to one thread for their own duration only.
    before = faiss.omp_get_max_threads()
    query = unit_vectors(1, seed=2)[0]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: index.search(query, k=5), range(16)))
    assert all(r == results[0] for r in results)
    index.search(query, k=5)
    assert faiss.omp_get_max_threads() == before


def test_distances_for_specific_chunks(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    query = unit_vectors(1, seed=4)[0]
    wanted = [int(ids[3]), int(ids[400]), 42]  # 42 is not in the index
    got = index.distances_for(query, wanted)
    assert set(got) == {int(ids[3]), int(ids[400])}
    assert got[int(ids[3])] == pytest.approx(1.0 - float(vecs[3] @ query), abs=1e-5)
    assert got[int(ids[400])] == pytest.approx(1.0 - float(vecs[400] @ query), abs=1e-5)


def test_remove(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    gone = ids[:100]
    assert index.remove(np.append(gone, 99)) == 100
    assert index.ntotal == len(index) == 400
    assert not np.isin(gone, index.ids()).any()
    query = vecs[0]  # the vector of a removed chunk
    hits = index.search(query, k=5)
    assert int(ids[0]) not in {c for c, _ in hits}
    assert [c for c, _ in hits] == brute_force(ids[100:], vecs[100:], query, 5)
    # Lookups by id still work after FAISS moved the remaining rows.
    assert index.distances_for(query, [int(ids[450])]) == {
        int(ids[450]): pytest.approx(1.0 - float(vecs[450] @ query), abs=1e-5)
    }
    assert index.distances_for(query, [int(ids[0])]) == {}
    assert index.remove([]) == 0


def test_add_converts_dtype_and_layout() -> None:
    vecs = unit_vectors(6).astype(np.float64)[::2]  # float64, not contiguous
    vi = VectorIndex(DIM)
    vi.add([5, 6, 7], vecs)
    assert vi.ids().tolist() == [5, 6, 7]
    assert vi.search(vecs[1], k=1)[0][0] == 6


def test_add_refuses_duplicates_and_wrong_shapes(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    with pytest.raises(IndexOutOfSync, match="already"):
        index.add(ids[:2], vecs[:2])
    with pytest.raises(IndexOutOfSync, match="twice"):
        index.add(np.array([1, 1]), unit_vectors(2))
    with pytest.raises(IndexOutOfSync, match="dimension"):
        index.add(np.array([1]), unit_vectors(1, dim=DIM + 1))
    with pytest.raises(ValueError, match="unit length"):
        index.add(np.array([1]), 2 * unit_vectors(1))
    with pytest.raises(ValueError, match="unit length"):
        index.add(np.array([1]), np.full((1, DIM), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="ids but"):
        index.add(np.array([1, 2]), unit_vectors(1))
    assert index.ntotal == 500  # nothing half-added


# ------------------------------------------------------------------ persistence


def test_save_and_load_round_trip(index: VectorIndex, corpus, index_dir: Path) -> None:
    ids, _ = corpus
    path = index_dir / "vectors.faiss"
    index.save(path, generation=17)
    loaded, generation = VectorIndex.load(path, dim=DIM)
    assert generation == 17
    assert (loaded.dim, loaded.ntotal) == (DIM, 500)
    assert loaded.ids().tolist() == ids.tolist()
    query = unit_vectors(1, seed=5)[0]
    assert loaded.search(query, k=8) == index.search(query, k=8)
    assert loaded.search(query, k=3, allowed_ids=ids[:3]) == index.search(
        query, k=3, allowed_ids=ids[:3]
    )
    assert loaded.distances_for(query, ids[:4]) == index.distances_for(query, ids[:4])
    assert [p.name for p in index_dir.iterdir()] == ["vectors.faiss"]  # no temp file left


def test_empty_index_round_trip(index_dir: Path) -> None:
    VectorIndex(DIM).save(index_dir / "v.faiss", generation=0)
    loaded, generation = VectorIndex.load(index_dir / "v.faiss")
    assert (loaded.ntotal, generation, loaded.dim) == (0, 0, DIM)


def test_load_refuses_another_dimension(index: VectorIndex, index_dir: Path) -> None:
    index.save(index_dir / "v.faiss", generation=1)
    with pytest.raises(IndexOutOfSync, match="384-dimensional"):
        VectorIndex.load(index_dir / "v.faiss", dim=384)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated: FAISS itself fails to read
        lambda data: b"garbage" + data,  # not our header
        lambda data: data.replace(b'"ntotal": 500', b'"ntotal": 501'),  # header disagrees
    ],
    ids=["truncated", "foreign", "wrong-count"],
)
def test_damaged_file_is_out_of_sync(index: VectorIndex, index_dir: Path, damage) -> None:
    path = index_dir / "v.faiss"
    index.save(path, generation=1)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(IndexOutOfSync, match="rebuild"):
        VectorIndex.load(path)


def test_missing_file_is_out_of_sync(index_dir: Path) -> None:
    with pytest.raises(IndexOutOfSync):
        VectorIndex.load(index_dir / "nope.faiss")


def test_failure_while_saving_keeps_the_previous_file(
    index: VectorIndex, index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = index_dir / "v.faiss"
    index.save(path, generation=1)
    before = path.read_bytes()

    real_write_index = faiss.write_index

    def write_then_fail(idx: faiss.Index, writer: faiss.IOWriter) -> None:
        real_write_index(idx, writer)  # bytes reach the temp file, then FAISS fails
        raise RuntimeError("Error in faiss::write_index: disk quota")

    monkeypatch.setattr(faiss, "write_index", write_then_fail)
    bigger = VectorIndex(DIM)
    bigger.add(np.arange(3), unit_vectors(3))
    with pytest.raises(VectorIndexError, match="disk quota") as caught:
        bigger.save(path, generation=2)
    assert isinstance(caught.value, KBError)
    assert path.read_bytes() == before
    assert [p.name for p in index_dir.iterdir()] == ["v.faiss"]
    monkeypatch.undo()
    assert VectorIndex.load(path)[1] == 1


# -------------------------------------------------------------- atomic writes


def test_write_atomic_creates_and_replaces(index_dir: Path) -> None:
    path = index_dir / "f.bin"
    write_atomic(path, lambda tmp: tmp.write_bytes(b"one"))
    write_atomic(path, lambda tmp: tmp.write_bytes(b"two"))
    assert path.read_bytes() == b"two"
    assert [p.name for p in index_dir.iterdir()] == ["f.bin"]


def test_write_atomic_failure_mid_write_leaves_the_old_file(index_dir: Path) -> None:
    path = index_dir / "f.bin"
    path.write_bytes(b"old content")

    def crash(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(b"new con")
            f.flush()
            raise KeyboardInterrupt  # even an interrupt must not leave debris

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, crash)
    assert path.read_bytes() == b"old content"
    assert [p.name for p in index_dir.iterdir()] == ["f.bin"]


def test_write_atomic_translates_os_errors(index_dir: Path) -> None:
    def disk_full(tmp: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(AtomicWriteError, match="No space left") as caught:
        write_atomic(index_dir / "f.bin", disk_full)
    assert isinstance(caught.value, KBError)
    assert list(index_dir.iterdir()) == []
    with pytest.raises(AtomicWriteError, match="previous version"):
        write_atomic(index_dir / "missing-dir" / "f.bin", lambda tmp: tmp.write_bytes(b"x"))


def test_updated_returns_a_new_index_and_leaves_this_one(index: VectorIndex, corpus) -> None:
    ids, vecs = corpus
    removed = ids[:40]
    new_ids = np.arange(5) + 1
    new_vecs = unit_vectors(5, seed=9)
    updated = index.updated(np.append(removed, 123_456_789), new_ids, new_vecs)
    assert index.ntotal == 500 and np.array_equal(index.ids(), ids)
    fresh = VectorIndex(DIM)
    fresh.add(np.concatenate([ids[40:], new_ids]), np.vstack([vecs[40:], new_vecs]))
    assert np.array_equal(np.sort(updated.ids()), np.sort(fresh.ids()))
    for query in [new_vecs[0], vecs[0], vecs[100]]:
        assert updated.search(query, 10) == fresh.search(query, 10)
    assert index.search(vecs[0], 1)[0][0] == ids[0]  # the original still has it
    with pytest.raises(IndexOutOfSync):
        index.updated([], ids[:1], vecs[:1])
    assert index.ntotal == 500
