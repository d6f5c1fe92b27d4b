"""Cost of bringing the derived indexes up to date after one small upload or removal.

A store of N chunks (default 100k: the bundled corpus's chunk texts, then
recombinations of its sentences; random 384-d unit vectors) is indexed once.
Then, alternately, one 10-chunk document is added or the last one removed,
and ``DerivedIndexes.refresh()`` (incremental) is timed against ``rebuild()``
(everything re-read from SQLite, as every refresh did before). Both persist
the two index files.

Run: python -m bench.refresh [--chunks 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from bench.query import corpus_chunks, synthetic_chunks
from index.models import Chunk
from index.records import Stamp
from index.search.derived import DerivedIndexes
from index.storage.store import NewDocument, Store

DIM = 384
STAMP = Stamp("bench/model", DIM, "bench", "bench")
DOC_CHUNKS = 100


def add_document(store: Store, texts: list[str], rng: np.random.Generator) -> int:
    """Store one indexed document with these chunk texts and random unit vectors."""
    vecs = rng.standard_normal((len(texts), DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    doc_id = store.insert_document(
        NewDocument(name=f"doc-{rng.integers(1 << 62)}", sha256="-", size=1)
    )
    chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(texts)]
    store.commit_indexed(
        doc_id, chunks, vecs, [0] * len(texts), canonical_text="", stamp=STAMP, window_splits=0
    )
    return doc_id


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    texts = synthetic_chunks(corpus_chunks(), args.chunks + 10 * args.rounds)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        for at in range(0, args.chunks, DOC_CHUNKS):
            add_document(store, texts[at : min(at + DOC_CHUNKS, args.chunks)], rng)
        indexes = DerivedIndexes(store, embedding_model=STAMP.embedding_model, dimensions=DIM)
        indexes.rebuild()
        extra = iter(texts[args.chunks :])
        print(f"{args.chunks:,} chunks; refresh after one change (wall s / CPU s)")
        print(f"{'change':<22}{'incremental':>16}{'full rebuild':>16}")
        for _ in range(args.rounds):
            for change in ("add 10 chunks", "remove 10 chunks"):
                if change.startswith("add"):
                    last = add_document(store, [next(extra) for _ in range(10)], rng)
                else:
                    store.delete_document(last)
                inc = timed(indexes.refresh)
                full = timed(indexes.rebuild)
                print(f"{change:<22}{inc[0]:>8.2f} /{inc[1]:>6.2f}{full[0]:>9.2f} /{full[1]:>6.2f}")


if __name__ == "__main__":
    main()
