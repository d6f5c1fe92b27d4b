"""How long a running `kb serve` takes to see what another process committed.

A data dir holds N chunks (default 10k: corpus sentences recombined, random
384-d unit vectors, stamped with the running embedding model so they are
searchable). `kb serve` runs on it as its own process. Then, alternately, a
real `kb ingest` adds one of the sample documents and a real `kb rm` removes
it, each as its own process. `/readyz` is polled every 10 ms throughout: the
time from the store's generation moving (the commit) to the server's snapshot
reaching it is the follow latency. Also reported: any `/readyz` answer that was
not 200, and the server's CPU time while nothing changes (the cost of following).

Run: python -m bench.follow [--chunks 10000] [--trials 10] [--sync-seconds 1.0]
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
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe as machine
from bench.query import corpus_chunks, synthetic_chunks
from index.config import IndexConfig
from index.knowledge_base import KnowledgeBase
from index.models import Chunk
from index.storage.store import NewDocument

SAMPLE = Path(__file__).resolve().parents[1] / "bot" / "sample" / "vpn.md"
DOC_CHUNKS = 100
POLL_S = 0.01
IDLE_S = 20.0


def seed(data_dir: Path, n_chunks: int) -> None:
    """Store ``n_chunks`` searchable chunks with random vectors, in documents of 100."""
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir))
    stamp = kb.stamp
    texts = synthetic_chunks(corpus_chunks(), n_chunks)
    rng = np.random.default_rng(0)
    for at in range(0, n_chunks, DOC_CHUNKS):
        batch = texts[at : at + DOC_CHUNKS]
        vecs = rng.standard_normal((len(batch), stamp.dimensions)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        doc_id = kb.store.insert_document(
            NewDocument(name=f"seed-{at}.md", sha256=f"seed-{at}", size=1)
        )
        chunks = [Chunk(i, 0, len(t), t, t, "") for i, t in enumerate(batch)]
        kb.store.commit_indexed(
            doc_id, chunks, vecs, [0] * len(batch), canonical_text="", stamp=stamp, window_splits=0
        )
    kb.search_index.rebuild()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`kb serve` on a loopback port, and a poller of its `/readyz`."""

    def __init__(self, data_dir: Path, sync_seconds: float) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "KB_DATA_DIR": str(data_dir),
            "KB_SYNC_SECONDS": str(sync_seconds),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--port", str(self.port)],
            env=env,
            cwd=data_dir.parent,
            stdout=subprocess.DEVNULL,
            stderr=open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "w"),  # noqa: SIM115
        )
        self.not_ready: list[Any] = []

    def readyz(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body: dict[str, Any] = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
            self.not_ready.append(body)
        return body

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.readyz().get("ready"):
                    self.not_ready.clear()  # start-up does not count
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        raise SystemExit("kb serve did not become ready")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def follow(server: Server, data_dir: Path, *args: str) -> tuple[float, float]:
    """Run ``kb ARGS``; (seconds from its last commit to the server having it, command seconds)."""
    env = {**os.environ, "KB_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}
    # When each generation was first seen in the store, and in the server's snapshot.
    first_seen: dict[int, float] = {}
    caught_up: dict[int, float] = {}
    started = time.monotonic()
    done = threading.Event()

    def run() -> None:
        subprocess.run(
            [sys.executable, "-m", "bot.cli", *args],
            env=env,
            cwd=data_dir.parent,
            check=True,
            capture_output=True,
        )
        done.set()

    worker = threading.Thread(target=run)
    worker.start()
    while True:
        index = server.readyz()["index"]
        now = time.monotonic()
        first_seen.setdefault(index["generation"], now)
        caught_up.setdefault(index["snapshot_generation"], now)
        if done.is_set() and index["lag"] == 0 and len(first_seen) > 1:
            worker.join()
            final = index["generation"]
            return caught_up[final] - first_seen[final], now - started
        time.sleep(POLL_S)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--sync-seconds", type=float, default=1.0)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        seed(data_dir, args.chunks)
        server = Server(data_dir, args.sync_seconds)
        try:
            server.wait_ready()
            cpu0 = server.cpu_seconds()
            time.sleep(IDLE_S)
            idle_cpu = (server.cpu_seconds() - cpu0) / IDLE_S
            latencies: dict[str, list[float]] = {"kb ingest": [], "kb rm": []}
            for _ in range(args.trials):
                took, _ = follow(server, data_dir, "ingest", str(SAMPLE))
                latencies["kb ingest"].append(took)
                took, _ = follow(server, data_dir, "rm", SAMPLE.name)
                latencies["kb rm"].append(took)
        finally:
            server.stop()
    print(
        f"{args.chunks:,} chunks, KB_SYNC_SECONDS={args.sync_seconds}, {args.trials} trials; "
        "seconds from the commit to the server's snapshot having it"
    )
    print(f"{'command':<12}{'median':>10}{'max':>10}{'min':>10}")
    for name, values in latencies.items():
        print(
            f"{name:<12}{statistics.median(values):>10.2f}{max(values):>10.2f}{min(values):>10.2f}"
        )
    print(f"/readyz answers other than 200 during the trials: {len(server.not_ready)}")
    print(f"server CPU while idle (following only): {idle_cpu * 100:.2f} % of one core")


if __name__ == "__main__":
    main()
