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

Then what confining the readers costs (``index.ingest.sandbox``), alternately
in each round, with a fresh pool of one reader per side:

    unconfined  KB_READER_SANDBOX=off
    sandboxed   KB_READER_SANDBOX=required: Landlock, the seccomp filter, the limits

a reader's start (the interpreter, its imports, the confinement and a tiny
document), its first read of each document of a mixed set (the extractors'
own imports), then each document read again by that warm reader: a PDF with a
text layer and a Word file of 10 pages, a workbook of 2 sheets and a deck of 20
slides (``bench.ingest_formats``), and a scanned page read by Tesseract when it
is installed. Prints the medians side by side and the ratio sandboxed/unconfined.

Run: python -m bench.reading [--rounds 5] [--sandbox-only]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.ingest import peak_rss_mb
from bench.ingest_formats import deck, pdf, word, workbook
from bench.machine import describe as machine
from bench.ocr import scanned_pdf
from bench.query import BUNDLED, EVALSET
from index.config import ExtractLimits, IndexConfig, OcrConfig
from index.embed.onnx import OnnxEmbedder
from index.ingest.extract import extract
from index.ingest.isolated import ReaderPool, read_isolated
from index.ingest.sandbox import kernel_support
from index.knowledge_base import KnowledgeBase

SIDES: dict[str, ExtractLimits | None] = {"in-process": None, "reader": ExtractLimits()}
SANDBOX_SIDES = {
    "unconfined": ExtractLimits(sandbox="off"),
    "sandboxed": ExtractLimits(sandbox="required"),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sandbox-only", action="store_true", help="only what confining costs")
    args = ap.parse_args()
    if args.sandbox_only:
        print(f"machine: {machine()}")
        sandbox_costs(args.rounds)
        return
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
    sandbox_costs(args.rounds)


def read_rate(files: list[tuple[str, bytes]], limits: ExtractLimits | None) -> float:
    """Documents/s of reading every file, in this process or through a reader."""
    t = time.perf_counter()
    for name, data in files:
        if limits is None:
            extract(data, name)
        else:
            read_isolated(data, name, limits=limits, max_bytes=10**8, max_pages=10**4)
    return len(files) / (time.perf_counter() - t)


def sandbox_costs(rounds: int) -> None:
    """A reader's start and each document's read, unconfined and sandboxed, side by side."""
    support = kernel_support()
    print(f"\nreaders confined: Landlock ABI {support.landlock_abi}, seccomp {support.seccomp}")
    if not support.landlock_abi:
        print(f"no sandboxed side: {support.reason}")
        return
    documents = {
        "PDF, 10 pages": ("bench.pdf", pdf(10)),
        "Word, 10 pages": ("bench.docx", word(10)),
        "Excel, 2 sheets": ("bench.xlsx", workbook(2)),
        "PowerPoint, 20 slides": ("bench.pptx", deck(20)),
    }
    if shutil.which(OcrConfig().tesseract_cmd):
        documents["scanned page (OCR)"] = ("scan.pdf", scanned_pdf(1, 150))
    rows = ["reader start", "first reads, in all", *documents]
    seconds: dict[str, dict[str, list[float]]] = {
        side: {row: [] for row in rows} for side in SANDBOX_SIDES
    }
    for _ in range(rounds):
        for side, limits in SANDBOX_SIDES.items():
            pool = ReaderPool(1)
            seconds[side]["reader start"].append(read_seconds(pool, limits, "warm.md", b"# w\n"))
            first = [read_seconds(pool, limits, name, data) for name, data in documents.values()]
            seconds[side]["first reads, in all"].append(sum(first))
            for row, (name, data) in documents.items():
                seconds[side][row].append(read_seconds(pool, limits, name, data))
            pool.close()
    print(f"\n{'median ms':<24}{'unconfined':>12}{'sandboxed':>12}{'ratio':>8}")
    for row in rows:
        off, on = (statistics.median(seconds[side][row]) * 1000 for side in SANDBOX_SIDES)
        print(f"{row:<24}{off:>12.1f}{on:>12.1f}{on / off:>8.2f}")


def read_seconds(pool: ReaderPool, limits: ExtractLimits, name: str, data: bytes) -> float:
    """Seconds one document takes to read through ``pool``."""
    t = time.perf_counter()
    pool.read(
        data,
        name,
        limits=limits,
        max_bytes=10**8,
        max_pages=10**4,
        max_text_chars=10**8,
        ocr=OcrConfig(),
    )
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
