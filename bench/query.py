"""Query-path latency at 1k, 10k and 100k chunks, with FAISS alone and rank-bm25 as references.

Times the local engine (``LocalSearchIndex``) over a snapshot built here, and
its parts, so it reaches past ``SearchIndex`` on purpose.

Chunk texts are real: the bundled evaluation corpus, chunked by the product's
chunker; larger sizes are made of new chunks that recombine the corpus's real
sentences. Vectors are the real embeddings at 1k and random unit vectors above
(the cost of a flat inner-product scan does not depend on the values).

Measured per query, over the out-of-domain questions (they exercise the whole
refusal path: embed, both legs, fusion, gate, nothing kept):

    embed | dense (FAISS via the backend) | bm25 | fusion+gate | whole refusal path
    + references: bare FAISS search, rank-bm25 BM25Okapi.get_scores

and, up to 10k chunks, what an *answered* question adds after the gate: its 20
candidates' sentence vectors read from SQLite and their order
(``Store.sentence_vectors`` + ``core.retrieve.sentence_order``; random unit
sentence vectors, 3 per chunk, in a real data dir), that order with term
proximity as the engine runs it (``core.retrieve.answer_order``: the
candidates' texts read and analysed too), and the rows of three
passages listed beside the answer (``core.gate.beside_answer``'s worst case).
The refusal path never runs either.

Run: python -m bench.query [--sizes 1000,10000,100000] [--repeat 3]

``--engine qdrant`` times the product's search (``SearchIndex.search``, both
legs, fusion, distances) side by side on one store of synthetic chunks (as
above, one data dir per size): the local engine, Qdrant's in-process engine
(Edge) exact and through HNSW (m = 16, ef_construct = 100, built by its
optimizer before timing), and qdrant-client's local mode (pure Python, only
up to ``--local-mode-max`` chunks). Each engine's build (``open``) is timed too.

``--agreement`` indexes the bundled set with the product's ingestion and
counts, per question (both phrasings and the out-of-domain ones), whether
each Qdrant engine's top 4 equals the local engine's.

Run: python -m bench.query --engine qdrant --sizes 10000,100000 --repeat 3
     python -m bench.query --agreement

Questions embed with the product's default runtime (ONNX Runtime);
``--runtime torch`` uses PyTorch. ``python -m bench.encoder`` runs both
runtimes side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from core.config import DEFAULT_PROXIMITY_WEIGHT, DEFAULT_SENTENCE_WEIGHT, DEFAULT_THRESHOLD
from core.gate import gate
from core.retrieve import FUSION, Candidate, LocalBackend, answer_order, fuse, sentence_order
from index.embed import Embedder
from index.embed.onnx import OnnxEmbedder
from index.embed.pytorch import LocalEmbedder
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from index.models import EVERYONE, Chunk
from index.records import Stamp
from index.search.bm25 import BM25Index
from index.search.derived import Snapshot
from index.search.vectors import VectorIndex
from index.storage.store import NewDocument, Store

BUNDLED = "bundled:all-MiniLM-L6-v2"
EVALSET = Path(__file__).resolve().parents[1] / "evaluation" / "sets" / "pip-black"


def corpus_chunks() -> list[str]:
    """Embedded texts of the bundled corpus's chunks."""
    texts = []
    for path in sorted((EVALSET / "corpus").iterdir()):
        doc = extract(path.read_bytes(), path.name)
        texts += [c.text for c in chunk_document(doc).chunks]
    return texts


def synthetic_chunks(real: list[str], n: int, seed: int = 7) -> list[str]:
    """``n`` chunk texts: the real ones, then recombinations of real sentences."""
    rng = random.Random(seed)
    sentences = [s for t in real for s in re.split(r"(?<=[.!?])\s+", t) if len(s) > 20]
    out = list(real[:n])
    while len(out) < n:
        k = rng.randint(2, 5)
        out.append(" ".join(rng.choice(sentences) for _ in range(k)))
    return out


def ood_questions() -> list[str]:
    """The bundled out-of-domain questions."""
    lines = (EVALSET / "ood.jsonl").read_text().splitlines()
    return [json.loads(line)["question"] for line in lines if line.strip()]


class _Indexes:
    def __init__(self, snap: Snapshot) -> None:
        self.snapshot = snap


def snapshot_backend(snap: Snapshot) -> LocalBackend:
    """The engine's local search over ``snap`` alone (no store, no derived-index files)."""
    return LocalBackend(_Indexes(snap))  # type: ignore[arg-type]


def build(texts: list[str], vectors: np.ndarray) -> Snapshot:
    """A search snapshot over ``texts`` with ``vectors``."""
    ids = np.arange(1, len(texts) + 1, dtype=np.int64)
    vi = VectorIndex(vectors.shape[1])
    vi.add(ids, vectors)
    bm = BM25Index(ids.tolist(), texts)
    return Snapshot(vi, bm, ids, np.array([EVERYONE] * len(texts), dtype=object), 0)


def pct(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` in ms."""
    return float(np.percentile(np.array(values), q))


SENTENCES_PER_CHUNK = 3
SENTENCE_STORE_MAX = 10_000


def sentence_store(tmp: Path, texts: list[str], vecs: np.ndarray) -> tuple[Store, list[int]]:
    """A data dir holding the chunks with random sentence vectors, and their chunk ids."""
    store = Store(tmp)
    doc = store.insert_document(NewDocument(name="bench", sha256="bench", size=1, scope=EVERYONE))
    rng = np.random.default_rng(len(texts))
    dim = vecs.shape[1]
    sentences = []
    for _ in texts:
        m = rng.standard_normal((SENTENCES_PER_CHUNK, dim)).astype(np.float32)
        sentences.append(m / np.linalg.norm(m, axis=1, keepdims=True))
    chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(texts)]
    ids = store.commit_indexed(
        doc,
        chunks,
        vecs,
        [1] * len(texts),
        canonical_text="",
        stamp=Stamp("bench", dim, "bench", "bench"),
        window_splits=0,
        sentence_vectors=sentences,
    )
    return store, ids


def run_size(
    n: int, real: list[str], real_vecs: np.ndarray, embedder: Embedder, repeat: int
) -> dict[str, dict[str, float]]:
    texts = synthetic_chunks(real, n)
    if n <= len(real):
        vecs = real_vecs[:n]
    else:
        rng = np.random.default_rng(n)
        extra = rng.standard_normal((n - len(real), real_vecs.shape[1])).astype(np.float32)
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        vecs = np.vstack([real_vecs, extra])
    snap = build(texts, vecs)
    backend = snapshot_backend(snap)
    from rank_bm25 import BM25Okapi

    from index.search.tokens import tokenize

    okapi = BM25Okapi([tokenize(t) for t in texts])
    faiss_index = snap.vectors
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "embed",
            "dense",
            "bm25",
            "fusion+gate",
            "refusal path",
            "ref: faiss alone",
            "ref: rank-bm25 get_scores",
            "answered: sentence order",
            "answered: order + proximity",
            "answered: 3 passages beside",
        )
    }
    tmp = tempfile.TemporaryDirectory(prefix="kb-bench-query-")
    store, store_ids = (
        sentence_store(Path(tmp.name), texts, vecs) if n <= SENTENCE_STORE_MAX else (None, [])
    )
    questions = ood_questions()
    for _ in range(repeat):
        for q in questions:
            t0 = time.perf_counter()
            v = embedder.encode_query(q)
            t1 = time.perf_counter()
            dense = snap.vectors.search(v, 25)
            t2 = time.perf_counter()
            sparse = snap.bm25.search(q, 25)
            t3 = time.perf_counter()
            fused = fuse(dense, sparse, FUSION)[:20]
            dist = dict(dense)
            missing = [c for c, _ in fused if c not in dist]
            dist.update(snap.vectors.distances_for(v, missing))
            gate([Candidate(c, dist[c], s) for c, s in fused], threshold=DEFAULT_THRESHOLD, top_k=4)
            t4 = time.perf_counter()
            # the whole path exactly as the engine runs it
            t5 = time.perf_counter()
            cands = backend.search(embedder.encode_query(q), q, None, 20)
            gate(cands, threshold=DEFAULT_THRESHOLD, top_k=4)
            t6 = time.perf_counter()
            faiss_index.search(v, 25)
            t7 = time.perf_counter()
            if n <= 10_000 or len(times["ref: rank-bm25 get_scores"]) < 10:
                okapi.get_scores(tokenize(q))
                t8 = time.perf_counter()
                times["ref: rank-bm25 get_scores"].append((t8 - t7) * 1000)
            if store is not None:
                pool = [Candidate(store_ids[c], dist[c], s) for c, s in fused]
                t8 = time.perf_counter()
                found = store.sentence_vectors([c.chunk_id for c in pool])
                ordered = sentence_order(pool, v, found, 0.5)
                times["answered: sentence order"].append((time.perf_counter() - t8) * 1000)
                # What the engine runs: the same leg and term proximity (texts read too).
                t8 = time.perf_counter()
                answer_order(
                    pool,
                    v,
                    q,
                    store,
                    sentence_weight=DEFAULT_SENTENCE_WEIGHT,
                    proximity_weight=DEFAULT_PROXIMITY_WEIGHT,
                )
                times["answered: order + proximity"].append((time.perf_counter() - t8) * 1000)
                # The worst case: three of the answer's first four are listed beside it.
                t9 = time.perf_counter()
                store.chunks_by_id([c.chunk_id for c in ordered[1:4]])
                times["answered: 3 passages beside"].append((time.perf_counter() - t9) * 1000)
            for key, a, b in (
                ("embed", t0, t1),
                ("dense", t1, t2),
                ("bm25", t2, t3),
                ("fusion+gate", t3, t4),
                ("refusal path", t5, t6),
                ("ref: faiss alone", t6, t7),
            ):
                times[key].append((b - a) * 1000)
    tmp.cleanup()
    return {k: {"p50": pct(v, 50), "p95": pct(v, 95), "n": len(v)} for k, v in times.items() if v}


def engine_store(tmp: Path, texts: list[str], vecs: np.ndarray, model: str) -> Store:
    """A data dir holding ``texts`` with ``vecs`` as one indexed document of ``model``."""
    store = Store(tmp)
    doc = store.insert_document(NewDocument(name="bench", sha256="bench", size=1, scope=EVERYONE))
    chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(texts)]
    store.commit_indexed(
        doc,
        chunks,
        vecs,
        [1] * len(texts),
        canonical_text="",
        stamp=Stamp(model, vecs.shape[1], "bench", "bench"),
        window_splits=0,
    )
    return store


def engines_side_by_side(
    n: int,
    real: list[str],
    real_vecs: np.ndarray,
    embedder: Embedder,
    repeat: int,
    local_mode_max: int,
) -> dict[str, dict[str, float]]:
    """Build time and search latency of each engine over one store of ``n`` chunks."""
    from index.search import open_search_index
    from index.search.contract import SearchIndex
    from index.search.qdrant.client import ClientEngine
    from index.search.qdrant.edge import EdgeEngine
    from index.search.qdrant.index import QdrantSearchIndex

    texts, vecs = synthetic_chunks(real, n), synthetic_vectors(real_vecs, n)
    tmp = tempfile.TemporaryDirectory(prefix="kb-bench-engines-")
    store = engine_store(Path(tmp.name) / "kb", texts, vecs, "bench")
    edge = EdgeEngine(Path(tmp.name) / "edge", exact=True)
    engines: dict[str, SearchIndex] = {
        "local (FAISS + BM25)": open_search_index(store, embedding_model="bench", dimensions=384),
        "qdrant edge exact": QdrantSearchIndex(
            store, embedding_model="bench", dimensions=384, engine=edge
        ),
    }
    if n <= local_mode_max:
        from qdrant_client import QdrantClient

        client = ClientEngine(QdrantClient(path=str(Path(tmp.name) / "client")), indexed=False)
        engines["qdrant client local mode"] = QdrantSearchIndex(
            store, embedding_model="bench", dimensions=384, engine=client
        )
    out: dict[str, dict[str, float]] = {}
    built: dict[str, float] = {}
    for name, index in engines.items():
        t0 = time.perf_counter()
        index.open()
        built[name] = time.perf_counter() - t0
    alias = engines["qdrant edge exact"].alias  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    edge.optimize(alias)  # the HNSW graphs, so that exact=False uses them
    built["qdrant edge hnsw"] = built["qdrant edge exact"] + time.perf_counter() - t0
    questions = ood_questions()
    vectors = [embedder.encode_query(q) for q in questions]
    runs = [*engines.items(), ("qdrant edge hnsw", engines["qdrant edge exact"])]
    for name, index in runs:
        edge.exact = name != "qdrant edge hnsw"
        times = []
        for _ in range(repeat):
            for q, v in zip(questions, vectors, strict=True):
                t0 = time.perf_counter()
                index.search(v, q, None, 20)
                times.append((time.perf_counter() - t0) * 1000)
        out[name] = {"build s": built[name], "p50": pct(times, 50), "p95": pct(times, 95)}
    edge.close()
    tmp.cleanup()
    return out


def synthetic_vectors(real_vecs: np.ndarray, n: int) -> np.ndarray:
    """``n`` chunk vectors: the real ones, then random unit vectors (seeded by ``n``)."""
    if n <= len(real_vecs):
        return real_vecs[:n]
    rng = np.random.default_rng(n)
    extra = rng.standard_normal((n - len(real_vecs), real_vecs.shape[1])).astype(np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    return np.vstack([real_vecs, extra])


def top4_agreement(embedder: Embedder) -> dict[str, tuple[int, int]]:
    """Per Qdrant engine: (questions whose top 4 equals the local engine's, questions)."""
    from index.config import IndexConfig
    from index.knowledge_base import KnowledgeBase
    from index.search.qdrant.index import QdrantSearchIndex

    tmp = tempfile.TemporaryDirectory(prefix="kb-bench-agreement-")
    kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp.name)), embedder=embedder)
    kb.ingest_paths([EVALSET / "corpus"])
    rows = [json.loads(line) for line in (EVALSET / "questions.jsonl").read_text().splitlines()]
    questions = [r[k] for r in rows for k in ("doc_phrasing", "ticket_phrasing")]
    questions += ood_questions()
    out: dict[str, tuple[int, int]] = {}
    for url in ("", "edge"):
        other = QdrantSearchIndex(
            kb.store, embedding_model=embedder.name, dimensions=embedder.dim, url=url
        )
        other.open()
        same = 0
        for q in questions:
            v = embedder.encode_query(q)
            mine = [c.chunk_id for c in other.search(v, q, None, 4)]
            same += mine == [c.chunk_id for c in kb.search_index.search(v, q, None, 4)]
        out[url or "client local mode"] = (same, len(questions))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engine", choices=("local", "qdrant"), default="local")
    ap.add_argument("--local-mode-max", type=int, default=10_000)
    ap.add_argument("--agreement", action="store_true")
    ap.add_argument("--runtime", choices=("onnx", "torch"), default="onnx")
    args = ap.parse_args()
    print(f"machine: {machine()}, encoder runtime {args.runtime}")
    cache = tempfile.TemporaryDirectory(prefix="kb-bench-query-")
    embedder: Embedder = (
        OnnxEmbedder(BUNDLED, Path(cache.name))
        if args.runtime == "onnx"
        else LocalEmbedder(BUNDLED)
    )
    if args.agreement:
        for name, (same, total) in top4_agreement(embedder).items():
            print(f"{name:<20} top 4 equal to the local engine's: {same}/{total}")
        return
    real = corpus_chunks()
    real_vecs = embedder.encode(real)
    print(f"real chunks from the bundled corpus: {len(real)}")
    if args.engine == "qdrant":
        for n in [int(s) for s in args.sizes.split(",")]:
            side = engines_side_by_side(
                n, real, real_vecs, embedder, args.repeat, args.local_mode_max
            )
            print(f"\n== {n:,} chunks: SearchIndex.search, k = 20")
            print(f"{'engine':<28}{'build s':>10}{'p50 ms':>10}{'p95 ms':>10}")
            for k, v in side.items():
                print(f"{k:<28}{v['build s']:>10.1f}{v['p50']:>10.2f}{v['p95']:>10.2f}")
        return
    for n in [int(s) for s in args.sizes.split(",")]:
        res = run_size(n, real, real_vecs, embedder, args.repeat)
        print(f"\n== {n:,} chunks")
        print(f"{'stage':<28}{'p50 ms':>10}{'p95 ms':>10}")
        for k, v in res.items():
            print(f"{k:<28}{v['p50']:>10.2f}{v['p95']:>10.2f}")
        bm = res["bm25"]["p50"]
        ref = res["ref: rank-bm25 get_scores"]["p50"]
        print(f"bm25 speed-up over rank-bm25 get_scores: {ref / bm:.1f}x")


if __name__ == "__main__":
    main()
