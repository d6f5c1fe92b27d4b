"""Ingestion speed per document format: a mixed corpus generated here.

The same handbook-like prose is written as Markdown, a PDF with a text layer
(fpdf2), a Word file (python-docx; a "page" is one heading, six paragraphs and
a four-row table, about 3,000 characters, the PDF's page), a PowerPoint deck
(python-pptx; a slide is a title, five bullets and speaker notes), an Excel
workbook (openpyxl; sheets of 200 rows by 6 columns) and a CSV file of the
same rows. Each format is measured side by side in one run, ``--rounds``
times, two ways:

    read     index.ingest.extract.extract + index.ingest.chunk.chunk_document (what the format costs)
    ingest   KnowledgeBase.ingest_bytes into a fresh data dir (embedding, SQLite, indexes)

Prints medians per unit (pages, slides, sheets and rows per second), chunks per
second of the whole ingest, the texts each format embeds (chunks and their
sentences, ``index.ingest.sentences``), and the machine.

Run: python -m bench.ingest_formats [--rounds 3] [--units 10]
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docx
import openpyxl
import pptx
from fpdf import FPDF

from bench.machine import describe as machine
from index.config import IndexConfig
from index.embed.pytorch import LocalEmbedder
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from index.ingest.sentences import sentence_texts
from index.knowledge_base import KnowledgeBase

ROWS_PER_SHEET = 200
COLUMNS = ["Ticket", "Team", "Owner", "Status", "Opened", "Summary"]


def paragraph(page: int, i: int) -> str:
    return (
        f"Rule {page}.{i}: expense claims for trips in region {page * 7 + i} are filed within "
        f"{10 + i} days of return, with receipts attached and the cost centre {4000 + page} "
        "named; the finance team answers within two working days and pays with the next run."
    )


def row(n: int) -> list[str]:
    return [f"T-{n:05d}", f"team {n % 9}", f"Owner {n % 37}", ("open", "closed")[n % 2],
            f"2026-{1 + n % 12:02d}-{1 + n % 28:02d}", f"Laptop {n} does not boot after update {n % 5}"]  # fmt: skip


def markdown(pages: int) -> bytes:
    out = []
    for p in range(pages):
        out.append(f"## Section {p}\n\n" + "\n\n".join(paragraph(p, i) for i in range(6)))
    return "\n\n".join(out).encode()


def pdf(pages: int) -> bytes:
    doc = FPDF()
    doc.set_font("Helvetica", size=10)
    for p in range(pages):
        doc.add_page()
        doc.multi_cell(0, 5, f"Section {p}\n\n" + "\n\n".join(paragraph(p, i) for i in range(6)))
    return bytes(doc.output())


def word(pages: int) -> bytes:
    d = docx.Document()
    for p in range(pages):
        d.add_heading(f"Section {p}", 1)
        for i in range(6):
            d.add_paragraph(paragraph(p, i))
        table = d.add_table(rows=4, cols=3)
        for r in range(4):
            for c in range(3):
                table.cell(r, c).text = f"cell {p}.{r}.{c}"
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def deck(slides: int) -> bytes:
    prs = pptx.Presentation()
    for s in range(slides):
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = f"Section {s}"
        slide.placeholders[1].text = "\n".join(paragraph(s, i)[:120] for i in range(5))
        slide.notes_slide.notes_text_frame.text = paragraph(s, 9)
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def workbook(sheets: int) -> bytes:
    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for s in range(sheets):
        ws = wb.create_sheet(f"Tickets {s}")
        ws.append(COLUMNS)
        for n in range(ROWS_PER_SHEET):
            ws.append(row(s * ROWS_PER_SHEET + n))
    out = io.BytesIO()
    wb.save(out)
    return out.getvalue()


def csv_file(rows: int) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    writer.writerows(row(n) for n in range(rows))
    return out.getvalue().encode()


@dataclass(frozen=True)
class Format:
    name: str
    filename: str
    unit: str
    units: int
    build: Callable[[int], bytes]
    size: int  # what ``build`` is called with


def formats(units: int) -> list[Format]:
    sheets = max(1, units // 5)
    return [
        Format("Markdown", "bench.md", "pages", units, markdown, units),
        Format("PDF (text layer)", "bench.pdf", "pages", units, pdf, units),
        Format("Word", "bench.docx", "pages", units, word, units),
        Format("PowerPoint", "bench.pptx", "slides", 2 * units, deck, 2 * units),
        Format("Excel", "bench.xlsx", "sheets", sheets, workbook, sheets),
        Format(
            "CSV", "bench.csv", "rows", sheets * ROWS_PER_SHEET, csv_file, sheets * ROWS_PER_SHEET
        ),
    ]


def read_seconds(f: Format, data: bytes) -> tuple[float, int]:
    start = time.perf_counter()
    chunks = chunk_document(extract(data, f.filename)).chunks
    return time.perf_counter() - start, len(chunks)


def ingest_seconds(f: Format, data: bytes, embedder: LocalEmbedder) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp)), embedder=embedder)
        start = time.perf_counter()
        doc = kb.ingest_bytes(data, f.filename).document
        seconds = time.perf_counter() - start
        kb.store.close()
    assert doc.state == "indexed", doc.failure_reason
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--units", type=int, default=10, help="pages per document (slides: twice)")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    embedder = LocalEmbedder("bundled:all-MiniLM-L6-v2")
    embedder.encode(["warm up"])
    corpus = [(f, f.build(f.size)) for f in formats(args.units)]
    reads: dict[str, list[float]] = {f.name: [] for f, _ in corpus}
    ingests: dict[str, list[float]] = {f.name: [] for f, _ in corpus}
    chunks: dict[str, int] = {}
    for _ in range(args.rounds):
        for f, data in corpus:  # formats alternate within each round
            seconds, chunks[f.name] = read_seconds(f, data)
            reads[f.name].append(seconds)
            ingests[f.name].append(ingest_seconds(f, data, embedder))
    print(f"\nmedian of {args.rounds} rounds")
    for f, data in corpus:
        extracted = chunk_document(extract(data, f.filename)).chunks
        texts = sum(len(sentence_texts(c.text, c.content)) for c in extracted)
        print(f"{f.name}: {len(extracted)} chunks and {texts} sentence texts embedded")
    print()
    print("| format | document | chunks | read: units/s | ingest: units/s | ingest: chunks/s |")
    print("|---|---|---|---|---|---|")
    for f, data in corpus:
        read = statistics.median(reads[f.name])
        ingest = statistics.median(ingests[f.name])
        rows = f" ({f.units * ROWS_PER_SHEET} rows)" if f.unit == "sheets" else ""
        print(
            f"| {f.name} | {f.units} {f.unit}{rows}, {len(data) / 1024:.0f} KB | {chunks[f.name]} "
            f"| {rate(f.units / read, f.unit, rows)} | {rate(f.units / ingest, f.unit, rows)} "
            f"| {chunks[f.name] / ingest:.1f} |"
        )


def rate(per_second: float, unit: str, rows: str) -> str:
    """Units per second, rows per second beside sheets."""
    text = f"{number(per_second)} {unit}/s"
    return f"{text} ({number(per_second * ROWS_PER_SHEET)} rows/s)" if rows else text


def number(x: float) -> str:
    """Three significant digits, without an exponent."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


if __name__ == "__main__":
    main()
