"""What ``kb serve`` costs to hold and to start, with each encoder runtime, side by side.

For each knowledge-base size (empty, 10k and 100k chunks) a data dir is filled
once: chunk texts recombine the bundled evaluation corpus's real sentences
(``bench.query.synthetic_chunks``), vectors are random unit vectors (memory and
the flat scan do not depend on their values), stamped as the running
configuration stamps documents, so the server loads every chunk (the
multilingual preset gets a data dir of its own, stamped for its model). Then, in
rounds alternating the configurations (``onnx`` and ``torch``: MiniLM on each
runtime; ``multilingual``: the multilingual preset), ``kb serve`` starts on it (Slack off), and this
measures:

    start-to-ready  seconds from the process's start to ``/readyz`` answering 200
                    (warm: the index files and the ONNX export already exist)
    RSS             the server's resident memory at that moment (VmRSS)

and, in a child process of its own at the largest size, the memory of the
FAISS flat index and of the BM25 postings (resident growth while each is
built, and the bytes of their arrays), beside the server's growth from the
empty knowledge base: a copy of the vectors held twice would show there.

Run: python -m bench.footprint [--sizes 10000,100000] [--rounds 3] [--runtimes onnx,multilingual]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from bench.query import corpus_chunks, synthetic_chunks

# Each configuration: its settings for ``kb serve`` and the embedding model its data
# dir is stamped with (a data dir stamped for another model would not be loaded).
CONFIGS: dict[str, tuple[dict[str, str], str]] = {
    "onnx": ({"KB_ENCODER_RUNTIME": "onnx"}, "bundled:all-MiniLM-L6-v2"),
    "torch": ({"KB_ENCODER_RUNTIME": "torch"}, "bundled:all-MiniLM-L6-v2"),
    "multilingual": ({"KB_EMBEDDING_MODEL": "multilingual"}, "multilingual"),
}
RUNTIMES = tuple(CONFIGS)
DIM = 384
DOC_CHUNKS = 1000
READY_TIMEOUT_S = 600.0


def fill(data_dir: Path, n: int, cache: Path, model: str = "bundled:all-MiniLM-L6-v2") -> None:
    """A data dir of ``n`` searchable chunks in documents of ``DOC_CHUNKS``, stamped for ``model``."""
    from index.config import IndexConfig
    from index.embed import load_embedder
    from index.knowledge_base import KnowledgeBase
    from index.models import EVERYONE, Chunk
    from index.storage.store import NewDocument

    config = IndexConfig(data_dir=data_dir, encoder_cache=cache, embedding_model=model)
    kb = KnowledgeBase(config, embedder=load_embedder(config))
    texts = synthetic_chunks(corpus_chunks(), n)
    rng = np.random.default_rng(n)
    for start in range(0, n, DOC_CHUNKS):
        part = texts[start : start + DOC_CHUNKS]
        vecs = rng.standard_normal((len(part), DIM)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        name = f"doc-{start // DOC_CHUNKS}"
        doc = kb.store.insert_document(NewDocument(name=name, sha256=name, size=1, scope=EVERYONE))
        chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(part)]
        kb.store.commit_indexed(
            doc,
            chunks,
            vecs,
            [1] * len(part),
            canonical_text="",
            stamp=kb.stamp,
            window_splits=0,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(port: int) -> int | None:
    """The chunks ``/readyz`` says the server searches once it is ready; ``None`` before."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            if resp.status != 200:
                return None
            return int(json.load(resp)["chunks"])
    except OSError:
        return None


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def serve_once(data_dir: Path, runtime: str, cache: Path) -> tuple[float, float, int]:
    """``(seconds to ready, RSS MB at ready, chunks it searches)`` of one ``kb serve`` start."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "SLACK_", "OPENAI_"))}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "KB_DATA_DIR": str(data_dir),
        "KB_ENCODER_CACHE": str(cache),
        "KB_LOG_LEVEL": "WARNING",
        **CONFIGS[runtime][0],
    }
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--port", str(port)],
        env=env,
        cwd=data_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while (chunks := _ready(port)) is None:
            if proc.poll() is not None or time.perf_counter() - t > READY_TIMEOUT_S:
                raise RuntimeError(f"kb serve ({runtime}) did not become ready on {data_dir}")
            time.sleep(0.05)
        return time.perf_counter() - t, _rss_mb(proc.pid), chunks
    finally:
        proc.terminate()
        proc.wait(timeout=60)


_INDEX_MEMORY = """
import json, sys, numpy as np
from bench.footprint import rss_mb_self
from bench.query import corpus_chunks, synthetic_chunks
from index.search.bm25 import BM25Index
from index.search.vectors import VectorIndex
n = int(sys.argv[1])
texts = synthetic_chunks(corpus_chunks(), n)
vecs = np.random.default_rng(1).standard_normal((n, 384)).astype(np.float32)
vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
ids = np.arange(1, n + 1, dtype=np.int64)
base = rss_mb_self()
vi = VectorIndex(384); vi.add(ids, vecs); del vecs
faiss_mb = rss_mb_self() - base
base = rss_mb_self()
bm = BM25Index(ids.tolist(), texts)
bm25_mb = rss_mb_self() - base
arrays = sum(a.nbytes for a in vars(bm).values() if isinstance(a, np.ndarray)) / 2**20
print(json.dumps({"faiss_rss": faiss_mb, "faiss_bytes": vi.ntotal * 384 * 4 / 2**20,
                  "bm25_rss": bm25_mb, "bm25_arrays": arrays}))
"""


def rss_mb_self() -> float:
    """This process's resident memory, in MB."""
    return _rss_mb(os.getpid())


def index_memory(n: int) -> dict[str, float]:
    """Memory of the FAISS flat index and the BM25 postings over ``n`` chunks (own process)."""
    done = subprocess.run(
        [sys.executable, "-c", _INDEX_MEMORY, str(n)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(
    sizes: list[int], runtimes: list[str], rounds: int = 3
) -> dict[tuple[str, int], tuple[float, float, int]]:
    """Per ``(runtime, size)``: the medians of ``rounds`` warm starts, ``(ready s, RSS MB)``,
    and the fewest chunks a start said it searches (a data dir it did not load shows 0)."""
    with tempfile.TemporaryDirectory(prefix="kb-bench-footprint-") as tmp:
        root = Path(tmp)
        cache = root / "encoders"
        dirs: dict[tuple[str, int], Path] = {}
        for n in sizes:
            for model in dict.fromkeys(CONFIGS[r][1] for r in runtimes):
                folder = root / f"kb-{n}-{len(dirs)}" / "kb-data"
                folder.parent.mkdir()
                fill(folder, n, cache, model)
                dirs[(model, n)] = folder
            for runtime in runtimes:  # first starts: index files and the export are made
                serve_once(dirs[(CONFIGS[runtime][1], n)], runtime, cache)
        runs: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
        for _ in range(rounds):
            for n in sizes:
                for runtime in runtimes:
                    folder = dirs[(CONFIGS[runtime][1], n)]
                    runs.setdefault((runtime, n), []).append(serve_once(folder, runtime, cache))
    return {
        key: (
            statistics.median(r[0] for r in starts),
            statistics.median(r[1] for r in starts),
            min(r[2] for r in starts),
        )
        for key, starts in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help="of: " + ", ".join(RUNTIMES))
    args = ap.parse_args()
    sizes = [0, *(int(s) for s in args.sizes.split(","))]
    runtimes = [r for r in args.runtimes.split(",") if r]
    print(f"machine: {machine()}")
    starts = measure(sizes, runtimes, args.rounds)
    print(f"\nkb serve, warm start, medians of {args.rounds} rounds (Slack off)")
    print(f"{'chunks':>8} {'runtime':>13} {'ready s':>9} {'RSS MB':>8} {'searched':>9}")
    for n in sizes:
        for runtime in runtimes:
            ready, rss, searched = starts[(runtime, n)]
            print(f"{n:>8,} {runtime:>13} {ready:>9.2f} {rss:>8.0f} {searched:>9,}")
    largest = sizes[-1]
    mem = index_memory(largest)
    for runtime in runtimes:
        grown = starts[(runtime, largest)][1] - starts[(runtime, 0)][1]
        print(f"server growth 0 -> {largest:,} chunks ({runtime}): {grown:.0f} MB")
    print(
        f"at {largest:,} chunks: FAISS flat {mem['faiss_rss']:.0f} MB resident "
        f"({mem['faiss_bytes']:.0f} MB of vectors); BM25 {mem['bm25_rss']:.0f} MB resident "
        f"({mem['bm25_arrays']:.0f} MB of postings arrays)"
    )


if __name__ == "__main__":
    main()
