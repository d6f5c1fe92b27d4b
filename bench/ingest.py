"""Ingestion throughput: the full pipeline versus bare ``SentenceTransformer.encode``.

Both sides embed exactly the same texts (the bundled evaluation corpus,
chunked by the product's chunker: every chunk's text, then its sentences'
texts as ``index.sentences`` makes them, shortest first), alternately, several
rounds, in one run:

    bare     model.encode(texts, batch_size=64, normalize_embeddings=True)
    pipeline KnowledgeBase.ingest_paths(corpus) into a fresh data dir:
             extract + chunk (with token-window checks) + embed + SQLite + FAISS/BM25

Prints chunks/s medians, the ratio pipeline/bare (target >= 0.9), and the
process's peak resident memory.

Run: python -m bench.ingest [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.machine import describe as machine
from bench.query import EVALSET
from index.chunk import chunk_document
from index.config import IndexConfig
from index.embed import DEFAULT_BATCH_SIZE, LocalEmbedder
from index.extract import extract
from index.knowledge_base import KnowledgeBase
from index.sentences import sentence_texts


def corpus_texts(corpus: Path) -> tuple[list[str], list[str]]:
    """The embedded texts of every chunk of the corpus, and of their sentences (shortest first)."""
    texts: list[str] = []
    sentences: list[str] = []
    for path in sorted(corpus.iterdir()):
        chunks = chunk_document(extract(path.read_bytes(), path.name)).chunks
        texts += [c.text for c in chunks]
        sentences += [s for c in chunks for s in sentence_texts(c.text, c.content)]
    return texts, sorted(sentences, key=len)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    corpus = EVALSET / "corpus"
    print(f"machine: {machine()}")
    embedder = LocalEmbedder("bundled:all-MiniLM-L6-v2")
    model = embedder._model
    texts, sentences = corpus_texts(corpus)
    model.encode(texts[:64], batch_size=DEFAULT_BATCH_SIZE)  # warm-up
    print(
        f"corpus: {len(list(corpus.iterdir()))} documents, {len(texts)} chunks, "
        f"{len(sentences)} sentence texts"
    )
    bare: list[float] = []
    pipe: list[float] = []
    for r in range(args.rounds):
        t = time.perf_counter()
        for batch in (texts, sentences):
            model.encode(
                batch,
                batch_size=DEFAULT_BATCH_SIZE,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        bare.append(len(texts) / (time.perf_counter() - t))
        with tempfile.TemporaryDirectory() as tmp:
            kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp)), embedder=embedder)
            t = time.perf_counter()
            summary = kb.ingest_paths([corpus])
            elapsed = time.perf_counter() - t
            assert summary.chunks == len(texts), (summary.chunks, len(texts))
            pipe.append(summary.chunks / elapsed)
        print(f"round {r + 1}: bare {bare[-1]:.1f} chunks/s, pipeline {pipe[-1]:.1f} chunks/s")
    b, p = statistics.median(bare), statistics.median(pipe)
    print(f"\nmedian bare encode : {b:.1f} chunks/s")
    print(f"median pipeline    : {p:.1f} chunks/s")
    print(f"ratio pipeline/bare: {p / b:.2f}x (target >= 0.9)")
    print(f"peak RSS           : {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
