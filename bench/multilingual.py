"""The multilingual preset's costs beside the default model's, measured in one run.

    query        embedder.encode_query(question) for the bundled set's questions,
                 the two models alternating question by question (p50, p95)
    bare         embedder.encode(chunk texts) of the set's corpus: the encoder alone
    bare+sent    the encoder over everything ingestion embeds: the chunk texts and
                 each chunk's sentences (index.ingest.sentences, a ranking signal),
                 and with a sparse head the chunk texts' latent terms (index.embed.latent)
    latent       the sparse head's pass over a question (encode_latent), which the
                 answer order makes once a question passes the gate
    ingestion    KnowledgeBase.ingest_paths(corpus) into a fresh data dir: reading,
                 chunking, language detection, both embeddings, SQLite, the indexes

Prints chunks per second of each and ingestion's share of each bare throughput
(the bar: >= 0.9x). The first ratio counts the sentence vectors as overhead; the
second shows what reading, detection, storage and indexing cost beyond the
encoder.

Run: python -m bench.multilingual [--set manpages-l10n] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.machine import describe as machine
from evaluation.set_check import bundled_sets
from index.config import IndexConfig
from index.embed import latent_encoder, load_embedder
from index.ingest.sentences import sentence_texts
from index.knowledge_base import KnowledgeBase

MODELS = ("bundled:all-MiniLM-L6-v2", "multilingual")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--set", default="manpages-l10n")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = bundled_sets()[args.set]
    rows = [json.loads(line) for line in (folder / "questions.jsonl").open(encoding="utf-8")]
    questions = [r[f"{p}_phrasing"] for r in rows for p in ("doc", "ticket")]
    print(f"# {args.set}: {len(questions)} questions; {machine()}")
    embedders = {m: load_embedder(IndexConfig(embedding_model=m)) for m in MODELS}
    for e in embedders.values():
        e.encode_query("warm up")
    times: dict[str, list[float]] = {m: [] for m in MODELS}
    heads = {m: h for m, e in embedders.items() if (h := latent_encoder(e)) is not None}
    latent: dict[str, list[float]] = {m: [] for m in heads}
    for _ in range(args.repeat):
        for q in questions:
            for model, embedder in embedders.items():
                t = time.perf_counter()
                embedder.encode_query(q)
                times[model].append((time.perf_counter() - t) * 1000)
                if model in heads:
                    t = time.perf_counter()
                    heads[model].encode_latent([q])
                    latent[model].append((time.perf_counter() - t) * 1000)
    for model, ms in times.items():
        print(f"query {model:<28} p50 {_pct(ms, 0.5):6.1f} ms  p95 {_pct(ms, 0.95):6.1f} ms")
    for model, ms in latent.items():
        print(f"latent {model:<27} p50 {_pct(ms, 0.5):6.1f} ms  p95 {_pct(ms, 0.95):6.1f} ms")
    for model, embedder in embedders.items():
        with tempfile.TemporaryDirectory() as tmp:
            config = IndexConfig(data_dir=Path(tmp), embedding_model=model, min_free_bytes=0)
            kb = KnowledgeBase(config, embedder=embedder)
            t = time.perf_counter()
            result = kb.ingest_paths([folder / "corpus"])
            ingested = result.chunks / (time.perf_counter() - t)
            rows = [c for d in kb.documents() for c in kb.store.chunk_rows(d.id)]
        texts = [c["text"] for c in rows]
        sentences = [s for c in rows for s in sentence_texts(c["text"], c["content"])]
        t = time.perf_counter()
        embedder.encode(texts)
        bare = len(texts) / (time.perf_counter() - t)
        t = time.perf_counter()
        embedder.encode(texts)
        embedder.encode(sorted(sentences, key=len))
        if model in heads:
            heads[model].encode_latent(texts)
        with_sentences = len(texts) / (time.perf_counter() - t)
        print(
            f"ingest {model:<27} bare {bare:6.1f} chunks/s  bare+sent {with_sentences:6.1f}"
            f"  ingestion {ingested:6.1f} chunks/s  ratio {ingested / bare:.2f}x"
            f" / {ingested / with_sentences:.2f}x  ({len(texts)} chunks, {len(sentences)} sentences)"
        )


if __name__ == "__main__":
    main()
