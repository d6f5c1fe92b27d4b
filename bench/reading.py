"""What reading documents in a reader process costs honest ingestion, side by side.

Alternately, several rounds, in one run, on the bundled evaluation corpus with
the ONNX encoder:

    in-process  IndexConfig(extract=None): ``extract`` in the ingesting process
    reader      IndexConfig() (the product's default): every document read in a
                reader process within KB_EXTRACT_MEMORY_MB and KB_EXTRACT_TIMEOUT

each a full ``KnowledgeBase.ingest_paths`` into a fresh data dir (the readers
are started before the first round: their start-up is paid once per process,
not per document). Also the reading alone: ``extract`` of every document in
this process versus a round trip through a reader.

Prints documents/s and chunks/s medians and the ratio reader/in-process
(target >= 0.95), and the ingesting process's peak resident memory.

Run: python -m bench.reading [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.ingest import peak_rss_mb
from bench.machine import describe as machine
from bench.query import BUNDLED, EVALSET
from index.config import ExtractLimits, IndexConfig
from index.embed.onnx import OnnxEmbedder
from index.ingest.extract import extract
from index.ingest.isolated import read_isolated
from index.knowledge_base import KnowledgeBase

SIDES: dict[str, ExtractLimits | None] = {"in-process": None, "reader": ExtractLimits()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    corpus = EVALSET / "corpus"
    files = [(p.name, p.read_bytes()) for p in sorted(corpus.iterdir())]
    print(f"machine: {machine()}")
    print(f"corpus: {len(files)} documents, {sum(len(d) for _, d in files) / 1e6:.1f} MB")
    read_isolated(
        b"# warm\n\nup\n", "warm.md", limits=ExtractLimits(), max_bytes=10**6, max_pages=1
    )
    with tempfile.TemporaryDirectory(prefix="kb-bench-reading-") as cache:
        embedder = OnnxEmbedder(BUNDLED, Path(cache))
        embedder.encode(["warm up"])
        reading: dict[str, list[float]] = {name: [] for name in SIDES}
        ingest: dict[str, list[float]] = {name: [] for name in SIDES}
        for r in range(args.rounds):
            for name, limits in SIDES.items():
                reading[name].append(read_rate(files, limits))
                with tempfile.TemporaryDirectory() as tmp:
                    config = IndexConfig(data_dir=Path(tmp), extract=limits)
                    kb = KnowledgeBase(config, embedder=embedder)
                    t = time.perf_counter()
                    summary = kb.ingest_paths([corpus])
                    ingest[name].append(summary.chunks / (time.perf_counter() - t))
                print(
                    f"round {r + 1} {name:>10}: reading {reading[name][-1]:.0f} documents/s, "
                    f"ingest {ingest[name][-1]:.1f} chunks/s"
                )
    print(f"\n{'median':<12}{'reading docs/s':>16}{'ingest chunks/s':>17}")
    for name in SIDES:
        print(
            f"{name:<12}{statistics.median(reading[name]):>16.0f}"
            f"{statistics.median(ingest[name]):>17.1f}"
        )
    for label, rates in (("reading", reading), ("ingest", ingest)):
        ratio = statistics.median(rates["reader"]) / statistics.median(rates["in-process"])
        print(f"{label} reader/in-process: {ratio:.2f}")
    print(f"peak RSS of this process: {peak_rss_mb():.0f} MB")


def read_rate(files: list[tuple[str, bytes]], limits: ExtractLimits | None) -> float:
    """Documents/s of reading every file, in this process or through a reader."""
    t = time.perf_counter()
    for name, data in files:
        if limits is None:
            extract(data, name)
        else:
            read_isolated(data, name, limits=limits, max_bytes=10**8, max_pages=10**4)
    return len(files) / (time.perf_counter() - t)


if __name__ == "__main__":
    main()
