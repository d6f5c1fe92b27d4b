"""Ingestion throughput of both encoder runtimes: the full pipeline versus bare encoding.

Every side embeds exactly the same texts (the bundled evaluation corpus,
chunked by the product's chunker: every chunk's text, then its sentences'
texts as ``index.ingest.sentences`` makes them, shortest first), alternately, several
rounds, in one run, for ONNX Runtime and PyTorch:

    bare     embedder.encode(texts, batch_size=64): PyTorch through
             SentenceTransformer.encode, ONNX Runtime in length-sorted batches
    pipeline KnowledgeBase.ingest_paths(corpus) into a fresh data dir:
             extract + chunk (with token-window checks) + embed + SQLite + FAISS/BM25

Prints chunks/s medians per runtime, the ratio pipeline/bare (target >= 0.9),
ONNX/PyTorch, and the process's peak resident memory (both models loaded).

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
from bench.query import BUNDLED, EVALSET
from index.config import IndexConfig
from index.embed import DEFAULT_BATCH_SIZE, Embedder
from index.embed.onnx import OnnxEmbedder
from index.embed.pytorch import LocalEmbedder
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from index.ingest.sentences import sentence_texts
from index.knowledge_base import KnowledgeBase


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
    with tempfile.TemporaryDirectory(prefix="kb-bench-ingest-") as cache:
        embedders: dict[str, Embedder] = {
            "onnx": OnnxEmbedder(BUNDLED, Path(cache)),
            "torch": LocalEmbedder(BUNDLED),
        }
        texts, sentences = corpus_texts(corpus)
        for embedder in embedders.values():
            embedder.encode(texts[:64], batch_size=DEFAULT_BATCH_SIZE)  # load + warm-up
        print(
            f"corpus: {len(list(corpus.iterdir()))} documents, {len(texts)} chunks, "
            f"{len(sentences)} sentence texts"
        )
        bare: dict[str, list[float]] = {name: [] for name in embedders}
        pipe: dict[str, list[float]] = {name: [] for name in embedders}
        for r in range(args.rounds):
            for name, embedder in embedders.items():
                t = time.perf_counter()
                for batch in (texts, sentences):
                    embedder.encode(batch, batch_size=DEFAULT_BATCH_SIZE)
                bare[name].append(len(texts) / (time.perf_counter() - t))
                pipe[name].append(pipeline_rate(corpus, embedder, len(texts)))
                print(
                    f"round {r + 1} {name:>5}: bare {bare[name][-1]:.1f} chunks/s, "
                    f"pipeline {pipe[name][-1]:.1f} chunks/s"
                )
    print(f"\n{'chunks/s (median)':<20}{'bare':>8}{'pipeline':>10}{'ratio':>7}")
    for name in embedders:
        b, p = statistics.median(bare[name]), statistics.median(pipe[name])
        print(f"{name:<20}{b:>8.1f}{p:>10.1f}{p / b:>7.2f}")
    ratio = statistics.median(pipe["onnx"]) / statistics.median(pipe["torch"])
    print(f"pipeline onnx/torch : {ratio:.2f}x")
    print(f"peak RSS           : {peak_rss_mb():.0f} MB")


def pipeline_rate(corpus: Path, embedder: Embedder, expected: int) -> float:
    """Chunks/s of one ingestion of ``corpus`` into a fresh data dir."""
    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp)), embedder=embedder)
        t = time.perf_counter()
        summary = kb.ingest_paths([corpus])
        elapsed = time.perf_counter() - t
    assert summary.chunks == expected, (summary.chunks, expected)
    return summary.chunks / elapsed


if __name__ == "__main__":
    main()
