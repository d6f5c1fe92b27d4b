"""The refusal path with each encoder runtime, beside the bare FAISS scan, in one run.

The question embedding was most of the refusal path (docs/benchmarks.md); the
flat scan is the floor, since it reads every vector. Over the same snapshot
(``bench.query.build``: real chunk texts and embeddings, random unit vectors
past the bundled corpus), for each out-of-domain question, alternating the
runtimes within each round:

    embed         embedder.encode_query(question)
    refusal path  embed + the local engine's search as the engine asks for it
                  (the dense leg; BM25 and the fusion skipped when nothing is
                  within the looser threshold) + the gate and the related check
    with BM25     the same with both legs and the fusion always run (before the cutoff)
    faiss alone   the bare FAISS search of the same vector (the reference)

Runtimes: ``onnx`` (the product's), ``onnx-spin`` (ONNX Runtime's default
spin-waiting threads) and ``torch``. The query log's write is not included.

Prints p50/p95 per runtime and size, and the refusal path's excess over the
bare scan's p50 (the bar: <= 4 ms at 10k chunks, <= 6 ms at 100k).

Run: python -m bench.encoder [--sizes 10000,100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from bench.query import (
    BUNDLED,
    build,
    corpus_chunks,
    ood_questions,
    pct,
    snapshot_backend,
    synthetic_chunks,
    synthetic_vectors,
)
from core.config import DEFAULT_RELATED_THRESHOLD, DEFAULT_THRESHOLD
from core.gate import gate, related
from core.retrieve import LocalBackend
from index.embed import Embedder
from index.embed.onnx import OnnxEmbedder
from index.embed.pytorch import LocalEmbedder

BARS = {10_000: 4.0, 100_000: 6.0}
# MiniLM's (answer, related) thresholds: the gate the runtimes here are timed with.
MINILM_THRESHOLDS = (DEFAULT_THRESHOLD, DEFAULT_RELATED_THRESHOLD)


def time_size(
    n: int,
    real: list[str],
    real_vecs: np.ndarray,
    embedders: dict[str, Embedder],
    repeat: int,
    thresholds: tuple[float, float] = MINILM_THRESHOLDS,
) -> dict[str, dict[str, list[float]]]:
    """Milliseconds per stage and runtime over ``repeat`` rounds of the OOD questions.

    ``real_vecs`` are the embedders' model's vectors of ``real`` and ``thresholds``
    that model's gate, so the refusal path takes the turns it takes in the product.
    """
    snap = build(synthetic_chunks(real, n), synthetic_vectors(real_vecs, n))
    backend = snapshot_backend(snap)
    questions = ood_questions()
    first = next(iter(embedders.values()))
    # What the engine passes: nothing beyond both thresholds is shown (core.answer).
    cutoff = max(thresholds)
    refused = sum(_refuse(backend, first.encode_query(q), q, cutoff, thresholds) for q in questions)
    print(f"\n{n:,} chunks: {refused} of {len(questions)} questions refused outright", end="")
    print(f" (the others show related passages at <= {thresholds[1]})")
    stages = ("embed", "refusal path", "with BM25", "faiss alone")
    times = {name: {stage: [] for stage in stages} for name in embedders}
    for _ in range(repeat):
        for name, embedder in embedders.items():
            for q in questions:
                t0 = time.perf_counter()
                vector = embedder.encode_query(q)
                t1 = time.perf_counter()
                _refuse(backend, vector, q, cutoff, thresholds)
                t2 = time.perf_counter()
                _refuse(backend, vector, q, None, thresholds)
                t3 = time.perf_counter()
                snap.vectors.search(vector, 25)
                t4 = time.perf_counter()
                times[name]["embed"].append((t1 - t0) * 1000)
                times[name]["refusal path"].append((t2 - t0) * 1000)
                times[name]["with BM25"].append((t1 - t0 + t3 - t2) * 1000)
                times[name]["faiss alone"].append((t4 - t3) * 1000)
    return times


def _refuse(
    backend: LocalBackend,
    vector: np.ndarray,
    question: str,
    cutoff: float | None,
    thresholds: tuple[float, float],
) -> bool:
    """As the engine decides (core.answer): the gate, then the related passages; refused?"""
    candidates = backend.search(vector, question, None, 20, cutoff=cutoff)
    passed = gate(candidates, threshold=thresholds[0], top_k=4)
    return not passed and not related(candidates, related_threshold=thresholds[1])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="kb-bench-encoder-") as cache:
        embedders: dict[str, Embedder] = {
            "onnx": OnnxEmbedder(BUNDLED, Path(cache)),
            # ONNX Runtime's default: its threads spin-wait between operators.
            "onnx-spin": OnnxEmbedder(BUNDLED, Path(cache), spinning=True),
            "torch": LocalEmbedder(BUNDLED),
        }
        real = corpus_chunks()
        real_vecs = embedders["torch"].encode(real)
        for embedder in embedders.values():
            embedder.encode_query("warm up")
        for n in [int(s) for s in args.sizes.split(",")]:
            times = time_size(n, real, real_vecs, embedders, args.repeat)
            print(f"\n== {n:,} chunks ({len(times['onnx']['embed'])} questions per runtime)")
            print(f"{'runtime':<11}{'stage':<16}{'p50 ms':>9}{'p95 ms':>9}")
            for name, stages in times.items():
                for stage, values in stages.items():
                    print(f"{name:<11}{stage:<16}{pct(values, 50):>9.2f}{pct(values, 95):>9.2f}")
            for name, stages in times.items():
                excess = pct(stages["refusal path"], 50) - pct(stages["faiss alone"], 50)
                bar = BARS.get(n)
                verdict = "" if bar is None else f" (bar <= {bar:.0f} ms: {excess <= bar})"
                print(f"{name}: refusal path p50 - faiss p50 = {excess:.2f} ms{verdict}")


if __name__ == "__main__":
    main()
